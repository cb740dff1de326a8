"""Artifacts and the compile cache.

A compiled kernel depends on the model's shapes and dtype, never on its weight values (weights are
bound at run time), so the cache key hashes the config, the parameter shapes and dtype, every
compile option and the versions of everything that generates or builds code. An artifact folder
holds ``kernel.py`` (the generated source), ``schedule.json``, ``instructions.npz``,
``manifest.json`` and ``compiled.pkl`` (the whole pipeline result, for reuse in about a second).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import torch
import triton

import megakernel

from .pipeline import Compiled, CompileOptions, compile_model

def model_hash(model) -> str:
    h = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
    for name, p in model.named_parameters(remove_duplicate=False):
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
    return h.hexdigest()[:16]


def code_hash() -> str:
    """Every compiler module (they generate the code and define the pickled IR) and the template."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + path.read_bytes())
    from .codegen import _template_dir

    h.update((_template_dir() / "megakernel.py.jinja").read_bytes())
    return h.hexdigest()[:16]


def cache_key(model, options: CompileOptions) -> str:
    parts = [model_hash(model), repr(options), code_hash(), megakernel.__version__,
             torch.__version__, triton.__version__]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def manifest(compiled: Compiled, model, key: str) -> dict:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {"model": compiled.name, "model_hash": model_hash(model), "cache_key": key,
            "batch_size": compiled.options.batch_size,
            "max_seq_len": compiled.options.max_seq_len, "target": compiled.options.target,
            "gpu": gpu, "dtype": str(next(model.parameters()).dtype),
            "options": dataclasses.asdict(compiled.options), "tasks": len(compiled.tasks.tasks),
            "workers": compiled.schedule.num_workers, "scheduler": compiled.schedule.scheduler,
            "makespan_us": compiled.schedule.makespan_us, "megakernel": megakernel.__version__,
            "torch": torch.__version__, "triton": triton.__version__}


def save(compiled: Compiled, model, folder: Path, key: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    enc = compiled.encoded
    (folder / "kernel.py").write_text(compiled.kernel.source)
    np.savez_compressed(folder / "instructions.npz", instructions=enc.instructions,
                        waits=enc.waits, queues=enc.queues)
    (folder / "schedule.json").write_text(json.dumps({
        "scheduler": compiled.schedule.scheduler, "makespan_us": compiled.schedule.makespan_us,
        "queues": [list(q) for q in compiled.schedule.queues]}))
    with open(folder / "compiled.pkl", "wb") as f:
        pickle.dump(compiled, f)
    (folder / "manifest.json").write_text(json.dumps(manifest(compiled, model, key), indent=1))
    return folder


def saved_key(folder: Path) -> str | None:
    """The cache key of the artifact saved in ``folder`` (its manifest is written last)."""
    path = Path(folder) / "manifest.json"
    return json.loads(path.read_text()).get("cache_key") if path.is_file() else None


def load(folder: Path) -> Compiled:
    with open(Path(folder) / "compiled.pkl", "rb") as f:
        return pickle.load(f)


def compile_cached(model, options: CompileOptions, name: str, root: Path) -> tuple[Compiled, bool]:
    """(compiled, whether it came from the cache)."""
    key = cache_key(model, options)
    folder = root / f"{name}-b{options.batch_size}-{key}"
    if (folder / "compiled.pkl").is_file():
        return load(folder), True
    compiled = compile_model(model, options, name)
    save(compiled, model, folder, key)
    return compiled, False
