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
``refine`` flipped (``refine.REFINE``: balanced projection spans, the cache block, deeper
projection pipelines, the K slices of o and down, deeper one-matrix steps, norms from their
inputs' writers' sums of squares, op bodies as calls at each warp count, the KV cache asked of
L2 a task ahead, the weights asked of L2 with default priority instead of evict_last, the
projections' K loops each from a step of their own, the other warp count), where that
builds another variant, and where several flips gained, the fastest of them with the next gains'
changes too, and where a first-round variant of another class came within 1% of the fastest,
that one with the gains' changes (``refine.compound``); where that made a faster variant, the
flips that gained but are not in it, or missed by less than 1%, are made again on it
(``refine.second_look``).
Each variant's build seconds go into its ledger row; with ``progress``, where the run's time went
(builds, timing, waiting for builds) is printed at the end.
Last, the ``finalists`` fastest right variants of each batch size are timed again side by side in
``final_rounds`` interleaved rounds (``finals``), and the winner is the fastest there.
With ``prior`` (an earlier run's ``autotune.json``, e.g. from another machine or compiler
version), the winners of its final rounds for the same model, context and batch size join each
shortlist, so that the single timings that steer the refinement cannot lose a known winner.
Persisted under ``folder``: ``autotune.json`` with every measurement (model hash, batch size,
device, code version, variant) and each batch size's shortlist (kept while the rules that made
it, ``rules_hash``, stay the same), so a rerun times only what is missing, and each batch size's
winner as a compiled artifact in ``folder/b{B}`` (the layout ``megakernel compile`` writes, which
``KernelLibrary`` serves). A variant that fails to build, to fit or to finish is recorded with its
error and skipped.
"""
from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from megakernel.compiler.artifact import (cache_key, code_hash, compile_cached, model_hash, save,
                                          saved_key)
from megakernel.compiler.cost import TARGETS, Target
from megakernel.compiler.pipeline import CompileOptions

from .fanout import fan_out, worker_pool
from .finals import FINAL_ROUNDS, FINALISTS, final_round
from .ledger import Ledger
from .measure import measure, step_inputs
from .effective import effective
from .graphs import hand_over, op_costs, op_graph
from .refine import REFINE, compound, ranked, refinement, second_look
from .search import SPACE, predict, shortlist
from .variant import Variant, parse_variant


@dataclass(frozen=True)
class Winner:
    batch: int
    label: str
    ms: float
    predicted_us: float
    timed: int          # variants timed and right for this batch size (this run and earlier)
    failed: int         # variants that failed to build, fit or finish, or gave wrong logits


def _prepare_timed(job) -> tuple[str | None, float]:
    """``_prepare``'s error, if any, and the seconds it took."""
    start = time.perf_counter()
    return _prepare(job), time.perf_counter() - start


def _prepare(job) -> str | None:
    """In a worker process: compile one variant (into the artifact cache) and build its kernel
    (into Triton's cache); the error, if any."""
    from megakernel.models.weights import empty_model

    from .megakernel import build_ahead

    cfg, dtype, name, opts, root, device = job
    try:
        compiled, _ = compile_cached(empty_model(cfg).to(dtype), opts, name, Path(root),
                                     lambda: op_graph(cfg, dtype, opts.batch_size,
                                                      opts.max_seq_len))
        build_ahead(compiled, dtype, device)
        return None
    except Exception as err:  # reported with the variant, which is then not timed
        return f"{type(err).__name__}: {err}"[:300]


def _plan(job) -> tuple[list[tuple[Variant, float]], object]:
    """In a worker process: the shortlist of one batch size, and the op graph it was rated on
    (handed to the refinements in the autotuner's process, which need not capture it again)."""
    cfg, dtype, batch, seq, target, space, classes = job
    ops = op_graph(cfg, dtype, batch, seq)
    return shortlist(ops, TARGETS[target], space, classes), ops


