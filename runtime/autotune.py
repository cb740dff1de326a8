"""Autotune: for each batch size, search kernel variants, rank them with the cost model, time the
best on the device, keep the fastest.

    autotune(model, name, batch_sizes, max_seq_len, folder) -> list[Winner]

Each batch size's shortlist (``search.shortlist``: the cost model's best schedule classes, each
crossed with the code-level knobs) is compiled and built side by side (``processes`` at once, as
is the rating of each batch size: Triton builds one kernel per process), each variant timed as
soon as it is built while the later ones build (one after another, in plan order: a decode step
at position ``max_seq_len - 1``, median of ``iters``), each step's logits checked against the
eager model's on the same step: a variant farther than ``max_rel_err`` (relative norm) is
recorded as wrong and never kept. Then each batch size's fastest is timed again with each knob of
``refine`` flipped (``REFINE``: balanced projection spans, the cache block, deeper projection
pipelines, the K slices of o and down at each warp count, deeper one-matrix steps, norms from
the reduces' sums of squares, op bodies as calls at each warp count), where that builds another
variant.
Last, the ``finalists`` fastest right variants of each batch size are timed again side by side in
``final_rounds`` interleaved rounds (``finals``), and the winner is the fastest there.
Persisted under ``folder``: ``autotune.json`` with every measurement (model hash, batch size,
device, code version, variant) and each batch size's shortlist (kept while the rules that made
it, ``rules_hash``, stay the same), so a rerun times only what is missing, and each batch size's
winner as a compiled artifact in ``folder/b{B}`` (the layout ``megakernel compile`` writes, which
``KernelLibrary`` serves). A variant that fails to build, to fit or to finish is recorded with its
error and skipped.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from megakernel.compiler.artifact import (cache_key, code_hash, compile_cached, model_hash, save,
                                          saved_key)
from megakernel.compiler.capture import capture
from megakernel.compiler.cost import TARGETS, Target
from megakernel.compiler.lower import lower
from megakernel.compiler.pipeline import CompileOptions
from megakernel.compiler.registry import rows
from megakernel.compiler.tile import TileConfig

from .fanout import fan_out, worker_pool
from .finals import FINAL_ROUNDS, FINALISTS, final_round
from .ledger import Ledger
from .measure import measure, step_inputs
from .search import SPACE, block_fits, predict, shortlist
from .variant import Variant, effective, stream_kv_split

# Knobs flipped one at a time on each batch size's fastest variant, once the shortlist is timed
# (``_refinement``; a knob's companions take its new value too): projection tasks in near-equal
# spans that fill whole waves of workers (llama-3.1-8b on the H200 at batch 1: 4.192 -> 4.132 ms,
# 132 tasks of gate_up, o and down instead of 128; llama-3.2-1b: the winner at 1 and 13 rows, within
# 1% elsewhere), the cache block (the shortlist times the largest that fits), deeper projection
# pipelines (``TileConfig.stage_kib``; llama-3.2-1b, tuned ms: 64 rows 1.749 -> 1.704, 48 1.655 ->
# 1.634, won at 5 and 32 rows too, 0.5-3.4% slower elsewhere) and the K slices of o and down (on,
# their reduce fused with the norm where it comes first, or off; at each warp count, ``RESHAPING``):
# the cost model rates them against the measurements at 8 rows (4 slices fused 0.997 ms with 8
# warps, 1.033 with 4; none 1.037 / 1.030; rated 1153 us against 1078), so the shortlists of 1 to 5
# rows hold none (4 fused slices won at 5 rows: 0.976 ms against 1.008); one-matrix steps as deep as
# gate_up's (``TileConfig.step_weights``: lm_head's; won at 8-64 rows, 48 rows 1.660 -> 1.603 ms);
# and the K slices' reduces writing their rows' sums of squares (and x times the norm weight) for
# the next op's norm instead of a norm phase (``TileConfig.norm_sums``; sweeps against each winner,
# ms: 5 rows 0.980 -> 0.966, 8 0.990 -> 0.980, 13 1.090 -> 1.080; lost at 16, 17, 24, 32 and 64).
# A deeper attention pipeline (``attn_stages``: 8 stages, three buffers of keys and values) lost
# at all 12 batch sizes (0.2-4.9%), pairs of kv heads over key ranges (``attn_pair_ranges``,
# flipped with at most half the context per range) at each of the five where they applied
# (llama-3.2-1b, ms: 3 rows 0.916 -> 0.951, 5 1.009 -> 1.063, 8 1.000 -> 1.058, 13 1.080 -> 1.115,
# 16 1.084 -> 1.208): both left the refinement. Op bodies as functions of their own
# (``noinline``): each gets its own registers, where one dispatch holds them all (sm_90 builds of
# llama-3.2-1b's winners at 1 and 3 rows: 255 registers and 44-60 bytes of spills -> 198 and none;
# on the H200, final rounds: 1 row 0.870 -> 0.852 ms, 2 0.896 -> 0.863, 13 1.075 -> 1.034). Any
# call serialises a kernel's warpgroup MMAs (ptxas C7510; 64-row dots, from 48 rows on): 64
# rows 1.600 -> 1.954 ms.
REFINE = ("balance", "kv_block", "stage_kib", "split_k", "step_weights", "norm_sums",
          "noinline")
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


# the interpreter ignores pipeline stages; step sizes change only what streams at once
GPU_ONLY_FLIPS = ("stage_kib", "attn_stages", "step_weights", "noinline")
# knobs whose flip is not a switch's: (variant, context) -> the flipped variant
FLIPS = {"kv_block": other_block, "split_k": other_split,
         "stage_kib": deeper("stage_kib", DEEP_STAGES_KIB, TileConfig.stage_kib),
         "attn_stages": deeper("attn_stages", DEEP_ATTN_STAGES, TileConfig.attn_stages),
         "step_weights": deeper("step_weights", 2, TileConfig.step_weights)}
# flips that change the shape of every task of some ops, or how the registers are shared out:
# timed at each warp count of ``SPACE`` (on GPUs; the interpreter ignores warps). With calls,
# llama-3.2-1b's 4-warp variants won at 1-5, 13 and 16 rows (5 rows: 0.941 ms against 0.972 for
# the best without, of 8 warps), while calls at 8 warps lost at 8, 17 and 32 rows by about 1%
# (sm_90 builds of 8-warp variants with calls keep to about 128 registers: 16 rows 153 -> 118)
RESHAPING = ("split_k", "noinline")


def warpgroup_mmas(dims, tile: TileConfig) -> bool:
    """Whether the projections' dots take 64 rows or more (the batch's rows as the tiles pad them,
    or weight rows as the dot's M): Hopper's warpgroup MMAs, which any call in the kernel
    serialises (ptxas C7510), so op bodies as calls are not built with them."""
    return not tile.gemv and (tile.swap_ab or rows(dims, tile) >= 64)


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


@dataclass(frozen=True)
class Winner:
    batch: int
    label: str
    ms: float
    predicted_us: float
    timed: int          # variants timed and right for this batch size (this run and earlier)
    failed: int         # variants that failed to build, fit or finish, or gave wrong logits


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
    """The modules that decide a shortlist or a refinement (``search``, this one, and
    ``variant`` with ``effective``): a plan kept in the ledger under other rules is rated
    again."""
    h = hashlib.sha256()
    for path in (Path(__file__).with_name(f"{name}.py") for name in ("search", "autotune",
                                                                     "variant")):
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

    if iters < 1:
        raise ValueError(f"iters={iters}: each variant needs at least one timed step")
    device = next(model.parameters()).device
    target = TARGETS[kernel_target(device.type)]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    ledger, root = Ledger(folder / "autotune.json"), cache_root or cache_dir() / "artifacts"
    base = dict(model=model_hash(model), seq=max_seq_len, device=gpu, code=code_hash())
    plans = _plans(ledger, model, batch_sizes, max_seq_len, target, space, classes, processes,
                   base)
    bar = tqdm(total=sum(map(len, plans.values())), desc="autotune", disable=not progress)
    run = _Tuning(model, name, max_seq_len, target, ledger, base, root, iters, max_rel_err, bar,
                  finalists, final_rounds)
    with worker_pool(processes) as pool:
        rows, times = _time_all(run, pool, plans, refine)
    bar.close()
    return [_keep_winner(run, b, rows[b], times[b], folder) for b in plans]


def _time_all(run: _Tuning, pool, plans: dict, refine: tuple[str, ...]) -> tuple[dict, dict]:
    """Every build asked at once; each batch size timed in turn as its builds come, its
    refinement then rated and asked for, and timed once the shortlists are; then the finals.
    Returns ({batch: [(variant, ledger row)]}, {batch: {label: final ms}})."""
    builds = {b: run.build(pool, b, picks) for b, picks in plans.items()}
    rows, more = {}, {}
    for b, picks in plans.items():
        rows[b] = run.timed(b, picks, builds[b])
        more[b] = _refinement(run.ledger, run.base, b, rows[b], refine, run.model,
                              run.max_seq_len, run.target)
        run.bar.total += len(more[b])
        builds[b] |= run.build(pool, b, more[b])
    for b in plans:
        rows[b] += run.timed(b, more[b], builds[b])
    finals = {b: run.final_picks(b, rows[b]) for b in plans}
    ready = {b: [run.submit(pool, b, v) for v in picks] for b, (fk, picks) in finals.items()
             if run.ledger.final(fk) is None}
    return rows, {b: run.final(b, *finals[b], ready.get(b, [])) for b in plans}


@dataclass
class _Tuning:
    """What the steps of one ``autotune`` call share: the model, the target, the ledger and the
    fields of its keys, the artifacts' root, the timing settings and the progress bar."""
    model: object
    name: str
    max_seq_len: int
    target: Target
    ledger: Ledger
    base: dict
    root: Path
    iters: int
    max_rel_err: float
    bar: object
    finalists: int
    final_rounds: int

    def opts(self, b: int, v: Variant) -> CompileOptions:
        return CompileOptions(b, self.max_seq_len, target=self.target.name,
                              **v.options(self.target.sms))

    def key(self, b: int, v: Variant) -> str:
        return self.ledger.key(batch=b, variant=v.label, **self.base)

    def submit(self, pool, b: int, v: Variant):
        """Ask the pool to compile and build variant ``v`` of batch ``b`` (``_prepare``)."""
        w = next(self.model.parameters())
        return pool.submit(_prepare, (self.model.config, w.dtype, self.name, self.opts(b, v),
                                      str(self.root), w.device.type))

    def build(self, pool, b: int, picks: list) -> dict:
        """The builds of the picks not in the ledger yet, asked of the pool: {label: future}."""
        return {v.label: self.submit(pool, b, v) for v, _ in picks
                if self.ledger.get(self.key(b, v)) is None}

    def timed(self, b: int, picks: list, builds: dict) -> list:
        """[(variant, ledger row)] of the picks, each timed once its build is done."""
        inputs, out = None, []                 # one set of decode inputs serves every variant
        for v, predicted in picks:
            row = self.ledger.get(self.key(b, v))
            if row is None:
                failed = builds[v.label].result()
                if failed:
                    fields = dict(ms=None, error=failed)
                else:
                    inputs = inputs or step_inputs(self.model, b, self.max_seq_len)
                    fields = measure(self.model, self.name, self.opts(b, v), self.root,
                                     self.iters, inputs, self.max_rel_err)
                row = self.ledger.add(self.key(b, v), batch=b, variant=v.label,
                                      predicted_us=predicted, **fields)
            out.append((v, row))
            self.bar.update()
        return out

    def final_picks(self, b: int, rows: list) -> tuple[str, list[Variant]]:
        """The ledger key and variants of the batch size's final round: its ``finalists``
        fastest right variants (none where fewer than 2 are right)."""
        picks = ranked(rows)[:self.finalists] \
            if self.finalists >= 2 and self.final_rounds >= 1 else []
        picks = picks if len(picks) >= 2 else []
        return self.ledger.key(batch=b, finals=[v.label for v in picks],
                               rounds=self.final_rounds, iters=self.iters, **self.base), picks

    def final(self, b: int, final_key: str, picks: list, builds: list) -> dict:
        """{label: ms} of the final round, once its variants are built (in the pool: a rerun
        that resumes on another machine builds them there side by side, not here in turn)."""
        for job in builds:
            job.result()
        if not picks:
            return {}
        return final_round(self.ledger, final_key, self.model, self.name,
                           [(v.label, self.opts(b, v)) for v in picks], self.root, self.iters,
                           self.final_rounds,
                           lambda: step_inputs(self.model, b, self.max_seq_len)[0])


