"""Run a megakernel through the CUDA backend.

``CudaStep(compiled, model, kv_cache)`` is a :class:`MegakernelStep` whose launch runs the kernel
``compiler.cuda_codegen`` generates from the same compiled tables, built with nvcc for sm_90a
(``build_cubin``, cached by source) and launched through the CUDA driver (ctypes), on the
current PyTorch stream. Weights, arenas, counters, epochs and the watchdog are the base class's;
only bf16 models on a CUDA device are built.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

from .megakernel import MegakernelStep, cache_dir, launch_args

ARCH = ["-gencode=arch=compute_90a,code=sm_90a"]
FLAGS = ["-O3", "-std=c++17", "-cubin", "-lineinfo", "-Xptxas=-v"]


def nvcc() -> str:
    found = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"),
                                                 "bin", "nvcc")
    if not os.path.isfile(found):
        raise RuntimeError("the CUDA backend needs nvcc (on PATH or under $CUDA_HOME/bin)")
    return found


def build_cubin(source: str) -> Path:
    """nvcc the generated source (with the op headers beside the template) into a cubin for
    sm_90a, once per source; ptxas's report of registers and spills lands beside it (.log)."""
    from megakernel.compiler.codegen import _template_dir

    headers = sorted(_template_dir().glob("*.cuh"))
    digest = hashlib.sha256("\0".join([source, *(p.read_text() for p in headers),
                                       *ARCH, *FLAGS]).encode()).hexdigest()[:16]
    folder = cache_dir() / "cuda"
    folder.mkdir(parents=True, exist_ok=True)
    cubin = folder / f"kernel_{digest}.cubin"
    if cubin.is_file():
        return cubin
    src = folder / f"kernel_{digest}.cu"
    src.write_text(source)
    tmp = cubin.with_suffix(f".{os.getpid()}.tmp")
    run = subprocess.run([nvcc(), *FLAGS, *ARCH, f"-I{_template_dir()}", "-o", str(tmp),
                          str(src)], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"nvcc failed on {src}:\n{run.stderr[-4000:]}")
    cubin.with_suffix(".log").write_text(run.stderr)
    tmp.replace(cubin)
    return cubin


class TensorMap:
    """The 128 bytes of ``count`` CUtensorMaps, 64-byte aligned in host memory (as the driver
    asks); ``param`` (which keeps its buffer alive) is what a launch passes."""

    def __init__(self, count: int = 1):
        buf = (ctypes.c_ubyte * (128 * count + 64))()
        offset = -ctypes.addressof(buf) % 64
        self.param = (ctypes.c_ubyte * (128 * count)).from_buffer(buf, offset)   # holds buf
        self.address = ctypes.addressof(self.param)


def kernel_maps(driver: "Driver", arena: torch.Tensor, ks: tuple[int, ...],
                act: torch.Tensor | None = None, x_rows: int = 0) -> TensorMap:
    """The CUDA kernel's ``mk::Maps``: for each row length K of ``ks``, the weight arena read as
    [rows, K] in boxes of 128, 64, 32, 16 and 8 rows by 64 columns, then the activation arena
    ``act`` read as [rows, K] in boxes of ``x_rows`` rows (x's chunks, ``megakernel_mma.cuh``:
    as many bytes as its copies expect); one blank entry's worth where ``ks`` is empty
    (projections on CUDA cores)."""
    from megakernel.compiler.cuda_codegen import KC, NBOX

    n = max(1, len(ks))
    maps = TensorMap((NBOX + 1) * n)
    for i, k in enumerate(ks):
        for b in range(NBOX):
            driver.tensor_map(arena.data_ptr(), arena.numel() // k, k, 128 >> b, KC,
                              into=maps.address + 128 * (i * NBOX + b))
        if act is not None:
            driver.tensor_map(act.data_ptr(), act.numel() // k, k, x_rows, KC,
                              into=maps.address + 128 * (n * NBOX + i))
    return maps


