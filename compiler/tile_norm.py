"""Tile an op's RMSNorm ahead of it (``TileConfig.norm_first``): tasks of a few whole rows write
the normalised input {op}.xn [B, K] once, and the op reads it with no norm of its own.

Two task kinds write {op}.xn, row by row:
    rms_norm     RMSNorm(x) * w, from the op's input x
    reduce_norm  (``TileConfig.reduce_norm``) where x is the output of a projection split in K
                 slices: the slices' fp32 partials summed (and the residual added) into x, as
                 linear_reduce does it by columns, and x normalised in the same task, so that
                 the reduce and the norm take one phase instead of two
Or (``TileConfig.norm_sums``, before reduce_norm) no xn at all: each task writing columns of x
(linear_reduce of K slices, linear of whole columns, embed) also writes the sums of squares of
its columns of each row into {x}.sums [G, B] fp32 (G column groups) and its columns times the
norm's weight into {x}.scaled [B, K], and the op keeps its norm in another form:
RMSNorm(x) * w @ W^T = rstd * ((x * w) @ W^T) with rstd per row, so each task projects
{x}.scaled as it is and scales its rows by the rstd of those sums at the end (no norm phase, no
pass over x's rows, no norm arithmetic in the projection's loop; rounded once, after the scaling,
not after the norm).
The embedding's tasks write the same for the first layer's norm, so that its q/k/v tasks take
the form of every other layer's.
Invariant: each row of x and of xn is written by exactly one task; each (group, row) of
{x}.sums, and each column of {x}.scaled, by one linear_reduce, linear or embed task.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .ir import Buffer, Region

if TYPE_CHECKING:
    from .tile import Tiler


def normed_input(t: Tiler, op) -> Buffer:
    """{op}.xn, the buffer that holds op's normalised input."""
    x = t.b(op.params["x"])
    xn = Buffer(f"{op.name}.xn", "act", x.shape)
    t.buffers.setdefault(xn.name, xn)
    return xn


def norm_first(t: Tiler, op):
    """rms_norm tasks write the op's normalised input {op}.xn (unless a reduce_norm phase
    already has); returns the op reading it with no norm of its own; or, where x's writers
    wrote its sums of squares, the op reading {x}.scaled and taking the RMS from those."""
    p, d = op.params, t.graph.dims
    if f"{p['x']}.sums" in t.buffers:
        return replace(op, params={**p, "x": f"{p['x']}.scaled", "sums": f"{p['x']}.sums"})
    fused = f"{op.name}.xn" in t.buffers
    x, xn = t.b(p["x"]), normed_input(t, op)
    k = x.shape[1]
    per, groups = t.row_groups(k)
    for r0, r1 in [] if fused else groups:
        t.add(op, "rms_norm", dict(x=x.name, norm=p["norm"], out=xn.name, r0=r0, r1=r1,
                                   rows=per, k=k, eps=p["eps"]),
              [Region(x.name, ((r0, r1), (0, k))), Region(p["norm"], ((0, k),))],
              [Region(xn.name, ((r0, r1), (0, k)))], (2 * (r1 - r0) + 1) * k * d.itemsize, 0)
    return replace(op, params={**p, "x": xn.name, "norm": None, "prenormed": True})


def norm_reader(t: Tiler, name: str):
    """The op that will normalise buffer ``name`` first (reduce_norm can write its input, or
    name's writers what ``norm_sums`` takes), or None."""
    if not ((t.cfg.reduce_norm or t.cfg.norm_sums) and t.norm_first()):
        return None
    return next((op for op in t.graph.ops
                 if op.params.get("x") == name and op.params.get("norm")), None)


def sums_reader(t: Tiler, name: str):
    """The op that will take its norm of buffer ``name`` from the sums of squares name's writers
    write (``norm_sums``; see ``sums_writes``), or None."""
    return norm_reader(t, name) if t.cfg.norm_sums else None


def tile_reduce_norm(t: Tiler, op, part: Buffer, reader) -> None:
    """reduce_norm tasks by rows: op's output from its K slices' partials ``part`` [S, B, N]
    (plus the residual), and ``reader``'s normalised input from it."""
    p, d = op.params, t.graph.dims
    out, xn = t.b(op.outputs[0]), normed_input(t, reader)
    slices, _, n = part.shape
    per, groups = t.row_groups(n)
    for r0, r1 in groups:
        reads = [Region(part.name, ((0, slices), (r0, r1), (0, n))),
                 Region(reader.params["norm"], ((0, n),))]
        reads += [Region(p["residual"], ((r0, r1), (0, n)))] if p["residual"] else []
        t.add(op, "reduce_norm", dict(part=part.name, residual=p["residual"],
                                      norm=reader.params["norm"], out=out.name, xn=xn.name,
                                      r0=r0, r1=r1, rows=per, n=n, slices=slices,
                                      eps=reader.params["eps"]),
              reads, [Region(out.name, ((r0, r1), (0, n))), Region(xn.name, ((r0, r1), (0, n)))],
              (r1 - r0) * n * (4 * slices + 3 * d.itemsize) + n * d.itemsize, 0)


def sums_writes(t: Tiler, x: Buffer, reader, groups: int, g: int, lo: int,
                hi: int) -> tuple[list, list, dict]:
    """What the task writing columns [lo, hi) of x (column group g of ``groups``) reads, writes
    and takes besides, where ``reader`` takes its norm from x's sums of squares (``norm_sums``;
    None: nothing): the norm's weight there; {x}.sums [groups, B] fp32 at group g and
    {x}.scaled [B, K] (x times that weight) there."""
    from .tile import cols

    if reader is None:
        return [], [], dict(sums=None, norm=None, scaled=None)
    sums = Buffer(f"{x.name}.sums", "f32", (groups, t.graph.dims.batch))
    scaled = Buffer(f"{x.name}.scaled", "act", x.shape)
    t.buffers.update({sums.name: sums, scaled.name: scaled})
    norm = reader.params["norm"]
    return ([Region(norm, ((lo, hi),))],
            [Region(sums.name, ((g, g + 1), (0, t.graph.dims.batch))), cols(scaled, lo, hi)],
            dict(sums=sums.name, norm=norm, scaled=scaled.name))


def norm_reads(t: Tiler, p: dict) -> list[Region]:
    """What an op's norm reads: its weight, or (``norm_sums``: x scaled by it already) the sums
    of squares of x's rows."""
    from .tile import full

    if p.get("sums"):
        return [Region(p["sums"], full(t.b(p["sums"])))]
    return [Region(p["norm"], full(t.b(p["norm"])))] if p["norm"] else []


def sums_args(t: Tiler, p: dict) -> dict:
    """A normalising task's arguments for the sums of squares of x's rows: the buffer (None:
    the task takes the RMS from x) and its column groups."""
    sums = p.get("sums")
    return dict(sums=sums, groups=t.b(sums).shape[0] if sums else 0)
