"""Kernel variants: the knobs of one compiled megakernel as one short label, shared by the
sweep, the trace command and the autotuner.

Label: ``BNxBKxWARPSxWORKERS`` then optional flags, e.g. ``64x256x4x132xs3xkv64``: ``g`` GEMV
projections, ``t`` tensor-core projections with weight rows as the dot's M, ``sN`` an N-stage
projection pipeline (s1: none), ``smN`` each projection's pipeline deepened to as many stages as fit
N KiB of shared memory (at most 8), ``sw2`` one-matrix projection steps as deep as fit gate_up's
step, ``kvN`` N keys per attention task, ``qN`` N tasks per q/k/v head (none: as many as spread the
heads over the workers), ``qc`` q/k/v pieces across heads (each kind's RoPE pairs end to end, equal
pieces filling one wave; models without head norms), ``qsN`` a head's q/k/v tasks as N K slices
of pieces N times wider, the last to take a piece's ticket finishing it (x normalised first),
``hn0`` heads with a head norm kept whole (by default they split into pieces too, then one task
per head normalises and rotates it), ``ruN`` a row RMS loads up to N elements at once (default
16384; ru0: a load and a reduction per step), ``np`` no
L2 prefetch of each task's weights before its waits, ``pf`` with it (the default), ``pfN`` with at
most N KiB of them per task (default 64; ``pf0`` all of them), ``paN`` prefetching the weights of
the task N places later in the worker's queue instead of its own, ``pw0`` each task's weights
prefetched before its waits instead of between polls of them (``pw``, the default: a task whose
inputs are ready starts at once), ``ptN`` with it, a waiting task's prefetch begun only once N% of
the producers it polls have signalled, ``pn0`` the next instruction's words not prefetched into L2
(``pn``, the default with a prefetch), ``boN`` N ns of sleep between polls of a counter not yet
reached, ``foN`` at most N column slices of a narrow projection step folded into its dot (default
16; fo1: none), ``frN`` while their batch rows stay within N dot rows (default 16), ``ksN`` N key
elements per attention step (default 8192), ``asN`` an N-stage attention pipeline (default 6; as0:
the projections', at least 2), ``atN`` keys per attention task doubled while there are more than N
tasks per worker (default 2; at0 never), ``pl`` counters polled with acquire loads instead of
atomics, ``bal`` projection tasks in near-equal spans filling whole waves, ``skN`` projections
without a norm in N K slices (default sk0: 4 from batch 8 on; sk1: none), ``kl`` only those with
more reduction columns than the hidden size, ``lsN`` those in N slices whatever ``skN`` asks of the
others, ``nf`` normalised x written once by rms_norm tasks (norm first; ``nf0`` never; default: from
5 batch rows on), ``rn`` with norm first and split-K, the K slices reduced by whole rows and each
row normalised in the same task, ``ns`` instead the writers of a normalised input (the embedding,
the reduces, projections in whole columns) writing its rows' sums of squares and x times the norm
weight, the next op projecting that and scaling each row of the product by its RMS, ``ab`` attention
tasks cut from all rows' keys laid end to end, about one cut per worker, ``af`` attention as one
stream of keys per worker (an equal share of all units' keys), ``ap`` attention tasks over a row's
pair of kv heads where each unit's keys are one task's (``agN``: groups of N kv heads; ``apr``:
pairs also over key ranges, merged by combines), ``sp`` the units left over a whole number of rounds
of the workers cut into cache blocks spread over them, ``arN`` a kv head's query heads padded to at
least N rows in the attention dots (default 4), ``pk`` attention tasks asking L2 for earlier steps'
keys and values before their waits, ``knN`` the task before each attention task in its worker's
queue asking L2 for the first N of them of each of its units, before its own waits, ``ps0`` the
K slices of projections (o, down) not asking L2 for their weights before their waits, ``fw``
each task that reads no weights (attention) asking L2 for the next task's instead, ``pc`` a
capped prefetch taking the first columns of every weight row (loop order) instead of the first
rows, ``kbN``
cache blocks (the block table's unit) of N tokens (default 16; where a block holds whole
attention steps each step reads one table entry), ``rgN`` at
most N registers per thread, ``ni`` each op body a function of its own (a call: its own registers,
not the whole dispatch's), ``tmN`` each projection task's first weight rows, up to N KiB, copied
into the worker's shared memory before its waits (``compiler.staging``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from megakernel.compiler.pipeline import CompileOptions
from megakernel.compiler.registry import p2
from megakernel.compiler.tile import TileConfig, Tiler
from megakernel.compiler.tile_attention import stream_layout
from megakernel.compiler.tile_proj import column_reduced, split_slices
from megakernel.compiler.tile_qkv import qkv_slices as tile_qkv_slices


@dataclass(frozen=True)
class Variant:
    block_n: int
    block_k: int
    num_warps: int
    workers: int
    gemv: bool = False
    stages: int = TileConfig.stages
    stage_kib: int = TileConfig.stage_kib
    step_weights: int = TileConfig.step_weights
    kv_split: int = TileConfig.kv_split
    kv_block: int = TileConfig.kv_block
    prefetch: bool = True
    qkv_parts: int = TileConfig.qkv_parts
    prefetch_kb: int = CompileOptions.prefetch_kb
    backoff_ns: int = 0
    prefetch_ahead: int = 0
    split_head_norm: bool = TileConfig.split_head_norm
    prefetch_next: bool = CompileOptions.prefetch_next
    swap_ab: bool = False
    rms_unroll: int = TileConfig.rms_unroll
    fold: int = TileConfig.fold
    fold_rows: int = TileConfig.fold_rows
    kv_step: int = TileConfig.kv_step
    attn_stages: int = TileConfig.attn_stages
    attn_tasks_per_worker: int = TileConfig.attn_tasks_per_worker
    poll_load: bool = False
    prefetch_start: int = CompileOptions.prefetch_start
    balance: bool = TileConfig.balance
    split_k: int = TileConfig.split_k
    split_long: bool = TileConfig.split_long
    long_slices: int = TileConfig.long_slices
    prefetch_wait: bool = CompileOptions.prefetch_wait
    prefetch_kv: bool = False
    prefetch_kv_ahead: int = CompileOptions.prefetch_kv_ahead
    prefetch_slices: bool = CompileOptions.prefetch_slices
    prefetch_fill: bool = CompileOptions.prefetch_fill
    prefetch_columns: bool = CompileOptions.prefetch_columns
    norm_first: bool | None = TileConfig.norm_first
    reduce_norm: bool = TileConfig.reduce_norm
    norm_sums: bool = TileConfig.norm_sums
    attn_balance: bool = TileConfig.attn_balance
    attn_stream: bool = TileConfig.attn_stream
    attn_pairs: bool = TileConfig.attn_pairs
    fuse_combine: bool = TileConfig.fuse_combine
    fuse_reduce: bool = TileConfig.fuse_reduce
    attn_group: int = TileConfig.attn_group
    attn_pair_ranges: bool = TileConfig.attn_pair_ranges
    attn_spill: bool = TileConfig.attn_spill
    attn_rows: int = TileConfig.attn_rows
    attn_keys_m: bool = TileConfig.attn_keys_m
    stream_pieces: bool = TileConfig.stream_pieces
    qkv_cross: bool = TileConfig.qkv_cross
    qkv_slices: int = TileConfig.qkv_slices
    max_registers: int = CompileOptions.max_registers
    noinline: bool = CompileOptions.noinline
    staged_kib: int = TileConfig.staged_kib

    @property
    def label(self) -> str:
        flags = ["g"] * self.gemv + ["t"] * self.swap_ab
        flags += [f"s{self.stages}"] + [f"sm{self.stage_kib}"] * bool(self.stage_kib)
        flags += [f"sw{self.step_weights}"] * (self.step_weights != TileConfig.step_weights)
        flags += [f"kv{self.kv_split}"]
        flags += [f"q{self.qkv_parts}"] * (self.qkv_parts != TileConfig.qkv_parts)
        flags += ["qc"] * self.qkv_cross
        flags += [f"qs{self.qkv_slices}"] * (self.qkv_slices != TileConfig.qkv_slices)
        flags += ["hn0"] * (not self.split_head_norm)
        flags += [f"ru{self.rms_unroll}"] * (self.rms_unroll != TileConfig.rms_unroll)
        flags += [f"fo{self.fold}"] * (self.fold != TileConfig.fold)
        flags += [f"fr{self.fold_rows}"] * (self.fold_rows != TileConfig.fold_rows)
        flags += [f"kb{self.kv_block}"] * (self.kv_block != TileConfig.kv_block)
        flags += [f"ks{self.kv_step}"] * (self.kv_step != TileConfig.kv_step)
        flags += [f"as{self.attn_stages}"] * (self.attn_stages != TileConfig.attn_stages)
        flags += [f"at{self.attn_tasks_per_worker}"] * (
            self.attn_tasks_per_worker != TileConfig.attn_tasks_per_worker)
        flags += ["np"] * (not self.prefetch)
        flags += [f"pf{self.prefetch_kb}"] * (self.prefetch_kb != CompileOptions.prefetch_kb)
        flags += [f"pa{self.prefetch_ahead}"] * bool(self.prefetch_ahead)
        flags += ["pn0"] * (self.prefetch and not self.prefetch_next)
        flags += ["pw0"] * (self.prefetch and not self.prefetch_wait)
        flags += ["pk"] * self.prefetch_kv
        flags += [f"kn{self.prefetch_kv_ahead}"] * bool(self.prefetch_kv_ahead)
        flags += ["ps0"] * (not self.prefetch_slices)
        flags += ["fw"] * self.prefetch_fill
        flags += ["pc"] * self.prefetch_columns
        flags += ["pl"] * self.poll_load
        flags += [f"pt{self.prefetch_start}"] * bool(self.prefetch_start)
        flags += ["bal"] * self.balance
        flags += [] if self.norm_first is None else ["nf" if self.norm_first else "nf0"]
        flags += ["rn"] * self.reduce_norm
        flags += ["ns"] * self.norm_sums
        flags += ["fs"] * self.fuse_reduce
        flags += ["ab"] * self.attn_balance
        flags += ["af"] * self.attn_stream
        flags += ["pp"] * self.stream_pieces
        flags += ["ap"] * self.attn_pairs
        flags += ["fc"] * self.fuse_combine
        flags += [f"ag{self.attn_group}"] * (self.attn_group != TileConfig.attn_group)
        flags += ["apr"] * self.attn_pair_ranges
        flags += ["sp"] * self.attn_spill
        flags += [f"ar{self.attn_rows}"] * (self.attn_rows != TileConfig.attn_rows)
        flags += ["km"] * self.attn_keys_m
        flags += [f"sk{self.split_k}"] * (self.split_k != TileConfig.split_k)
        flags += ["kl"] * self.split_long
        flags += [f"ls{self.long_slices}"] * bool(self.long_slices)
        flags += [f"bo{self.backoff_ns}"] * bool(self.backoff_ns)
        flags += [f"rg{self.max_registers}"] * bool(self.max_registers)
        flags += [f"tm{self.staged_kib}"] * bool(self.staged_kib)
        flags += ["ni" if self.noinline else "ni0"] * (self.noinline != CompileOptions.noinline)
        return "x".join(map(str, [self.block_n, self.block_k, self.num_warps, self.workers, *flags]))

    @property
    def tile(self) -> TileConfig:
        return TileConfig(**{f: getattr(self, f) for f in TILE_FIELDS})

    def options(self, sms: int) -> dict:
        """Keyword arguments of ``CompileOptions`` for a target with ``sms`` SMs."""
        return dict(tile=self.tile, num_warps=self.num_warps, num_workers=self.workers,
                    workers_per_sm=-(-self.workers // sms),
                    **{o: getattr(self, v) for v, o in OPTION_FIELDS.items()})


# Variant fields that are TileConfig fields of the same name (the rest of TileConfig keeps its
# defaults), and Variant fields -> the CompileOptions fields they set
TILE_FIELDS = tuple(f.name for f in fields(TileConfig) if f.name in Variant.__dataclass_fields__)
OPTION_FIELDS = {"prefetch": "prefetch", "prefetch_kb": "prefetch_kb",
                 "prefetch_ahead": "prefetch_ahead", "prefetch_next": "prefetch_next",
                 "prefetch_wait": "prefetch_wait",
                 "prefetch_kv": "prefetch_kv", "prefetch_kv_ahead": "prefetch_kv_ahead",
                 "prefetch_slices": "prefetch_slices", "prefetch_fill": "prefetch_fill",
                 "prefetch_columns": "prefetch_columns",
                 "backoff_ns": "spin_backoff_ns", "poll_load": "poll_load",
                 "prefetch_start": "prefetch_start", "max_registers": "max_registers",
                 "noinline": "noinline"}


# label flags: fixed settings, and prefixes of a number (-> Variant fields)
SWITCHES = {"g": {"gemv": True}, "t": {"swap_ab": True}, "hn": {"split_head_norm": True},
            "hn0": {"split_head_norm": False}, "pn": {"prefetch_next": True},
            "pn0": {"prefetch_next": False},
            "pw": {"prefetch": True, "prefetch_wait": True}, "pk": {"prefetch_kv": True},
            "ps": {"prefetch_slices": True}, "ps0": {"prefetch_slices": False},
            "fw": {"prefetch_fill": True}, "pc": {"prefetch_columns": True},
            "pl": {"poll_load": True}, "bal": {"balance": True},
            "ab": {"attn_balance": True}, "af": {"attn_stream": True},
            "pp": {"stream_pieces": True},
            "ap": {"attn_pairs": True}, "km": {"attn_keys_m": True},
            "apr": {"attn_pairs": True, "attn_pair_ranges": True},
            "fc": {"fuse_combine": True}, "fs": {"fuse_reduce": True},
            "qc": {"qkv_cross": True}, "sp": {"attn_spill": True},
            "rn": {"reduce_norm": True}, "ns": {"norm_sums": True}, "kl": {"split_long": True},
            "nf": {"norm_first": True}, "np": {"prefetch": False},
            "pf": {"prefetch": True}, "ni": {"noinline": True}, "ni0": {"noinline": False}}
NUMBERS = {"s": lambda n: {"stages": n}, "sm": lambda n: {"stage_kib": n},
           "sw": lambda n: {"step_weights": n},
           "kv": lambda n: {"kv_split": n},
           "q": lambda n: {"qkv_parts": n}, "qs": lambda n: {"qkv_slices": n},
           "ru": lambda n: {"rms_unroll": n},
           "fo": lambda n: {"fold": n}, "fr": lambda n: {"fold_rows": n},
           "ks": lambda n: {"kv_step": n}, "kb": lambda n: {"kv_block": n},
           "as": lambda n: {"attn_stages": n},
           "ar": lambda n: {"attn_rows": n}, "ag": lambda n: {"attn_group": n},
           "at": lambda n: {"attn_tasks_per_worker": n}, "bo": lambda n: {"backoff_ns": n},
           "sk": lambda n: {"split_k": n}, "ls": lambda n: {"long_slices": n},
           "rg": lambda n: {"max_registers": n}, "tm": lambda n: {"staged_kib": n},
           "pw": lambda n: {"prefetch_wait": bool(n)}, "nf": lambda n: {"norm_first": bool(n)},
           "pf": lambda n: {"prefetch": True, "prefetch_kb": n},
           "pa": lambda n: {"prefetch": True, "prefetch_ahead": n},
           "kn": lambda n: {"prefetch_kv_ahead": n},
           "pt": lambda n: {"prefetch": True, "prefetch_wait": True, "prefetch_start": n}}


def parse_variant(text: str) -> Variant:
    parts = text.split("x")
    try:
        bn, bk, warps, workers = (int(v) for v in parts[:4])
    except ValueError:
        raise ValueError(f"variant {text!r}: expected BNxBKxWARPSxWORKERS[xflags]") from None
    kw: dict = {}
    for flag in parts[4:]:
        prefix = flag.rstrip("0123456789")
        if flag in SWITCHES:
            kw.update(SWITCHES[flag])
        elif prefix in NUMBERS and flag != prefix:
            kw.update(NUMBERS[prefix](int(flag[len(prefix):])))
        else:
            raise ValueError(f"variant {text!r}: unknown flag {flag!r}")
    return Variant(bn, bk, warps, workers, **kw)


def stream_kv_split(kv_block: int) -> int:
    """The keys per task a streamed variant is built with (its tasks ignore them): the
    default's, or one cache block's where that is more (they stay whole blocks)."""
    return max(TileConfig.kv_split, kv_block)


CUDA_KV_BLOCK = 128   # tokens a cache block, for the CUDA backend's tensor-core attention


def cuda_form(v: Variant, sms: int, batch: int = 1, context: int = 0) -> Variant:
    """``v`` with what the CUDA backend builds (``compiler.cuda_codegen``): at most one worker an
    SM, norms first from the writers' sums of squares, q/k/v pieces within heads in whole K,
    nothing staged, K slices reduced by reduce tasks (no CUDA body reduces its own group),
    attention in plain pieces (a streamed variant's keys a task kept) whose units merge
    themselves (fused combines; the Triton kernel of the same tables at batch 1 on the H200:
    0.8294 -> 0.8256 ms, the CUDA one 0.8287 -> 0.8176). Below ``MMA_FROM`` batch rows
    projections in whole K; from there on (tensor cores) K slices as ``v`` has them, and tasks
    of at most 128 weight rows (block_n at most 32: the widest task's rows are a ring page),
    attention in balanced pieces where ``v`` asks for them (``ab``), and cache blocks of
    ``CUDA_KV_BLOCK`` tokens where they divide the ``context`` and the keys a task (so that
    attention's keys stream through the ring onto tensor cores, ``MmaKeys``)."""
    from megakernel.compiler.cuda_codegen import MMA_FROM

    keys = stream_kv_split(v.kv_block) if v.attn_stream else v.kv_split
    slices = dict(split_k=1, split_long=False, long_slices=0, attn_balance=False) \
        if batch < MMA_FROM else dict(block_n=min(v.block_n, 32))
    if batch >= MMA_FROM and context and v.kv_block < CUDA_KV_BLOCK and \
            context % CUDA_KV_BLOCK == 0 and keys % CUDA_KV_BLOCK == 0:
        slices["kv_block"] = CUDA_KV_BLOCK
    return replace(v, workers=min(v.workers, sms), norm_first=True, norm_sums=True,
                   reduce_norm=False, qkv_cross=False, qkv_slices=1, staged_kib=0,
                   attn_stream=False, stream_pieces=False, attn_pairs=False,
                   attn_pair_ranges=False,
                   attn_group=TileConfig.attn_group, fuse_combine=True, fuse_reduce=False,
                   kv_split=keys, **slices)


def effective(ops, v: Variant, memo: dict | None = None) -> Variant:
    """The variant as it will be built for the op graph ``ops``: keys per attention task as the
    tiler raises them for this batch (at most the context), q/k/v pieces per head as it chooses them
    (one where heads have a head norm, unless split; split only where that makes pieces; models
    without a head norm keep the default), the attention task limit only where it changed the
    keys per task (balanced attention: never; its keys per task are a minimum there, kept as
    asked; and no balance where it cuts the keys as the plain tiling does; streamed attention:
    none of the three), the fused reduce and norm only with both norm first and split-K (the
    sums of squares instead: with norm first), the attention rows only where they pad the heads
    otherwise, q/k/v pieces across heads only without head norms (their pieces per head then
    mean nothing), KV prefetch a task ahead only where attention is not streamed, pairs (or
    groups) of kv heads per task or streamed unit only where they apply (``Tiler.attn_pairs``,
    ``Tiler.stream_heads``), the group size only with them, keys as the attention dots' M only
    where whole pairs or groups are tasks, a loop per piece only in streams over pairs or
    groups, pairs over key ranges only where units have several, spilled units only where some
    are cut, fused combines only for pieces
    (plain, pairs over key ranges, or streams of kv head groups) where some unit has several,
    slices of the long projections only where that leaves some projections unsliced, their own
    slices only where they change some (``slicing``), K slices that reduce themselves only
    where some are reduced by columns (``tile_proj.column_reduced``). Equal results build equal
    kernels. ``memo`` (variant -> result) carries results across calls on the same ``ops``."""
    memo = {} if memo is None else memo
    if v not in memo:
        memo[v] = _effective(ops, v, lambda u: effective(ops, u, memo))
    return memo[v]


def _effective(ops, v: Variant, again) -> Variant:
    """``effective`` of ``v``, ``again`` of a variant it changes."""
    stream_split = stream_kv_split(v.kv_block)
    if v.attn_stream and (v.kv_split, v.attn_tasks_per_worker, v.attn_balance) != \
            (stream_split, TileConfig.attn_tasks_per_worker, False):
        return again(replace(v, kv_split=stream_split, attn_balance=False,
                             attn_tasks_per_worker=TileConfig.attn_tasks_per_worker))
    tiler = Tiler(ops, v.tile, v.workers)
    # whether the key ranges stay as they are with a switch of the attention layout off
    cuts_alike = lambda knob: tiler.kv_pieces() == Tiler(
        ops, replace(v.tile, **{knob: False}), v.workers).kv_pieces()
    if v.attn_balance and cuts_alike("attn_balance"):
        return again(replace(v, attn_balance=False))
    if v.attn_pairs and not (tiler.attn_pairs() or tiler.stream_heads() > 1):
        return again(replace(v, attn_pairs=False))
    if v.attn_group != TileConfig.attn_group and not v.attn_pairs:
        return again(replace(v, attn_group=TileConfig.attn_group))
    if v.attn_keys_m and not (tiler.attn_pairs() and tiler.whole_units()):
        return again(replace(v, attn_keys_m=False))
    if v.stream_pieces and not (v.attn_stream and tiler.stream_heads() > 1):
        return again(replace(v, stream_pieces=False))
    if v.attn_pair_ranges and (not v.attn_pairs or tiler.whole_units()):
        return again(replace(v, attn_pair_ranges=False))
    if v.attn_spill and (v.attn_stream or cuts_alike("attn_spill")):
        return again(replace(v, attn_spill=False))
    if v.fuse_combine and (not stream_cuts(tiler) if v.attn_stream else tiler.whole_units()):
        return again(replace(v, fuse_combine=False))
    if v.prefetch_kv_ahead and v.attn_stream:           # streams have no prefetch body
        return again(replace(v, prefetch_kv_ahead=0))
    head_norm = any(op.kind == "qkv_rope" and op.params.get("q_norm") for op in ops.ops)
    if v.qkv_cross and head_norm:
        return again(replace(v, qkv_cross=False))
    if v.qkv_cross and (v.qkv_parts, v.split_head_norm) != (TileConfig.qkv_parts,
                                                            TileConfig.split_head_norm):
        return again(replace(v, qkv_parts=TileConfig.qkv_parts,
                             split_head_norm=TileConfig.split_head_norm))
    pieces, span = tiler.qkv_pieces(head_norm), tiler.kv_span()
    pieces = TileConfig.qkv_parts if v.qkv_cross else pieces
    plain = replace(v.tile, kv_split=span,
                    attn_tasks_per_worker=TileConfig.attn_tasks_per_worker)
    at = v.attn_tasks_per_worker if Tiler(ops, plain, v.workers).kv_span() != span \
        else TileConfig.attn_tasks_per_worker
    if v.attn_balance or v.attn_stream:
        span, at = v.kv_split, TileConfig.attn_tasks_per_worker
    elif ops.dims.max_seq_len % v.kv_block == 0:      # keys past the context change nothing
        span = min(span, ops.dims.max_seq_len)
    group = ops.dims.heads // ops.dims.kv_heads
    rows = v.attn_rows if p2(group, v.attn_rows) != p2(group, TileConfig.attn_rows) \
        else TileConfig.attn_rows
    split, long, long_slices = slicing(ops, v.tile, v.workers)
    if (split, long, long_slices) != (tiler.split_k(), v.split_long, v.long_slices):
        return again(replace(v, split_k=split, split_long=long, long_slices=long_slices))
    # a split's output normalised
    split_norm = tiler.norm_first() and max(split, long_slices) > 1
    sums = v.norm_sums and tiler.norm_first()
    # q/k/v in K slices (the tiling's rule) where pieces lie within heads, pieces 1/slices of
    # a head's tasks (at least 1): the tasks a head as that builds them
    qkv_slices = TileConfig.qkv_slices if v.qkv_cross else tile_qkv_slices(tiler)
    if qkv_slices > 1 and not (head_norm and v.split_head_norm and pieces > 1):
        pieces = max(1, pieces // qkv_slices) * qkv_slices
    out = replace(v, kv_split=span, qkv_parts=pieces, attn_tasks_per_worker=at, attn_rows=rows,
                  split_k=split, norm_first=tiler.norm_first(), norm_sums=sums,
                  qkv_slices=qkv_slices,
                  reduce_norm=v.reduce_norm and split_norm and not sums,
                  split_head_norm=v.split_head_norm and pieces > 1 if head_norm
                  else TileConfig.split_head_norm)
    return replace(out, fuse_reduce=out.fuse_reduce and any(
        column_reduced(Tiler(ops, out.tile, v.workers), op) for op in ops.ops
        if op.kind == "linear"))


def stream_cuts(tiler: Tiler) -> bool:
    """Whether streams over units of kv head groups cut some unit (the ones a fused combine
    merges; streams of single heads have none)."""
    return tiler.stream_heads() > 1 and bool(stream_layout(tiler)[-1])


def slicing(ops, tile: TileConfig, workers: int) -> tuple[int, bool, int]:
    """(K slices, only the long projections, the long ones' own slices) as ``tile`` acts on
    ``ops`` (the tiling's own rule, ``tile_proj.split_slices``): ``split_long`` only where it
    leaves some of the projections that would be sliced unsliced (with ``long_slices``: those
    as ``split_k``) and no slices where it leaves none, ``long_slices`` only where they change
    some projection's slices."""
    split = Tiler(ops, tile, workers).split_k()
    if not tile.split_long and not tile.long_slices:
        return split, False, 0
    if tile.split_long and tile.long_slices:        # only the long ones, sliced as asked
        return slicing(ops, replace(tile, split_k=tile.long_slices, long_slices=0), workers)
    linear = [op for op in ops.ops if op.kind == "linear"]

    def sliced(**changes) -> tuple[int, ...]:
        tiler = Tiler(ops, replace(tile, **changes), workers)
        return tuple(split_slices(tiler, op) for op in linear)
    asked = sliced()
    if tile.long_slices:
        return split, False, tile.long_slices if asked != sliced(long_slices=0) else 0
    if asked == sliced(split_long=False):
        return split, False, 0
    return (split, True, 0) if any(n > 1 for n in asked) else (1, False, 0)


def variant_of(compiled) -> Variant:
    """The variant a compiled kernel was built with, as built (see ``effective``)."""
    o = compiled.options
    built = Variant(num_warps=o.num_warps, workers=compiled.schedule.num_workers,
                    **{f: getattr(o.tile, f) for f in TILE_FIELDS},
                    **{v: getattr(o, f) for v, f in OPTION_FIELDS.items()})
    return effective(compiled.ops, built)
