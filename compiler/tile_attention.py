"""Tile the attention op: an attn_partial task per key range of each (row, kv head) unit
(``Tiler.kv_pieces``), partials in fp32 slots merged by one attn_combine per unit of several
ranges; a unit of one range writes its output itself."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .ir import Buffer, Region

if TYPE_CHECKING:
    from .tile import Tiler


def tile_attention(t: Tiler, op) -> None:
    """An attn_partial task per key range of ``Tiler.kv_pieces`` of each (row, kv head); a unit
    in one range writes its output itself, the others' ranges write consecutive slots of
    {op}.acc [P, G, D] and {op}.ml [P, G, 2] and an attn_combine per unit merges them."""
    d = t.graph.dims
    q, out, layer = t.b(op.params["q"]), t.b(op.outputs[0]), op.params["layer"]
    group, hd, pieces = d.heads // d.kv_heads, d.head_dim, t.kv_pieces()
    slots = sum(len(p) for p in pieces if len(p) > 1)
    longest = max(hi - lo for p in pieces for lo, hi in p)
    most = max(len(p) for p in pieces)
    acc = Buffer(f"{op.name}.acc", "f32", (slots, group, hd))
    ml = Buffer(f"{op.name}.ml", "f32", (slots, group, 2))
    if slots:
        t.buffers.update({acc.name: acc, ml.name: ml})
    first = 0
    for b in range(d.batch):
        for g in range(d.kv_heads):
            ranges, heads = pieces[b * d.kv_heads + g], (g * group, (g + 1) * group)
            direct = len(ranges) == 1
            into = (dict(out=out.name, acc=None, ml=None) if direct     # where partials go
                    else dict(out=None, acc=acc.name, ml=ml.name))
            out_region = Region(out.name, ((b, b + 1), (heads[0] * hd, heads[1] * hd)))
            q_region = Region(q.name, ((b, b + 1), (heads[0] * hd, heads[1] * hd)))
            for s, (lo, hi) in enumerate(ranges):
                kv = Region("kv_cache", ((layer, layer + 1), (0, 2), (b, b + 1), (g, g + 1),
                                         (lo, hi), (0, hd)))
                slot = ((first + s, first + s + 1), (0, group))
                writes = [out_region] if direct else [Region(acc.name, slot + ((0, hd),)),
                                                      Region(ml.name, slot + ((0, 2),))]
                t.add(op, "attn_partial", dict(q=q.name, row=b, kv_head=g, slot=first + s,
                                               lo=lo, span=hi - lo, layer=layer,
                                               kv_split=longest, direct=direct, **into),
                      [q_region, kv, Region("positions", ((0, d.batch),))], writes,
                      (2 * (hi - lo) * hd + group * hd) * d.itemsize + group * (hd + 2) * 4,
                      4 * group * (hi - lo) * hd)
            if direct:
                continue
            used = ((first, first + len(ranges)), (0, group))
            t.add(op, "attn_combine", dict(acc=acc.name, ml=ml.name, out=out.name, row=b,
                                           kv_head=g, first=first, count=len(ranges),
                                           nsplit=most),
                  [Region(acc.name, used + ((0, hd),)), Region(ml.name, used + ((0, 2),))],
                  [out_region], group * len(ranges) * (hd + 2) * 4 + group * hd * d.itemsize, 0)
            first += len(ranges)
