"""Decode-step backends: ``name -> factory(model, kv_cache) -> step``.

A step maps ``tokens [B, 1], positions [B, 1], kv_cache`` to logits ``[B, 1, V]`` and writes the
new keys and values into ``kv_cache``. Every backend computes the same function as
``CausalLM.forward``; they differ only in how it runs.
"""
from __future__ import annotations

from typing import Callable

import torch

from megakernel.models.transformer import CausalLM

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
BackendFactory = Callable[[CausalLM, torch.Tensor], Step]
RECOMPILE_LIMIT = 64  # torch-compile steps (batch sizes, models) one process may hold


def eager_backend(model: CausalLM, kv_cache: torch.Tensor) -> Step:
    return model


def torch_compile_backend(model: CausalLM, kv_cache: torch.Tensor) -> Step:
    """``torch.compile(mode="reduce-overhead")``: Inductor kernels replayed as one CUDA graph. The
    cache is marked static so that its in-place update stays inside the graph. Every batch size
    is another specialisation of the same ``forward``: with ``fullgraph=True`` the ninth in one
    process (the bench of 12 batch sizes) would fail on Dynamo's recompile limit (8), so the
    limit is raised to at least ``RECOMPILE_LIMIT``. (Clearing Dynamo's caches with
    ``torch._dynamo.reset()`` instead slowed every step compiled after the first: llama-3.2-1b
    on the H200, 12 batch sizes in one process, batch 2 1.361 ms with it, 1.287 without.)"""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    torch._dynamo.mark_static_address(kv_cache)
    return torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=False)


def megakernel_backend(model: CausalLM, kv_cache: torch.Tensor, **options) -> Step:
    """One persistent kernel per decode step (``megakernel.compiler``); ``options`` are
    ``CompileOptions`` fields (none: the autotuned kernel, if any)."""
    from .megakernel import megakernel_backend as build

    return build(model, kv_cache, **options)


def megakernel_cuda_backend(model: CausalLM, kv_cache: torch.Tensor) -> Step:
    """The megakernel's tables (the autotuned kernel's variant, or the default, in the form the
    CUDA backend builds) run by the CUDA C++ kernel (``runtime.cuda_step``); GPU only."""
    from .megakernel import megakernel_backend as build

    return build(model, kv_cache, kernel="cuda")


BACKENDS: dict[str, BackendFactory] = {
    "eager": eager_backend,
    "torch-compile": torch_compile_backend,
    "megakernel": megakernel_backend,
    "megakernel-cuda": megakernel_cuda_backend,
}


def get_backend(name: str) -> BackendFactory:
    if name not in BACKENDS:
        raise ValueError(f"backend {name!r} is not available; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name]
