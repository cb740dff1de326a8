"""The handoff bound (``bench.sync_bound``) on the CPU: each form's kernel module binds its own
changed ``kernel_loop``, and under the interpreter (one program after another) every form's
step agrees with eager."""
import json

import pytest

from megakernel.bench import sync_bound


def test_each_form_binds_its_own_kernel_loop(tmp_path):
    source = "import triton\nfrom megakernel.compiler import kernel_loop, ops\n\nx = 1\n"
    changed = sync_bound.form_source(source, "relaxed-polls", tmp_path)
    assert changed.splitlines()[2] == "import megakernel_sync_relaxed_polls as kernel_loop"
    text = (tmp_path / "megakernel_sync_relaxed_polls.py").read_text()
    assert 'sem="release"' not in text and 'sem="acquire"' not in text
    assert "ld.acquire.gpu.global" not in text and "from .cost" not in text
    assert sync_bound.form_source(source, "release", tmp_path) == source
    with pytest.raises(ValueError, match="form 'fenced' unknown"):
        sync_bound.form_source(source, "fenced", tmp_path)
    with pytest.raises(ValueError, match="does not import kernel_loop"):
        sync_bound.form_source("import triton\n", "relaxed", tmp_path)


def test_forms_timed_side_by_side_agree_with_eager_on_the_interpreter(tmp_path):
    out = tmp_path / "sync.json"
    assert sync_bound.main(["--model", "tiny-llama", "--device", "cpu", "--batch-sizes", "2",
                            "--context", "32", "--variant", "32x64x4x1xs1", "--forms",
                            "release,no-barrier", "--rounds", "2", "--iters", "1",
                            "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["form"] for r in rows] == ["release", "no-barrier"]
    assert all(len(r["ms_rounds"]) == 2 and r["rel_err"] < 1e-4 for r in rows)
    assert rows[0]["vs_first"] == 1.0
