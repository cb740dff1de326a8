"""The autotuner on the CPU (interpreter timings): persistence, resume, served winners, the
right logits of every kept winner, the worker processes and the final round (its search:
``test_search``, its refinement: ``test_refine``)."""
from dataclasses import replace

import pytest
import torch

from megakernel.models import load_model
from megakernel.runtime import allocate_kv_cache, autotune as tuning, graphs, refine
from megakernel.runtime.effective import variant_of
from megakernel.runtime.megakernel import KernelLibrary, megakernel_backend
from megakernel.runtime.variant import parse_variant
from test_search import SPACE       # the small search space the search's tests use too



def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(what)
    return refuse


def test_autotune_keeps_a_correct_winner_per_batch_size_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    loaded = load_model("tiny-llama", progress=False)
    model, folder = loaded.model, tmp_path / "autotune" / "tiny-llama"
    run = lambda jobs: tuning.autotune(model, "tiny-llama", [1, 2], 64, folder, space=SPACE,
                                       classes=1, iters=1, progress=False,
                                       cache_root=tmp_path / "c", processes=jobs,
                                       refine=("prefetch_kv",), finalists=2, final_rounds=2)
    no_compiling = _refuse("variants are compiled in the worker processes, not here")
    graphs._graphs.clear()
    with monkeypatch.context() as patch:
        patch.setattr("megakernel.compiler.artifact.compile_model", no_compiling)
        patch.setattr("megakernel.runtime.graphs.model_ops",
                      _refuse("the shortlists' workers hand their op graphs over"))
        winners = run(2)                  # compiled in two worker processes, timed here
    _check_first_run(tuning.Ledger(folder / "autotune.json"), winners)

    no_timing = _refuse("a rerun must not time what autotune.json already holds")
    no_rating = _refuse("a rerun reads each batch size's shortlist from autotune.json")
    monkeypatch.setattr("megakernel.runtime.measure.time_variant", no_timing)
    monkeypatch.setattr("megakernel.runtime.finals.final_times", no_timing)
    monkeypatch.setattr(tuning, "_plan", no_rating)
    monkeypatch.setattr(refine, "_flips", no_rating)
    with monkeypatch.context() as patch:  # the kept winners are not compiled or loaded again
        patch.setattr(tuning, "compile_cached", no_compiling)
        assert run(1) == winners
        patch.setattr(tuning, "rules_hash", lambda: "other rules")
        with pytest.raises(AssertionError, match="shortlist"):   # kept plans are rated again
            run(1)
    _check_served(folder, model, winners)


def _check_first_run(ledger, winners) -> None:
    """Every timed variant in the ledger with its build seconds, each batch size's fastest
    with the refining knob flipped, and the winners from the side-by-side final rounds."""
    assert [w.batch for w in winners] == [1, 2]
    assert all(w.ms > 0 and w.failed == 0 and w.timed >= 2 for w in winners)
    assert len(ledger.rows) == sum(w.timed for w in winners)
    assert {(r["batch"], r["variant"]) for r in ledger.rows} >= {(w.batch, w.label) for w in winners}
    assert all(r["build_s"] > 0 for r in ledger.rows)   # each build's seconds, in its process
    # then each batch size's fastest of the shortlist with the refining knob flipped (KV prefetch:
    # not in the interpreter's shortlist, the same kernel there)
    for b in (1, 2):
        rows = [r for r in ledger.rows if r["batch"] == b]
        flipped = [r for r in rows if "xpk" in r["variant"]]
        fastest = min((r for r in rows if r not in flipped), key=lambda r: r["ms"])
        assert [r["variant"] for r in flipped] == \
            [variant_of_label(fastest["variant"], prefetch_kv=True)]

    # then each batch size's two fastest timed again side by side: the winner is the faster there
    assert len(ledger.finals) == 2
    for w, times in zip(winners, ledger.finals.values()):
        fastest = sorted((r for r in ledger.rows if r["batch"] == w.batch and r["error"] is None),
                         key=lambda r: (r["ms"], r["variant"]))[:2]
        assert sorted(times) == sorted(r["variant"] for r in fastest)
        assert w.ms == min(times.values()) == times[w.label]