def rules_hash() -> str:
    """The modules that decide a shortlist or a refinement (``search``, this one, ``refine``
    and ``variant`` with ``effective``): a plan kept in the ledger under other rules is rated
    again."""
    h = hashlib.sha256()
    for path in (Path(__file__).with_name(f"{name}.py") for name in ("search", "autotune",
                                                                     "refine", "variant",
                                                                     "effective")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _plans(ledger: Ledger, model, batch_sizes, max_seq_len, target, space, classes, processes,
           base: dict, progress: bool) -> dict:
    """Each batch size's shortlist: from the ledger, else rated (in worker processes, a progress
    bar while they work) and kept."""
    from tqdm import tqdm

    key = {b: ledger.key(batch=b, space=space, classes=classes, target=target.name,
                         rules=rules_hash(), **base) for b in batch_sizes}
    plans = {b: ledger.plan(key[b]) for b in batch_sizes}
    todo = [b for b in batch_sizes if plans[b] is None]
    dtype = next(model.parameters()).dtype
    with tqdm(total=len(todo), desc="shortlists", disable=not progress or not todo) as bar:
        rated = fan_out(_plan, [(model.config, dtype, b, max_seq_len, target.name, space,
                                 classes) for b in todo], processes, bar.update)
    for b, (picks, ops) in zip(todo, rated):
        ledger.add_plan(key[b], picks)
        plans[b] = picks
        hand_over(model.config, dtype, b, max_seq_len, ops)
    return plans


def autotune(model, name: str, batch_sizes: list[int], max_seq_len: int, folder: Path,
             space: dict = SPACE, classes: int = 2, iters: int = 20, progress: bool = True,
             cache_root: Path | None = None, processes: int = 1,
             max_rel_err: float = 0.1, refine: tuple[str, ...] = REFINE,
             finalists: int = FINALISTS, final_rounds: int = FINAL_ROUNDS,
             prior: Path | None = None) -> list[Winner]:
    from tqdm import tqdm

    from megakernel.interpreter import kernel_target

    from .megakernel import cache_dir

    if iters < 1:
        raise ValueError(f"iters={iters}: each variant needs at least one timed step")
    if max_seq_len < 1 or not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch sizes {batch_sizes} and max_seq_len={max_seq_len}: each at "
                         "least 1")
    device = next(model.parameters()).device
    target = TARGETS[kernel_target(device.type)]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    ledger, root = Ledger(folder / "autotune.json"), cache_root or cache_dir() / "artifacts"
    base = dict(model=model_hash(model), seq=max_seq_len, device=gpu, code=code_hash())
    plans = _plans(ledger, model, batch_sizes, max_seq_len, target, space, classes, processes,
                   base, progress)
    if prior is not None:
        plans = _with_prior(plans, Ledger(Path(prior)), model, max_seq_len, target, base)
    bar = tqdm(total=sum(map(len, plans.values())), desc="autotune", disable=not progress)
    run = _Tuning(model, name, max_seq_len, target, ledger, base, root, iters, max_rel_err, bar,
                  finalists, final_rounds)
    with worker_pool(processes) as pool:
        rows, times = _time_all(run, pool, plans, refine)
    bar.close()
    if progress and run.spent["built"]:
        print(run.spent_text(processes), file=sys.stderr)
    return [_keep_winner(run, b, rows[b], times[b], folder) for b in plans]


def _with_prior(plans: dict, prior: Ledger, model, max_seq_len: int, target: Target,
                base: dict) -> dict:
    """Each batch size's plan with the winners of ``prior``'s final rounds for it (the same
    model and context, on any device and compiler version) that it lacks, as built here and
    rated, at its end: they are timed beside the search's own picks, so that a known winner is
    not lost to the single timings, about 1% apart, that steer the refinement."""
    if not prior.path.is_file():
        raise FileNotFoundError(f"no earlier autotune ledger at {prior.path}")
    dtype, out = next(model.parameters()).dtype, {}
    for b, picks in plans.items():
        labels = prior.winners(b, model=base["model"], seq=max_seq_len)
        out[b] = picks
        if not labels:                  # no op graph captured for a batch size it lacks
            continue
        ops = op_graph(model.config, dtype, b, max_seq_len)
        costs = op_costs(model.config, dtype, b, max_seq_len)
        have, extra = {v.label for v, _ in picks}, []
        for label in labels:
            try:
                v = effective(ops, parse_variant(label))
            except ValueError:          # a label that this compiler no longer parses or builds
                continue
            if v.label not in have:
                have.add(v.label)
                extra.append((v, predict(ops, v, target, memo=costs)))
        out[b] = picks + extra
    return out


