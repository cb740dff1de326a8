"""Tile the qkv_rope op: pieces of RoPE pairs (dim i with i + D/2 of a head), each a qkv_rope
task that projects, rotates and stores its pairs of q, k or v.

Per head (``tile_qkv_rope``): ``Tiler.qkv_pieces`` pieces of each head; where a head norm needs
the whole head and its pieces are split, they write the raw projection and a head_norm_rope task
per head finishes it. Across heads (``TileConfig.qkv_cross``, models without head norms): each
kind's pairs laid end to end over its heads and cut into pieces of equal pair counts, the fewest
that fill one wave of the workers (at least ``min_qkv_dims`` pairs each); a piece may end in
the next head (or further), so the q/k/v phase need not be as long as a head's half. Such
tasks have ``cross`` set, ``head``/``d0`` their first pair, ``part`` the pairs of every piece
(the kind's last one fewer); their regions are the union of the heads' pieces they touch, so
dependencies follow as for pieces of one head.

In K slices (``TileConfig.qkv_slices``, pieces within heads that write no raw projection, x
normalised already): a head's tasks are its pieces' slices (``Tiler.qkv_pieces`` tasks, so
pieces that many times wider), a qkv_part_rope task a slice (``add_qkv_slices``), each piece
finished by the last of its slices to take its ticket."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .ir import Buffer, Region

if TYPE_CHECKING:
    from .tile import Tiler


def qkv_writes(t: Tiler, q: Buffer, kind: str, h: int, layer: int, spans) -> list[Region]:
    """Where a q/k/v piece's columns ``spans`` (of the head's weight rows) end up: q columns, or
    the head's dims in the cache plane of this layer."""
    from .tile import cols

    d = t.graph.dims
    if kind == "q":
        return [cols(q, lo, hi) for lo, hi in spans]
    plane = ((layer, layer + 1), (int(kind == "v"), int(kind == "v") + 1), (0, d.batch), (h, h + 1),
             (0, d.max_seq_len))
    return [Region("kv_cache", plane + ((lo - h * d.head_dim, hi - h * d.head_dim),))
            for lo, hi in spans]


def add_qkv_piece(t: Tiler, op, kind: str, spans: dict, n: int, part: int, inv: tuple,
                  args: dict, reads: tuple = (), writes: list | None = None) -> None:
    """A qkv_rope task of ``n`` RoPE pairs (of pieces of ``part``) whose weight rows are
    ``spans`` {head: (lo half, hi half)}: it reads x, those rows, the positions, the frequencies
    ``inv`` (a box), ``reads`` and the norm, and writes its heads' q columns or cache dims (or
    ``writes``); ``args`` join the common ones."""
    from .tile import full, p2, rows
    from .tile_norm import norm_reads, sums_args

    p, d = op.params, t.graph.dims
    x, q, w = t.b(p["x"]), t.b(op.outputs[0]), t.b(p[f"w{kind}"])
    reads = [Region(x.name, full(x)), *(rows(w, lo, hi) for s in spans.values() for lo, hi in s),
             Region("positions", ((0, d.batch),)), Region(p["inv_freq"], inv), *reads,
             *norm_reads(t, p)]
    if writes is None:
        writes = [r for h, s in spans.items() for r in qkv_writes(t, q, kind, h, p["layer"], s)]
    nbytes = (2 * n * d.hidden + d.batch * d.hidden + 2 * d.batch * n) * d.itemsize
    t.add(op, "qkv_rope", dict(x=x.name, norm=p["norm"], weight=w.name, inv_freq=p["inv_freq"],
                               kind="qkv".index(kind), layer=p["layer"], part=part,
                               eps=p["eps"], qk_eps=p["qk_eps"], **sums_args(t, p),
                               bk=t.depth(d.hidden, 2 * max(p2(part), 16)), **args),
          reads, writes, nbytes, 4 * d.batch * n * d.hidden)


def qkv_slices(t: Tiler) -> int:
    """K slices of the q/k/v pieces within heads (``TileConfig.qkv_slices``): where x is
    normalised first (by rms_norm tasks, or the norm's RMS from sums of squares, applied to the
    product: ``tile_norm.norm_first``) and each slice keeps a multiple of 16 columns, else 1."""
    s, k = t.cfg.qkv_slices, t.graph.dims.hidden
    return s if s > 1 and t.norm_first() and k % (16 * s) == 0 else 1


