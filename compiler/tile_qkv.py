"""q/k/v pieces that span heads (``TileConfig.qkv_cross``, models without head norms): each
kind's RoPE pairs (dim i with i + D/2 of a head) laid end to end over its heads and cut into
pieces of equal pair counts, the fewest that fill one wave of the workers (at least
``min_qkv_dims`` pairs each); a piece may end in the next head (or further), so the q/k/v phase
need not be as long as a head's half.

Input: a qkv_rope op; output: qkv_rope tasks with ``cross`` set, ``head``/``d0`` their first
pair, ``part`` the pairs of every piece (the kind's last one fewer). Their regions are the
union of the heads' pieces they touch, so dependencies follow as for whole-head pieces."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .ir import Region

if TYPE_CHECKING:
    from .tile import Tiler


def cross_pairs(kinds: list[int], workers: int, least: int = 1) -> int:
    """Pairs per piece for kinds of ``kinds`` pairs each: the fewest, at least ``least``, whose
    pieces (each kind cut on its own) fit in one wave of ``workers``, or one piece per kind."""
    n = max(least, -(-sum(kinds) // workers))
    while sum(-(-k // n) for k in kinds) > workers and n < max(kinds):
        n += 1
    return n


def head_spans(p0: int, p1: int, half: int) -> dict[int, tuple]:
    """Pairs [p0, p1) of heads laid end to end -> {head: its row spans (lo half, hi half)}."""
    out = {}
    for h in range(p0 // half, (p1 - 1) // half + 1):
        a, b = max(p0, h * half) - h * half, min(p1, (h + 1) * half) - h * half
        hd = 2 * half
        out[h] = ((h * hd + a, h * hd + b), (h * hd + half + a, h * hd + half + b))
    return out


def tile_qkv_cross(t: Tiler, op) -> None:
    """The qkv_rope op's pieces across heads (see the module docstring)."""
    from .tile import full, p2, qkv_writes, rows

    p, d = op.params, t.graph.dims
    x, q = t.b(p["x"]), t.b(op.outputs[0])
    hd, half, layer = d.head_dim, d.head_dim // 2, p["layer"]
    kinds = [("q", d.heads), ("k", d.kv_heads), ("v", d.kv_heads)]
    # at least min_qkv_dims pairs: a tensor-core dot's 16 weight rows
    n = cross_pairs([heads * half for _, heads in kinds], t.workers, t.cfg.min_qkv_dims)
    for kind, heads in kinds:
        w = t.b(p[f"w{kind}"])
        for p0 in range(0, heads * half, n):
            p1 = min(p0 + n, heads * half)
            spans = head_spans(p0, p1, half)
            reads = [Region(x.name, full(x)), Region("positions", ((0, d.batch),)),
                     Region(p["inv_freq"], ((0, half),))]
            reads += [rows(w, lo, hi) for s in spans.values() for lo, hi in s]
            reads += [Region(p["norm"], ((0, d.hidden),))] if p["norm"] else []
            writes = [r for h, s in spans.items() for r in qkv_writes(t, q, kind, h, layer, s)]
            m = p1 - p0
            nbytes = (2 * m * d.hidden + d.batch * d.hidden + 2 * d.batch * m) * d.itemsize
            t.add(op, "qkv_rope", dict(x=x.name, norm=p["norm"], weight=w.name, head_norm=None,
                                       inv_freq=p["inv_freq"], out=q.name,
                                       kind="qkv".index(kind), head=p0 // half, layer=layer,
                                       d0=p0 % half, col=p0 // half * hd, part=n, eps=p["eps"],
                                       qk_eps=p["qk_eps"], raw=False, cross=True,
                                       bk=t.depth(d.hidden, 2 * max(p2(n), 16))),
                  reads, writes, nbytes, 4 * d.batch * m * d.hidden)
