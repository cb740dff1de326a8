"""Place: Schedule -> Schedule with queue w to run on the SM whose ``%smid`` is w
(``CompileOptions.queues_by_sm``; the kernel's programs then take their SM's queue).

    place_queues(tasks, schedule, groups) -> Schedule

Inputs: the task graph, a schedule of one worker per SM, and the target's SM groups
(``cost.Target.sm_groups``: SMs that share a rate). The queues that stream attention (their
attention tasks' bytes) go, most bytes first, each to the group where the attention bytes per
SM stay lowest (the lowest free SM id there), then the others fill the free SMs in order: at 24
rows, 96 attention queues on 132 SMs leave about one SM of every four-SM group idle instead of
whole groups busy beside whole groups idle (ties go to the smaller group: the pairs named
where no sharing was seen). Invariants: a permutation of the queues (each
queue's tasks and order kept), so the dependencies and the cost model's rating are unchanged.
"""
from __future__ import annotations

from dataclasses import replace

from .cost import ATTENTION
from .ir import Schedule, TaskGraph


def attention_bytes(tasks: TaskGraph, queue) -> int:
    return sum(tasks.tasks[t].bytes for t in queue if tasks.tasks[t].kind in ATTENTION)


def place_queues(tasks: TaskGraph, schedule: Schedule, groups) -> Schedule:
    n = schedule.num_workers
    if not groups:
        raise ValueError("queues_by_sm: the target names no SM groups (cost.Target.sm_groups)")
    covered = sorted(s for g in groups for s in g)
    if covered != list(range(n)):
        raise ValueError(f"queues_by_sm: {n} workers, but the target's SM groups cover SMs "
                         f"{covered[:4]}...: one worker per SM needed (num_workers = the "
                         "target's SMs)")
    load = [attention_bytes(tasks, q) for q in schedule.queues]
    free = [sorted(g, reverse=True) for g in groups]            # pop() gives the lowest id
    given = [0] * len(groups)
    on_sm: list = [None] * n
    for w in sorted(range(n), key=lambda w: (-load[w], w)):
        if load[w]:
            g = min((i for i, f in enumerate(free) if f),
                    key=lambda i: ((given[i] + load[w]) / len(groups[i]), len(groups[i]), i))
            given[g] += load[w]
            on_sm[free[g].pop()] = schedule.queues[w]
    idle = iter(w for w in range(n) if not load[w])
    queues = tuple(q if q is not None else schedule.queues[next(idle)] for q in on_sm)
    return replace(schedule, queues=queues)