def _check_served(folder, model, winners) -> None:
    """The tuned kernels served by ``KernelLibrary`` and the megakernel backend, right against
    eager; kernels of other compiler code refused by name, passed over by the backend."""
    library = KernelLibrary(folder, model)
    assert library.batch_sizes == [1, 2]
    compiled = library.pick(2, 64)
    assert compiled.options.tile.block_n == int(winners[1].label.split("x")[0])
    cache = allocate_kv_cache(model.config, 2, 64, dtype=torch.float32, device="cpu")
    cache.normal_(generator=torch.Generator().manual_seed(3))
    ref_cache = cache.clone()
    tokens, positions = torch.tensor([[5], [77]]), torch.tensor([[9], [30]])
    got = library.step(compiled, model, cache)(tokens, positions, cache)
    ref = model(tokens, positions, ref_cache)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    # the megakernel backend finds the tuned kernel by itself; explicit options still compile
    assert variant_of(megakernel_backend(model, cache).compiled).label == winners[1].label
    assert megakernel_backend(model, cache, num_warps=8).compiled.options.num_warps == 8
    # kernels generated by other compiler code: refused by name, a tuned one passed over
    manifest = folder / "b2" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"code": "', '"code": "0'))
    with pytest.raises(ValueError, match="another version of the compiler"):
        KernelLibrary(folder, model)
    with pytest.warns(UserWarning, match="tuned kernel not used"):
        step = megakernel_backend(model, cache)
    from megakernel.compiler.pipeline import CompileOptions

    assert step.compiled.options == CompileOptions(2, 64, target="cpu")   # the default, compiled


def test_autotune_refuses_zero_timed_steps_rows_or_context(tmp_path):
    model = load_model("tiny-llama", progress=False).model
    with pytest.raises(ValueError, match="iters=0"):
        tuning.autotune(model, "tiny-llama", [1], 64, tmp_path, iters=0, progress=False)
    for sizes, context in (([1], 0), ([0, 1], 64), ([], 64)):
        with pytest.raises(ValueError, match="each at least 1"):
            tuning.autotune(model, "tiny-llama", sizes, context, tmp_path, progress=False)
    assert not (tmp_path / "autotune.json").exists()


def test_autotune_command_times_fewer_steps_under_the_interpreter(tmp_path, monkeypatch, capsys):
    """On the CPU each timed step is an interpreter run: the command's default is TIMED_STEPS's
    (and says its timings rank CPU time); --iters, 0 included, is passed on as given."""
    from megakernel import cli

    asked = []
    monkeypatch.setattr(tuning, "autotune", lambda *a, **kw: asked.append(kw["iters"]) or [])
    for extra in ([], ["--iters", "7"], ["--iters", "0"]):
        cli.main(["autotune", "tiny-llama", "--device", "cpu", "-o", str(tmp_path)] + extra)
    assert asked == [cli.TIMED_STEPS["cpu"], 7, 0] and cli.TIMED_STEPS["cpu"] < 20
    assert "Triton interpreter" in capsys.readouterr().err


def variant_of_label(label: str, **knobs) -> str:
    return replace(parse_variant(label), **knobs).label


def test_autotune_never_keeps_a_variant_with_wrong_logits(tmp_path, monkeypatch):
    """Each timed step's logits are checked against eager's: a variant whose kernel computes
    something else (here: every 16-column projection step's logits doubled) is recorded as wrong
    with its distance, and the winner is a right one."""
    from megakernel.runtime.megakernel import MegakernelStep

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    model = load_model("tiny-llama", progress=False).model
    call = MegakernelStep.__call__

    def corrupt(self, *args):
        out = call(self, *args)
        return out * 2 if self.compiled.options.tile.block_n == 16 else out

    monkeypatch.setattr(MegakernelStep, "__call__", corrupt)
    space = dict(SPACE, stages=(1,), kv_split=(32,), qkv_parts=(1,))
    folder = tmp_path / "tuned"
    [winner] = tuning.autotune(model, "tiny-llama", [1], 64, folder, space=space, classes=2,
                               iters=1, progress=False, cache_root=tmp_path / "c",
                               final_rounds=1)
    rows = tuning.Ledger(folder / "autotune.json").rows
    bad = [r for r in rows if r["variant"].startswith("16x")]
    assert bad and all(r["error"].startswith("wrong logits") and r["rel_err"] > 0.5
                       for r in bad)
    assert not winner.label.startswith("16x") and winner.failed == len(bad)
    assert all(r["rel_err"] < 1e-4 for r in rows if r not in bad)
    [finals] = tuning.Ledger(folder / "autotune.json").finals.values()    # right ones only
    assert len(finals) >= 2 and not any(label.startswith("16x") for label in finals)


