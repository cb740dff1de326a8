"""Autotune: for each batch size, search kernel variants, rank them with the cost model, time the
best on the device, keep the fastest.

    autotune(model, name, batch_sizes, max_seq_len, folder) -> list[Winner]

Search space (``SPACE``): projection step ``block_n x block_k``, pipeline stages, warps, programs
per SM, keys per attention task, the attention task limit, tasks per q/k/v head, split head-norm
heads, K slices of the projections without a norm, norm first (and the K slices' reduce fused with
it), streamed attention, attention tasks over pairs of kv heads, cache blocks (16 keys, or 128: one
block-table entry per attention step, where the keys per task are whole blocks), KV prefetch and
the cap on each task's L2 prefetch of its weights (only the defaults of these two in ``SPACE``, as
measured on the H200 with llama-3.2-1b: KV prefetch at most 1% faster at 1 to 8 rows and slower
from 13 on, in the autotune ledger bench/results/session-2026-11-30g/autotune-12.json; the cap's
256 KiB slower than 64 at every size, 16 and 32 no faster at batch 1; a space given by the caller
may hold others). Variants whose pipeline stages cannot fit in shared memory, or whose cache block
does not divide the context, are dropped. The knobs that shape the task graph (``schedule_class``)
are rated by the cost model's estimate of their tasks (tiling only, no code generated); the
default's class, the ``classes`` best and, per attention layout, the class nearest the default,
each also with the K slices' reduce fused with the norm or not (``shortlist``), each crossed with
every code-level knob (block_k, stages, warps, KV prefetch, prefetch cap) with the largest cache
block that fits (``largest_blocks``), are compiled and built side by side (``processes`` at once,
as is the rating of each batch size: Triton builds one kernel per process), each timed as soon as
it is built while the later ones build (one after another, in plan order: a decode step at position
``max_seq_len - 1``, median of ``iters``), each step's logits checked against the eager model's on
the same step: a variant farther than ``max_rel_err`` (relative norm) is recorded as wrong and
never kept. Then each batch size's fastest is timed again with each knob of ``refine`` flipped
(``REFINE``: balanced projection spans, the cache block, deeper projection pipelines, the K
slices of o and down at each warp count), where that builds another variant. Last, the ``finalists`` fastest right variants
of each batch size are timed again side by side in ``final_rounds`` interleaved rounds
(``finals``), and the winner is the fastest there.
Persisted under ``folder``: ``autotune.json`` with every measurement (model hash, batch size,
device, code version, variant) and each batch size's shortlist (kept while the rules that made
it, ``rules_hash``, stay the same), so a rerun times only what is missing, and each batch size's
winner as a compiled artifact in ``folder/b{B}`` (the layout ``megakernel compile`` writes, which
``KernelLibrary`` serves). A variant that fails to build, to fit or to finish is recorded with its
error and skipped.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from megakernel.compiler.artifact import (cache_key, code_hash, compile_cached, model_hash, save,
                                          saved_key)
from megakernel.compiler.capture import capture
from megakernel.compiler.cost import TARGETS, Target, op_waves_us
from megakernel.compiler.lower import lower
from megakernel.compiler.pipeline import CompileOptions
from megakernel.compiler.tile import TILERS, TileConfig, Tiler

from .fanout import fan_out, worker_pool
from .finals import FINAL_ROUNDS, FINALISTS, final_round
from .ledger import Ledger
from .variant import Variant, effective, stream_kv_split

SPACE = {"block_n": (32, 64, 128), "block_k": (256, 512), "stages": (3,), "num_warps": (4, 8),
         "workers_per_sm": (1, 2), "kv_split": (32, 64, 128), "qkv_parts": (1, 2, 4),
         "split_head_norm": (False, True), "attn_tasks_per_worker": (1, 2, 4),
         "split_k": (1, 4), "norm_first": (False, True), "reduce_norm": (False, True),
         "prefetch_kv": (CompileOptions.prefetch_kv,),
         "prefetch_kb": (CompileOptions.prefetch_kb,), "attn_stream": (False, True),
         "kv_block": (16, 128), "attn_pairs": (False, True), "attn_group": (2, 4)}
OPTIONAL = {"split_head_norm": TileConfig.split_head_norm,     # the value where a space has none
            "attn_tasks_per_worker": TileConfig.attn_tasks_per_worker,
            "split_k": TileConfig.split_k, "norm_first": TileConfig.norm_first,
            "reduce_norm": TileConfig.reduce_norm,
            "prefetch_kv": CompileOptions.prefetch_kv,
            "prefetch_kb": CompileOptions.prefetch_kb, "attn_stream": TileConfig.attn_stream,
            "kv_block": TileConfig.kv_block, "attn_pairs": TileConfig.attn_pairs,
            "attn_group": TileConfig.attn_group}
# Knobs flipped one at a time on each batch size's fastest variant, once the shortlist is timed
# (``_refinement``; a knob's companions take its new value too): projection tasks in near-equal
# spans that fill whole waves of workers (llama-3.1-8b on the H200 at batch 1: 4.192 -> 4.132 ms,
# 132 tasks of gate_up, o and down instead of 128; llama-3.2-1b: the winner at 1 and 13 rows,
# within 1% elsewhere), the cache block (the shortlist times the largest that fits), deeper
# projection pipelines (``TileConfig.stage_kib``; llama-3.2-1b, tuned ms: 64 rows 1.749 -> 1.704,
# 48 1.655 -> 1.634, won at 5 and 32 rows too, 0.5-3.4% slower elsewhere) and the K slices of o
# and down (on, their reduce fused with the norm where it comes first, or off; at each warp
# count, ``RESHAPING``): the cost model rates them against the measurements at 8 rows (4 slices
# fused 0.997 ms with 8 warps, 1.033 with 4; none 1.037 / 1.030; rated 1153 us against 1078),
# so the shortlists of 1 to 5 rows hold none. A deeper attention pipeline (``attn_stages``: 8
# stages, three buffers of keys and values) lost at all 12 batch sizes (0.2-4.9%), pairs of kv
# heads over key ranges (``attn_pair_ranges``, flipped with at most half the context per range)
# at each of the five where they applied (llama-3.2-1b, ms: 3 rows 0.916 -> 0.951, 5 1.009 ->
# 1.063, 8 1.000 -> 1.058, 13 1.080 -> 1.115, 16 1.084 -> 1.208): both left the refinement.
REFINE = ("balance", "kv_block", "stage_kib", "split_k")
COMPANIONS = {"attn_pair_ranges": ("attn_pairs",)}
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
    """The flip of a pipeline depth: ``deep`` from the default, the default from any other."""
    return lambda v, seq: replace(v, **{knob: deep if getattr(v, knob) == default else default})


def other_split(v: Variant, seq: int) -> Variant:
    """K slices of the projections without a norm on (4, their reduce fused with the norm where
    the norm comes first) where ``v`` has none, else none."""
    split = 1 if v.split_k > 1 else 4
    return replace(v, split_k=split, reduce_norm=split > 1 and bool(v.norm_first))


GPU_ONLY_FLIPS = ("stage_kib", "attn_stages")   # the interpreter ignores pipeline stages
# knobs whose flip is not a switch's: (variant, context) -> the flipped variant
FLIPS = {"kv_block": other_block, "split_k": other_split,
         "stage_kib": deeper("stage_kib", DEEP_STAGES_KIB, TileConfig.stage_kib),
         "attn_stages": deeper("attn_stages", DEEP_ATTN_STAGES, TileConfig.attn_stages)}
# flips that change the shape of every task of some ops: timed at each warp count of ``SPACE``
# (on GPUs; the interpreter ignores warps)
RESHAPING = ("split_k",)


def flip(v: Variant, knob: str, seq: int) -> Variant:
    """``v`` with ``knob`` flipped (``FLIPS``, else a switch), and its companions set to the
    knob's new value; key ranges turned on (``attn_pair_ranges``) hold at most half of the
    ``seq`` keys."""
    if knob in FLIPS:
        return FLIPS[knob](v, seq)
    value = not getattr(v, knob)
    u = replace(v, **{k: value for k in (knob, *COMPANIONS.get(knob, ()))})
    if knob == "attn_pair_ranges" and value:
        u = replace(u, kv_split=min(u.kv_split, seq // 2))
    return u


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


@dataclass(frozen=True)
class Winner:
    batch: int
    label: str
    ms: float
    predicted_us: float
    timed: int          # variants timed and right for this batch size (this run and earlier)
    failed: int         # variants that failed to build, fit or finish, or gave wrong logits


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
        # a register file holds 8 warps of 255 registers (what these kernels take on sm_90);
        # the interpreter has one program per SM and no prefetch
        cpu = target.name == "cpu"
        gpu_only = k["prefetch_kv"] or k["prefetch_kb"] != OPTIONAL["prefetch_kb"]
        if smem * per_sm > target.smem_bytes or (cpu and (per_sm > 1 or gpu_only)) \
                or per_sm * warps > 8:
            continue
        if k["kv_split"] % k["kv_block"]:        # keys per task in whole cache blocks
            if not k["attn_stream"]:
                continue
            k["kv_split"] = stream_kv_split(k["kv_block"])
        out.append(Variant(bn, bk, warps, per_sm * target.sms, stages=st, **k))
    return out


SCHEDULE_FIELDS = ("block_n", "workers", "kv_split", "qkv_parts", "split_head_norm",
                   "attn_tasks_per_worker", "split_k", "norm_first", "reduce_norm",
                   "attn_balance", "attn_stream", "qkv_cross", "attn_pairs", "attn_group")


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


def predict(ops, v: Variant, target: Target, alike: list | None = None) -> float:
    """Estimated step time (us) of the variant's tasks under the cost model (whose estimate adds
    up op by op, so each group of ``alike_ops`` is tiled once)."""
    per_sm = -(-v.workers // target.sms)
    total = 0.0
    for op, count in alike if alike is not None else alike_ops(ops):
        tiler = Tiler(ops, v.tile, v.workers)
        TILERS[op.kind](tiler, op)
        total += count * op_waves_us(tiler.tasks, replace(target, workers_per_sm=per_sm),
                                     v.workers)
    return total


def shortlist(ops, target: Target, space: dict, classes: int) -> list[tuple[Variant, float]]:
    """The default variant, then every code-level knob of the default's schedule class, of the
    ``classes`` best-rated classes (equal ratings: the class nearer the default first) and, for
    each attention layout (keys per task, balanced, streamed, pairs or groups of 4 kv heads; at
    64 rows groups of 4 took 1.751 ms against pairs' 1.845) at the default's workers, of the
    class nearest the default (equally near: the better rated); and of each of
    these classes with the K slices' reduce fused with the norm where it was not, or not where it
    was (``fused_sibling``; llama-3.2-1b on the H200, each batch size's winner -> fused, ms: 13
    rows 1.120 -> 1.092, 17 1.296 -> 1.270, 24 1.320 -> 1.293, 32 1.349 -> 1.324, 64 1.902 ->
    1.839, 16 1.101 -> 1.145; the rules before timed it only at 64 rows). The cost model rates
    attention least well: llama-3.2-1b on the H200 at 16 rows, 1024 keys per task 1.130 ms against
    512 1.250, rated the other way round; at 13 rows the default with 1024 keys 1.153, the
    best-rated class with 1024 keys (no K slices) 1.267."""
    variants = largest_blocks(list(dict.fromkeys(
        effective(ops, v) for v in candidates(target, space)
        if block_fits(v, v.kv_block, ops.dims.max_seq_len))))
    rated, alike = {}, alike_ops(ops)
    for v in variants:
        if schedule_class(v) not in rated:
            rated[schedule_class(v)] = predict(ops, v, target, alike)
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
                                v.attn_group),
                               schedule_class(v))
    picked = dict.fromkeys([home, *sorted(rated, key=rank)[:classes], *layouts.values()])
    picked |= dict.fromkeys(k for k in map(fused_sibling, list(picked)) if k in rated)
    picks = [(default, predict(ops, default, target))]
    picks += [(v, rated[k]) for k in picked if k in rated for v in variants
              if schedule_class(v) == k and v != default]
    return picks


def time_variant(model, name: str, opts: CompileOptions, root: Path, iters: int,
                 state: tuple, expected: torch.Tensor) -> tuple[float, float]:
    """Median ms of one decode step on ``state`` = (tokens, positions, cache) of the batch,
    and the relative distance of that step's logits from ``expected`` (eager's)."""
    from megakernel.bench.decode import median_step_ms
    from megakernel.bench.sweep import rel_err

    from .megakernel import MegakernelStep

    compiled, _ = compile_cached(model, opts, name, root)
    tokens, positions, cache = state
    step = MegakernelStep(compiled, model, cache)
    with torch.inference_mode():
        ms = median_step_ms(lambda: step(tokens, positions, cache), cache.device,
                            min(3, iters), iters)
        err = rel_err(step(tokens, positions, cache), expected)
    step.synchronize()
    return ms, err


def step_inputs(model, batch: int, max_seq_len: int) -> tuple:
    """(state, expected): one decode step's (tokens, positions, cache) at position
    ``max_seq_len - 1`` and the eager model's fp32 logits [B, V] of it (which writes the same
    cache slot every variant's step writes)."""
    from megakernel.bench.decode import decode_state

    state = decode_state(model, batch, max_seq_len)
    with torch.inference_mode():
        return state, model(*state).float()


