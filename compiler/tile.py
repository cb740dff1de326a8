"""Tile: OpGraph -> TaskGraph. Each op becomes tile tasks with read/write regions, bytes and flops;
dependencies are derived from region overlap (``deps.derive_deps``), never wired by hand.

Tilings (``tile_config.TileConfig`` sets the sizes):
    embed      one task per ``block_n`` columns of the hidden size
    qkv_rope   one task per head (or per ``qkv_parts`` piece of one): each q head, each k head,
               each v head (k/v write the cache); with ``split_head_norm``, pieces of heads with
               a head norm write the raw projection and head_norm_rope finishes each head; or
               (``qkv_cross``) pieces across heads that fill one wave (``tile_qkv``)
    attention  attn_partial per key range of each (row, kv head) into fp32 partials, then
               attn_combine per (row, kv head); a partial waits only for its q heads and its k/v
               head; a single range writes the output itself (``attn_pairs``: attn_pair per row
               and pair of kv heads where every unit is a single range; ``attn_spill``: units
               left over whole rounds of the workers in pieces); or (``attn_stream``) one
               attn_stream per equal share of all units' keys (``tile_attention``)
    linear     one task per output columns [n0, n1) (norm, residual fused in); with
               ``split_k`` S > 1 and no norm, linear_part per (column group, K slice) into
               fp32 partials {op}.part [S, B, N], then linear_reduce per column group
    gate_up    one task per columns [n0, n1) of the intermediate size (linear and gate_up:
               ``tile_proj``)
    rms_norm   (``norm_first``) rows of an op's normalised input, before the op's own tasks;
               reduce_norm instead where that input is a split projection's output
               (``reduce_norm``), or none, the input's writers (the embedding, the split's
               reduces, a projection's tasks) writing their rows' sums of squares
               (``norm_sums``; see ``tile_norm``)
A projection's columns split evenly over the workers in as few waves as keep tasks within
4 * ``block_n`` columns, so that every op spreads its weights over the whole GPU with the fewest
tasks; ``bn`` is the op body's block (a power of two), ``n0``/``n1`` the task's columns.
Invariant: the write regions of an op's tasks tile its outputs exactly once.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .deps import derive_deps
from .ir import Buffer, OpGraph, Region, Task, TaskGraph
from .tile_attention import tile_attention
from .tile_config import TileConfig
from .tile_norm import norm_first, sums_reader, sums_writes
from .tile_proj import tile_gate_up, tile_linear
from .tile_qkv import tile_qkv_rope


def p2(n: int) -> int:
    """The next power of two >= n (block sizes of op bodies)."""
    return 1 << max(n - 1, 0).bit_length()


def full(buf: Buffer) -> tuple[tuple[int, int], ...]:
    return tuple((0, s) for s in buf.shape)


def cols(buf: Buffer, lo: int, hi: int) -> Region:
    return Region(buf.name, ((0, buf.shape[0]), (lo, hi)))


def rows(buf: Buffer, lo: int, hi: int) -> Region:
    return Region(buf.name, ((lo, hi),) + full(buf)[1:])


@dataclass
class Tiler:
    graph: OpGraph
    cfg: TileConfig
    workers: int = 1
    tasks: list = field(default_factory=list)
    buffers: dict = field(default_factory=dict)
    tickets: int = 0           # units of fused partials so far (``fuse_combine``,
                               # ``fuse_reduce``)

    def __post_init__(self):
        self.buffers = dict(self.graph.buffers)

    def add(self, op, kind, args, reads, writes, nbytes, flops) -> None:
        self.tasks.append(Task(len(self.tasks), op.name, kind, args, tuple(reads), tuple(writes),
                               int(nbytes), int(flops)))

    def b(self, name) -> Buffer:
        return self.buffers[name]

    def width(self, n: int) -> int:
        """Columns per projection task: the columns split evenly over the workers (a multiple
        of 8, at least min_block_n), in as few waves as keep tasks within 4 * block_n columns.
        Each task has a fixed cost (instruction, wait, pipeline fill, signal), so fewer and
        larger tasks win while the waves stay even."""
        cfg = self.cfg
        even = -(-n // self.workers)
        waves = -(-even // (4 * cfg.block_n))
        return max(cfg.min_block_n, (-(-n // (self.workers * waves)) + 7) // 8 * 8)

    def depth(self, k: int, rows: int, weights: int = 1) -> int:
        """Reduction columns per inner step: block_n * block_k elements of each weight per step
        whatever the task's rows (bytes in flight do not change with the width), within [16, k];
        halved while the activation rows beyond 32 would make a step stage more than that (at
        large batches the activation tile rivals the weights' in the pipeline's shared memory:
        batch 64 took 480 KB without it, 104 KB with it; up to batch 32 the steps stay whole,
        145 KB at batch 32, where halving them at 17-32 rows made batch 32 35% slower). With
        ``step_weights`` 2, a one-matrix step is then doubled while its weights and x rows fit
        in as many elements as gate_up's step (its two matrices' and x's): no more shared
        memory than gate_up's stages take."""
        nominal = self.cfg.block_n * self.cfg.block_k
        bk = min(max(16, nominal // rows), p2(k))
        extra = max(0, p2(self.graph.dims.batch) - 32)
        while bk > 16 and (rows * weights + extra) * bk > nominal * weights:
            bk //= 2
        if weights == 1 and self.cfg.step_weights == 2:
            b, n = p2(self.graph.dims.batch), self.cfg.block_n
            gate = (2 * n + b) * self.depth(self.graph.dims.hidden, n, weights=2)
            while 2 * bk <= p2(k) and (rows + b) * 2 * bk <= gate:
                bk *= 2
        return bk

    def kv_span(self) -> int:
        """Keys per attention task: kv_split, doubled while the (row, kv head, split) tasks
        would outnumber attn_tasks_per_worker per worker (more tasks only add overhead)."""
        d, cfg, span = self.graph.dims, self.cfg, self.cfg.kv_split
        units = d.batch * d.kv_heads
        limit = max(self.workers * cfg.attn_tasks_per_worker, units)
        while cfg.attn_tasks_per_worker and span < d.max_seq_len and \
                units * -(-d.max_seq_len // span) > limit:
            span *= 2
        return span

    def kv_pieces(self) -> list[list[tuple[int, int]]]:
        """Key ranges [(lo, hi)] of the attention tasks of each (row, kv head) unit: kv_span()
        keys each, or (``attn_balance``) the units' keys laid end to end and cut every
        ceil(keys / workers) keys (a multiple of kv_block, at least kv_split), so that each
        worker gets about one cut's worth: at 17 rows on 132 workers, 263 tasks making 1056
        keys per worker instead of 136 tasks of 1024 in two rounds."""
        d, cfg, s = self.graph.dims, self.cfg, self.graph.dims.max_seq_len
        units = d.batch * d.kv_heads
        if not cfg.attn_balance:
            span = self.kv_span()
            plain = [[(lo, min(s, lo + span)) for lo in range(0, s, span)]] * units
            return self.spill(plain) if cfg.attn_spill and not cfg.attn_pairs else plain
        per_worker = -(-units * s // self.workers)
        cut = max(cfg.kv_split, -(-per_worker // cfg.kv_block) * cfg.kv_block)
        out = []
        for u in range(units):
            edges = sorted({0, s} | {c - u * s for c in range(-(-u * s // cut) * cut, (u + 1) * s,
                                                             cut)})
            out.append(list(zip(edges, edges[1:])))
        return out

    def spill(self, plain: list) -> list:
        """``attn_spill``: where every unit is one task's and the units overrun a whole number of
        rounds of the workers by ``rest``, the last ``rest`` units in pieces of whole cache
        blocks, about an equal share per worker, where a piece is at most a quarter of a unit
        (llama-3.2-1b at 17 rows on the H200: 132 whole units and 4 cut in 32 pieces of 128
        keys, the attention phase 20.1 -> 16.6 us a layer against pairs of kv heads, the
        autotuner's winner 1.255 -> 1.204 ms; at 24 rows, 60 units in 120 pieces of 512 keys,
        1.281 -> 1.309)."""
        d, s, w = self.graph.dims, self.graph.dims.max_seq_len, self.workers
        units = d.batch * d.kv_heads
        rest = units % w
        if units < w or not rest or any(len(p) > 1 for p in plain):
            return plain
        share = -(-rest * s // w)
        cut = -(-share // self.cfg.kv_block) * self.cfg.kv_block
        if 4 * cut > s:
            return plain
        return plain[:units - rest] + [[(lo, min(s, lo + cut)) for lo in range(0, s, cut)]] * rest

    def attn_pairs(self) -> bool:
        """``attn_pairs`` where it applies: kv heads in whole groups of ``attn_group``, no
        stream, and each unit's keys one task's (``kv_pieces``) or, with ``attn_pair_ranges``
        and pairs, the same key ranges for every unit (not balanced): a pair's heads share each
        range's task."""
        cfg = self.cfg
        if not cfg.attn_pairs or cfg.attn_stream or self.graph.dims.kv_heads % cfg.attn_group:
            return False
        return self.whole_units() or \
            (cfg.attn_pair_ranges and cfg.attn_group == 2 and not cfg.attn_balance)

    def stream_heads(self) -> int:
        """kv heads of a streamed unit: ``attn_group`` with ``attn_pairs`` where the kv heads
        are whole groups of it, else 1."""
        cfg = self.cfg
        whole = self.graph.dims.kv_heads % cfg.attn_group == 0
        return cfg.attn_group if cfg.attn_stream and cfg.attn_pairs and whole else 1

    def whole_units(self) -> bool:
        """Whether each (row, kv head) unit's keys are one attention task's (``kv_pieces``)."""
        return all(len(p) == 1 for p in self.kv_pieces())

    def qkv_pieces(self, head_norm: bool) -> int:
        """Tasks per q/k/v head: one where a head RMSNorm needs the whole head (unless
        split_head_norm), else qkv_parts, or (qkv_parts=0) doubled while all pieces still run in
        one wave over the workers."""
        if head_norm and not self.cfg.split_head_norm:
            return 1
        if self.cfg.qkv_parts:
            return self.cfg.qkv_parts
        d, parts = self.graph.dims, 1
        heads = d.heads + 2 * d.kv_heads
        while 2 * heads * parts <= self.workers and \
                d.head_dim // (4 * parts) >= self.cfg.min_qkv_dims:
            parts *= 2
        return parts

    def split_k(self) -> int:
        """K slices asked of the projections without a norm (``TileConfig.split_k``)."""
        return self.cfg.split_k or (4 if self.graph.dims.batch >= 8 else 1)

    def norm_first(self) -> bool:
        """Whether norms are written once before their op (``TileConfig.norm_first``)."""
        nf = self.cfg.norm_first
        return self.graph.dims.batch >= 5 if nf is None else nf

    def row_groups(self, k: int) -> tuple[int, list[tuple[int, int]]]:
        """Rows per task of a whole-row op over k columns (as few as spread the batch over the
        workers, at most 16K elements held) and the tasks' rows [(r0, r1)]."""
        b = self.graph.dims.batch
        per = max(1, min(-(-b // self.workers), 16384 // p2(k)))
        return per, [(r0, min(b, r0 + per)) for r0 in range(0, b, per)]

    def col_tiles(self, n: int, bn: int):
        for lo in range(0, n, bn):
            yield lo, min(n, lo + bn)

    def spans(self, n: int) -> tuple[list[tuple[int, int]], int]:
        """A projection's task columns [(n0, n1)] and its op body's block (a power of two):
        width() each, or (``balance``) as many near-equal spans as fill the waves that width()
        takes, e.g. 2048 columns on 132 workers in 132 tasks of 15-16 instead of 128 of 16."""
        bn = self.width(n)
        if not self.cfg.balance:
            return list(self.col_tiles(n, bn)), p2(bn)
        tasks = -(-n // bn)
        tasks = max(tasks, min(-(-tasks // self.workers) * self.workers, n // 8))
        return [(i * n // tasks, (i + 1) * n // tasks) for i in range(tasks)], p2(-(-n // tasks))


def tile_embed(t: Tiler, op) -> None:
    """Tasks of ``block_n`` columns; with ``norm_sums`` each also writes its columns' sums of
    squares and scaled columns for the first norm, as the projections' tasks do for theirs
    (``tile_proj``), so that every q/k/v task shares one form."""
    table, out = t.b(op.inputs[0]), t.b(op.outputs[0])
    d = t.graph.dims
    reader = sums_reader(t, out.name)
    tiles = list(t.col_tiles(d.hidden, t.cfg.block_n))
    for g, (lo, hi) in enumerate(tiles):
        extra_reads, writes, args = sums_writes(t, out, reader, len(tiles), g, lo, hi)
        reads = [Region("tokens", ((0, d.batch),)), Region(table.name, ((0, d.vocab), (lo, hi)))]
        t.add(op, "embed", dict(table=table.name, out=out.name, n0=lo, bn=t.cfg.block_n, **args),
              reads + extra_reads, [cols(out, lo, hi), *writes],
              (2 + bool(reader)) * d.batch * (hi - lo) * d.itemsize, 0)


TILERS = {"embed": tile_embed, "linear": tile_linear, "gate_up": tile_gate_up,
          "qkv_rope": tile_qkv_rope, "attention": tile_attention}


def tile_tasks(graph: OpGraph, cfg: TileConfig = TileConfig(), workers: int = 1) -> Tiler:
    """The tasks (and the scratch buffers they add), without dependencies."""
    t = Tiler(graph, cfg, workers)
    for op in graph.ops:
        if t.norm_first() and op.params.get("norm"):
            op = norm_first(t, op)
        TILERS[op.kind](t, op)
    return t


def tile(graph: OpGraph, cfg: TileConfig = TileConfig(), workers: int = 1) -> TaskGraph:
    t = tile_tasks(graph, cfg, workers)
    tasks = tuple(t.tasks)
    return TaskGraph(replace(graph, buffers=t.buffers), tasks, derive_deps(tasks))