def test_worker_pool_runs_jobs_there_or_here_and_hands_errors_to_the_asker():
    from megakernel.runtime.fanout import worker_pool

    for processes in (2, 1):
        with worker_pool(processes) as pool:
            jobs = [pool.submit(abs, x) for x in (-3, 1, -2)]
            assert [job.result() for job in jobs] == [3, 1, 2]
            with pytest.raises(TypeError):
                pool.submit(abs, "not a number").result()


def test_fan_out_keeps_the_jobs_order_and_reports_each_result():
    from megakernel.runtime.fanout import fan_out

    for processes in (2, 1):
        seen = []
        assert fan_out(abs, [-3, 1, -2], processes, lambda: seen.append(1)) == [3, 1, 2]
        assert len(seen) == 3


def test_final_round_times_the_finalists_in_turn_and_keeps_each_ones_median(monkeypatch):
    """Every round times each finalist once, in order, on the same state; a finalist's figure
    is the median of its rounds (neither ``b``'s slow round nor its fastest decides)."""
    from megakernel.runtime import finals

    class Step:
        def __init__(self, compiled, model, cache):
            self.name = compiled

        def __call__(self, *state):
            return self.name

        def synchronize(self):
            pass

    rounds = {"a": [3.0, 3.0, 3.0], "b": [9.0, 1.0, 1.5], "c": [2.0, 2.5, 2.2]}
    order = []

    def median_step_ms(fn, device, warmup, iters):
        order.append(fn())
        return rounds[order[-1]][sum(o == order[-1] for o in order) - 1]

    monkeypatch.setattr("megakernel.runtime.megakernel.MegakernelStep", Step)
    monkeypatch.setattr("megakernel.compiler.artifact.compile_cached",
                        lambda model, opts, name, root: (opts, None))
    monkeypatch.setattr("megakernel.bench.decode.median_step_ms", median_step_ms)
    state = (None, None, torch.zeros(1))
    assert finals.final_times(None, "m", ["a", "b", "c"], None, 5, 3, state) == [3.0, 1.5, 2.2]
    assert order == ["a", "b", "c"] * 3


def test_autotune_times_an_earlier_ledgers_winners_beside_its_shortlist(tmp_path, monkeypatch):
    """``prior``: the winner of each of an earlier ledger's final rounds for the same model,
    context and batch size joins the shortlist and is timed; other batch sizes' and contexts'
    winners, losers of those rounds and labels that no longer parse are not."""
    import json

    from megakernel.compiler.artifact import model_hash

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    model = load_model("tiny-llama", progress=False).model
    prior = tuning.Ledger(tmp_path / "prior" / "autotune.json")
    key = lambda **kw: json.dumps(dict(dict(batch=1, model=model_hash(model), seq=64), **kw))
    prior.add_final(key(device="x"), {"64x32x4x1xs1": 1.0, "64x32x4x1xs2": 2.0, "zz9": 0.5})
    prior.add_final(key(device="y"), {"64x32x4x1xs1": 1.0})          # the same winner again
    prior.add_final(key(batch=2), {"128x32x4x1xs1": 1.0})
    prior.add_final(key(seq=128), {"256x32x4x1xs1": 1.0})
    assert prior.winners(1, model=model_hash(model), seq=64) == ["zz9", "64x32x4x1xs1"]
    folder = tmp_path / "tuned"
    tune = lambda path: tuning.autotune(model, "tiny-llama", [1], 64, folder, space=SPACE,
                                        classes=1, iters=1, progress=False,
                                        cache_root=tmp_path / "c", refine=(), finalists=0,
                                        prior=path)
    tune(prior.path)
    labels = [r["variant"] for r in tuning.Ledger(folder / "autotune.json").rows]
    assert [label.split("x")[:2] for label in labels].count(["64", "32"]) == 1
    assert not any(label.split("x")[0] in ("128", "256") for label in labels)
    assert not any(label.startswith("64x32x4x1xs2") for label in labels)
    with pytest.raises(FileNotFoundError, match="no earlier autotune ledger"):
        tune(tmp_path / "nowhere.json")