def wrong(rel_err: float, max_rel_err: float) -> str | None:
    """Why a variant's logits are rejected (NaN included), or None."""
    if rel_err <= max_rel_err:
        return None
    return f"wrong logits: relative distance {rel_err:.2e} from eager's (at most {max_rel_err})"


def measure(model, name: str, opts: CompileOptions, root: Path, iters: int, inputs: tuple,
            max_rel_err: float) -> dict:
    """A variant's ledger fields: ms, its logits' distance from eager's and the error that
    rejects it (wrong logits, or a kernel that cannot fit or finish)."""
    try:
        ms, err = time_variant(model, name, opts, root, iters, *inputs)
        return dict(ms=ms, rel_err=err, error=wrong(err, max_rel_err))
    except Exception as err:  # a variant that cannot fit or finish: skip it
        return dict(ms=None, error=f"{type(err).__name__}: {err}"[:300])


def _prepare(job) -> str | None:
    """In a worker process: compile one variant (into the artifact cache) and build its kernel
    (into Triton's cache); the error, if any."""
    from megakernel.models.weights import empty_model

    from .megakernel import build_ahead

    cfg, dtype, name, opts, root, device = job
    try:
        compiled, _ = compile_cached(empty_model(cfg).to(dtype), opts, name, Path(root))
        build_ahead(compiled, dtype, device)
        return None
    except Exception as err:  # reported with the variant, which is then not timed
        return f"{type(err).__name__}: {err}"[:300]


