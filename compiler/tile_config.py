"""The tile knobs: ``TileConfig``, the sizes and forms the tiler (``tile``) cuts ops into tasks
with and the op bodies are built with; each field says what it changes and, where measured,
what it did on the H200. Invalid combinations raise ``ValueError`` naming the field."""
from __future__ import annotations

from dataclasses import dataclass


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
    attn_stack: bool = False   # pair streams (attn_stream with attn_pairs): the queries of
                               # the units a stream touches stacked as its dots' rows (with
                               # attn_keys_m: as N), loaded once, and the block-table entries
                               # of its steps asked for before its one loop; each piece stored
                               # after the loop (``stacked_stream``)
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
    attn_keys_m: bool = False  # whole pairs and groups of kv heads, and their streams: the
                               # keys (and the head dim) as the attention dots' M, the query
                               # rows as N (padded to 8, not 16: half the tensor-core steps
                               # and of the softmax's work), each warp's keys reduced within
                               # the warp (a pair's step in registry.KEY_GROUPS groups with
                               # running states of their own, a group's heads one a warp)
    attn_rotate: bool = False  # whole pairs and groups of kv heads: each task's key loop from
                               # its own step on (its index in the op mod the steps), wrapping
                               # around, so that tasks side by side do not read the same
                               # offsets of their heads at once
    proj_rotate: bool = False  # projections' K loops each from a step of its own (its first
                               # weight row's task index mod the steps), wrapping around, so
                               # that tasks side by side do not read the same columns of x at
                               # once (GPU: x's lines are read by every task of a phase)
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