def ranked(rows: list) -> list[Variant]:
    """The right variants of timed ``rows`` [(variant, ledger row)], fastest first (equal times:
    by label)."""
    return [v for *_, v in sorted((row["ms"], v.label, v) for v, row in rows
                                   if row["error"] is None)]


def _refinement(ledger: Ledger, base: dict, batch: int, rows: list, refine: tuple[str, ...],
                model, max_seq_len: int, target: Target) -> list[tuple[Variant, float]]:
    """The batch size's fastest right variant with each ``refine`` knob flipped (``flip``), as
    it will be built, where that is a variant not timed yet: [(variant, predicted us)]; rated
    here, kept in the ledger's plans (a rerun rates nothing)."""
    ok = ranked(rows)
    if not ok:
        return []
    best = ok[0]
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
               for k in refine if k not in skip for u in [flip(v, k, seq)] for w in warps(k)
               if not (u.noinline and warpgroup_mmas(ops.dims, u.tile))]
    return [(u, predict(ops, u, target)) for u in dict.fromkeys(flipped) if u.label not in labels]


def _keep_winner(run: _Tuning, batch: int, rows: list, finals: dict, folder: Path) -> Winner:
    """The fastest right variant (by the final round's figures where there was one), saved
    as ``folder/b{batch}``."""
    ok = [(finals.get(v.label, row["ms"]), v.label, v, row) for v, row in rows
          if row["error"] is None]
    if not ok:
        raise RuntimeError(f"autotune: every variant failed at batch {batch}: "
                           f"{rows[0][1]['error']}")
    ms, label, v, row = min(x for x in ok if not finals or x[1] in finals)
    opts = run.opts(batch, v)
    key = cache_key(run.model, opts)
    if saved_key(folder / f"b{batch}") != key:            # a warm rerun keeps what is there
        compiled, _ = compile_cached(run.model, opts, run.name, run.root)
        save(compiled, run.model, folder / f"b{batch}", key)
    return Winner(batch, label, ms, row["predicted_us"], len(ok), len(rows) - len(ok))
