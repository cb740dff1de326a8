"""The variant sweep on the CPU (interpreter): rows per batch size and variant, each checked
against eager on the same step; a variant that cannot be built is a row with its error."""
import json

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
    assert "WRONG" not in capsys.readouterr().out
