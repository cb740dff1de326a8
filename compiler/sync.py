"""Sync: (TaskGraph, Schedule) -> SyncPlan, the counters the kernel signals and waits on.

Only essential dependencies are synchronised: a dependency on d is dropped when another
dependency of the same task already (transitively) depends on d, since release/acquire chains
order d's writes before that task anyway. Producers of one op whose sets of essential consumers
are equal share one counter, so a consumer that reads a whole row waits on one counter, not one
per tile. A wait is dropped when queue order (tasks earlier on the consumer's worker, and what
they waited for) or the task's other waits already imply it. Tasks nobody waits for signal
nothing (-1).
"""
from __future__ import annotations

import functools
from collections import defaultdict
from graphlib import TopologicalSorter

from .ir import Schedule, SyncPlan, TaskGraph, merged_writes


@functools.lru_cache(maxsize=1)
def ancestors(deps: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """Per task, a bitset (int) of every task it depends on, directly or transitively (the last
    graph's kept: the sync plan and the validation of one compile ask for the same).
    Raises ``graphlib.CycleError`` on a cycle."""
    anc = [0] * len(deps)
    ordered = all(d < t for t, ds in enumerate(deps) for d in ds)    # as tiling numbers them
    for t in range(len(deps)) if ordered else \
            TopologicalSorter({t: ds for t, ds in enumerate(deps)}).static_order():
        bits = 0
        for d in deps[t]:
            bits |= anc[d] | (1 << d)
        anc[t] = bits
    return tuple(anc)


def essential_deps(deps, anc: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], ...]:
    """Each task's dependencies minus those implied through another of its dependencies."""
    anc = ancestors(deps) if anc is None else anc
    out = []
    for ds in deps:
        implied = 0
        for d in ds:
            implied |= anc[d]
        out.append(tuple(d for d in ds if not (implied >> d) & 1))
    return tuple(out)


def counter_closure(signal, anc: tuple[int, ...], num_counters: int) -> list[int]:
    """Per counter, a bitset of its producers and everything they depend on: all of it has
    happened once a wait on the counter returns."""
    closure = [0] * num_counters
    for t, c in enumerate(signal):
        if c >= 0:
            closure[c] |= anc[t] | (1 << t)
    return closure


def needed_waits(deps, signal, closure, before: int) -> tuple[int, ...]:
    """The counters a task must wait on for ``deps``, minus those whose dependencies already
    happened (``before``: earlier on the worker) or are implied by the task's other waits."""
    waits = sorted({signal[d] for d in deps if not (before >> d) & 1})
    for c in list(waits):
        others = before
        for c2 in waits:
            others |= closure[c2] if c2 != c else 0
        if all((others >> d) & 1 for d in deps if signal[d] == c):
            waits.remove(c)
    return tuple(waits)


def plan_sync(graph: TaskGraph, schedule: Schedule) -> SyncPlan:
    anc = ancestors(graph.deps)
    deps = essential_deps(graph.deps, anc)
    consumers = defaultdict(list)
    for t, ds in enumerate(deps):
        for d in ds:
            consumers[d].append(t)
    groups: dict = {}
    signal = [-1] * len(graph.tasks)
    members = defaultdict(list)
    for t, task in enumerate(graph.tasks):
        if consumers[t]:
            c = groups.setdefault((task.op, tuple(consumers[t])), len(groups))
            signal[t] = c
            members[c].append(t)
    closure = counter_closure(signal, anc, len(groups))
    waits: list = [()] * len(graph.tasks)
    for queue in schedule.queues:
        before = 0                        # what happened before the worker's next task
        for t in queue:
            waits[t] = needed_waits(deps[t], signal, closure, before)
            for c in waits[t]:
                before |= closure[c]
            before |= anc[t] | (1 << t)
    sizes = tuple(len(members[c]) for c in range(len(groups)))
    tickets = 1 + max((k for t in graph.tasks for k in merged_writes(t).values()), default=-1)
    return SyncPlan(len(groups), sizes, tuple(signal), tuple(waits), tickets)
