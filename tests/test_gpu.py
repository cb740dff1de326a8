"""GPU checks (skipped without CUDA): bf16 on the GPU against fp32 references."""
import copy

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
def test_torch_compile_is_as_accurate_as_eager(name):
    """bf16 eager and torch-compile against the same weights run in fp32. A deep random model in
    bf16 sits about 2e-2 from fp32 whatever runs it, so compile must stay within 1.5x of eager.
    Top-1 must agree where fp32's margin (top-1 minus top-2 logit) exceeds 0.2, far beyond that
    error: random weights leave near-ties elsewhere, where bf16 eager itself flips rows."""
    torch.manual_seed(0)
    model = load_model(name, device="cuda", dtype="bfloat16", progress=False).model
    ref_model = copy.deepcopy(model).float()
    batch, context = 4, 64
    cache = allocate_kv_cache(model.config, batch, context, dtype=torch.bfloat16, device="cuda")
    cache.normal_()
    caches = {"fp32": cache.float(), "eager": cache.clone(), "torch-compile": cache.clone()}
    tokens = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    positions = torch.tensor([[3], [63], [0], [17]], device="cuda")
    errs = {}
    with torch.inference_mode():
        ref = ref_model(tokens, positions, caches["fp32"])
        for backend in ("eager", "torch-compile"):
            step = get_backend(backend)(model, caches[backend])
            for _ in range(3):  # warm-up, record, replay
                out = step(tokens, positions, caches[backend]).clone()
            errs[backend] = rel_err(out, ref)
            print(f"{name} {backend}: logits rel err {errs[backend]:.2e} against fp32")
            assert rel_err(caches[backend], caches["fp32"]) <= 1e-2, backend
            top2 = ref.topk(2, dim=-1).values                                 # [B, 1, 2]
            decisive = (top2[..., 0] - top2[..., 1]) > 0.2                     # [B, 1]
            agree = out.argmax(-1) == ref.argmax(-1)
            print(f"{name} {backend}: top-1 agrees on {int((agree & decisive).sum())} of "
                  f"{int(decisive.sum())} decisive rows ({int(agree.sum())} of {batch} in all)")
            assert agree[decisive].all(), backend
    assert errs["eager"] <= 3e-2
    assert errs["torch-compile"] <= 1.5 * errs["eager"] + 1e-3
