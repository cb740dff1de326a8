"""The variant sweep on the CPU (interpreter): rows per batch size and variant, each checked
against eager on the same step; a variant that cannot be built is a row with its error."""
import json

import pytest
import torch

from megakernel.bench.sweep import main


def test_sweep_times_and_checks_every_variant(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    rc = main(["--model", "tiny-llama", "--device", "cpu", "--baseline", "eager",
               "--batch-sizes", "1,2", "--context", "32", "--iters", "1", "--json", str(out),
               "--variants", "32x64x4x1xs1,32x64x4x1xfo1,32x64x4x1xbogus"])
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [(r["batch"], r["variant"]) for r in rows] == [
        (b, v) for b in (1, 2) for v in ("32x64x4x1xs1", "32x64x4x1xfo1", "32x64x4x1xbogus")]
    for r in rows:
        if r["variant"].endswith("bogus"):
            assert "unknown flag" in r["error"]
        else:
            assert r["rel_err"] < 1e-4 and r["ms_per_token"] > 0 and r["baseline"] == "eager"
            assert r["timing"] == "median"
    assert "WRONG" not in capsys.readouterr().out


def test_sweep_tries_flags_on_each_batch_sizes_autotune_winner(tmp_path):
    from megakernel.bench.sweep import winner_variants

    ledger = tmp_path / "autotune.json"
    run = lambda b, v, ms, err=None: dict(key=f"{b}{v}", batch=b, variant=v, predicted_us=1.0,
                                          ms=ms, error=err)
    ledger.write_text(json.dumps({"plans": {}, "runs": [
        run(1, "32x64x4x1xs1xkv64", 2.0), run(1, "16x64x4x1xs1xkv64", 1.0, "wrong logits"),
        run(1, "32x64x4x1xs2xkv64", 3.0), run(2, "16x64x4x1xs1xkv64", 1.5)]}))
    assert winner_variants(str(ledger), 1, ["fo1", "s1", "af+ar16"]) == [
        "32x64x4x1xs1xkv64", "32x64x4x1xs1xkv64xfo1", "32x64x4x1xs1xkv64xafxar16"]
    with pytest.raises(ValueError, match="no timed variant of batch 3"):
        winner_variants(str(ledger), 3, [])
    # a final round picks the kernel the tuned folder holds, though an earlier round timed
    # another variant faster once
    data = json.loads(ledger.read_text())
    data["finals"] = {json.dumps({"batch": 1}): {"32x64x4x1xs2xkv64": 2.5,
                                                "32x64x4x1xs1xkv64": 2.6}}
    picked = tmp_path / "picked.json"
    picked.write_text(json.dumps(data))
    assert winner_variants(str(picked), 1, ["fo1"]) == ["32x64x4x1xs2xkv64",
                                                        "32x64x4x1xs2xkv64xfo1"]
    out = tmp_path / "sweep.json"
    assert main(["--model", "tiny-llama", "--device", "cpu", "--baseline", "eager",
                 "--batch-sizes", "2", "--context", "32", "--iters", "1", "--json", str(out),
                 "--winners", str(ledger), "--flags", "fo1,dl", "--timing", "mean"]) == 0
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["16x64x4x1xs1xkv64", "16x64x4x1xs1xkv64xfo1",
                                            "16x64x4x1xs1xkv64xdl"]
    assert all(r["rel_err"] < 1e-4 and r["timing"] == "mean" for r in rows)


def test_ncu_summary_adds_up_stall_samples_by_reason_instruction_and_region():
    from megakernel.bench.ncu_step import summarize

    def row(source, samples, wait, executed):
        return {"Address": "0x0", "Source": source,               # as csv reads the page
                "Warp Stall Sampling (All Samples)": f"{samples:,}",
                "Instructions Executed": str(executed), "stall_long_sb": str(samples - wait),
                "stall_wait": str(wait), "stall_wait (Not Issued)": "0"}

    rows = [row("LDG.E R1, desc[UR4][R2.64]", 30, 0, 10),
            row("@P0 HMMA.16816.F32 R4, R8", 10, 10, 5), row("MUFU.EX2 R2, R3", 60, 15, 5)]
    report = summarize(rows, top=2, width=2).splitlines()
    assert report[0] == "3 instructions, 100 samples"
    assert report[1].split() == ["75.00%", "stall_long_sb"]
    assert report[2].split() == ["25.00%", "stall_wait"]
    assert report[4].split()[:3] == ["2", "60.00%", "stall_long_sb"]
    # the runs: instructions 0-1 (an LDG and a predicated HMMA), then 2 (a MUFU)
    assert report[-2].split() == ["0", "40.00%", "10", "LDG:1", "HMMA:1"]
    assert report[-1].split() == ["2", "60.00%", "5", "MUFU.EX2:1"]


@pytest.mark.parametrize("protocol", ["counter", "flagged"])
def test_phase_boundary_probe_computes_what_pytorch_does(protocol):
    """``bench/hop.py``'s rounds on the CPU: one program (the interpreter runs programs one
    after another), so every wait is on its own writes; the values must follow the reference."""
    from megakernel.bench.hop import reference, run

    out = run(protocol, 1, 16, 5, "cpu", spin_limit=4)
    torch.testing.assert_close(out, reference(1, 16, 5))


def test_results_merge_keeps_each_runs_rows_and_the_rest(tmp_path):
    """``python -m megakernel.bench.results``: the halves of a range timed apart, merged in
    order into a results file; rows of other models and batch sizes stay, newer rows replace."""
    from megakernel.bench.results import main as merge

    row = lambda model, b, ms: dict(model=model, batch_size=b, context=1024,
                                    backend="megakernel", ms_per_token=ms)
    into, a, b = tmp_path / "h200.json", tmp_path / "a.json", tmp_path / "b.json"
    into.write_text(json.dumps({"gpu": "old", "results": [row("8b", 1, 4.0), row("1b", 1, 0.9),
                                                          row("1b", 64, 2.0)]}))
    a.write_text(json.dumps({"gpu": "H200", "results": [row("1b", 1, 0.8)]}))
    b.write_text(json.dumps({"gpu": "H200", "results": [row("1b", 64, 1.8)]}))
    merge([str(into), str(a), str(b), "--plot", str(tmp_path / "h200.png")])
    merged = json.loads(into.read_text())
    assert merged["gpu"] == "H200" and (tmp_path / "h200.png").stat().st_size > 0
    assert sorted((r["model"], r["batch_size"], r["ms_per_token"]) for r in merged["results"]) \
        == [("1b", 1, 0.8), ("1b", 64, 1.8), ("8b", 1, 4.0)]


def test_a_watchdog_trip_in_the_last_steps_is_the_rows_error(tmp_path, monkeypatch):
    """A step reports a trip up to 24 steps late (or at ``synchronize``): the sweep asks at the
    end, so a variant that tripped is an error row, not a row of NaN logits."""
    import megakernel.bench.sweep as sweep
    from megakernel.runtime.megakernel import WatchdogError

    def tripping(*args, **kwargs):
        step = real(*args, **kwargs)
        def synchronize():
            raise WatchdogError("megakernel watchdog: task 3 waited past its bound")
        step.synchronize = synchronize
        return step

    real = sweep.megakernel_backend
    monkeypatch.setattr(sweep, "megakernel_backend", tripping)
    out = tmp_path / "sweep.json"
    assert main(["--model", "tiny-llama", "--device", "cpu", "--baseline", "eager",
                 "--batch-sizes", "1", "--context", "32", "--iters", "1", "--json", str(out),
                 "--variants", "32x64x4x1xs1"]) == 0
    [row] = json.loads(out.read_text())
    assert "watchdog" in row["error"] and "rel_err" not in row


def test_l2_persist_bench_needs_a_gpu():
    from megakernel.bench.l2_persist import main as l2_main

    if torch.cuda.is_available():
        pytest.skip("on a GPU the bench runs")
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        l2_main(["--winners", "autotune.json"])
