"""The autotuner's final round: each batch size's fastest few variants timed again side by side.

    final_round(ledger, key, model, name, finalists, root, iters, rounds, state) -> {label: ms}

A variant's first timing is one median of ``iters`` steps, taken while other variants build, and
the fastest of some tens of such figures leans to the lucky. So the finalists (labels with their
``CompileOptions``) are timed again in ``rounds`` rounds, every finalist once a round in turn on
the same decode state, so that whatever drifts between rounds (clocks, the other processes'
builds) reaches all of them alike; each one's figure is the median of its rounds. Kept in the
ledger under ``key`` (a rerun times nothing). Each finalist's step binds its own copy of the
weights while the round runs. On the H200 (llama-3.2-1b, 12 batch sizes, 3 finalists, 5 rounds
of 20 steps) each batch size's fastest first figure sat 0-1% under its final one (24 rows 1.279
-> 1.292 ms), and the final round picked another winner at 3 of 12 batch sizes, each within 0.5%
of the first pick.
"""
from __future__ import annotations

import statistics

import torch

from .ledger import Ledger

FINALISTS = 3       # each batch size's fastest right variants timed again (fewer than 2: none)
FINAL_ROUNDS = 5    # rounds of ``iters`` steps each


def final_times(model, name: str, options: list, root, iters: int, rounds: int,
                state: tuple) -> list[float]:
    """Median over ``rounds`` interleaved rounds of each compiled variant's median step (ms) on
    ``state`` = (tokens, positions, cache), in the order of ``options``."""
    from megakernel.bench.decode import median_step_ms
    from megakernel.compiler.artifact import compile_cached

    from .megakernel import MegakernelStep

    tokens, positions, cache = state
    steps = [MegakernelStep(compile_cached(model, opts, name, root)[0], model, cache)
             for opts in options]
    times: list[list[float]] = [[] for _ in steps]
    with torch.inference_mode():
        for _ in range(rounds):
            for step, out in zip(steps, times):
                out.append(median_step_ms(lambda: step(tokens, positions, cache), cache.device,
                                          min(3, iters), iters))
    for step in steps:
        step.synchronize()              # a megakernel reports late errors
    return [statistics.median(t) for t in times]


def final_round(ledger: Ledger, key: str, model, name: str, finalists: list, root, iters: int,
                rounds: int, state) -> dict[str, float]:
    """{label: ms} of ``finalists`` [(label, CompileOptions)] from the ledger, else timed by
    ``final_times`` (``state``: a callable giving the decode state, asked only then) and kept."""
    times = ledger.final(key)
    if times is None:
        ms = final_times(model, name, [opts for _, opts in finalists], root, iters, rounds,
                         state())
        times = ledger.add_final(key, {label: t for (label, _), t in zip(finalists, ms)})
    return times