def _plan(job) -> list[tuple[Variant, float]]:
    """In a worker process: the shortlist of one batch size."""
    from megakernel.models.weights import empty_model

    cfg, dtype, batch, seq, target, space, classes = job
    model = empty_model(cfg).to(dtype)
    ops = lower(capture(model, batch, seq), model.lm_head.weight.element_size())
    return shortlist(ops, TARGETS[target], space, classes)


def rules_hash() -> str:
    """The modules that decide a shortlist (this one, and ``variant`` with ``effective``): a
    plan kept in the ledger under other rules is rated again."""
    h = hashlib.sha256()
    for path in (Path(__file__), Path(__file__).with_name("variant.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _plans(ledger: Ledger, model, batch_sizes, max_seq_len, target, space, classes, processes,
           base: dict) -> dict:
    """Each batch size's shortlist: from the ledger, else rated (in worker processes) and kept."""
    key = {b: ledger.key(batch=b, space=space, classes=classes, target=target.name,
                         rules=rules_hash(), **base) for b in batch_sizes}
    plans = {b: ledger.plan(key[b]) for b in batch_sizes}
    todo = [b for b in batch_sizes if plans[b] is None]
    dtype = next(model.parameters()).dtype
    rated = fan_out(_plan, [(model.config, dtype, b, max_seq_len, target.name, space, classes)
                            for b in todo], processes)
    for b, picks in zip(todo, rated):
        ledger.add_plan(key[b], picks)
        plans[b] = picks
    return plans


def autotune(model, name: str, batch_sizes: list[int], max_seq_len: int, folder: Path,
             space: dict = SPACE, classes: int = 2, iters: int = 20, progress: bool = True,
             cache_root: Path | None = None, processes: int = 1,
             max_rel_err: float = 0.1, refine: tuple[str, ...] = REFINE,
             finalists: int = FINALISTS, final_rounds: int = FINAL_ROUNDS) -> list[Winner]:
    from tqdm import tqdm

    from megakernel.interpreter import kernel_target

    from .megakernel import cache_dir

    device = next(model.parameters()).device
    target = TARGETS[kernel_target(device.type)]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    ledger, root = Ledger(folder / "autotune.json"), cache_root or cache_dir() / "artifacts"
    base = dict(model=model_hash(model), seq=max_seq_len, device=gpu, code=code_hash())
    dtype = next(model.parameters()).dtype
    plans = _plans(ledger, model, batch_sizes, max_seq_len, target, space, classes, processes,
                   base)
    bar = tqdm(total=sum(map(len, plans.values())), desc="autotune", disable=not progress)
    opts = lambda b, v: CompileOptions(b, max_seq_len, target=target.name,
                                       **v.options(target.sms))
    key = lambda b, v: ledger.key(batch=b, variant=v.label, **base)

    def submit(pool, b: int, v: Variant):
        return pool.submit(_prepare, (model.config, dtype, name, opts(b, v), str(root),
                                      device.type))

    def build(pool, b: int, picks: list) -> dict:
        """The builds of the picks not in the ledger yet, asked of the pool: {label: future}."""
        return {v.label: submit(pool, b, v) for v, _ in picks if ledger.get(key(b, v)) is None}

    def timed(b: int, picks: list, builds: dict) -> list:
        """[(variant, ledger row)] of the picks, each timed once its build is done."""
        inputs, out = None, []                 # one set of decode inputs serves every variant
        for v, predicted in picks:
            row = ledger.get(key(b, v))
            if row is None:
                failed = builds[v.label].result()
                if failed:
                    fields = dict(ms=None, error=failed)
                else:
                    inputs = inputs or step_inputs(model, b, max_seq_len)
                    fields = measure(model, name, opts(b, v), root, iters, inputs, max_rel_err)
                row = ledger.add(key(b, v), batch=b, variant=v.label, predicted_us=predicted,
                                 **fields)
            out.append((v, row))
            bar.update()
        return out

    def final_picks(b: int) -> tuple[str, list[Variant]]:
        """The ledger key and variants of the batch size's final round: its ``finalists``
        fastest right variants (none where fewer than 2 are right)."""
        ok = sorted((row["ms"], v.label, v) for v, row in rows[b] if row["error"] is None)
        picks = [v for *_, v in ok[:finalists]] if final_rounds >= 1 else []
        picks = picks if len(picks) >= 2 else []
        return ledger.key(batch=b, finals=[v.label for v in picks], rounds=final_rounds,
                          iters=iters, **base), picks

    def final(b: int, final_key: str, picks: list, builds: list) -> dict:
        """{label: ms} of the final round, once its variants are built (in the pool: a rerun
        that resumes on another machine builds them there side by side, not here in turn)."""
        for job in builds:
            job.result()
        return final_round(ledger, final_key, model, name, [(v.label, opts(b, v)) for v in picks],
                           root, iters, final_rounds,
                           lambda: step_inputs(model, b, max_seq_len)[0]) if picks else {}

    # every build asked at once; each batch size timed in turn as its builds come, its
    # refinement then rated and asked for, and timed once the shortlists are; then the finals
    with worker_pool(processes) as pool:
        builds = {b: build(pool, b, picks) for b, picks in plans.items()}
        rows, more = {}, {}
        for b, picks in plans.items():
            rows[b] = timed(b, picks, builds[b])
            more[b] = _refinement(ledger, base, b, rows[b], refine, model, max_seq_len, target)
            bar.total += len(more[b])
            builds[b] |= build(pool, b, more[b])
        for b in plans:
            rows[b] += timed(b, more[b], builds[b])
        finals = {b: final_picks(b) for b in plans}
        ready = {b: [submit(pool, b, v) for v in picks] for b, (fk, picks) in finals.items()
                 if ledger.final(fk) is None}
        times = {b: final(b, *finals[b], ready.get(b, [])) for b in plans}
    bar.close()
    return [_keep_winner(model, name, b, max_seq_len, target, rows[b], times[b], folder, root)
            for b in plans]


def _refinement(ledger: Ledger, base: dict, batch: int, rows: list, refine: tuple[str, ...],
                model, max_seq_len: int, target: Target) -> list[tuple[Variant, float]]:
    """The batch size's fastest right variant with each ``refine`` knob flipped (``flip``), as
    it will be built, where that is a variant not timed yet: [(variant, predicted us)]; rated
    here, kept in the ledger's plans (a rerun rates nothing)."""
    ok = [(row["ms"], v.label, v) for v, row in rows if row["error"] is None]
    if not ok:
        return []
    best = min(ok)[2]
    key = ledger.key(batch=batch, best=best.label, refine=list(refine), rules=rules_hash(),
                     **base)
    if ledger.plan(key) is None:
        dtype = next(model.parameters()).dtype
        ledger.add_plan(key, _flips(model.config, dtype, batch, max_seq_len, target, best,
                                    refine, {u.label for u, _ in rows}))
    return ledger.plan(key)


def _flips(cfg, dtype, batch: int, seq: int, target: Target, v: Variant,
           refine: tuple[str, ...], labels: set[str]) -> list[tuple[Variant, float]]:
    """``v`` with each knob of ``refine`` flipped (as it will be built), rated, unless a
    variant of that label is timed already (``labels``)."""
    from megakernel.models.weights import empty_model

    model = empty_model(cfg).to(dtype)
    ops = lower(capture(model, batch, seq), model.lm_head.weight.element_size())
    cpu = target.name == "cpu"
    skip = GPU_ONLY_FLIPS if cpu else ()      # the interpreter's are alike
    warps = lambda k: SPACE["num_warps"] if k in RESHAPING and not cpu else (None,)
    flipped = [effective(ops, replace(u, num_warps=w or u.num_warps))
               for k in refine if k not in skip for u in [flip(v, k, seq)] for w in warps(k)]
    return [(u, predict(ops, u, target)) for u in dict.fromkeys(flipped) if u.label not in labels]


def _keep_winner(model, name, batch, max_seq_len, target, rows, finals, folder,
                 root) -> Winner:
    """The fastest right variant (by the final round's figures where there was one), saved
    as ``folder/b{batch}``."""
    ok = [(finals.get(v.label, row["ms"]), v.label, v, row) for v, row in rows
          if row["error"] is None]
    if not ok:
        raise RuntimeError(f"autotune: every variant failed at batch {batch}: "
                           f"{rows[0][1]['error']}")
    ms, label, v, row = min(x for x in ok if not finals or x[1] in finals)
    opts = CompileOptions(batch, max_seq_len, target=target.name, **v.options(target.sms))
    key = cache_key(model, opts)
    if saved_key(folder / f"b{batch}") != key:            # a warm rerun keeps what is there
        compiled, _ = compile_cached(model, opts, name, root)
        save(compiled, model, folder / f"b{batch}", key)
    return Winner(batch, label, ms, row["predicted_us"], len(ok), len(rows) - len(ok))
