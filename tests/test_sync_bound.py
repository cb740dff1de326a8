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


@pytest.mark.parametrize("form", ["one-row", "no-x"])
def test_x_forms_hold_only_inside_their_context(form):
    """``x_bound``'s forms: inside ``x_form`` every projection reads row 0's x in every row, or
    ones, so a batch of two different rows gets wrong logits; outside it the kernel is right
    again."""
    import torch

    from megakernel.bench.decode import decode_state
    from megakernel.bench.x_bound import x_form
    from megakernel.models import load_model
    from megakernel.runtime.megakernel import megakernel_backend

    model = load_model("tiny-llama", progress=False).model
    tokens, positions, cache = decode_state(model, 2, 32)
    tokens[1] = (tokens[0] + 1) % model.config.vocab_size
    step = megakernel_backend(model, cache, num_workers=1)
    with torch.inference_mode():
        expected = model(tokens, positions, cache).float()
        assert torch.allclose(step(tokens, positions, cache).float(), expected, atol=1e-4)
        with x_form(form):
            wrong = step(tokens, positions, cache).clone()
        assert torch.allclose(step(tokens, positions, cache).float(), expected, atol=1e-4)
    assert not torch.allclose(wrong, expected, atol=1e-2)
    assert not torch.allclose(expected[0], expected[1], atol=1e-2)
