"""GPU checks (skipped without CUDA): bf16 on the GPU against fp32 references."""
import pytest
import torch

from hf_checkpoints import write_checkpoint
from megakernel.models import load_model
from megakernel.runtime import allocate_kv_cache, get_backend

pytestmark = pytest.mark.gpu


def rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bf16_gpu_matches_transformers_fp32(tmp_path, arch):
    hf = write_checkpoint(arch, tmp_path, seed=5)
    model = load_model(str(tmp_path), device="cuda", dtype="bfloat16", progress=False).model
    tokens = torch.randint(0, model.config.vocab_size, (2, 9))
    positions = torch.arange(9).expand(2, 9)
    cache = allocate_kv_cache(model.config, 2, 16, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        ours = model(tokens.cuda(), positions.cuda(), cache).cpu()
        ref = hf(input_ids=tokens).logits
    assert rel_err(ours, ref) <= 2e-2


@pytest.mark.parametrize("name", ["tiny-llama", "llama-3.2-1b"])
def test_torch_compile_matches_eager(name):
    model = load_model(name, device="cuda", dtype="bfloat16", progress=False).model
    batch, context = 4, 64
    cache = allocate_kv_cache(model.config, batch, context, dtype=torch.bfloat16, device="cuda")
    cache.normal_()
    cache_ref = cache.clone()
    tokens = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    positions = torch.tensor([[3], [63], [0], [17]], device="cuda")
    step = get_backend("torch-compile")(model, cache)
    with torch.inference_mode():
        ref = model(tokens, positions, cache_ref)
        for _ in range(3):  # warm-up, record, replay
            out = step(tokens, positions, cache).clone()
    assert rel_err(out, ref) <= 2e-2
    assert rel_err(cache, cache_ref) <= 1e-2
