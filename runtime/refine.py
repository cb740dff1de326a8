"""The refinement of each batch size's fastest variant: its knobs flipped one at a time, then the
flips that gained combined, on it and on a first-round variant of another class nearly as fast,
then the flips that missed by less than the noise made again on the fastest so far.

    refinement(ledger, base, batch, rows, refine, model, seq, target) -> [(Variant, predicted)]
    compound(ledger, base, batch, start, rows, tried, model, seq, target) -> [(Variant, predicted)]
    second_look(ledger, base, batch, start, rows, tried, model, seq, target) -> [(Variant, ...)]
    runner_up(start, rows, tried, ms) -> Variant | None

``rows`` are [(variant, ledger row)] of the variants timed so far; each returns the variants to
build and time next with their cost-model ratings (us), none already timed, and keeps that plan
in the ledger, so that a rerun rates nothing.
"""
from __future__ import annotations

from dataclasses import fields, replace

from megakernel.compiler.cost import Target
from megakernel.compiler.registry import rows as dot_rows
from megakernel.compiler.tile import TileConfig

from .ledger import Ledger
from .search import SPACE, block_fits, predict, warps_fit
from .effective import effective
from .graphs import op_costs, op_graph
from .variant import Variant, stream_kv_split

# Knobs flipped one at a time on each batch size's fastest variant, once the shortlist is timed
# (``refinement``; a knob's companions take its new value too): projection tasks in near-equal
# spans that fill whole waves of workers (llama-3.1-8b on the H200 at batch 1: 4.192 -> 4.132 ms,
# 132 tasks of gate_up, o and down instead of 128; llama-3.2-1b: the winner at 1 and 13 rows, within
# 1% elsewhere), the cache block (the shortlist times the largest that fits), deeper projection
# pipelines (``TileConfig.stage_kib``; llama-3.2-1b, tuned ms: 64 rows 1.749 -> 1.704, 48 1.655 ->
# 1.634, won at 5 and 32 rows too, 0.5-3.4% slower elsewhere) and the K slices of o and down (on,
# their reduce fused with the norm where it comes first, or off):
# the cost model rates them against the measurements at 8 rows (4 slices fused 0.997 ms with 8
# warps, 1.033 with 4; none 1.037 / 1.030; rated 1153 us against 1078), so the shortlists of 1 to 5
# rows hold none (4 fused slices won at 5 rows: 0.976 ms against 1.008); one-matrix steps as deep as
# gate_up's (``TileConfig.step_weights``: lm_head's; won at 8-64 rows, 48 rows 1.660 -> 1.603 ms);
# and the K slices' reduces writing their rows' sums of squares (and x times the norm weight) for
# the next op's norm instead of a norm phase (``TileConfig.norm_sums``; sweeps against each winner,
# ms: 5 rows 0.980 -> 0.966, 8 0.990 -> 0.980, 13 1.090 -> 1.080; lost at 16, 17, 24, 32 and 64;
# where the norm is in the projections' loops, each task's RMS a pass over x before its loop,
# the flip sets norm first too: ``other_norm``).
# A deeper attention pipeline (``attn_stages``: 8 stages, three buffers of keys and values) lost
# at all 12 batch sizes (0.2-4.9%), pairs of kv heads over key ranges (``attn_pair_ranges``,
# flipped with at most half the context per range) at each of the five where they applied
# (llama-3.2-1b, ms: 3 rows 0.916 -> 0.951, 5 1.009 -> 1.063, 8 1.000 -> 1.058, 13 1.080 -> 1.115,
# 16 1.084 -> 1.208): both left the refinement. Op bodies as functions of their own
# (``noinline``): each gets its own registers, where one dispatch holds them all (sm_90 builds of
# llama-3.2-1b's winners at 1 and 3 rows: 255 registers and 44-60 bytes of spills -> 198 and none;
# on the H200, final rounds: 1 row 0.870 -> 0.852 ms, 2 0.896 -> 0.863, 13 1.075 -> 1.034). Any
# call serialises a kernel's warpgroup MMAs (ptxas C7510; 64-row dots, from 48 rows on): 64
# rows 1.600 -> 1.954 ms. K slices only for the projections longer than the hidden size
# (``split_long``: down, not o; no reduce phase after o) left it: rated 3-5% faster on
# llama-3.2-1b's winners at 8-32 rows (17 rows 1268 -> 1230 us), it lost at every batch size
# from 8 rows on (the best variant with it against the winner, ms: 8 rows 1.001 / 0.953, 17
# 1.204 / 1.139, 32 1.293 / 1.245, 64 1.710 / 1.560).
# The earlier keys and values of each attention task's units, the first 128 of each, asked of L2
# by the task before it in its worker's queue (``CompileOptions.prefetch_kv_ahead``; sweeps
# against each winner, llama-3.2-1b on the H200, ms: 13 rows 1.011 -> 0.998, 16 1.030 -> 1.025,
# 17 1.136 -> 1.123 and 1.134 -> 1.121, 8 0.951 -> 0.946; 5 rows 0.911 -> 0.914, 32 1.247 ->
# 1.245; 256 keys lost 1-5% at 24, 48 and 64 rows, all keys 6-20%).
# K slices that reduce their column group themselves (``TileConfig.fuse_reduce``, the last slice
# of a group to take its ticket): no reduce phase and no wait on it after o and down; where the
# slices are reduced by rows with the norm, flipped on with the norm from sums of squares
# instead (``fused_reduce``); the autotune's winner at 8, 16, 17, 24 and 48 rows (24: 1.204 ->
# 1.179 ms). Pairs of kv heads over key ranges merged by their last part (``fuse_combine``, no
# combine phase), in quarters of the context, up to 8 tasks a worker, meant for 24 and 48 rows
# where whole pairs or groups leave 36 of 132 workers without attention, lost at all 12 batch
# sizes (7-39%; 24 rows 1.458 ms, 48 1.750 against 1.432) and left the refinement again.
# Streams over units of a row's kv head groups (``Tiler.stream_heads``: every worker an equal
# share of the step's keys, where whole pairs or groups fill 96 of 132 workers at 24 and 48
# rows) lost wherever timed against the winners (ms: 13 rows 0.996 -> 1.058, 17 1.102 -> 1.216,
# 24 1.185 -> 1.280, 32 1.225 -> 1.242, 48 1.437 -> 1.499 with groups of 4, 64 1.561 -> 1.587;
# merged by their last piece, slower still) and left the refinement. Whole pairs' and groups'
# dots with the keys as M (``attn_keys_m``: a third fewer instructions a pair's step in the
# sm_90 build, 579 against 848, no barrier; against the winners, ms: 24 rows 1.176 -> 1.156, 64
# rows with groups of 4 1.553 -> 1.544; again, 24 rows 1.181 -> 1.175, 32 1.234 -> 1.239, 48
# 1.452 -> 1.479, 64 1.570 -> 1.559) flip on where they apply. A head's q/k/v tasks as 2 K
# slices of pieces twice as wide (``qkv_slices``, where x is normalised first: each task reads
# half as much of x from L2; the cost model rated them 1-2% faster) lost against every winner
# timed (ms: 24 rows 1.181 -> 1.243, 32 1.234 -> 1.265, 48 1.452 -> 1.530, 64 1.570 -> 1.673;
# traced at 64 rows, a slice's task 9.9 us against a whole piece's 7.7 and the phase 14.2
# against 8.5) and left the refinement; its flip stays in ``FLIPS`` for a ``refine`` argument.
# Streams over pairs as a loop per unit's piece (863 instructions a step in the sm_90 SASS of the
# 24-row winner against its whole pairs' 843 and one loop's 1059) lost as the streams did (ms:
# 24 rows 1.181 -> 1.320, 32 1.233 -> 1.245; the bodies alone 27.3 us against the streams'
# 24.8) and were removed.
# Whole pairs' and groups' key loops each from a step of its own (``attn_rotate``; against the
# winners beside torch-compile on the H200, ms: 24 rows with `km` 1.194 -> 1.175, 48 rows with
# groups and `km` 1.479 -> 1.458, 64 rows 1.553 -> 1.573).
# The weights' L2 prefetches with evict_last priority (``CompileOptions.prefetch_last``, on by
# default; against the H200 ledger's winners on an H100, ms: 24 rows 1.463 -> 1.440, 48 1.802 ->
# 1.788, 64 1.977 -> 1.958) flip off.
# Projection tasks' K loops each from a step of their own (``proj_rotate``; against the H200
# ledger's winners on an H100, ms: 24 rows 1.445 -> 1.427, 64 rows 1.950 -> 1.969).
# The fastest at the other warp count (``other_warps``; the shortlists hold 4 warps only, see
# ``search.SPACE``).
REFINE = ("balance", "kv_block", "stage_kib", "split_k", "step_weights", "norm_sums",
          "noinline", "prefetch_kv_ahead", "fuse_reduce", "attn_keys_m", "attn_rotate",
          "prefetch_last", "proj_rotate", "num_warps")
