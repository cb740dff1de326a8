"""One variant timed for the autotuner: a decode step's median time on the device and the
distance of its logits from the eager model's on the same step.

    measure(model, name, opts, root, iters, step_inputs(model, batch, max_seq_len),
            max_rel_err) -> {ms, rel_err, error}

A variant whose logits are farther than ``max_rel_err`` (relative norm; NaN included) carries
the reason as its error, as does one that cannot fit or finish (the exception, shortened);
the autotuner never keeps either.
"""
from __future__ import annotations

from pathlib import Path

import torch

from megakernel.compiler.artifact import compile_cached
from megakernel.compiler.pipeline import CompileOptions


def time_variant(model, name: str, opts: CompileOptions, root: Path, iters: int,
                 state: tuple, expected: torch.Tensor) -> tuple[float, float]:
    """Median ms of one decode step on ``state`` = (tokens, positions, cache) of the batch,
    and the relative distance of that step's logits from ``expected`` (eager's)."""
    from megakernel.bench.decode import median_step_ms
    from megakernel.bench.sweep import rel_err

    from .megakernel import MegakernelStep

    compiled, _ = compile_cached(model, opts, name, root)
    tokens, positions, cache = state
    step = MegakernelStep(compiled, model, cache)
    with torch.inference_mode():
        ms = median_step_ms(lambda: step(tokens, positions, cache), cache.device,
                            min(3, iters), iters)
        err = rel_err(step(tokens, positions, cache), expected)
    step.synchronize()
    return ms, err


def step_inputs(model, batch: int, max_seq_len: int) -> tuple:
    """(state, expected): one decode step's (tokens, positions, cache) at position
    ``max_seq_len - 1`` and the eager model's fp32 logits [B, V] of it (which writes the same
    cache slot every variant's step writes)."""
    from megakernel.bench.decode import decode_state

    state = decode_state(model, batch, max_seq_len)
    with torch.inference_mode():
        return state, model(*state).float()


def wrong(rel_err: float, max_rel_err: float) -> str | None:
    """Why a variant's logits are rejected (NaN included), or None."""
    if rel_err <= max_rel_err:
        return None
    return f"wrong logits: relative distance {rel_err:.2e} from eager's (at most {max_rel_err})"


def measure(model, name: str, opts: CompileOptions, root: Path, iters: int, inputs: tuple,
            max_rel_err: float) -> dict:
    """A variant's ledger fields: ms, its logits' distance from eager's and the error that
    rejects it (wrong logits, or a kernel that cannot fit or finish)."""
    try:
        ms, err = time_variant(model, name, opts, root, iters, *inputs)
        return dict(ms=ms, rel_err=err, error=wrong(err, max_rel_err))
    except Exception as err:  # a variant that cannot fit or finish: skip it
        return dict(ms=None, error=f"{type(err).__name__}: {err}"[:300])
