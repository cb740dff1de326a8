"""The autotuner's search: the space of kernel variants and the shortlist of each batch size.

    shortlist(ops, target, space, classes) -> [(Variant, predicted us)]

Search space (``SPACE``): projection step ``block_n x block_k``, pipeline stages, warps (4 only in
``SPACE``: 8 are a flip of the refinement's), programs per SM, keys per attention task, the
attention task limit, tasks per q/k/v head, split head-norm heads, K slices of the projections
without a norm, norm first (and the K slices' reduce fused with it), streamed attention, attention
tasks over pairs of kv heads, spilled attention units, cache blocks (16 keys, or 128: one
block-table entry per attention step, where the keys per task are whole blocks), KV prefetch and
the cap on each task's L2 prefetch of its weights (only the defaults of these two in ``SPACE``, as
measured on the H200 with llama-3.2-1b: KV prefetch at most 1% faster at 1 to 8 rows and slower
from 13 on, in the autotune ledger bench/results/session-2026-11-30g/autotune-12.json; the cap's
256 KiB slower than 64 at every size, 16 and 32 no faster at batch 1; a space given by the caller
may hold others). Variants whose pipeline stages cannot fit in shared memory, or whose cache block
does not divide the context, are dropped. The knobs that shape the task graph (``schedule_class``)
are rated by the cost model's estimate of their tasks (``predict``: tiling only, no code generated;
each op's figure kept with the tile knobs its tiler read, ``op_us``); the default's class, the
``classes`` best and, per attention layout, the class nearest the default, each also with the K
slices' reduce fused with the norm or not, each crossed with every code-level knob (block_k,
stages, warps, KV prefetch, prefetch cap) with the largest cache block that fits
(``largest_blocks``), make the shortlist.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

from megakernel.compiler.cost import Target, op_waves_us
from megakernel.compiler.pipeline import CompileOptions
from megakernel.compiler.tile import TILERS, TileConfig, Tiler

from .effective import effective
from .variant import Variant, stream_kv_split

# 4 warps only: 8 are one flip of each batch size's fastest in the refinement
# (``refine.other_warps``). llama-3.2-1b on the H200, the best 8-warp variant against the best
# 4-warp one of the same tune: 1.0-17.6% slower at every batch size in each of the five tunes
# since bench/results/session-2026-12-01j (on H100s mostly 1-7% slower, 2-3% faster twice at 8
# rows); crossed with every class they were 120 of the 426 builds of a cold tune (H100, 537 s)
SPACE = {"block_n": (32, 64, 128), "block_k": (256, 512), "stages": (3,), "num_warps": (4,),
         "workers_per_sm": (1, 2), "kv_split": (32, 64, 128), "qkv_parts": (1, 2, 4),
         "split_head_norm": (False, True), "attn_tasks_per_worker": (1, 2, 4),
         "split_k": (1, 4), "norm_first": (False, True), "reduce_norm": (False, True),
         "prefetch_kv": (CompileOptions.prefetch_kv,),
         "prefetch_kb": (CompileOptions.prefetch_kb,), "attn_stream": (False, True),
         "kv_block": (16, 128), "attn_pairs": (False, True), "attn_group": (2, 4),
         "attn_spill": (False, True)}
OPTIONAL = {"split_head_norm": TileConfig.split_head_norm,     # the value where a space has none
            "attn_tasks_per_worker": TileConfig.attn_tasks_per_worker,
            "split_k": TileConfig.split_k, "norm_first": TileConfig.norm_first,
            "reduce_norm": TileConfig.reduce_norm,
            "prefetch_kv": CompileOptions.prefetch_kv,
            "prefetch_kb": CompileOptions.prefetch_kb, "attn_stream": TileConfig.attn_stream,
            "kv_block": TileConfig.kv_block, "attn_pairs": TileConfig.attn_pairs,
            "attn_group": TileConfig.attn_group, "attn_spill": TileConfig.attn_spill}


def block_fits(v: Variant, block: int, seq: int) -> bool:
    """Whether cache blocks of ``block`` keys fit the variant: they divide the context and
    its keys per task (streams: any, their tasks' keys ignore it)."""
    return seq % block == 0 and (v.attn_stream or v.kv_split % block == 0)


def largest_blocks(variants: list[Variant]) -> list[Variant]:
    """Of variants equal but for the cache block, the one with the largest (the refinement
    times the other; llama-3.2-1b on the H200, the fastest with 16-key blocks against the
    fastest with 128-key ones: 1.3-4.0% slower at 11 of 12 batch sizes, 0.7% faster at 16
    rows), in order."""
    same = lambda v: replace(v, kv_block=0, kv_split=0 if v.attn_stream else v.kv_split)
    largest: dict = {}
    for v in variants:
        k = same(v)
        if k not in largest or v.kv_block > largest[k].kv_block:
            largest[k] = v
    return [v for v in variants if largest[same(v)] is v]


def warps_fit(warps: int, per_sm: int) -> bool:
    """Whether ``per_sm`` programs of ``warps`` warps fit one SM's register file: it holds 8
    warps of 255 registers, what these kernels take on sm_90."""
    return per_sm * warps <= 8


def candidates(target: Target, space: dict) -> list[Variant]:
    out = []
    knobs = [space[k] if k in space else (OPTIONAL[k],) for k in SPACE]
    for values in itertools.product(*knobs):
        k = dict(zip(SPACE, values))
        bn, bk, st, warps, per_sm = (k.pop(f) for f in ("block_n", "block_k", "stages",
                                                          "num_warps", "workers_per_sm"))
        # sm_90 builds hold stages - 1 buffers of gate and up steps (2 bytes each) and at most
        # half a step more (llama-3.2-1b at 64 rows: 64x256 and 128x128 with 3 stages 147 KB,
        # 128x256 with 3 295 KB, with 2 197 KB)
        smem = (max(st, 2) - 1) * bn * bk * 2 * 2 + bn * bk * 2
        # the interpreter has one program per SM and no prefetch
        cpu = target.name == "cpu"
        gpu_only = k["prefetch_kv"] or k["prefetch_kb"] != OPTIONAL["prefetch_kb"]
        if smem * per_sm > target.smem_bytes or (cpu and (per_sm > 1 or gpu_only)) \
                or not warps_fit(warps, per_sm):
            continue
        if k["attn_stream"] and k["attn_pairs"]:  # grouped streams: timed by hand only
            continue
        if k["kv_split"] % k["kv_block"]:        # keys per task in whole cache blocks
            if not k["attn_stream"]:
                continue
            k["kv_split"] = stream_kv_split(k["kv_block"])
        out.append(Variant(bn, bk, warps, per_sm * target.sms, stages=st, **k))
    return out


SCHEDULE_FIELDS = ("block_n", "workers", "kv_split", "qkv_parts", "split_head_norm",
                   "attn_tasks_per_worker", "split_k", "norm_first", "reduce_norm",
                   "attn_balance", "attn_stream", "qkv_cross", "attn_pairs", "attn_group",
                   "attn_spill")


def schedule_class(v: Variant) -> tuple:
    """The knobs that change the task graph and its schedule (the rest change only the code)."""
    return tuple(getattr(v, f) for f in SCHEDULE_FIELDS)


def fused_sibling(k: tuple) -> tuple:
    """The schedule class ``k`` with the K slices' reduce fused with the norm, or not."""
    i = SCHEDULE_FIELDS.index("reduce_norm")
    return k[:i] + (not k[i],) + k[i + 1:]


def alike_ops(ops) -> list[tuple]:
    """(op, count) for each group of ops that tile alike: same kind, and params and buffers
    equal up to names (the layers of a model repeat), in graph order."""
    shape = lambda v: ops.buffers[v].shape if isinstance(v, str) and v in ops.buffers else v
    groups: dict = {}
    for op in ops.ops:
        key = (op.kind, tuple(sorted((k, shape(v)) for k, v in op.params.items() if k != "layer")),
               tuple(shape(b) for b in op.inputs + op.outputs))
        first, count = groups.get(key, (op, 0))
        groups[key] = (first, count + 1)
    return list(groups.values())


class Reads:
    """A tile config read through: each field a tiler asks for, and its value, kept in
    ``seen``."""

    def __init__(self, cfg: TileConfig):
        self.cfg, self.seen = cfg, {}

    def __getattr__(self, name: str):
        value = getattr(self.cfg, name)
        self.seen[name] = value
        return value


def op_us(ops, op, v: Variant, target: Target, memo: dict) -> float:
    """The cost model's time of ``op``'s tasks under ``v``. A tiler is a function of the op
    graph, the workers and the tile knobs it reads, so ``memo`` keeps each result with the knobs
    read for it, {(op, workers, target): [(knobs, us)]}, and answers any variant that agrees on
    them (the variants of a shortlist differ mostly in knobs of other ops)."""
    tile = v.tile                   # a TileConfig built from the variant's fields: once here
    entries = memo.setdefault((op.name, v.workers, target), [])
    for knobs, us in entries:
        if all(getattr(tile, k) == value for k, value in knobs.items()):
            return us
    cfg = Reads(tile)
    tiler = Tiler(ops, cfg, v.workers)
    TILERS[op.kind](tiler, op)
    us = op_waves_us(tiler.tasks, replace(target, workers_per_sm=-(-v.workers // target.sms)),
                     v.workers)
    entries.append((cfg.seen, us))
    return us


def predict(ops, v: Variant, target: Target, alike: list | None = None,
            memo: dict | None = None) -> float:
    """Estimated step time (us) of the variant's tasks under the cost model (whose estimate adds
    up op by op, so each group of ``alike_ops`` is tiled once; ``memo``: ``op_us``'s, shared by
    the calls on one op graph and target)."""
    memo = {} if memo is None else memo
    return sum(count * op_us(ops, op, v, target, memo)
               for op, count in (alike if alike is not None else alike_ops(ops)))


def shortlist(ops, target: Target, space: dict, classes: int) -> list[tuple[Variant, float]]:
    """The default variant, then every code-level knob of the default's schedule class, of the
    ``classes`` best-rated classes (equal ratings: the class nearer the default first) and, for
    each attention layout (keys per task, balanced, streamed, pairs or groups of 4 kv heads,
    spilled units; at 64 rows groups of 4 took 1.751 ms against pairs' 1.845) at the default's
    workers, of the class nearest the default (equally near: the better rated); and of each of
    these classes with the K slices' reduce fused with the norm where it was not, or not where it
    was (``fused_sibling``; llama-3.2-1b on the H200, each batch size's winner -> fused, ms: 13
    rows 1.120 -> 1.092, 17 1.296 -> 1.270, 24 1.320 -> 1.293, 32 1.349 -> 1.324, 64 1.902 ->
    1.839, 16 1.101 -> 1.145; the rules before timed it only at 64 rows). The cost model rates
    attention least well: llama-3.2-1b on the H200 at 16 rows, 1024 keys per task 1.130 ms against
    512 1.250, rated the other way round; at 13 rows the default with 1024 keys 1.153, the
    best-rated class with 1024 keys (no K slices) 1.267."""
    memo: dict = {}
    variants = largest_blocks(list(dict.fromkeys(
        effective(ops, v, memo) for v in candidates(target, space)
        if block_fits(v, v.kv_block, ops.dims.max_seq_len))))
    rated, alike, costs = {}, alike_ops(ops), {}
    for v in variants:
        if schedule_class(v) not in rated:
            rated[schedule_class(v)] = predict(ops, v, target, alike, costs)
    t = TileConfig()
    default = effective(ops, Variant(t.block_n, t.block_k, CompileOptions.num_warps,
                                     target.max_workers))
    home = schedule_class(default)
    near = lambda k: sum(a != b for a, b in zip(k, home))
    rank = lambda k: (rated[k], near(k), k)
    layouts = {}
    for v in sorted(variants, key=lambda v: (near(schedule_class(v)), rank(schedule_class(v)))):
        if v.workers == default.workers:
            layouts.setdefault((v.kv_split, v.attn_balance, v.attn_stream, v.attn_pairs,
                                v.attn_group, v.attn_spill),
                               schedule_class(v))
    picked = dict.fromkeys([home, *sorted(rated, key=rank)[:classes], *layouts.values()])
    picked |= dict.fromkeys(k for k in map(fused_sibling, list(picked)) if k in rated)
    picks = [(default, predict(ops, default, target, alike, costs))]
    picks += [(v, rated[k]) for k in picked if k in rated for v in variants
              if schedule_class(v) == k and v != default]
    return picks
