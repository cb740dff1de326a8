"""Schedule: TaskGraph -> Schedule (which worker runs which tasks, in which order).

Two schedulers behind one signature ``(graph, target, num_workers) -> Schedule``:
    greedy  list scheduling: tasks in topological order, most critical first within an op, each
            placed on the worker where it can start earliest; a dependency on another worker
            costs ``target.sync_us``. It is the oracle.
    cpsat   OR-tools CP-SAT over windows of the greedy schedule (see ``cpsat.py``); it keeps its
            answer only where the cost model rates it better, so it is never worse than greedy.
``simulate`` rates any schedule with the same cost model (and finds deadlocks).
"""
from __future__ import annotations

import heapq

from .cost import Target, task_us
from .ir import Schedule, TaskGraph


class DeadlockError(RuntimeError):
    pass


def bottom_levels(graph: TaskGraph, cost: list[float]) -> list[float]:
    level = list(cost)
    for t in reversed(range(len(graph.tasks))):
        below = level[t]
        for d in graph.deps[t]:
            if cost[d] + below > level[d]:
                level[d] = cost[d] + below
    return level


def costs(graph: TaskGraph, target: Target, workers: int) -> list[float]:
    return [task_us(t, target, workers) for t in graph.tasks]


def greedy(graph: TaskGraph, target: Target, num_workers: int) -> Schedule:
    """Ops in graph order; within an op, the tasks that feed another task of the op (attention
    pieces, their combine's inputs) first, then the most critical first. Where an op mixes
    whole units and pieces (``attn_spill``), longest first would start each piece after a
    whole unit and its combine later still; pieces first end early, and their combines run on
    a worker whose whole unit ends first (llama-3.2-1b at 17 rows: rated 1186 -> 1135 us)."""
    cost = costs(graph, target, num_workers)
    level = bottom_levels(graph, cost)
    op_index = {}
    for t in graph.tasks:
        op_index.setdefault(t.op, len(op_index))
    feeds = [False] * len(cost)
    for t in graph.tasks:
        for d in graph.deps[t.id]:
            feeds[d] = feeds[d] or graph.tasks[d].op == t.op
    order = sorted(range(len(cost)),
                   key=lambda t: (op_index[graph.tasks[t].op], not feeds[t], -level[t]))
    return place(graph, order, cost, target, num_workers, "greedy")


def place(graph: TaskGraph, order: list[int], cost: list[float], target: Target,
          num_workers: int, scheduler: str) -> Schedule:
    """List-place tasks in ``order``, each on the worker where it can start earliest (the
    earliest-free worker or one of its producers', which saves the sync)."""
    free = [(0.0, w) for w in range(num_workers)]      # heap of (time the worker frees up, w)
    worker_free = [0.0] * num_workers
    where, finish = [0] * len(cost), [0.0] * len(cost)
    queues = [[] for _ in range(num_workers)]
    for t in order:
        while free[0][0] != worker_free[free[0][1]]:    # drop stale heap entries
            heapq.heappop(free)
        latest: dict[int, float] = {}                   # worker -> its latest producer's finish
        for d in graph.deps[t]:
            w, f = where[d], finish[d]
            if f > latest.get(w, -1.0):
                latest[w] = f
        w, start = _earliest(latest, free[0][1], worker_free, target.sync_us)
        where[t], finish[t] = w, start + cost[t]
        worker_free[w] = finish[t]
        heapq.heappush(free, (finish[t], w))
        queues[w].append(t)
    makespan = max(finish, default=0.0)
    return Schedule(num_workers, tuple(map(tuple, queues)), makespan, scheduler,
                    ((scheduler, makespan),))


def _earliest(latest: dict[int, float], idle: int, worker_free: list[float],
              sync_us: float) -> tuple[int, float]:
    """(worker, start) of the earliest start (equal starts: the lowest worker) of a task whose
    producers' latest finish on each worker is ``latest``, on the earliest-free worker ``idle``
    or a producer's: its own producers free, the others' plus the sync, the worker free. (Plain
    comparisons, not ``max`` and ``heapq``: a 64-row graph's placement asks this 10k times.)"""
    first_w, first, second = -1, -1.0, -1.0        # the two latest producers (ties: first seen)
    for w, f in latest.items():
        if f > first:
            second, first_w, first = first, w, f
        elif f > second:
            second = f
    first = first + sync_us if first_w >= 0 else 0.0
    second = second + sync_us if second >= 0 else 0.0
    best, best_start = -1, 0.0
    for w in (idle, *latest):
        if w == first_w:            # its own latest producer needs no sync
            start = max(latest[w], second, worker_free[w])
        else:                       # ``first`` is past its own producers (if any) already
            start = worker_free[w] if worker_free[w] > first else first
        if best < 0 or start < best_start or (start == best_start and w < best):
            best, best_start = w, start
    return best, best_start


def simulate(graph: TaskGraph, schedule: Schedule, target: Target) -> float:
    """Makespan of ``schedule`` under the cost model; raises DeadlockError if a queue waits on a
    task that can never run first."""
    return max(start_times(graph, schedule, target, finish=True).values(), default=0.0)


def start_times(graph: TaskGraph, schedule: Schedule, target: Target,
                finish: bool = False) -> dict[int, float]:
    """Start (or finish) time of every task when each worker runs its queue in order."""
    cost = costs(graph, target, schedule.num_workers)
    where = {t: w for w, q in enumerate(schedule.queues) for t in q}
    ends: dict[int, float] = {}
    starts: dict[int, float] = {}
    heads = [0] * schedule.num_workers
    clock = [0.0] * schedule.num_workers
    remaining = sum(len(q) for q in schedule.queues)
    while remaining:
        progressed = False
        for w, q in enumerate(schedule.queues):
            while heads[w] < len(q) and all(d in ends for d in graph.deps[q[heads[w]]]):
                t = q[heads[w]]
                ready = max((ends[d] + (0.0 if where[d] == w else target.sync_us)
                             for d in graph.deps[t]), default=0.0)
                starts[t] = max(clock[w], ready)
                clock[w] = ends[t] = starts[t] + cost[t]
                heads[w] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {w: q[heads[w]] for w, q in enumerate(schedule.queues) if heads[w] < len(q)}
            raise DeadlockError(f"schedule deadlocks: worker -> waiting task {stuck}")
    return ends if finish else starts


def cpsat(graph: TaskGraph, target: Target, num_workers: int) -> Schedule:
    from .cpsat import cpsat as solve

    return solve(graph, target, num_workers)


SCHEDULERS = {"greedy": greedy, "cpsat": cpsat}


def schedule(graph: TaskGraph, target: Target, num_workers: int, scheduler: str = "greedy"):
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler {scheduler!r} unknown; choose one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[scheduler](graph, target, num_workers)
