"""Capture: one decode step of a ``megakernel.models`` model as a shaped torch.fx graph.

Output: a ``GraphModule`` with placeholders ``tokens [B, 1]``, ``positions [B, 1]``,
``kv_cache [L, 2, B, Hkv, S, D]`` and logits ``[B, 1, V]`` as output; every node carries
``meta["tensor_meta"]`` from ``ShapeProp`` run on fake tensors (no real compute, any device).
"""
from __future__ import annotations

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import ShapeProp

from megakernel.models.transformer import CausalLM
from megakernel.runtime.kv_cache import cache_shape


def capture(model: CausalLM, batch_size: int, max_seq_len: int) -> fx.GraphModule:
    gm = fx.symbolic_trace(model, concrete_args={"logit_index": None})
    p = next(model.parameters())
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        tokens = torch.zeros(batch_size, 1, dtype=torch.long, device=p.device)
        positions = torch.zeros(batch_size, 1, dtype=torch.long, device=p.device)
        cache = torch.zeros(cache_shape(model.config, batch_size, max_seq_len), dtype=p.dtype,
                            device=p.device)
    ShapeProp(gm, fake_mode=mode).propagate(tokens, positions, cache)
    return gm
