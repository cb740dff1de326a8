"""Validate a schedule before anything launches; each check raises :class:`ScheduleError`.

    deps cover regions  every read-after-write overlap of regions is a dependency
    acyclic             dependencies form a DAG
    complete            every task is queued exactly once
    deadlock-free       running each queue in order, every wait can be satisfied
    written once        every element of every activation/scratch buffer, and every (layer, k/v,
                        row, kv head, dim) of the cache, is written by exactly one task (a
                        fused attention unit's output: by its pieces together, once)
    fits                the grid is resident on the target at once (workers <= resident slots)
    sync covers deps    each dependency is waited on, or implied by queue order or by another wait
"""
from __future__ import annotations

from graphlib import CycleError

import numpy as np

from .cost import Target
from .ir import Schedule, SyncPlan, TaskGraph, merged_writes
from .schedule import DeadlockError, simulate
from .sync import ancestors, counter_closure
from .deps import derive_deps


class ScheduleError(ValueError):
    pass


def check_deps_cover_regions(graph: TaskGraph) -> None:
    for t, needed in enumerate(derive_deps(graph.tasks)):
        missing = set(needed) - set(graph.deps[t])
        if missing:
            raise ScheduleError(f"task {t} reads what task(s) {sorted(missing)[:4]} write, "
                                "without depending on them")


def check_acyclic(graph: TaskGraph) -> tuple[int, ...]:
    """Each task's ancestors (``sync.ancestors``, which orders the tasks topologically)."""
    try:
        return ancestors(graph.deps)
    except CycleError as err:
        raise ScheduleError(f"dependency cycle through tasks {err.args[1]}") from None


def check_complete(graph: TaskGraph, schedule: Schedule) -> None:
    queued = [t for q in schedule.queues for t in q]
    if sorted(queued) != list(range(len(graph.tasks))):
        missing = set(range(len(graph.tasks))) - set(queued)
        raise ScheduleError(f"tasks queued {len(queued)} times for {len(graph.tasks)} tasks; "
                            f"missing {sorted(missing)[:8]}")


def cache_cells(dims: tuple) -> tuple:
    """[L, 2, B, Hkv, S, D] -> [L, 2, B, Hkv, D]: what one decode step writes of the cache."""
    return tuple(dims[:4]) + tuple(dims[5:])


def check_written_once(graph: TaskGraph) -> None:
    shapes = {}                                 # each writable buffer's shape, as counted
    for name, buf in graph.ops.buffers.items():
        if buf.space in ("act", "f32") and not name.startswith("inv_freq"):
            shapes[name] = buf.shape
        elif buf.space == "cache":              # a step writes one slot per row: skip S
            shapes[name] = cache_cells(buf.shape)
    boxes = {name: [] for name in shapes}
    # (ticket, region): what the pieces of a fused unit or column group all declare (the
    # merge's or reduce's writes, done by one of them) counts once; a piece's own slot is its own
    merged = set()
    for task in graph.tasks:
        tickets = merged_writes(task)
        for r in task.writes:
            if tickets and r in tickets:
                if (tickets[r], r) in merged:
                    continue
                merged.add((tickets[r], r))
            if r.buffer not in boxes:
                raise ScheduleError(f"task {task.id} writes {r.buffer}, which is not writable")
            space = graph.ops.buffers[r.buffer].space
            boxes[r.buffer].append(cache_cells(r.box) if space == "cache" else r.box)
    for name, shape in shapes.items():
        c = cover_counts(shape, boxes[name])
        if c.size and (c.min() != 1 or c.max() != 1):
            raise ScheduleError(f"buffer {name}: elements written {int(c.min())} to {int(c.max())} "
                                "times, not exactly once")


def cover_counts(shape: tuple, boxes: list) -> np.ndarray:
    """How many of ``boxes`` [((lo, hi) per dim)] cover each cell of ``shape`` cut at every
    box's edges (each cell's elements are covered alike, so its count is theirs; a box reaching
    past the shape is cut at its end): as counting every element, in a few cells a box."""
    ends = np.asarray(shape, dtype=np.int64)
    b = np.clip(np.asarray(boxes, dtype=np.int64).reshape(len(boxes), len(shape), 2), 0,
                ends[None, :, None])                                   # [N, D, 2]
    cuts = [np.unique(np.concatenate(([0, n], b[:, i].ravel()))) for i, n in enumerate(shape)]
    at = np.stack([np.searchsorted(c, b[:, i]) for i, c in enumerate(cuts)], axis=1)
    counts = np.zeros([len(c) - 1 for c in cuts], dtype=np.int32)
    for box in at.tolist():
        counts[tuple(slice(lo, hi) for lo, hi in box)] += 1
    return counts


def check_sync(graph: TaskGraph, schedule: Schedule, sync: SyncPlan,
               anc: tuple[int, ...]) -> None:
    """Every dependency must happen before its consumer: it ran earlier on the same worker, or
    it is a producer of a counter the consumer (or an earlier task of its worker) waited on, or
    an ancestor of one (release/acquire chains are transitive; ``anc``: each task's)."""
    closure = counter_closure(sync.signal, anc, sync.num_counters)
    for queue in schedule.queues:
        before = 0                                    # happened before the worker's next task
        for t in queue:
            for c in sync.waits[t]:
                before |= closure[c]
            missing = [d for d in graph.deps[t] if not (before >> d) & 1]
            if missing:
                raise ScheduleError(f"task {t} depends on task {missing[0]} on another worker "
                                    "without waiting on a counter that implies it")
            before |= anc[t] | (1 << t)


def validate(graph: TaskGraph, schedule: Schedule, sync: SyncPlan, target: Target) -> None:
    if schedule.num_workers > target.max_workers:
        raise ScheduleError(f"{schedule.num_workers} workers cannot all be resident on "
                            f"{target.name} ({target.max_workers} slots)")
    anc = check_acyclic(graph)
    check_deps_cover_regions(graph)
    check_complete(graph, schedule)
    check_written_once(graph)
    check_sync(graph, schedule, sync, anc)
    try:
        simulate(graph, schedule, target)
    except DeadlockError as err:
        raise ScheduleError(str(err)) from err
