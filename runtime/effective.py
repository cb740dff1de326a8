"""What a variant builds: ``effective`` normalises a ``Variant`` to the kernel the compiler
will build from it for one op graph (equal results build equal kernels), ``variant_of`` reads
that back from a compiled kernel, and ``cuda_form`` is the form the CUDA backend builds.

Inputs: an ``OpGraph`` (``ops``) and a ``Variant``; outputs: a ``Variant``. Invariant: a
variant's effective form is a fixed point of ``effective``.
"""
from __future__ import annotations

from dataclasses import replace

from megakernel.compiler.registry import p2
from megakernel.compiler.tile import TileConfig, Tiler
from megakernel.compiler.tile_attention import stream_layout
from megakernel.compiler.tile_proj import column_reduced, split_slices
from megakernel.compiler.tile_qkv import qkv_slices as tile_qkv_slices

from .variant import OPTION_FIELDS, TILE_FIELDS, Variant, stream_kv_split

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
                   attn_stream=False, attn_pairs=False,
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
    where some are reduced by columns (``tile_proj.column_reduced``), and without the weights'
    L2 prefetch none of its settings (``WEIGHT_PREFETCH``). Equal results build equal kernels.
    ``memo`` (variant -> result) carries results across calls on the same ``ops``."""
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
    if not v.prefetch and any(getattr(v, f) != getattr(Variant, f) for f in WEIGHT_PREFETCH):
        return again(replace(v, **{f: getattr(Variant, f) for f in WEIGHT_PREFETCH}))
    if v.prefetch_start and not v.prefetch_wait:    # a start only delays prefetches between polls
        return again(replace(v, prefetch_start=0))
    tiler = Tiler(ops, v.tile, v.workers)
    head_norm = any(op.kind == "qkv_rope" and op.params.get("q_norm") for op in ops.ops)
    changed = _attention_layout(ops, v, tiler) or _qkv_form(v, head_norm)
    if changed is not None:
        return again(changed)
    split, long, long_slices = slicing(ops, v.tile, v.workers)
    if (split, long, long_slices) != (tiler.split_k(), v.split_long, v.long_slices):
        return again(replace(v, split_k=split, split_long=long, long_slices=long_slices))
    out = _as_tiled(ops, v, tiler, head_norm, split)
    return replace(out, fuse_reduce=out.fuse_reduce and any(
        column_reduced(Tiler(ops, out.tile, v.workers), op) for op in ops.ops
        if op.kind == "linear"))


# what only the weights' L2 prefetch reads (kept at their defaults without it: the kernel's
# PREFETCH switch ignores them, and a label cannot say them without turning it on)
WEIGHT_PREFETCH = ("prefetch_kb", "prefetch_ahead", "prefetch_next", "prefetch_wait",
                   "prefetch_start", "prefetch_slices", "prefetch_fill", "prefetch_columns",
                   "prefetch_last")


def _attention_layout(ops, v: Variant, tiler: Tiler) -> Variant | None:
    """``v`` with the first attention switch that does not apply to ``ops`` turned off, or
    None where all apply."""
    # whether the key ranges stay as they are with a switch of the attention layout off
    cuts_alike = lambda knob: tiler.kv_pieces() == Tiler(
        ops, replace(v.tile, **{knob: False}), v.workers).kv_pieces()
    if v.attn_balance and cuts_alike("attn_balance"):
        return replace(v, attn_balance=False)
    if v.attn_pairs and not (tiler.attn_pairs() or tiler.stream_heads() > 1):
        return replace(v, attn_pairs=False)
    if v.attn_group != TileConfig.attn_group and not v.attn_pairs:
        return replace(v, attn_group=TileConfig.attn_group)
    if v.attn_keys_m and not (tiler.attn_pairs() and tiler.whole_units()
                              or tiler.stream_heads() > 1):      # whole units, grouped streams
        return replace(v, attn_keys_m=False)
    if v.attn_stack and not (v.attn_stream and tiler.stream_heads() == 2):
        return replace(v, attn_stack=False)                  # pair streams' own loop
    if v.attn_rotate and not (tiler.attn_pairs() and tiler.whole_units()):
        return replace(v, attn_rotate=False)
    if v.attn_pair_ranges and (not v.attn_pairs or tiler.whole_units()):
        return replace(v, attn_pair_ranges=False)
    if v.attn_spill and (v.attn_stream or cuts_alike("attn_spill")):
        return replace(v, attn_spill=False)
    if v.fuse_combine and (not stream_cuts(tiler) if v.attn_stream else tiler.whole_units()):
        return replace(v, fuse_combine=False)
    if v.prefetch_kv_ahead and v.attn_stream:           # streams have no prefetch body
        return replace(v, prefetch_kv_ahead=0, prefetch_kv_late=False)
    if v.prefetch_kv_late and not v.prefetch_kv_ahead:
        return replace(v, prefetch_kv_late=False)
    if v.prefetch_kv_last and not (v.prefetch_kv_ahead or v.prefetch_kv):
        return replace(v, prefetch_kv_last=False)
    return None


def _qkv_form(v: Variant, head_norm: bool) -> Variant | None:
    """``v`` without q/k/v pieces across heads where the model has head norms, and with the
    default pieces per head and head-norm split where they are across heads; None if neither."""
    if v.qkv_cross and head_norm:
        return replace(v, qkv_cross=False)
    if v.qkv_cross and (v.qkv_parts, v.split_head_norm) != (TileConfig.qkv_parts,
                                                            TileConfig.split_head_norm):
        return replace(v, qkv_parts=TileConfig.qkv_parts,
                       split_head_norm=TileConfig.split_head_norm)
    return None


def _as_tiled(ops, v: Variant, tiler: Tiler, head_norm: bool, split: int) -> Variant:
    """``v``'s counts as ``tiler`` builds them: keys and attention tasks per worker, q/k/v
    pieces and slices, attention rows, K slices, and the norm switches that apply."""
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
    # a split's output normalised
    split_norm = tiler.norm_first() and max(split, v.long_slices) > 1
    sums = v.norm_sums and tiler.norm_first()
    # q/k/v in K slices (the tiling's rule) where pieces lie within heads, pieces 1/slices of
    # a head's tasks (at least 1): the tasks a head as that builds them
    qkv_slices = TileConfig.qkv_slices if v.qkv_cross else tile_qkv_slices(tiler)
    if qkv_slices > 1 and not (head_norm and v.split_head_norm and pieces > 1):
        pieces = max(1, pieces // qkv_slices) * qkv_slices
    return replace(v, kv_split=span, qkv_parts=pieces, attn_tasks_per_worker=at,
                   attn_rows=rows, split_k=split, norm_first=tiler.norm_first(),
                   norm_sums=sums, qkv_slices=qkv_slices,
                   reduce_norm=v.reduce_norm and split_norm and not sums,
                   split_head_norm=v.split_head_norm and pieces > 1 if head_norm
                   else TileConfig.split_head_norm)


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
