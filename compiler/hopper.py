"""Build a generated kernel for Hopper (sm_90) without a GPU: ``triton.compile`` with a
``GPUTarget``. Proves that what the interpreter accepts also compiles, and reports registers,
shared memory and spills. Must run in a process without TRITON_INTERPRET."""
from __future__ import annotations

import os

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile

from .pipeline import CompileOptions
from .registry import NUM_WORDS

POINTERS = {
    "ins_ptr": "*i32", "waits_ptr": "*i32", "queue_ptr": "*i32", "counters_ptr": "*i32",
    "error_ptr": "*i32", "weights_ptr": "*{dt}", "act_ptr": "*{dt}",
    "f32_ptr": "*fp32", "cache_ptr": "*{dt}", "tokens_ptr": "*i64", "positions_ptr": "*i64",
    "block_table_ptr": "*i32", "epoch": "i32", "spin_limit": "i32", "trace_ptr": "*i64",
    "NWORDS": "constexpr", "PREFETCH": "constexpr", "TRACE": "constexpr", "BACKOFF": "constexpr",
    "POLL": "constexpr", "PF_START": "constexpr", "STAGE": "constexpr", "KV_AHEAD": "constexpr",
    "BY_SM": "constexpr", "PDL": "constexpr",
}
DEFAULT_SWITCHES = CompileOptions(1, 16).switches()      # those of the default options


def compile_for_hopper(kernel, dtype: str = "bf16", num_warps: int = 4, num_stages: int = 3,
                       trace: int = 0, switches: dict | None = None, max_registers: int = 0):
    """The sm_90 build of a generated kernel; ``switches``: its GPU-only constexprs
    (``CompileOptions.switches``), by default those of the default options; ``max_registers``
    as ``CompileOptions.max_registers``."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_for_hopper needs a process without TRITON_INTERPRET=1")
    signature = {k: v.format(dt=dtype) for k, v in POINTERS.items()}
    # as the launcher specialises them at run time: every pointer 16-byte aligned
    aligned = {(kernel.arg_names.index(k),): [["tt.divisibility", 16]]
               for k, v in signature.items() if v.startswith("*")}
    constexprs = {"NWORDS": NUM_WORDS, "TRACE": trace, **DEFAULT_SWITCHES, **(switches or {})}
    src = ASTSource(kernel, signature, constexprs=constexprs, attrs=aligned)
    compiled = triton_compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages,
                                       **({"maxnreg": max_registers} if max_registers else {})})
    return compiled