# the warp counts the refinement times (the shortlists' first)
WARPS = (4, 8)
# keys a unit the KV prefetch a task ahead asks for when flipped on
KV_AHEAD_KEYS = 128
# the shared memory deepened projection pipelines fill (sm_90 builds of llama-3.2-1b, 227 KiB
# an SM: 192 KiB at 64 rows with groups of 4 kv heads, 255 registers, 136 bytes of stack)
DEEP_STAGES_KIB = 200
# the attention pipeline's stages when deepened: the block table's gathers keep (stages - 1) // 2
# steps in shared memory (sm_90 builds of llama-3.2-1b's winners: 194 KiB at 32 rows with
# pairs and at 64 with groups of 4, 144 KiB at 13 rows)
DEEP_ATTN_STAGES = 8


def other_block(v: Variant, seq: int) -> Variant:
    """``v`` with the largest other cache block of ``SPACE`` that fits (itself where none does)."""
    fits = [b for b in SPACE["kv_block"] if b != v.kv_block and block_fits(v, b, seq)]
    if not fits:
        return v
    b = max(fits)
    return replace(v, kv_block=b, kv_split=stream_kv_split(b) if v.attn_stream else v.kv_split)


def deeper(knob: str, deep: int, default: int):
    """The flip of a depth or count: ``deep`` from the default, the default from any other."""
    return lambda v, seq: replace(v, **{knob: deep if getattr(v, knob) == default else default})


