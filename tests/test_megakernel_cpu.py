"""The generated megakernel under the Triton interpreter against the eager engine (fp32)."""
import pytest
import torch

from megakernel.models import load_model
from megakernel.runtime import Engine

STEPS = 32
PROMPTS = [[256, 72, 101, 108, 108, 111], [256, 9], [256, 40, 41, 42, 43, 44, 45, 46, 47, 48],
           [256, 7, 7], [256, 99, 98, 97, 96]]


# batch 1 and 3 for the compiler; 2 and 5 for the batch-size range (each its own kernel)
@pytest.mark.parametrize("name,batch", [(name, batch) for name in ("tiny-llama", "tiny-qwen3")
                                        for batch in (1, 3)] + [("tiny-llama", 2),
                                                                ("tiny-qwen3", 5)])
def test_megakernel_matches_eager_for_32_greedy_steps(name, batch):
    model = load_model(name, progress=False, seed=batch).model
    prompts = PROMPTS[:batch]
    ref = Engine(model, backend="eager", max_seq_len=64).generate(prompts, STEPS, keep_logits=True)
    got = Engine(model, backend="megakernel", max_seq_len=64).generate(
        prompts, STEPS, keep_logits=True, poison=True)
    assert got.generated_ids == ref.generated_ids
    for step, (a, b) in enumerate(zip(got.step_logits, ref.step_logits)):
        assert torch.isfinite(a).all(), f"step {step}"
        err = (a - b).abs().max().item()
        assert err <= 1e-4, f"step {step}: max |diff| {err:.2e}"


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_generate_cli_megakernel_on_hf_checkpoint_with_odd_sizes(tmp_path, arch, capsys):
    """head_dim 12 or 24, hidden 72 or 80, vocab 301 or 277: through the CLI, verified."""
    from hf_checkpoints import write_checkpoint
    from megakernel.cli import main

    write_checkpoint(arch, tmp_path, seed=7)
    args = ["generate", "--model", str(tmp_path), "--prompt", "x", "--prompt", "a b c",
            "--max-new-tokens", "6", "--device", "cpu", "--backend", "megakernel", "--verify"]
    assert main(args) == 0, capsys.readouterr().err
    assert "agree with the eager engine" in capsys.readouterr().err


def test_precompiled_kernels_pad_to_the_next_batch_size(tmp_path, capsys):
    from megakernel.cli import main

    kernels = tmp_path / "kernels"
    assert main(["compile", "tiny-llama", "--batch-sizes", "1,4", "--max-seq-len", "64",
                 "--device", "cpu", "--scheduler", "greedy", "-o", str(kernels)]) == 0
    capsys.readouterr()
    base = ["generate", "--model", "tiny-llama", "--device", "cpu", "--backend", "megakernel",
            "--kernels", str(kernels), "--max-new-tokens", "4"]
    prompts = [arg for p in ("a", "bb", "ccc") for arg in ("--prompt", p)]
    assert main(base + prompts + ["--verify"]) == 0
    captured = capsys.readouterr()
    assert "padded batch 3 to the compiled batch size 4" in captured.out
    assert "agree with the eager engine" in captured.err
    assert main(base + prompts + ["--prompt", "d", "--prompt", "e"]) == 1
    assert "[1, 4]" in capsys.readouterr().err
    other = ["generate", "--model", "tiny-qwen3", *base[3:], "--prompt", "a"]
    assert main(other) == 1
    assert "another model" in capsys.readouterr().err



@pytest.mark.parametrize("batch", [1, 2])
def test_staging_kernel_is_the_plain_kernel_with_its_rows_read_in_place(batch):
    """A kernel with weight staging (``tmN``, 2-byte weights) under the interpreter (staged rows
    read in place, ``staging``): every projection's first rows from the staged read, the rest
    streamed; its logits are the plain kernel's to fp32 rounding and near eager's (fp16: the
    interpreter's bf16 dots are wrong), over a few steps on fresh caches."""
    from megakernel.bench.decode import decode_state
    from megakernel.compiler.tile import TileConfig
    from megakernel.runtime.megakernel import megakernel_backend

    torch.manual_seed(batch)
    model = load_model("tiny-llama", progress=False, seed=3).model.to(torch.float16)
    tokens, positions, cache = decode_state(model, batch, 64)
    caches = {"staged": cache, "plain": cache.clone(), "eager": cache.clone()}
    steps = {"staged": megakernel_backend(model, caches["staged"], tile=TileConfig(staged_kib=1)),
             "plain": megakernel_backend(model, caches["plain"]), "eager": model}
    assert "STAGED_ROWS" in steps["staged"].compiled.kernel.source
    assert "STAGED_ROWS" not in steps["plain"].compiled.kernel.source
    for i in range(3):
        out = {k: steps[k](tokens, positions - 2 + i, caches[k]).float() for k in steps}
        assert torch.isfinite(out["staged"]).all(), f"step {i}"
        torch.testing.assert_close(out["staged"], out["plain"], atol=2e-3, rtol=2e-3)
        ref = out["eager"]
        assert ((out["staged"] - ref).norm() / ref.norm()).item() < 1e-2, f"step {i}"
        assert torch.equal(caches["staged"], caches["plain"]), f"step {i}: the caches differ"


def test_a_bf16_kernel_on_the_cpu_is_refused():
    """The interpreter's bf16 dots are wrong: a bf16 megakernel on the CPU is an error naming
    the dtypes that work, not garbage logits."""
    from megakernel.bench.decode import decode_state
    from megakernel.runtime.megakernel import megakernel_backend

    model = load_model("tiny-llama", progress=False).model.to(torch.bfloat16)
    _, _, cache = decode_state(model, 1, 64)
    with pytest.raises(ValueError, match="float32 or float16"):
        megakernel_backend(model, cache)