def add_qkv_slices(t: Tiler, op, kind: str, h: int, spans: tuple, n: int, part: int,
                   inv: tuple, args: dict, reads: list, slices: int) -> None:
    """``add_qkv_piece``'s piece of head h as ``slices`` qkv_part_rope tasks, one a K slice:
    each reads its columns of x and of the piece's weight rows ``spans`` and writes its slot of
    the kind's ``{op}.part{kind}`` [S, B, heads * D] fp32 (columns as the weight's rows); each
    also declares what the piece's finish reads and writes, and takes the piece's ticket, the
    last to take it summing the slots in order and rotating and storing the piece."""
    from .tile import p2
    from .tile_norm import norm_reads, sums_args

    p, d = op.params, t.graph.dims
    x, q, w = t.b(p["x"]), t.b(op.outputs[0]), t.b(p[f"w{kind}"])
    name = f"{op.name}.part{kind}"
    t.buffers.setdefault(name, Buffer(name, "f32", (slices, d.batch, w.shape[0])))
    ks = d.hidden // slices
    finish = ([Region("positions", ((0, d.batch),)), Region(p["inv_freq"], inv), *reads,
               *norm_reads(t, p)], qkv_writes(t, q, kind, h, p["layer"], spans))
    finish_bytes = d.batch * 2 * n * (4 * slices + d.itemsize)
    for s in range(slices):
        k0 = s * ks
        own = ([Region(x.name, ((0, d.batch), (k0, k0 + ks))),
                *(Region(w.name, ((lo, hi), (k0, k0 + ks))) for lo, hi in spans)],
               [Region(name, ((s, s + 1), (0, d.batch), (lo, hi))) for lo, hi in spans])
        nbytes = (2 * n + d.batch) * ks * d.itemsize + d.batch * 2 * n * 4 + \
            finish_bytes // slices
        t.add(op, "qkv_part_rope",
              dict(x=x.name, norm=p["norm"], weight=w.name, inv_freq=p["inv_freq"],
                   kind="qkv".index(kind), layer=p["layer"], part=part, eps=p["eps"],
                   qk_eps=p["qk_eps"], **sums_args(t, p), partial=name, s=s, ks=ks,
                   slices=slices, ticket=t.tickets,
                   bk=t.depth(ks, 2 * max(p2(part), 16)), **args),
              own[0] + finish[0], own[1] + finish[1], nbytes, 4 * d.batch * n * ks)
    t.tickets += 1


def tile_qkv_rope(t: Tiler, op) -> None:
    """Pieces of each head; where a head norm needs the whole head and its pieces are split,
    they write the raw projection into ``{op}.raw`` [B, (HQ + HKV) * D] and one head_norm_rope
    task per q/k head normalises, rotates and stores it."""
    from .tile import cols

    p, d = op.params, t.graph.dims
    if t.cfg.qkv_cross and not (p["q_norm"] or p["k_norm"]):
        return tile_qkv_cross(t, op)
    q, hd, layer = t.b(op.outputs[0]), d.head_dim, p["layer"]
    heads = [("q", h, p["q_norm"]) for h in range(d.heads)]
    heads += [(kind, h, p["k_norm"] if kind == "k" else None)
              for h in range(d.kv_heads) for kind in ("k", "v")]
    half = hd // 2
    raw = Buffer(f"{op.name}.raw", "act", (d.batch, (d.heads + d.kv_heads) * hd))
    slices = qkv_slices(t)
    for kind, h, head_norm in heads:
        # pieces of dims [d0, d0 + part) in each half (RoPE pairs i with i + hd/2); a head's
        # tasks pieces of K slices where they write no raw projection
        pieces = t.qkv_pieces(head_norm is not None)
        split = head_norm is not None and pieces > 1
        sliced = 1 if split else slices
        pieces = max(1, pieces // sliced)
        part = -(-half // pieces)
        col = (h + d.heads * (kind == "k")) * hd if split else h * hd      # out column of dim 0
        for d0 in range(0, half, part):
            n = min(part, half - d0)
            spans = ((h * hd + d0, h * hd + d0 + n), (h * hd + half + d0, h * hd + half + d0 + n))
            whole = head_norm and not split
            writes = [cols(raw, lo - h * hd + col, hi - h * hd + col) for lo, hi in spans] \
                if split else None
            args = dict(head_norm=None if split else head_norm,
                        out=raw.name if split else q.name, head=h, d0=d0, col=col, raw=split)
            reads = [Region(head_norm, ((0, hd),))] if whole else []
            if sliced > 1:
                add_qkv_slices(t, op, kind, h, spans, n, part, ((d0, d0 + n),), args, reads,
                               sliced)
            else:
                add_qkv_piece(t, op, kind, {h: spans}, n, part, ((d0, d0 + n),), args, reads,
                              writes)
        if split:
            t.buffers[raw.name] = raw
            spans = ((h * hd, h * hd + half), (h * hd + half, (h + 1) * hd))
            t.add(op, "head_norm_rope", dict(raw=raw.name, head_norm=head_norm,
                                             inv_freq=p["inv_freq"], out=q.name,
                                             kind="qkv".index(kind), head=h, layer=layer,
                                             col=col, qk_eps=p["qk_eps"]),
                  [cols(raw, col, col + hd), Region(head_norm, ((0, hd),)),
                   Region("positions", ((0, d.batch),)), Region(p["inv_freq"], ((0, half),))],
                  qkv_writes(t, q, kind, h, layer, spans), 4 * d.batch * hd * d.itemsize, 0)


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
    d = t.graph.dims
    hd, half = d.head_dim, d.head_dim // 2
    kinds = [("q", d.heads), ("k", d.kv_heads), ("v", d.kv_heads)]
    # at least min_qkv_dims pairs: a tensor-core dot's 16 weight rows
    n = cross_pairs([heads * half for _, heads in kinds], t.workers, t.cfg.min_qkv_dims)
    for kind, heads in kinds:
        for p0 in range(0, heads * half, n):
            p1 = min(p0 + n, heads * half)
            add_qkv_piece(t, op, kind, head_spans(p0, p1, half), p1 - p0, n, ((0, half),),
                          dict(head_norm=None, out=op.outputs[0], head=p0 // half, d0=p0 % half,
                               col=p0 // half * hd, raw=False, cross=True))
