"""Tile the projections (``tile.py`` has the plan): a linear op as tasks of output columns, or
split in K slices (linear_part per slice and column group into fp32 partials, then a reduce:
linear_reduce by column groups, or reduce_norm by rows, see ``tile_norm``), and gate_up as tasks
of intermediate columns, both projections in each.
Invariant: the write regions of an op's tasks tile its outputs exactly once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .ir import Buffer, Region
from .tile_norm import (norm_reads, norm_reader, sums_args, sums_reader, sums_writes,
                        tile_reduce_norm)

if TYPE_CHECKING:
    from .tile import Tiler


def split_slices(t: Tiler, op) -> int:
    """K slices of a linear op: split_k (``long_slices`` where set and K exceeds the hidden
    size) where it has no norm, K splits into slices of a multiple of 16 columns (whole 16-byte
    loads) and (``split_long``) exceeds the hidden size, else 1."""
    k, s = t.b(op.params["weight"]).shape[1], t.split_k()
    long = k > t.graph.dims.hidden
    s = t.cfg.long_slices if long and t.cfg.long_slices else s
    plain = op.params["norm"] is None and not op.params.get("prenormed")
    return s if s > 1 and plain and k % (16 * s) == 0 and (long or not t.cfg.split_long) else 1


def column_reduced(t: Tiler, op) -> bool:
    """Whether linear ``op`` is split in K slices that are reduced by column groups (not by
    rows, with the next op's norm: ``reduce_norm``)."""
    reader = norm_reader(t, op.outputs[0])
    by_rows = reader is not None and sums_reader(t, op.outputs[0]) is None
    return split_slices(t, op) > 1 and not by_rows


def tile_linear_split(t: Tiler, op, slices: int) -> None:
    """Per column group (``slices`` times a plain task's width): a linear_part task per K slice
    into {op}.part [S, B, N] fp32, then a linear_reduce task adding them and the residual; or,
    where the next op normalises this output first, reduce_norm tasks by rows after all parts
    (or, ``norm_sums``, the linear_reduce tasks also write their rows' sums of squares and
    their columns scaled by the reader's norm weight, see ``tile_norm``). With
    ``fuse_reduce`` (where no reduce_norm follows) the group's slices are linear_part_reduce
    tasks: the last of them to take the group's ticket reduces it, and each declares the
    reduce's reads and writes, so that the output's readers wait for all of them."""
    from .tile import cols, p2

    reader = norm_reader(t, op.outputs[0])
    p, d = op.params, t.graph.dims
    out, n = t.b(op.outputs[0]), t.b(p["weight"]).shape[0]
    part = Buffer(f"{op.name}.part", "f32", (slices, d.batch, n))
    t.buffers[part.name] = part
    bn = p2(min(t.width(n) * slices, n))
    summed = sums_reader(t, out.name)                    # the reader's norm from sums of squares
    by_rows = not column_reduced(t, op)                  # reduce_norm tasks reduce
    fused = t.cfg.fuse_reduce and not by_rows
    for g, (lo, hi) in enumerate(t.col_tiles(n, bn)):
        extra_reads, writes, args = sums_writes(t, out, summed, -(-n // bn), g, lo, hi)
        # the group's reduce: its arguments, what it reads besides the partials, its writes
        red_args = dict(part=part.name, residual=p["residual"], out=out.name, n0=lo, n1=hi,
                        n=n, bn=bn, slices=slices, **args)
        red_reads = [cols(t.b(p["residual"]), lo, hi)] if p["residual"] else []
        red_reads += extra_reads
        red_writes = [cols(out, lo, hi), *writes]
        red_bytes = d.batch * (hi - lo) * (4 * slices + 4 + 2 * bool(summed))
        reduce = (red_args, red_reads, red_writes, red_bytes) if fused else None
        add_linear_slices(t, op, part, lo, hi, bn, reduce)
        if fused:
            t.tickets += 1
        elif not by_rows:
            t.add(op, "linear_reduce", red_args,
                  [Region(part.name, ((0, slices), (0, d.batch), (lo, hi))), *red_reads],
                  red_writes, red_bytes, 0)
    if by_rows:
        tile_reduce_norm(t, op, part, reader)


def add_linear_slices(t: Tiler, op, part: Buffer, lo: int, hi: int, bn: int,
                      reduce: tuple | None) -> None:
    """The K slices of column group [lo, hi) of linear ``op``: a linear_part task each into its
    slot of ``part`` [S, B, N]; or, with ``reduce`` (the group's reduce: its arguments, reads
    besides the partials, writes and bytes), linear_part_reduce tasks that each declare the
    reduce's reads and writes and take the group's ticket (``t.tickets``)."""
    p, d = op.params, t.graph.dims
    x, w = t.b(p["x"]), t.b(p["weight"])
    (n, k), slices = w.shape, part.shape[0]
    ks = k // slices
    for s in range(slices):
        k0 = s * ks
        nbytes = ((hi - lo) * ks + d.batch * ks) * d.itemsize + d.batch * (hi - lo) * 4
        a = dict(x=x.name, weight=w.name, n0=lo, n1=hi, k0=k0, s=s, ks=ks, n=n, k=k, bn=bn,
                 bk=t.depth(ks, bn))
        reads = [Region(x.name, ((0, d.batch), (k0, k0 + ks))),
                 Region(w.name, ((lo, hi), (k0, k0 + ks)))]
        writes = [Region(part.name, ((s, s + 1), (0, d.batch), (lo, hi)))]
        if reduce is not None:
            args, red_reads, red_writes, red_bytes = reduce
            t.add(op, "linear_part_reduce", args | a | dict(ticket=t.tickets),
                  reads + red_reads, writes + red_writes, nbytes + red_bytes // slices,
                  2 * d.batch * (hi - lo) * ks)
        else:
            t.add(op, "linear_part", a | dict(out=part.name), reads, writes, nbytes,
                  2 * d.batch * (hi - lo) * ks)


def tile_linear(t: Tiler, op) -> None:
    """Tasks of output columns (``Tiler.spans``), or K slices (``tile_linear_split``); where the
    next op takes its norm from sums of squares (``norm_sums``), each task also writes its
    columns' (``tile_norm.sums_writes``)."""
    from .tile import cols, full, rows

    if (slices := split_slices(t, op)) > 1:
        return tile_linear_split(t, op, slices)
    p, d = op.params, t.graph.dims
    x, w, out = t.b(p["x"]), t.b(p["weight"]), t.b(op.outputs[0])
    n, k = w.shape
    spans, block = t.spans(n)
    summed = sums_reader(t, out.name)
    for g, (lo, hi) in enumerate(spans):
        extra_reads, writes, sums = sums_writes(t, out, summed, len(spans), g, lo, hi)
        reads = [Region(x.name, full(x)), rows(w, lo, hi), *norm_reads(t, p), *extra_reads]
        reads += [cols(t.b(p["residual"]), lo, hi)] if p["residual"] else []
        nbytes = ((hi - lo) * k + d.batch * k + d.batch * (hi - lo) * (2 + bool(summed)))
        t.add(op, "linear", dict(x=x.name, weight=w.name, norm=p["norm"], residual=p["residual"],
                                 out=out.name, n0=lo, n1=hi, bn=block, bk=t.depth(k, block),
                                 eps=p["eps"], n=n, k=k, osums=sums["sums"],
                                 onorm=sums["norm"], oscaled=sums["scaled"], g=g,
                                 **sums_args(t, p)),
              reads, [cols(out, lo, hi), *writes], nbytes * d.itemsize,
              2 * d.batch * (hi - lo) * k)


def tile_gate_up(t: Tiler, op) -> None:
    from .tile import cols, full, rows

    p, d = op.params, t.graph.dims
    x, out = t.b(p["x"]), t.b(op.outputs[0])
    k = d.hidden
    spans, block = t.spans(d.intermediate)
    for lo, hi in spans:
        reads = [Region(x.name, full(x)), rows(t.b(p["gate"]), lo, hi),
                 rows(t.b(p["up"]), lo, hi), *norm_reads(t, p)]
        nbytes = (2 * (hi - lo) * k + d.batch * k + d.batch * (hi - lo)) * d.itemsize
        t.add(op, "gate_up", dict(x=x.name, norm=p["norm"], gate=p["gate"], up=p["up"],
                                  out=out.name, n0=lo, n1=hi, bn=block,
                                  bk=t.depth(k, block, weights=2), eps=p["eps"],
                                  **sums_args(t, p)),
              reads, [cols(out, lo, hi)], nbytes, 4 * d.batch * (hi - lo) * k)