def _time_all(run: _Tuning, pool, plans: dict, refine: tuple[str, ...]) -> tuple[dict, dict]:
    """Every build asked at once; each batch size timed in turn as its builds come, its
    refinement then rated and asked for, and timed once the shortlists are, the refinement's
    gains combined (``compound``) and asked for as each batch size's refinement is timed, and
    timed once all are, its near misses made again on the fastest (``second_look``) asked for as
    each batch size's compounds are timed, and timed once all are; then the finals. Returns
    ({batch: [(variant, ledger row)]}, {batch: {label: final ms}})."""
    builds = {b: run.build(pool, b, picks) for b, picks in plans.items()}
    rows, more, start = {}, {}, {}
    keys = run.base | {"rules": rules_hash()}
    for b, picks in plans.items():
        rows[b] = run.timed(b, picks, builds[b])
        start[b] = (ranked(rows[b]) or [None])[0]
        more[b] = refinement(run.ledger, keys, b, rows[b], refine, run.model, run.max_seq_len,
                             run.target)
        run.bar.total += len(more[b])
        builds[b] |= run.build(pool, b, more[b])
    combined = {}
    for b in plans:
        rows[b] += run.timed(b, more[b], builds[b])
        combined[b] = compound(run.ledger, keys, b, start[b], rows[b], more[b], run.model,
                               run.max_seq_len, run.target) if start[b] else []
        run.bar.total += len(combined[b])
        builds[b] |= run.build(pool, b, combined[b])
    again = {}
    for b in plans:
        rows[b] += run.timed(b, combined[b], builds[b])
        again[b] = second_look(run.ledger, keys, b, start[b], rows[b], more[b], run.model,
                               run.max_seq_len, run.target) if start[b] else []
        run.bar.total += len(again[b])
        builds[b] |= run.build(pool, b, again[b])
    for b in plans:
        rows[b] += run.timed(b, again[b], builds[b])
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
    # this run's variants built, and seconds: in the build processes, in this one waiting for
    # them, timing (where a cold run's time goes)
    spent: dict = field(default_factory=lambda: dict(built=0, build=0.0, wait=0.0, timing=0.0))

    def spent_text(self, processes: int) -> str:
        s = self.spent
        return (f"autotune: {s['built']} variants built, {s['build']:.0f} s in {processes} build "
                f"processes; {s['timing']:.0f} s timing them, {s['wait']:.0f} s waiting for "
                "builds")

    def opts(self, b: int, v: Variant) -> CompileOptions:
        return CompileOptions(b, self.max_seq_len, target=self.target.name,
                              **v.options(self.target.sms))

    def key(self, b: int, v: Variant) -> str:
        return self.ledger.key(batch=b, variant=v.label, **self.base)

    def submit(self, pool, b: int, v: Variant):
        """Ask the pool to compile and build variant ``v`` of batch ``b`` (``_prepare_timed``)."""
        w = next(self.model.parameters())
        return pool.submit(_prepare_timed, (self.model.config, w.dtype, self.name,
                                            self.opts(b, v), str(self.root), w.device.type))

    def build(self, pool, b: int, picks: list) -> dict:
        """The builds of the picks not in the ledger yet, asked of the pool: {label: future}."""
        return {v.label: self.submit(pool, b, v) for v, _ in picks
                if self.ledger.get(self.key(b, v)) is None}

    def timed(self, b: int, picks: list, builds: dict) -> list:
        """[(variant, ledger row)] of the picks, each timed once its build is done."""
        inputs, out = [], []               # one set of decode inputs serves every variant
        for v, predicted in picks:
            row = self.ledger.get(self.key(b, v))
            if row is None:
                row = self.ledger.add(self.key(b, v), batch=b, variant=v.label,
                                      predicted_us=predicted,
                                      **self.measured(b, v, builds[v.label], inputs))
            out.append((v, row))
            self.bar.update()
        return out

    def measured(self, b: int, v: Variant, build, inputs: list) -> dict:
        """Variant ``v``'s ledger fields once its build (a ``_prepare_timed`` future) is done: its
        timing (``measure``) or the build's error, and the build's seconds; the seconds added to
        ``spent``. ``inputs``: the batch size's decode inputs, made on the first variant timed."""
        start = time.perf_counter()
        failed, build_s = build.result()
        self.spent["wait"] += time.perf_counter() - start
        self.spent["built"] += 1
        self.spent["build"] += build_s
        if failed:
            return dict(ms=None, error=failed, build_s=round(build_s, 2))
        start = time.perf_counter()
        if not inputs:
            inputs.append(step_inputs(self.model, b, self.max_seq_len))
        fields = measure(self.model, self.name, self.opts(b, v), self.root, self.iters,
                         inputs[0], self.max_rel_err)
        self.spent["timing"] += time.perf_counter() - start
        return dict(fields, build_s=round(build_s, 2))

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
        self.bar.set_postfix_str(f"final round, batch {b}")
        return final_round(self.ledger, final_key, self.model, self.name,
                           [(v.label, self.opts(b, v)) for v in picks], self.root, self.iters,
                           self.final_rounds,
                           lambda: step_inputs(self.model, b, self.max_seq_len)[0])


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
