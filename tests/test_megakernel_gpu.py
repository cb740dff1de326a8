"""The megakernel on the GPU (skipped without CUDA): bf16 against eager, watchdog, long runs."""
import time

import pytest
import torch

from megakernel.models import load_model
from megakernel.runtime import allocate_kv_cache, get_backend
from megakernel.runtime.megakernel import WatchdogError, megakernel_backend

pytestmark = pytest.mark.gpu
CONTEXT = 1024


def decode_pair(name, batch, steps, start):
    """Teacher-forced decode from identical random caches: eager vs megakernel logits."""
    model = load_model(name, device="cuda", dtype="bfloat16", progress=False).model
    cfg = model.config
    cache_e = allocate_kv_cache(cfg, batch, CONTEXT, dtype=torch.bfloat16, device="cuda")
    cache_e[:, :, :, :, :start].normal_()
    cache_m = cache_e.clone()
    cache_m[:, :, :, :, start:] = float("nan")       # never read before written
    mk = get_backend("megakernel")(model, cache_m)
    gen = torch.Generator(device="cuda").manual_seed(batch)
    errs, agree = [], []
    with torch.inference_mode():
        for i in range(steps):
            tokens = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda", generator=gen)
            positions = torch.full((batch, 1), start + i, device="cuda")
            positions[0] -= min(i, start - 1)           # rows at different lengths
            ref = model(tokens, positions, cache_e).float()
            out = mk(tokens, positions, cache_m).float()
            assert torch.isfinite(out).all(), f"step {i}"
            errs.append(((out - ref).norm() / ref.norm()).item())
            agree.append((out.argmax(-1) == ref.argmax(-1)).float().mean().item())
    return errs, agree, mk


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen3-0.6b"])
@pytest.mark.parametrize("batch", [1, 8])
def test_bf16_matches_eager_teacher_forced(name, batch):
    errs, agree, _ = decode_pair(name, batch, steps=64, start=CONTEXT - 64)
    print(f"{name} B={batch}: max rel err {max(errs):.2e}, top-1 agreement "
          f"{sum(agree) / len(agree):.4f}")
    assert max(errs) <= 2e-2
    assert sum(agree) / len(agree) >= 0.99


def _tiny_step(batch=2):
    model = load_model("tiny-llama", device="cuda", dtype="bfloat16", progress=False).model
    cache = allocate_kv_cache(model.config, batch, 64, dtype=torch.bfloat16, device="cuda")
    step = megakernel_backend(model, cache, num_workers=16)
    tokens = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
    positions = torch.full((batch, 1), 3, device="cuda")
    return step, tokens, positions, cache


def test_no_watchdog_trip_in_1000_steps():
    step, tokens, positions, cache = _tiny_step()
    for _ in range(1000):
        step(tokens, positions, cache)
    assert step.epoch == 1000


@pytest.mark.parametrize("fault", ["dropped signal", "dropped producer"])
def test_fault_raises_watchdog_quickly(fault):
    step, tokens, positions, cache = _tiny_step()
    step(tokens, positions, cache)
    waited = [c for ws in step.compiled.sync.waits for c in ws]
    assert waited, "the schedule has no cross-worker waits to break"
    victim = waited[0]
    ins = step.ins
    producers = (ins[:, 3] == victim).nonzero().flatten()
    if fault == "dropped signal":
        ins[producers[0], 3] = -1
    else:
        step.waits[:, 1][step.waits[:, 0] == victim] += 1
    t0 = time.perf_counter()
    with pytest.raises(WatchdogError, match="counter"):
        step(tokens, positions, cache)
    assert time.perf_counter() - t0 < 2.0
