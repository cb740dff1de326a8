"""Capture: one decode step of a ``megakernel.models`` model as a shaped torch.fx graph.

Output: a ``GraphModule`` with placeholders ``tokens [B, 1]``, ``positions [B, 1]``,
``kv_cache [L, 2, B, Hkv, S, D]`` and logits ``[B, 1, V]`` as output; every node carries
``meta["tensor_meta"]`` from ``ShapeProp`` run on fake tensors (no real compute, any device).
``from_dynamo`` brings the graph Dynamo hands a ``torch.compile`` backend (parameters lifted to
inputs, mangled names) into that same form, so both front ends share one lowering.
"""
from __future__ import annotations

import re

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


CANONICAL_INPUTS = ("tokens", "positions", "kv_cache")


def dotted(placeholder: str) -> str:
    """Dynamo's lifted name -> the module's own: 'L_self_modules_layers_modules_0_modules_mlp_'
    'modules_up_proj_parameters_weight_' -> 'layers.0.mlp.up_proj.weight'."""
    name = placeholder.removeprefix("L_self_").removeprefix("l_self_").rstrip("_")
    return re.sub(r"(^|_)(modules|parameters|buffers)_", ".", name).lstrip(".")


def from_dynamo(gm: fx.GraphModule, example_inputs) -> fx.GraphModule:
    """A graph Dynamo hands a ``torch.compile`` backend -> the canonical form ``lower`` reads:
    inputs renamed ``tokens``/``positions``/``kv_cache``, lifted parameters and buffers turned back
    into ``get_attr`` nodes with their module names, shapes propagated on fake tensors."""
    graph = fx.Graph()
    env, attrs, inputs = {}, {}, {}
    for node, value in zip([n for n in gm.graph.nodes if n.op == "placeholder"], example_inputs):
        plain = node.target.removeprefix("L_").removeprefix("l_").rstrip("_")
        if plain in CANONICAL_INPUTS:
            env[node] = graph.placeholder(plain)
            inputs[plain] = value
        else:
            attrs[dotted(node.target)] = value
    for name in attrs:
        env[name] = graph.get_attr(name)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node not in env:
                env[node] = env[dotted(node.target)]
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    output = next(n for n in graph.nodes if n.op == "output")
    if isinstance(output.args[0], (tuple, list)) and len(output.args[0]) == 1:
        output.args = (output.args[0][0],)            # Dynamo returns (logits,)
    missing = set(CANONICAL_INPUTS) - set(inputs)
    if missing:
        raise ValueError(f"the Dynamo graph lacks inputs {sorted(missing)}")
    out = fx.GraphModule(attrs, graph)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fakes = [mode.from_tensor(inputs[k]) for k in CANONICAL_INPUTS]
    ShapeProp(out, fake_mode=mode).propagate(*fakes)
    return out


def capture_dynamo(model: CausalLM, batch_size: int, max_seq_len: int) -> fx.GraphModule:
    """The same step as ``capture``, through ``torch.compile``'s front end (Dynamo)."""
    captured = {}

    def backend(gm, example_inputs):
        captured["gm"] = from_dynamo(gm, example_inputs)
        return gm.forward

    p = next(model.parameters())
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    tokens = torch.zeros(batch_size, 1, dtype=torch.long, device=p.device)
    cache = torch.zeros(cache_shape(model.config, batch_size, max_seq_len), dtype=p.dtype,
                        device=p.device)
    with torch.no_grad():
        compiled(tokens, tokens.clone(), cache)
    return captured["gm"]
