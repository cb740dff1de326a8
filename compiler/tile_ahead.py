"""Tile ``l2_ahead`` tasks: while a layer's attention runs on some of the workers, others ask
L2 for the head of that layer's gate_up weights, so that the gate_up tasks start on lines
already on chip instead of waiting for HBM at the start of their loops.

Input: the Tiler right after an attention op's tasks (``TileConfig.ahead_cols`` > 0). Output:
one task per worker the attention's tasks (combines aside) leave free, at least one, of a
pseudo-op ``{gate_up}.ahead``, each the first ``ahead_cols`` columns of an equal share of the
rows of the gate and up weights. Each reads one
element of the attention's q, so it waits for the q/k/v task writing it, and the list scheduler
(ops in graph order) places it after the attention tasks, on the workers free first; it writes
nothing. The cost model sees no bytes in it: the lines it asks for are the gate_up tasks'.
"""
from __future__ import annotations

from .ir import Region, Task


def next_gate_up(graph, attention_op):
    """The first gate_up op after ``attention_op`` in graph order, or None."""
    later = graph.ops[graph.ops.index(attention_op) + 1:]
    return next((op for op in later if op.kind == "gate_up"), None)


def tile_ahead(t, attention_op) -> None:
    d, gate_up = t.graph.dims, next_gate_up(t.graph, attention_op)
    cols = min(t.cfg.ahead_cols, d.hidden) // 64 * 64
    if gate_up is None or cols == 0:
        return
    p, q = gate_up.params, attention_op.params["q"]
    busy = sum(x.op == attention_op.name and x.kind != "attn_combine" for x in t.tasks)
    share = -(-d.intermediate // max(1, t.workers - busy))
    for r0 in range(0, d.intermediate, share):
        r1 = min(d.intermediate, r0 + share)
        reads = (Region(q, ((0, 1), (0, 1))), Region(p["gate"], ((r0, r1), (0, cols))),
                 Region(p["up"], ((r0, r1), (0, cols))))
        t.tasks.append(Task(len(t.tasks), f"{gate_up.name}.ahead", "l2_ahead",
                            dict(gate=p["gate"], up=p["up"], r0=r0, r1=r1, cols=cols),
                            reads, (), 0, 0))
