"""The op graphs that variants are rated on and compiled from, captured once per model config,
dtype, batch size and context.

    op_graph(cfg, dtype, batch, seq) -> OpGraph   (the same object while it is kept)
    op_costs(cfg, dtype, batch, seq) -> dict      (``search.op_us``'s memo for that graph)
    hand_over(cfg, dtype, batch, seq, ops)        (a graph made in another process)

Two levels: the last GRAPHS graphs in this process, and every graph pickled under the cache
folder (``graphs/``), keyed by the config's repr, the dtype, batch size and context, the code
that captures and lowers (``artifact.code_hash``: the compiler's and the models' modules) and
torch's version. Capturing and lowering llama-3.2-1b takes 0.7-2.5 s a batch size, once for
each build process of a cold autotune and again in every warm rerun; a pickled graph (tens of
KB) loads in about a millisecond.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import torch

from megakernel.compiler.artifact import code_hash
from megakernel.compiler.pipeline import model_ops

GRAPHS = 16     # op graphs kept in a process
# op_graph's arguments -> (op graph, search.op_us's memo for it), least recently asked for first
_graphs: OrderedDict = OrderedDict()


def hand_over(cfg, dtype, batch: int, seq: int, ops) -> None:
    """Keep the op graph ``ops``, made elsewhere (the shortlists' workers), as ``op_graph`` of
    these arguments (unless one is kept already)."""
    if (cfg, dtype, batch, seq) not in _graphs:
        _keep((cfg, dtype, batch, seq), ops)


def op_graph(cfg, dtype, batch: int, seq: int):
    """The op graph of a model of config ``cfg`` at ``batch`` rows (the one handed over or
    stored, if any), kept for the next variants of that batch size, and for the refinement's
    and the compounds' ratings of each batch size in the autotuner's process."""
    return _kept(cfg, dtype, batch, seq)[0]


def op_costs(cfg, dtype, batch: int, seq: int) -> dict:
    """``search.op_us``'s memo for ``op_graph`` of the same arguments (kept and dropped with
    it)."""
    return _kept(cfg, dtype, batch, seq)[1]


def _kept(cfg, dtype, batch: int, seq: int) -> tuple:
    key = (cfg, dtype, batch, seq)
    if key in _graphs:
        _graphs.move_to_end(key)
        return _graphs[key]
    return _keep(key, _stored(cfg, dtype, batch, seq))


def _keep(key: tuple, ops) -> tuple:
    """``ops`` (with an empty memo) as the latest of the kept op graphs (the least recent beyond
    GRAPHS dropped)."""
    _graphs[key] = (ops, {})
    _graphs.move_to_end(key)
    while len(_graphs) > GRAPHS:
        _graphs.popitem(last=False)
    return _graphs[key]


def stored_path(cfg, dtype, batch: int, seq: int) -> Path:
    from .megakernel import cache_dir

    text = "|".join(map(str, (repr(cfg), dtype, batch, seq, code_hash(), torch.__version__)))
    return cache_dir() / "graphs" / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.pkl"


def _stored(cfg, dtype, batch: int, seq: int):
    """The graph from the cache folder, else captured and lowered, then stored (written to a
    file of this process's own and renamed: build processes may store the same graph at once).
    A file that does not load is captured again and replaced; where nothing can be written,
    the graph is only returned."""
    from megakernel.models.weights import empty_model

    path = stored_path(cfg, dtype, batch, seq)
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        pass
    ops = model_ops(empty_model(cfg).to(dtype), batch, seq)
    part = path.with_name(f"{path.stem}.{os.getpid()}.part")
    try:                                    # a folder that takes no files: captured each time
        path.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(pickle.dumps(ops))
        os.replace(part, path)
    except OSError:
        with contextlib.suppress(OSError):
            part.unlink()
    return ops