def other_warps(v: Variant, seq: int) -> Variant:
    """``v`` at the other warp count of ``WARPS``."""
    return replace(v, num_warps=WARPS[1] if v.num_warps == WARPS[0] else WARPS[0])


def other_split(v: Variant, seq: int) -> Variant:
    """K slices of the projections without a norm on (4, their reduce fused with the norm where
    the norm comes first) where ``v`` has none, else none."""
    split = 1 if v.split_k > 1 else 4
    return replace(v, split_k=split, reduce_norm=split > 1 and bool(v.norm_first))


def other_norm(v: Variant, seq: int) -> Variant:
    """The norms from their inputs' writers' sums of squares where ``v`` has none, norm first
    then too (without it there are no such writers, and the flip would change nothing:
    llama-3.2-1b's winners at 1-3 rows have the norm in the projections' loops), else none."""
    if v.norm_sums:
        return replace(v, norm_sums=False)
    return replace(v, norm_sums=True, norm_first=True)


def fused_reduce(v: Variant, seq: int) -> Variant:
    """K slices reducing their column groups themselves where ``v``'s do not (their reduce by
    rows with the norm, ``reduce_norm``, then the norm from sums of squares: a fused reduce
    writes them), else reduce tasks."""
    if v.fuse_reduce:
        return replace(v, fuse_reduce=False)
    if v.reduce_norm:
        return replace(v, fuse_reduce=True, reduce_norm=False, norm_sums=True)
    return replace(v, fuse_reduce=True)


# the interpreter ignores pipeline stages and prefetches; step sizes change only what streams
# at once, the dots' form how the warps share a step
GPU_ONLY_FLIPS = ("stage_kib", "attn_stages", "step_weights", "noinline", "prefetch_kv_ahead",
                  "attn_keys_m", "attn_rotate", "prefetch_last", "proj_rotate", "num_warps")
