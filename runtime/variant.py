"""Kernel variants: the knobs of one compiled megakernel as one short label, shared by the
sweep, the trace command and the autotuner (what a variant builds for one model and batch size:
``runtime.effective``).

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
pairs also over key ranges, merged by combines; ``kr``: each whole pair's or group's key loop
from its own step on, wrapping around), ``sp`` the units left over a whole number of rounds
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
into the worker's shared memory before its waits (``compiler.staging``), ``dl`` each step a
programmatic dependent launch (its programs start as the previous step's leave their SMs).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from megakernel.compiler.pipeline import CompileOptions
from megakernel.compiler.tile import TileConfig


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
    queues_by_sm: bool = False
    prefetch_start: int = CompileOptions.prefetch_start
    balance: bool = TileConfig.balance
    split_k: int = TileConfig.split_k
    split_long: bool = TileConfig.split_long
    long_slices: int = TileConfig.long_slices
    prefetch_wait: bool = CompileOptions.prefetch_wait
    prefetch_kv: bool = False
    prefetch_kv_ahead: int = CompileOptions.prefetch_kv_ahead
    prefetch_kv_late: bool = CompileOptions.prefetch_kv_late
    prefetch_kv_last: bool = CompileOptions.prefetch_kv_last
    prefetch_slices: bool = CompileOptions.prefetch_slices
    prefetch_fill: bool = CompileOptions.prefetch_fill
    prefetch_columns: bool = CompileOptions.prefetch_columns
    prefetch_last: bool = CompileOptions.prefetch_last
    norm_first: bool | None = TileConfig.norm_first
    reduce_norm: bool = TileConfig.reduce_norm
    norm_sums: bool = TileConfig.norm_sums
    attn_balance: bool = TileConfig.attn_balance
    attn_stream: bool = TileConfig.attn_stream
    attn_pairs: bool = TileConfig.attn_pairs
    attn_stack: bool = TileConfig.attn_stack
    fuse_combine: bool = TileConfig.fuse_combine
    fuse_reduce: bool = TileConfig.fuse_reduce
    attn_group: int = TileConfig.attn_group
    attn_pair_ranges: bool = TileConfig.attn_pair_ranges
    attn_spill: bool = TileConfig.attn_spill
    attn_rows: int = TileConfig.attn_rows
    attn_keys_m: bool = TileConfig.attn_keys_m
    attn_rotate: bool = TileConfig.attn_rotate
    proj_rotate: bool = TileConfig.proj_rotate
    qkv_cross: bool = TileConfig.qkv_cross
    qkv_slices: int = TileConfig.qkv_slices
    max_registers: int = CompileOptions.max_registers
    noinline: bool = CompileOptions.noinline
    staged_kib: int = TileConfig.staged_kib
    dependent_launch: bool = CompileOptions.dependent_launch

    @property
    def label(self) -> str:
        flags = _tile_flags(self) + _prefetch_flags(self) + _layout_flags(self) + \
            _build_flags(self)
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
                 "prefetch_kv_late": "prefetch_kv_late", "prefetch_kv_last": "prefetch_kv_last",
                 "prefetch_slices": "prefetch_slices", "prefetch_fill": "prefetch_fill",
                 "prefetch_columns": "prefetch_columns", "prefetch_last": "prefetch_last",
                 "backoff_ns": "spin_backoff_ns", "poll_load": "poll_load",
                 "prefetch_start": "prefetch_start", "max_registers": "max_registers",
                 "noinline": "noinline", "queues_by_sm": "queues_by_sm",
                 "dependent_launch": "dependent_launch"}


# label flags: fixed settings, and prefixes of a number (-> Variant fields)
SWITCHES = {"g": {"gemv": True}, "t": {"swap_ab": True}, "hn": {"split_head_norm": True},
            "hn0": {"split_head_norm": False}, "pn": {"prefetch_next": True},
            "pn0": {"prefetch_next": False},
            "pw": {"prefetch": True, "prefetch_wait": True}, "pk": {"prefetch_kv": True},
            "ps": {"prefetch_slices": True}, "ps0": {"prefetch_slices": False},
            "fw": {"prefetch_fill": True}, "pc": {"prefetch_columns": True},
            "el": {"prefetch_last": True}, "el0": {"prefetch_last": False},
            "ke": {"prefetch_kv_last": True},
            "pl": {"poll_load": True}, "qm": {"queues_by_sm": True},
            "bal": {"balance": True},
            "ab": {"attn_balance": True}, "af": {"attn_stream": True},
            "ap": {"attn_pairs": True}, "km": {"attn_keys_m": True},
            "sq": {"attn_stack": True},
            "kr": {"attn_rotate": True}, "rk": {"proj_rotate": True},
            "apr": {"attn_pairs": True, "attn_pair_ranges": True},
            "fc": {"fuse_combine": True}, "fs": {"fuse_reduce": True},
            "qc": {"qkv_cross": True}, "sp": {"attn_spill": True},
            "rn": {"reduce_norm": True}, "ns": {"norm_sums": True}, "kl": {"split_long": True},
            "nf": {"norm_first": True}, "np": {"prefetch": False},
            "pf": {"prefetch": True}, "ni": {"noinline": True}, "ni0": {"noinline": False},
            "dl": {"dependent_launch": True}}
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
           "kd": lambda n: {"prefetch_kv_ahead": n, "prefetch_kv_late": True},
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


# a label's flags, in their order: tiling, prefetch and polls, norms, attention and slices, build
def _tile_flags(v: Variant) -> list:
    flags = ["g"] * v.gemv + ["t"] * v.swap_ab
    flags += [f"s{v.stages}"] + [f"sm{v.stage_kib}"] * bool(v.stage_kib)
    flags += [f"sw{v.step_weights}"] * (v.step_weights != TileConfig.step_weights)
    flags += [f"kv{v.kv_split}"]
    flags += [f"q{v.qkv_parts}"] * (v.qkv_parts != TileConfig.qkv_parts)
    flags += ["qc"] * v.qkv_cross
    flags += [f"qs{v.qkv_slices}"] * (v.qkv_slices != TileConfig.qkv_slices)
    flags += ["hn0"] * (not v.split_head_norm)
    flags += [f"ru{v.rms_unroll}"] * (v.rms_unroll != TileConfig.rms_unroll)
    flags += [f"fo{v.fold}"] * (v.fold != TileConfig.fold)
    flags += [f"fr{v.fold_rows}"] * (v.fold_rows != TileConfig.fold_rows)
    flags += [f"kb{v.kv_block}"] * (v.kv_block != TileConfig.kv_block)
    flags += [f"ks{v.kv_step}"] * (v.kv_step != TileConfig.kv_step)
    flags += [f"as{v.attn_stages}"] * (v.attn_stages != TileConfig.attn_stages)
    flags += [f"at{v.attn_tasks_per_worker}"] * (
        v.attn_tasks_per_worker != TileConfig.attn_tasks_per_worker)
    return flags


def _prefetch_flags(v: Variant) -> list:
    flags = ["np"] * (not v.prefetch)
    flags += [f"pf{v.prefetch_kb}"] * (v.prefetch_kb != CompileOptions.prefetch_kb)
    flags += [f"pa{v.prefetch_ahead}"] * bool(v.prefetch_ahead)
    flags += ["pn0"] * (v.prefetch and not v.prefetch_next)
    flags += ["pw0"] * (v.prefetch and not v.prefetch_wait)
    flags += ["pk"] * v.prefetch_kv
    late = "kd" if v.prefetch_kv_late else "kn"
    flags += [f"{late}{v.prefetch_kv_ahead}"] * bool(v.prefetch_kv_ahead)
    flags += ["ke"] * v.prefetch_kv_last
    flags += ["ps0"] * (not v.prefetch_slices)
    flags += ["fw"] * v.prefetch_fill
    flags += ["pc"] * v.prefetch_columns + ["el0"] * (not v.prefetch_last)
    flags += ["pl"] * v.poll_load + ["qm"] * v.queues_by_sm
    flags += [f"pt{v.prefetch_start}"] * bool(v.prefetch_start)
    return flags


def _layout_flags(v: Variant) -> list:
    flags = ["bal"] * v.balance
    flags += [] if v.norm_first is None else ["nf" if v.norm_first else "nf0"]
    flags += ["rn"] * v.reduce_norm + ["ns"] * v.norm_sums + ["fs"] * v.fuse_reduce
    flags += ["ab"] * v.attn_balance + ["af"] * v.attn_stream
    flags += ["ap"] * v.attn_pairs + ["sq"] * v.attn_stack + ["fc"] * v.fuse_combine
    flags += [f"ag{v.attn_group}"] * (v.attn_group != TileConfig.attn_group)
    flags += ["apr"] * v.attn_pair_ranges + ["sp"] * v.attn_spill
    flags += [f"ar{v.attn_rows}"] * (v.attn_rows != TileConfig.attn_rows)
    flags += ["km"] * v.attn_keys_m + ["kr"] * v.attn_rotate + ["rk"] * v.proj_rotate
    flags += [f"sk{v.split_k}"] * (v.split_k != TileConfig.split_k)
    flags += ["kl"] * v.split_long + [f"ls{v.long_slices}"] * bool(v.long_slices)
    return flags


def _build_flags(v: Variant) -> list:
    flags = [f"bo{v.backoff_ns}"] * bool(v.backoff_ns)
    flags += [f"rg{v.max_registers}"] * bool(v.max_registers)
    flags += [f"tm{v.staged_kib}"] * bool(v.staged_kib) + ["dl"] * v.dependent_launch
    return flags + ["ni" if v.noinline else "ni0"] * (v.noinline != CompileOptions.noinline)
