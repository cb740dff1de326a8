"""A one-screen summary of a compiled kernel: tasks per kind, the schedule and its syncs."""
from __future__ import annotations

from collections import Counter

from .pipeline import Compiled


def summary(c: Compiled) -> str:
    d, sched, sync = c.ops.dims, c.schedule, c.sync
    kinds = Counter(t.kind for t in c.tasks.tasks)
    mb = sum(t.bytes for t in c.tasks.tasks) / 1e6
    lines = [
        f"megakernel {c.name}: batch {d.batch}, max_seq_len {d.max_seq_len}, target "
        f"{c.options.target}, {d.layers} layers",
        f"  ops {len(c.ops.ops)} -> tasks {len(c.tasks.tasks)} ({mb:.1f} MB moved per step), "
        f"opcodes {len(c.encoded.variants)}",
        "  tasks: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
        f"  schedule: {sched.scheduler} on {sched.num_workers} workers, predicted makespan "
        f"{sched.makespan_us:.1f} us; per worker {min(map(len, sched.queues))}-"
        f"{max(map(len, sched.queues))} tasks",
        "  makespans: " + ", ".join(f"{name} {ms:.1f} us" for name, ms in sched.rated)
        + f" -> {sched.scheduler} kept",
        f"  sync: {sync.num_counters} counters, {sum(map(len, sync.waits))} waits "
        f"({sum(1 for w in sync.waits if not w)} tasks wait on nothing)"
        + (f", {sync.num_tickets} tickets (fused merges and reduces)" if sync.num_tickets
           else ""),
    ]
    return "\n".join(lines)
