"""Tile: OpGraph -> TaskGraph. Each op becomes tile tasks with read/write regions, bytes and flops;
dependencies are derived from region overlap (``deps.derive_deps``), never wired by hand.

Tilings (``TileConfig`` sets the sizes):
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
from .tile_norm import norm_first, sums_reader, sums_writes
from .tile_proj import tile_gate_up, tile_linear
from .tile_qkv import tile_qkv_rope


@dataclass(frozen=True)
class TileConfig:
    block_n: int = 64          # columns per embed task; projections: block_n x block_k weights
                               # per inner step, tasks of at most 4 x block_n columns
    min_block_n: int = 16      # narrowest projection task when spreading an op over workers
    balance: bool = False      # projection tasks in near-equal spans that fill whole waves of
                               # the workers (at least 8 columns each), not width() each
    split_k: int = 0           # K slices of a projection without a norm (o, down), each task a
                               # column group S times as wide; 1: none; 0: 4 from 8 batch rows
                               # on (llama-3.2-1b on the H200, ms at batch 8 / 17 / 64: 1.217 /
                               # 1.917 / 4.027 -> 1.202 / 1.799 / 3.163; batch 1 alike)
    split_long: bool = False   # K slices only for projections with more reduction columns
                               # than the hidden size (llama-3.2-1b: down's 8192 sliced, o's
                               # 2048 not: no reduce phase after o, whose x is as large as its
                               # weights' share of a task at 17 rows)
    long_slices: int = 0       # K slices of the projections without a norm and with more
                               # reduction columns than the hidden size (llama-3.2-1b: down),
                               # whatever split_k asks of the others; 0: split_k's
    block_k: int = 256         # reduction columns per inner step of a block_n-wide projection
    kv_block: int = 16         # cache block (tokens): the block table's unit; a multiple of an
                               # attention step's keys: one table entry per step (128: the
                               # autotuner's pick at 10 of 12 batch sizes of llama-3.2-1b on the
                               # H200, up to 4% faster; 8 rows 1% slower)
    kv_split: int = 64         # keys per attn_partial task (a multiple of kv_block), at least
    kv_step: int = 8192        # key elements (keys x head dim) per step of an attention task
    attn_stages: int = 6       # its pipeline's stages (0: the projections', at least 2); each
                               # step's keys come through the block table, so a stage covers
                               # two dependent loads (llama-3.2-1b on the H200, 4096 / 3 stages
                               # -> 8192 / 6: batch 17 2.136 -> 1.918 ms, 8 1.281 -> 1.207)
    attn_tasks_per_worker: int = 2  # kv_split doubles while attention has more tasks than this
                                    # per worker (beyond one per row and kv head); 0: never
    attn_balance: bool = False # attention tasks cut from the (row, kv head) units' keys laid
                               # end to end, about one cut per worker (see Tiler.kv_pieces)
    attn_stream: bool = False  # one attn_stream task per equal share of those keys, each one
                               # pipelined loop across its units (see tile_attention); with
                               # attn_pairs, units of attn_group kv heads (Tiler.stream_heads)
    stream_pieces: bool = False  # streams over pairs (groups) of kv heads: a loop per unit's
                               # piece, its row, heads, queries and length set before it,
                               # instead of one loop over the stream's steps that works out
                               # each step's unit (its integer work: 1032 instructions a step
                               # against a whole pair's 848 in the sm_90 SASS at 24 rows; per
                               # piece 872)
    attn_pairs: bool = False   # where each unit's keys are one task's: a task per row and pair
                               # of kv heads, both heads' steps in one loop (Tiler.attn_pairs)
    attn_group: int = 2        # kv heads per such task (2: attn_pair; more: attn_group, their
                               # steps as batched dots, keys per step 2 / attn_group as many)
    attn_pair_ranges: bool = False  # pairs also where units have several key ranges (the same
                                    # for all): an attn_pair_part per pair and range, combines
    attn_spill: bool = False   # where whole units leave a few over a multiple of the workers,
                               # those few cut into whole cache blocks spread over the workers
                               # and combined, not a round of their own (Tiler.kv_pieces)
    fuse_combine: bool = False # attn_partial pieces merge their unit themselves: each takes a
                               # ticket (an atomic counter a unit) after writing its slot, and
                               # the last of a unit merges every slot into the output; no
                               # attn_combine task, phase or wait (plain pieces, or pairs
                               # over key ranges: the pair's last part merges both units)
    fuse_reduce: bool = False  # K slices reduce their column group themselves: each takes a
                               # ticket after writing its partial, and the last of a group
                               # adds them (and the residual, and the sums ``norm_sums``
                               # takes) into the output; no linear_reduce task, phase or wait
                               # (where no reduce_norm reduces by rows)
    attn_keys_m: bool = False  # whole pairs and groups of kv heads: the keys (and the head
                               # dim) as the attention dots' M, the query rows as N (padded to
                               # 8, not 16: half the tensor-core steps and of the softmax's
                               # work), each warp's keys reduced within the warp (a pair's step
                               # in registry.KEY_GROUPS groups with running states of their
                               # own, a group's heads one a warp)
    attn_rows: int = 4         # a kv head's query heads padded to at least this many rows in
                               # the attention bodies' dots (4, 8 or 16; 4 against 16 on the
                               # H200, llama-3.2-1b: 24 rows 1.462 -> 1.376 ms, 48 1.848 -> 1.711)
    gemv: bool = False         # projections as multiply-and-sum instead of tensor-core dots
    swap_ab: bool = False      # tensor-core projections with weight rows as the dot's M
    rms_unroll: int = 16384    # a row RMS issues all its loads at once up to this many elements
                               # of the batch's rows (0: one load and reduction per step)
    norm_first: bool | None = None  # projections after a norm read a normalised copy of x
                               # that rms_norm tasks write once (one more phase; no norm
                               # work in the projection tasks); None: from 5 batch rows on
                               # (llama-3.2-1b on the H200, ms at batch 2 / 5 / 17 / 64 with
                               # pw: 0.986 / 1.157 / 1.758 / 3.035 -> 1.007 / 1.108 / 1.608 /
                               # 2.040)
    reduce_norm: bool = False  # with norm first and split-K: the slices reduced by whole rows,
                               # each row normalised for the next op in the same task
    norm_sums: bool = False    # with norm first: each writer of a normalised op's input (the
                               # embedding, a reduce of K slices, a projection task) also
                               # writes its columns' sums of squares and x times the norm
                               # weight, and the op projects that, each row's RMS applied to
                               # the product (no norm phase; before reduce_norm)
    stages: int = 3            # projection loop: an n-stage software pipeline (1: none)
    step_weights: int = 1      # 2: steps of one-matrix projections (all but gate_up) as deep
                               # as fit gate_up's step's elements (64 rows: lm_head 256 x 64
                               # instead of 256 x 32, whose 16 KB of weights a step streamed at
                               # 17 GB/s per SM; 16 rows and batch 1: 256 x 128, not 64)
    stage_kib: int = 0         # ... deepened per op to as many stages as fit this many KiB of
                               # shared memory (at most 8; 0: ``stages`` everywhere): where x
                               # takes half of each stage (64 rows: 64 x 128 weight steps, 3
                               # stages hold 32 KB of weights in flight, 23 GB/s per SM at
                               # about 1.5 us of latency), deeper ones keep more in flight
    staged_kib: int = 0        # KiB of shared memory per worker that a projection task's
                               # first weight rows are copied into whole before its waits (GPU
                               # kernels, ``staging``; 2-byte weights; 0: none)
    fold: int = 16             # at most this many column slices of a narrow projection step
                               # folded into its dot's rows and columns (1: none)
    fold_rows: int = 16        # ... while the slices' batch rows stay within this many dot rows
    qkv_parts: int = 0         # tasks per q/k/v head (pieces of dims; heads without a head
                               # norm); 0: doubled while the tasks fit in one wave
    min_qkv_dims: int = 8      # narrowest piece (dims per RoPE half) that qkv_parts=0 makes
    qkv_cross: bool = False    # without head norms: each kind's RoPE pairs laid end to end over
                               # its heads, cut into equal pieces that fill one wave
    qkv_slices: int = 1        # where x is normalised already (norm first, or the norm from
                               # sums of squares): a head's q/k/v tasks (qkv_parts, or as many
                               # as fill a wave) as pieces this many times wider in this many K
                               # slices (pieces that write no raw projection); each slice reads
                               # that share of x and of the piece's weights, writes its fp32
                               # partial and takes the piece's ticket, the last summing them and
                               # rotating and storing the piece. Each task's x from L2 shrinks
                               # with the slices (at 64 rows a q/k/v task of llama-3.2-1b read
                               # 256 KB of x for 131 KB of weights)
    split_head_norm: bool = True   # heads with a head norm also split into pieces, which write
                                   # the raw projection; a head_norm_rope task per head finishes
                                   # (qwen3-8b at batch 1 on the H200: 4.515 ms against 4.713)

    @property
    def form(self) -> int:
        """The op bodies' FORM constexpr: 0 dot, 1 multiply-and-sum, 2 dot with weight rows as M."""
        return 1 if self.gemv else 2 if self.swap_ab else 0

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"stages={self.stages}: a projection pipeline needs at least 1")
        if self.step_weights not in (1, 2):
            raise ValueError(f"step_weights={self.step_weights}: 1, or 2 (as deep as gate_up)")
        if self.stage_kib < 0:
            raise ValueError(f"stage_kib={self.stage_kib}: shared memory is at least 0 KiB")
        if not 0 <= self.staged_kib <= 200:
            raise ValueError(f"staged_kib={self.staged_kib}: 0-200 KiB of shared memory")
        if self.fold < 1 or self.fold & (self.fold - 1):
            raise ValueError(f"fold={self.fold} is not a power of two")
        if self.attn_rows not in (4, 8, 16):
            raise ValueError(f"attn_rows={self.attn_rows}: the attention dots take 4, 8 or 16 rows")
        if self.kv_split % self.kv_block:
            raise ValueError(f"kv_split={self.kv_split} is not a multiple of kv_block={self.kv_block}")
        if self.qkv_slices < 1:
            raise ValueError(f"qkv_slices={self.qkv_slices}: K slices of q/k/v are at least 1")
        if self.attn_group < 2 or self.attn_group & (self.attn_group - 1):
            raise ValueError(f"attn_group={self.attn_group}: kv heads per task are 2, 4, 8...")


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
    return TaskGraph(replace(graph, buffers=t.buffers), tuple(t.tasks), derive_deps(t.tasks))
