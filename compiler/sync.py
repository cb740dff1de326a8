"""Sync: (TaskGraph, Schedule) -> SyncPlan, the counters the kernel signals and waits on.

Producers of one op whose sets of consumers are equal share one counter (so a consumer waits on
exactly the tiles it reads, with one counter per group rather than one per tile); a wait on a
counter all of whose producers run earlier on the consumer's own worker is implied by queue order
and dropped. Tasks nobody reads signal nothing (-1).
"""
from __future__ import annotations

from collections import defaultdict

from .ir import Schedule, SyncPlan, TaskGraph


def plan_sync(graph: TaskGraph, schedule: Schedule) -> SyncPlan:
    consumers = defaultdict(list)
    for t, deps in enumerate(graph.deps):
        for d in deps:
            consumers[d].append(t)
    groups: dict = {}
    signal = [-1] * len(graph.tasks)
    members = defaultdict(list)
    for t, task in enumerate(graph.tasks):
        if consumers[t]:
            c = groups.setdefault((task.op, tuple(consumers[t])), len(groups))
            signal[t] = c
            members[c].append(t)
    where = {t: w for w, q in enumerate(schedule.queues) for t in q}
    waits = []
    for t, deps in enumerate(graph.deps):
        needed = sorted({signal[d] for d in deps})
        waits.append(tuple(c for c in needed
                           if any(where[m] != where[t] for m in members[c])))
    sizes = tuple(len(members[c]) for c in range(len(groups)))
    return SyncPlan(len(groups), sizes, tuple(signal), tuple(waits))