class _LaunchAttribute(ctypes.Structure):       # CUlaunchAttribute: id, pad, a 64-byte value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):          # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def _cluster_attribute(cluster: int) -> _LaunchAttribute:
    attr = _LaunchAttribute(id=4)                      # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    (ctypes.c_uint * 3).from_buffer(attr.value)[:] = [cluster, 1, 1]
    return attr


class Driver:
    """The few CUDA driver calls a launch needs, through ctypes."""
    MAX_DYNAMIC_SHARED = 8       # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, status: int, what: str) -> None:
        if status:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(status, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {name.value.decode() if name.value else status}")

    def load(self, cubin: Path, name: str, smem: int) -> ctypes.c_void_p:
        module, func = ctypes.c_void_p(), ctypes.c_void_p()
        data = cubin.read_bytes()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), data), "cuModuleLoadData")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(func), module, name.encode()),
                   "cuModuleGetFunction")
        self.check(self.lib.cuFuncSetAttribute(func, self.MAX_DYNAMIC_SHARED, smem),
                   "cuFuncSetAttribute")
        return func

    def tensor_map(self, ptr: int, rows: int, cols: int, box_rows: int,
                   box_cols: int, into: int | None = None) -> "TensorMap | None":
        """A TMA descriptor of a row-major bf16 matrix [rows, cols] at ``ptr``, copied as boxes
        [box_rows, box_cols] (box_cols * 2 <= 128 bytes) with the 128-byte swizzle, rows past
        the end filled with zeros; a kernel takes it as a ``__grid_constant__ CUtensorMap``.
        ``into``: encoded at that host address (64-byte aligned) instead, None returned."""
        if box_cols * 2 > 128 or box_rows > 256 or (cols * 2) % 16:
            raise ValueError(f"box [{box_rows}, {box_cols}] of a [{rows}, {cols}] bf16 matrix: "
                             "at most 256 rows, 128 bytes a row, rows a multiple of 16 bytes")
        tmap = TensorMap() if into is None else None
        u64, u32 = ctypes.c_uint64, ctypes.c_uint32
        self.check(self.lib.cuTensorMapEncodeTiled(
            ctypes.c_void_p(into if tmap is None else tmap.address), 9, 2, ctypes.c_void_p(ptr),
            (u64 * 2)(cols, rows), (u64 * 1)(cols * 2), (u32 * 2)(box_cols, box_rows),
            (u32 * 2)(1, 1), 0, 3, 3, 0),   # no interleave, 128-byte swizzle, L2 256 B, zeros
            "cuTensorMapEncodeTiled")
        return tmap

    def launch(self, func, grid: int, block: int, smem: int, stream: int, args: list,
               cluster: int = 1) -> None:
        """``cluster`` > 1: blocks in clusters of that many (``cuLaunchKernelEx``)."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p)
                                                 for a in args])
        if cluster == 1:
            self.check(self.lib.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, smem,
                                               ctypes.c_void_p(stream), params, None),
                       "cuLaunchKernel")
            return
        attr = _cluster_attribute(cluster)
        config = _LaunchConfig((grid, 1, 1), (block, 1, 1), smem, ctypes.c_void_p(stream),
                               ctypes.pointer(attr), 1)
        self.check(self.lib.cuLaunchKernelEx(ctypes.byref(config), func, params, None),
                   "cuLaunchKernelEx")

    def max_active_clusters(self, func, grid: int, block: int, smem: int, cluster: int) -> int:
        """How many clusters of ``cluster`` blocks of ``func`` the device holds at once."""
        attr = _cluster_attribute(cluster)
        config = _LaunchConfig((grid, 1, 1), (block, 1, 1), smem, None, ctypes.pointer(attr), 1)
        count = ctypes.c_int()
        self.check(self.lib.cuOccupancyMaxActiveClusters(ctypes.byref(count), func,
                                                         ctypes.byref(config)),
                   "cuOccupancyMaxActiveClusters")
        return count.value


def cuda_compiled(compiled, model, device):
    """The tables of ``compiled``'s variant in the form the CUDA backend builds
    (``effective.cuda_form``) for the GPU ``device``, compiled or reused from the artifact
    cache."""
    from megakernel.compiler.artifact import compile_cached
    from megakernel.compiler.pipeline import CompileOptions

    from .effective import cuda_form, variant_of

    dims, sms = compiled.ops.dims, torch.cuda.get_device_properties(device).multi_processor_count
    v = cuda_form(variant_of(compiled), sms, dims.batch, dims.max_seq_len)
    opts = CompileOptions(dims.batch, dims.max_seq_len, target=compiled.options.target,
                          **v.options(sms))
    return compile_cached(model, opts, model.config.arch, cache_dir() / "artifacts")[0]


class CudaStep(MegakernelStep):
    def __init__(self, compiled, model, kv_cache: torch.Tensor, spin_limit: int = 1 << 19,
                 trace: bool = False, **knobs):
        """``knobs``: ``generate_cuda``'s (flight, lanes, kv_ring, probe, kv_l2, acquire, mma,
        mma_chunks, mma_page_kib, kv_ahead, attn_runs, attn_mma, x_depth, chunk_log;
        None: its default)."""
        import inspect

        from megakernel.compiler.cuda_codegen import generate_cuda

        if not kv_cache.is_cuda:
            raise ValueError("the CUDA backend runs on a CUDA device; on the CPU use the Triton "
                             "kernel under the interpreter")
        if compiled.options.queues_by_sm:
            raise ValueError("queues_by_sm is a Triton kernel's option; the CUDA backend runs "
                             "each queue on the program of its index")
        if compiled.options.dependent_launch:
            raise ValueError("dependent_launch is a Triton kernel's option; the CUDA backend "
                             "launches each step after the previous one has ended")
        known = set(inspect.signature(generate_cuda).parameters) - {"enc", "model", "batch",
                                                                    "num_tasks"}
        if set(knobs) - known:
            raise ValueError(f"CUDA backend knobs {sorted(set(knobs) - known)} unknown; "
                             f"known: {', '.join(sorted(known))}")
        self.knobs = {k: v for k, v in knobs.items() if v is not None}
        super().__init__(compiled, model, kv_cache, spin_limit, trace)
        self.sm_stamps = False          # its kernel records no worker's SM (``trace_step``)
        if trace and self.knobs.get("chunk_log"):   # room for the wait logs after the stamps
            from megakernel.runtime.trace import LOG_WORDS

            self.stamps = torch.cat([self.stamps, self.stamps.new_zeros(
                3 * self.cuda.num_workers * self.knobs["chunk_log"] * LOG_WORDS)])
        if self.weights.dtype != torch.bfloat16:
            raise ValueError(f"the CUDA backend builds bf16 models, not {self.weights.dtype}")
        self.maps = kernel_maps(self.driver, self.weights, self.cuda.map_ks, self.act,
                                self.cuda.x_rows)   # arenas now bound

    def _load_kernel(self, compiled, device):
        """Generate, build and load the CUDA kernel (instead of the Triton module)."""
        from megakernel.compiler.cuda_codegen import generate_cuda

        sms = torch.cuda.get_device_properties(device).multi_processor_count
        workers = len(compiled.encoded.queues)
        if workers > sms:
            raise ValueError(f"the CUDA backend runs one worker an SM: {workers} workers on "
                             f"{sms} SMs (compile with one worker per SM)")
        self.cuda = generate_cuda(compiled.encoded, compiled.name, compiled.ops.dims.batch,
                                  len(compiled.tasks.tasks), **self.knobs)
        self.driver = Driver()
        return self.driver.load(build_cubin(self.cuda.source), self.cuda.kernel_name,
                                self.cuda.smem)

    def launch(self, kv_cache: torch.Tensor) -> None:
        """The Triton launch's arguments (``launch_args``, same order), then the trace switch."""
        self.epoch += 1
        args, _ = launch_args(self, kv_cache, self.compiled.options, self.trace_mode)
        c_args = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int(a)
                  for a in args] + [ctypes.c_int(1 if self.trace_mode else 0), self.maps.param]
        self.driver.launch(self.kernel, self.cuda.num_workers, self.cuda.threads,
                           self.cuda.smem, torch.cuda.current_stream().cuda_stream, c_args)