# knobs whose flip is not a switch's: (variant, context) -> the flipped variant
FLIPS = {"kv_block": other_block, "split_k": other_split, "norm_sums": other_norm,
         "fuse_reduce": fused_reduce, "num_warps": other_warps,
         "stage_kib": deeper("stage_kib", DEEP_STAGES_KIB, TileConfig.stage_kib),
         "attn_stages": deeper("attn_stages", DEEP_ATTN_STAGES, TileConfig.attn_stages),
         "step_weights": deeper("step_weights", 2, TileConfig.step_weights),
         "prefetch_kv_ahead": deeper("prefetch_kv_ahead", KV_AHEAD_KEYS, 0),
         "qkv_slices": deeper("qkv_slices", 2, TileConfig.qkv_slices)}
# flips that change how the registers are shared out: timed at each warp count of ``WARPS`` (on
# GPUs; the interpreter ignores warps). With calls, llama-3.2-1b's 4-warp variants won at 1-5, 13
# and 16 rows (5 rows: 0.941 ms against 0.972 for the best without, of 8 warps), and at 8, 17, 24
# and 32 rows where the best without was of 8 warps (17 rows 1.190 -> 1.160; with 8 warps 1.183),
# 8 warps with calls keeping to about 128 registers (sm_90 builds: 16 rows 153 -> 118). The K
# slices' flip at the other warp count never gained where the same flip at the variant's own
# did not (12 batch sizes; it lost 7-23% from 13 rows on), so it is timed at the variant's own.
RESHAPING = ("noinline",)


def warpgroup_mmas(dims, tile: TileConfig) -> bool:
    """Whether the projections' dots take 64 rows or more (the batch's rows as the tiles pad them,
    or weight rows as the dot's M): Hopper's warpgroup MMAs, which any call in the kernel
    serialises (ptxas C7510), so op bodies as calls are not built with them."""
    return not tile.gemv and (tile.swap_ab or dot_rows(dims, tile) >= 64)


def serialised(ops, v: Variant) -> bool:
    """Whether ``v`` has op bodies as calls beside warpgroup MMAs (never built: see above)."""
    return v.noinline and warpgroup_mmas(ops.dims, v.tile)


def flip(v: Variant, knob: str, seq: int) -> Variant:
    """``v`` with ``knob`` flipped (``FLIPS``, else a switch)."""
    if knob in FLIPS:
        return FLIPS[knob](v, seq)
    return replace(v, **{knob: not getattr(v, knob)})


def ranked(rows: list) -> list[Variant]:
    """The right variants of timed ``rows`` [(variant, ledger row)], fastest first (equal times:
    by label)."""
    return [v for *_, v in sorted((row["ms"], v.label, v) for v, row in rows
                                   if row["error"] is None)]


def refinement(ledger: Ledger, base: dict, batch: int, rows: list, refine: tuple[str, ...],
               model, max_seq_len: int, target: Target) -> list[tuple[Variant, float]]:
    """The batch size's fastest right variant with each ``refine`` knob flipped (``flip``), as
    it will be built, where that is a variant not timed yet: [(variant, predicted us)]; rated
    here, kept in the ledger's plans (a rerun rates nothing). ``base``: the ledger key's fields
    (model, context, device, code and rules versions)."""
    ok = ranked(rows)
    if not ok:
        return []
    best = ok[0]
    key = ledger.key(batch=batch, best=best.label, refine=list(refine), **base)
    if ledger.plan(key) is None:
        dtype = next(model.parameters()).dtype
        ledger.add_plan(key, _flips(model.config, dtype, batch, max_seq_len, target, best,
                                    refine, {u.label for u, _ in rows}))
    return ledger.plan(key)


