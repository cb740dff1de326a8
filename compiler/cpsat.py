"""CP-SAT scheduling over windows, hinted with the greedy schedule; never worse than greedy.

Whole decode graphs are too large for CP-SAT (about 10k tasks found nothing better than list
scheduling, often no solution in 30 s), so the graph is cut into windows of consecutive ops (a
layer is about one window). In a window each task is an interval whose length is its cost; the
workers are a cumulative resource of capacity ``num_workers``, HBM bandwidth a cumulative resource
of the chip's bytes/us, and every dependency costs ``target.sync_us``; predecessors outside the
window release it. Starts from the greedy schedule are the hint. The solved starts order the tasks;
they are placed on workers in that order, and the result is rated by the same simulator as greedy:
the better of the two is returned, with both makespans in ``rated``.
"""
from __future__ import annotations

from dataclasses import replace

from .cost import Target
from .ir import Schedule, TaskGraph
from .schedule import costs, greedy, place, simulate, start_times

TICKS_PER_US = 100


def windows(graph: TaskGraph, max_tasks: int) -> list[list[int]]:
    out, current, op = [], [], None
    for t in graph.tasks:
        if t.op != op and len(current) >= max_tasks:
            out.append(current)
            current = []
        current.append(t.id)
        op = t.op
    return out + [current] if current else out


def solve_window(graph, ids, cost, release, hint, target, workers, time_limit_s):
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    inside = set(ids)
    dur = {t: max(1, round(cost[t] * TICKS_PER_US)) for t in ids}
    horizon = sum(dur.values()) + max(release.values(), default=0) + 1
    start, end, iv = {}, {}, {}
    for t in ids:
        start[t] = m.new_int_var(release.get(t, 0), horizon, f"s{t}")
        end[t] = m.new_int_var(0, horizon, f"e{t}")
        iv[t] = m.new_interval_var(start[t], dur[t], end[t], f"i{t}")
        m.add_hint(start[t], hint[t])
    sync = round(target.sync_us * TICKS_PER_US)
    for t in ids:
        for d in graph.deps[t]:
            if d in inside:
                m.add(start[t] >= end[d] + sync)
    m.add_cumulative([iv[t] for t in ids], [1] * len(ids), workers)
    rate = [max(1, round(graph.tasks[t].bytes / max(cost[t], 1e-9))) for t in ids]
    m.add_cumulative([iv[t] for t in ids], rate, max(max(rate), round(target.hbm_bytes_per_us)))
    makespan = m.new_int_var(0, horizon, "makespan")
    m.add_max_equality(makespan, [end[t] for t in ids])
    m.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 2
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return {t: solver.value(start[t]) for t in ids}


def cpsat(graph: TaskGraph, target: Target, num_workers: int, time_limit_s: float = 20.0,
          window_tasks: int = 400) -> Schedule:
    base = greedy(graph, target, num_workers)
    base_ms = simulate(graph, base, target)
    cost = costs(graph, target, num_workers)
    hint = {t: round(s * TICKS_PER_US) for t, s in start_times(graph, base, target).items()}
    parts = windows(graph, window_tasks)
    order, done_at = [], {}
    budget = time_limit_s / max(1, len(parts))
    for ids in parts:
        inside = set(ids)
        release = {t: max((done_at[d] for d in graph.deps[t] if d not in inside), default=0)
                   for t in ids}
        solved = solve_window(graph, ids, cost, release, hint, target, num_workers, budget)
        starts = solved or {t: hint[t] for t in ids}
        order += sorted(ids, key=lambda t: (starts[t], t))
        sync = round(target.sync_us * TICKS_PER_US)
        for t in ids:
            done_at[t] = starts[t] + max(1, round(cost[t] * TICKS_PER_US)) + sync
    candidate = place(graph, order, cost, target, num_workers, "cpsat")
    cand_ms = simulate(graph, candidate, target)
    rated = (("greedy", base_ms), ("cpsat", cand_ms))
    if cand_ms < base_ms:
        return replace(candidate, makespan_us=cand_ms, rated=rated)
    return replace(base, makespan_us=base_ms, rated=rated)
