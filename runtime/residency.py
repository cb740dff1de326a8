"""Whether a compiled kernel's programs fit on the GPU at once, and its staging area's shared
memory (``compiler.staging``), for a launch of every worker of a persistent kernel.

    programs_per_sm(regs, smem, num_warps, ...) -> programs resident on one SM
    reserve_staging(built, extra)               -> the launch asks for ``extra`` more bytes
    check_residency(built, workers, num_warps, device)  raises where the grid cannot be resident
"""
from __future__ import annotations

import torch


def programs_per_sm(regs: int, smem: int, num_warps: int, regs_per_sm: int = 65536,
                    smem_per_sm: int = 233472, threads_per_sm: int = 2048) -> int:
    """Programs of ``num_warps`` warps, ``regs`` registers per thread and ``smem`` bytes of shared
    memory that fit on one SM at once (H200 figures by default): registers are allocated per warp
    in units of 256, each block reserves 1 KiB of shared memory."""
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    return min(regs_per_sm // (regs_per_warp * num_warps), smem_per_sm // (smem + 1024),
               threads_per_sm // (32 * num_warps))


def reserve_staging(built, extra: int) -> None:
    """Launch ``built`` with ``extra`` bytes of dynamic shared memory beyond Triton's, aligned to
    128 bytes: the area ``compiler.staging`` addresses from the end (before the module is loaded,
    which sets the function's shared-memory limit; once per built kernel)."""
    if not extra or getattr(built, "staging_reserved", False):
        return
    if built.module is not None:
        raise RuntimeError("the kernel was loaded before its staging area was reserved")
    shared = -(-built.metadata.shared // 128) * 128 + extra
    built.metadata = built.metadata._replace(shared=shared)
    built.packed_metadata = built.packed_metadata[:-1] + (shared,)
    built.staging_reserved = True


def check_residency(built, workers: int, num_warps: int, device) -> None:
    """Every worker must be resident at once (they wait on each other): refuse a grid that the
    compiled kernel's registers and shared memory cannot fit on this GPU."""
    try:
        built._init_handles()
    except Exception as err:  # triton's OutOfResources: one program alone does not fit
        raise RuntimeError(f"the kernel does not fit on this GPU: {err}") from err
    props = torch.cuda.get_device_properties(device)
    per_sm = programs_per_sm(built.n_regs, built.metadata.shared, num_warps,
                             getattr(props, "regs_per_multiprocessor", 65536),
                             getattr(props, "shared_memory_per_multiprocessor", 233472),
                             props.max_threads_per_multi_processor)
    if workers > per_sm * props.multi_processor_count:
        raise RuntimeError(
            f"{workers} workers cannot all be resident: the kernel takes {built.n_regs} registers "
            f"per thread and {built.metadata.shared} bytes of shared memory, so {per_sm} programs "
            f"of {num_warps} warps fit per SM ({props.multi_processor_count} SMs)")
