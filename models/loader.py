"""One entry point from a model name (preset) or a local Hugging Face folder to a ready model.

``load_model(source, device=..., dtype=...)`` returns a :class:`LoadedModel` with the model in eval
mode, its config and a tokenizer. Unknown names that are not folders raise ``ValueError`` listing the
presets.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig
from .presets import PRESETS
from .tokenizer import ByteTokenizer, load_tokenizer
from .transformer import CausalLM
from .weights import load_checkpoint, random_model

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class LoadedModel:
    name: str
    model: CausalLM
    config: ModelConfig
    tokenizer: object


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def load_model(source: str, *, device: str | torch.device = "cpu",
               dtype: str | torch.dtype = "float32", seed: int = 0,
               progress: bool = True) -> LoadedModel:
    dtype = parse_dtype(dtype)
    if source in PRESETS:
        cfg = PRESETS[source]
        model = random_model(cfg, device, dtype, seed=seed, std=0.02)
        return LoadedModel(source, model, cfg, ByteTokenizer())
    folder = Path(source)
    if not folder.is_dir():
        raise ValueError(f"model {source!r} is neither a preset ({', '.join(PRESETS)}) "
                         "nor a local folder")
    cfg = ModelConfig.from_folder(folder)
    model = load_checkpoint(cfg, folder, device, dtype, progress=progress)
    tokenizer = (load_tokenizer(folder, cfg.eos_token_ids)
                 if (folder / "tokenizer.json").is_file() else ByteTokenizer())
    return LoadedModel(folder.name, model, cfg, tokenizer)