def _flips(cfg, dtype, batch: int, seq: int, target: Target, v: Variant,
           refine: tuple[str, ...], labels: set[str]) -> list[tuple[Variant, float]]:
    """``v`` with each knob of ``refine`` flipped (as it will be built), rated, unless a
    variant of that label is timed already (``labels``)."""
    ops = op_graph(cfg, dtype, batch, seq)
    cpu = target.name == "cpu"
    skip = GPU_ONLY_FLIPS if cpu else ()      # the interpreter's are alike
    warps = lambda k, u: WARPS if k in RESHAPING and not cpu else (u.num_warps,)
    flipped = [effective(ops, replace(u, num_warps=w)) for k in refine if k not in skip
               for u in [flip(v, k, seq)] for w in warps(k, u)
               if not serialised(ops, u)
               and (cpu or warps_fit(w, -(-u.workers // target.sms)))]
    costs = op_costs(cfg, dtype, batch, seq)
    return [(u, predict(ops, u, target, memo=costs)) for u in dict.fromkeys(flipped)
            if u.label not in labels]


# the gaining flips of a refinement, besides its fastest, combined with it (``compound``; a
# gain whose changes the fastest holds already, such as calls at the other warp count, is passed
# over: in a cold autotune at 24 rows it took the slot of `ns`, whose compound with calls was
# then the fastest, 1.197 ms, too late for the second look to try `fs` on it):
# llama-3.2-1b on the H200, each batch size's winner with one more of its refinement's gains
# (ms): 48 rows `sw2` 1.518 -> with `sm200` too 1.485, 64 1.588 -> 1.562; in a cold autotune
# the compounds won at 8 rows (0.958), 17 (1.145 against the best single flip's 1.162), 48
# (1.476 against 1.517) and 64 (1.571 against 1.591)
COMPOUND = 2
# a first-round variant of another schedule class (not only other warps or calls) within this
# share of the refined one's time gets the refinement's gains too (``compound``): two cold
# autotunes of llama-3.2-1b at 48 rows timed the plain attention layout and groups of 4 kv heads
# 0.5% apart, once one first and once the other; each time only the first was refined, with
# the same gains (`sm200`, `sw2`), giving 1.485 ms with the groups and 1.535 without
TIE = 0.01


def compound(ledger: Ledger, base: dict, batch: int, start: Variant, rows: list, tried: list,
             model, max_seq_len: int, target: Target) -> list[tuple[Variant, float]]:
    """Where more than one of the refinement's flips (``tried``, of ``start``) beat ``start``,
    the fastest of them with each of the next ``COMPOUND`` fastest's changes (the fields that
    flip set on ``start``) set on it too, passing over those it holds already; where any gained
    and a first-round variant of another class came within ``TIE`` of ``start``
    (``runner_up``), that one with all those gains' changes (the faster's where two set one
    field). As they will be built, where not timed yet (nor a call beside warpgroup MMAs):
    [(variant, predicted us)], kept in the ledger's plans."""
    ms = {v.label: row["ms"] for v, row in rows if row["error"] is None}
    if start.label not in ms:
        return []
    gains = sorted((ms[u.label], u.label, u) for u, _ in tried
                   if u.label in ms and ms[u.label] < ms[start.label])
    on_fastest = lambda u: replace(gains[0][2], **changes(u, start))
    gains = gains[:1] + [g for g in gains[1:] if on_fastest(g[2]) != gains[0][2]][:COMPOUND]
    runner = runner_up(start, rows, tried, ms) if gains else None
    if len(gains) < 2 and runner is None:
        return []
    key = ledger.key(batch=batch, compound=[u.label for *_, u in gains],
                     runner=runner and runner.label, **base)
    if ledger.plan(key) is None:
        made = [on_fastest(u) for *_, u in gains[1:]]
        if runner is not None:
            made.append(replace(runner, **{k: v for *_, u in reversed(gains)
                                           for k, v in changes(u, start).items()}))
        ledger.add_plan(key, _rated(made, rows, model, batch, max_seq_len, target))
    return ledger.plan(key)


def changes(u: Variant, start: Variant) -> dict:
    """The fields of ``u`` that differ from ``start`` (what a flip or a compound set)."""
    return {f.name: getattr(u, f.name) for f in fields(Variant)
            if getattr(u, f.name) != getattr(start, f.name)}


def _rated(made: list[Variant], rows: list, model, batch: int, max_seq_len: int,
           target: Target) -> list[tuple[Variant, float]]:
    """``made`` as they will be built, less those timed already (``rows``) and calls beside
    warpgroup MMAs, each with its rating: [(variant, predicted us)]."""
    graph = (model.config, next(model.parameters()).dtype, batch, max_seq_len)
    ops = op_graph(*graph)
    made = [effective(ops, u) for u in made]
    timed = {v.label for v, _ in rows}
    made = [u for u in dict.fromkeys(made) if u.label not in timed and not serialised(ops, u)]
    return [(u, predict(ops, u, target, memo=op_costs(*graph))) for u in made]


# the refinement's near misses given a second look (``second_look``): the batch-1 winner of
# llama-3.2-1b on the H200 with `sm200`, whose flip had lost 0.2% on the first round's fastest
# (`nf0`), ms: 0.844 -> 0.829 in a sweep, 830.8 -> 821.9 us traced; never timed by the
# refinement, whose compounds take only the flips that gained; and gains the compounds left out
# (``COMPOUND`` take the fastest): at 17 rows the KV prefetch a task ahead gained 1.7% on the
# first round's fastest (8 warps, 1.1950 -> 1.1753 ms), fourth of six gains, and was never set on
# the winner (4 warps, calls, 1.1393), against which a sweep had timed it 1% faster
SECOND_LOOK = 3


def second_look(ledger: Ledger, base: dict, batch: int, start: Variant, rows: list,
                tried: list, model, max_seq_len: int,
                target: Target) -> list[tuple[Variant, float]]:
    """Where the refinement and its compounds made a faster variant than ``start`` (the
    first round's fastest), the flips of ``start`` (``tried``) that gained or missed by less
    than ``TIE`` (at most ``SECOND_LOOK``, the fastest first) made again on that fastest: each
    flip's changes set on it where they add to what the fastest changed itself and set none
    of its fields otherwise (``news``). As they will be built, where not timed yet: [(variant,
    predicted us)], kept in the ledger's plans."""
    ms = {v.label: row["ms"] for v, row in rows if row["error"] is None}
    ok = ranked(rows)
    if start.label not in ms or not ok or ok[0] == start:
        return []
    best = ok[0]
    own = changes(best, start)
    near = sorted((ms[u.label], u.label, u) for u, _ in tried if u.label in ms and u != best
                  and ms[u.label] <= ms[start.label] * (1 + TIE)
                  and news(changes(u, start), own))[:SECOND_LOOK]
    if not near:
        return []
    key = ledger.key(batch=batch, second=[u.label for *_, u in near], best=best.label, **base)
    if ledger.plan(key) is None:
        made = [replace(best, **changes(u, start)) for *_, u in near]
        ledger.add_plan(key, _rated(made, rows, model, batch, max_seq_len, target))
    return ledger.plan(key)


def news(flipped: dict, own: dict) -> bool:
    """Whether a flip's changes (``flipped``) add to a faster variant's own (``own``): some field
    it does not hold, none it set to another value. (A flip that needs another knob with it
    shares that knob with a faster variant that has it: llama-3.2-1b at 32 rows on the H200,
    the K slices' fused reduce, flipped with the norm from sums of squares on a variant
    without, was left out beside the winner, which had those sums already; a sweep timed it
    on the winner 1.234 -> 1.219 ms.)"""
    return (any(k not in own for k in flipped)
            and all(own.get(k, v) == v for k, v in flipped.items()))


def runner_up(start: Variant, rows: list, tried: list, ms: dict) -> Variant | None:
    """The fastest variant of the first round (``rows`` not among the refinement's ``tried``,
    none faster than ``start``, its fastest) that differs from ``start`` in more than warps and
    calls, where it came within ``TIE`` of ``start`` (``ms``: label -> ms of the right ones)."""
    flips = {u.label for u, _ in tried}
    alike = lambda u: replace(u, num_warps=start.num_warps, noinline=start.noinline) == start
    near = sorted((ms[u.label], u.label, u) for u, _ in rows
                  if u.label in ms and u.label not in flips and not alike(u)
                  and ms[start.label] <= ms[u.label] <= ms[start.label] * (1 + TIE))
    return near[0][2] if near else None
