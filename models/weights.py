"""Weights for :class:`CausalLM`: Hugging Face safetensors folders and seeded random presets.

Input: a folder holding ``model.safetensors`` or shards listed by ``model.safetensors.index.json``
(bf16, fp16 or fp32 tensors). Output: the model's parameters assigned in place, cast to the requested
dtype, on the requested device. Invariants: the model is built on the meta device and every
parameter is replaced exactly once; a missing, unexpected or misshaped tensor raises
:class:`CheckpointError` naming the tensor (and both shapes); tied embeddings stay tied.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from .config import ModelConfig
from .transformer import CausalLM

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint does not match the model its config.json describes."""


def checkpoint_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / s for s in shards]
    else:
        files = [folder / "model.safetensors"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"checkpoint file(s) not found: {', '.join(missing)}")
    return files


def empty_model(cfg: ModelConfig) -> CausalLM:
    with torch.device("meta"):
        return CausalLM(cfg)


def _expected(model: CausalLM) -> dict[str, torch.Size]:
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    return shapes


def _assign(model: CausalLM, state: dict[str, torch.Tensor]) -> CausalLM:
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.reset_buffers()
    return model.eval().requires_grad_(False)


def load_checkpoint(cfg: ModelConfig, folder: str | Path, device: torch.device | str,
                    dtype: torch.dtype, progress: bool = True) -> CausalLM:
    model = empty_model(cfg)
    expected = _expected(model)
    state: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            keys = list(f.keys())
            for key in tqdm(keys, desc=f"loading {path.name}", disable=not progress, leave=False):
                name = key.removeprefix("model.")
                if name not in expected:
                    tied_head = name == "lm_head.weight" and cfg.tie_word_embeddings
                    if not (tied_head or name.endswith(IGNORED_SUFFIXES)):
                        unexpected.append(key)
                    continue
                tensor = f.get_tensor(key)
                if tensor.shape != expected[name]:
                    raise CheckpointError(
                        f"tensor {key!r} in {path.name} has shape {tuple(tensor.shape)}, "
                        f"config.json implies {tuple(expected[name])}")
                state[name] = tensor.to(device=device, dtype=dtype)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensor(s): {', '.join(missing[:8])}")
    if unexpected:
        raise CheckpointError(
            f"checkpoint has {len(unexpected)} tensor(s) the model does not use: "
            f"{', '.join(unexpected[:8])}")
    return _assign(model, state)


def random_model(cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype,
                 seed: int = 0, std: float = 0.02) -> CausalLM:
    """Seeded random weights with the real shapes: N(0, std) matrices, unit norm weights."""
    model = empty_model(cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, shape in _expected(model).items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            w = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std
            state[name] = w.to(dtype)
    return _assign(model, state)
