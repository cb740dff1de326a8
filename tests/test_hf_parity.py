"""Our loader and eager engine against transformers on tiny random checkpoints (fp32)."""
import pytest
import torch

from hf_checkpoints import hf_greedy, write_checkpoint
from megakernel.models import load_model
from megakernel.runtime import Engine

STEPS = 32
PROMPTS = [[5, 17, 3, 99, 42, 7, 250, 1], [11], [200, 3, 3, 64, 9]]


def run_engine(folder, prompts, steps=STEPS):
    loaded = load_model(str(folder), device="cpu", dtype="float32", progress=False)
    engine = Engine(loaded.model, max_seq_len=64)
    return engine.generate(prompts, steps, keep_logits=True)


def assert_matches_hf(hf, result, prompts):
    for row, prompt in enumerate(prompts):
        ref_tokens, ref_logits = hf_greedy(hf, prompt, STEPS)
        assert result.generated_ids[row] == ref_tokens, f"row {row}"
        for step, ref in enumerate(ref_logits):
            ours = result.step_logits[step][row]
            err = (ours - ref).abs().max().item()
            assert err <= 1e-5, f"row {row} step {step}: max |diff| {err:.2e}"


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_logits_and_greedy_tokens_match_transformers(tmp_path, arch, batch):
    hf = write_checkpoint(arch, tmp_path, seed=batch)
    prompts = PROMPTS[:batch]
    assert_matches_hf(hf, run_engine(tmp_path, prompts), prompts)


def test_untied_llama_with_plain_rope(tmp_path):
    rope = dict(rope_type="default", rope_theta=500000.0)
    hf = write_checkpoint("llama", tmp_path, tie_word_embeddings=False, rope_parameters=rope)
    assert_matches_hf(hf, run_engine(tmp_path, PROMPTS[:1]), PROMPTS[:1])


def test_sharded_checkpoint_loads(tmp_path):
    hf = write_checkpoint("qwen3", tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    assert_matches_hf(hf, run_engine(tmp_path, PROMPTS[:1]), PROMPTS[:1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoint_loads(tmp_path, dtype):
    hf = write_checkpoint("llama", tmp_path, dtype=dtype)
    loaded = load_model(str(tmp_path), device="cpu", dtype="float32", progress=False)
    ours = dict(loaded.model.named_parameters())
    for name, ref in hf.named_parameters():
        got = ours[name.removeprefix("model.")]
        assert torch.equal(got, ref.to(dtype).float()), name
