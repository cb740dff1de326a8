"""The same Triton cache key for a generated kernel in every process.

    settle(module) -> None    after importing a generated module: its jit functions, and those
                              of the ``megakernel`` modules not settled yet, get complete keys
    forget() -> None          after changing a jit function or a global one reads: the next
                              ``settle`` computes every module's keys again

Triton (3.6) keys a jit function (``JITCallable.cache_key``) by its source, its callees' keys and
the constexpr globals that it and they read (``used_global_vals``), but merges a callee's globals
into the caller's before it computes the callee's key (``DependenciesFinder._update_hash``). So a
key computed while some callees are hashed for the first time misses their globals (e.g.
``staging.HEAD``), and a later key of the same kernel, once they are hashed, holds them. A kernel
that an autotune worker built while it hashed some callees for the first time (stored in Triton's
cache under that short key) was not found by the autotuner's process, which then built it again
while timing it (in a cold H100 tune about 55 of 321 variants took 4-8 s to time, the first 14
among them, the rest about 0.4), nor the other way round. Here the keys of each newly imported
module's jit functions are computed again until no function's globals change: then each holds all
of its callees', whatever the order in which a process hashed them.
"""
from __future__ import annotations

import sys

from triton.runtime.jit import JITCallable

MAX_ROUNDS = 16     # a round per level of calls at most: op bodies call helpers a few deep
_settled: set[str] = set()      # modules whose functions' keys are complete


def settle(module) -> None:
    new = [name for name, m in list(sys.modules.items())
           if name.startswith("megakernel.") and name not in _settled and m is not None]
    fns = [f for m in [*(sys.modules[name] for name in new), module]
           for f in vars(m).values() if isinstance(f, JITCallable)]
    for _ in range(MAX_ROUNDS):
        seen = [set(f.used_global_vals) for f in fns]
        for f in fns:
            f.hash = None
        for f in fns:
            f.cache_key           # a callee with no key yet is hashed here, merged before
        if [set(f.used_global_vals) for f in fns] == seen:
            break
    _settled.update(new)


def forget() -> None:
    _settled.clear()
