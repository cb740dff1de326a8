"""Run a compiled megakernel: bind a model's weights, own the arenas, launch one step.

``MegakernelStep(compiled, model, kv_cache)(tokens [B, 1], positions [B, 1], kv_cache)`` returns
logits [B, 1, V] after one launch. The model's parameters are moved into one weight arena (they
stay usable by eager PyTorch as views of it). Activation and scratch arenas start as NaN. Counters
count up by one epoch per step and are never reset; a wait that spins past its bound makes the
kernel record the task and counter, and this class raises :class:`WatchdogError` naming them.
On the GPU a step does not wait for the kernel: like a CUDA error, a watchdog trip is raised by a
later call or by ``synchronize()``. The error word is copied to the host every ``ERROR_EVERY``
steps (a copy engine's transfer between two kernels idles the GPU for about 5 us), so a later
call raises at most ``ERROR_EVERY * (MAX_UNCHECKED + 1)`` steps after the trip; every other
worker of a tripped step, and of the steps after it, gives up at its next wait instead of
hanging. Tokens and positions are read as int64: a caller's contiguous int64 tensors on the
device are read where they are, anything else is first copied into the step's own.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import numpy as np
import torch

from megakernel.interpreter import kernel_target

from .jit_keys import settle
from .residency import check_residency, reserve_staging


class WatchdogError(RuntimeError):
    pass


MAX_UNCHECKED = 2   # copies of the error word made on the GPU and not yet read (at most)
ERROR_EVERY = 8     # GPU steps between two copies of the error word


def cache_dir() -> Path:
    root = Path(os.environ.get("MEGAKERNEL_CACHE", Path.home() / ".cache" / "megakernel"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def load_kernel(source: str, name: str):
    """Triton needs real source files: write the generated module once, import it."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = cache_dir() / f"kernel_{digest}.py"
    if not path.is_file():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        tmp.replace(path)
    spec = importlib.util.spec_from_file_location(f"megakernel_generated_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    settle(module)                # its key as every other process computes it
    return getattr(module, name)


def bind_weights(model, names: tuple[str, ...], device) -> tuple[torch.Tensor, list[int]]:
    """Copy every distinct parameter into one arena and make the model's parameters views of it.
    Returns (arena, offset of each weight id in units of ALIGN elements). A matrix starts on a
    multiple of its row length too, so that the arena read as [rows, K] holds every matrix of
    row length K at a whole row (the CUDA backend's tensor maps)."""
    from math import lcm

    from megakernel.compiler.encode import ALIGN

    params = [model.get_parameter(n) for n in names]
    offsets, top, starts = [], 0, {}          # tied parameters share one slot
    for p in params:
        if id(p) not in starts:
            step = lcm(ALIGN, p.shape[-1]) if p.dim() == 2 else ALIGN
            top = -(-top // step) * step
            starts[id(p)] = top
            top += -(-p.numel() // ALIGN) * ALIGN
        offsets.append(starts[id(p)] // ALIGN)
    if top // ALIGN >= 2 ** 31:
        raise ValueError(f"weights of {top} elements: offsets overflow the int32 instruction words")
    arena = torch.empty(top, dtype=params[0].dtype, device=device)
    for p in {id(p): p for p in params}.values():
        view = arena[starts[id(p)]: starts[id(p)] + p.numel()].view(p.shape)
        view.copy_(p.data)
        p.data = view
    return arena, offsets


def resolve_weights(instructions: np.ndarray, weight_words: np.ndarray, offsets: list[int]):
    """Instruction words holding weight ids -> those weights' arena offsets / ALIGN."""
    ins = instructions.copy()
    ins[weight_words] = np.asarray(offsets, dtype=np.int64)[ins[weight_words]]
    return ins


def launch_args(s, kv_cache: torch.Tensor, options, trace_mode: int) -> tuple[tuple, dict]:
    """The kernel's arguments, from a step ``s`` (or anything holding the same tensors)."""
    from megakernel.compiler.registry import NUM_WORDS

    return ((s.ins, s.waits, s.queues, s.counters, s.error, s.weights, s.act, s.f32,
             kv_cache, *s.inputs, s.block_table, s.epoch, s.spin_limit, s.stamps[1:]),
            dict(NWORDS=NUM_WORDS, TRACE=trace_mode, num_warps=options.num_warps,
                 **options.switches(kv_cache.is_cuda),
                 **({"maxnreg": options.max_registers}
                    if kv_cache.is_cuda and options.max_registers else {}),
                 **({"launch_pdl": True} if kv_cache.is_cuda and options.dependent_launch
                    else {})))


def queue_tables(enc, by_sm: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's queue table, int32: (first, count) of each of the W queues, then, for
    ``queues_by_sm``, an empty queue and W claims (``kernel_loop.claim_sm``); and its [W, 2]
    view of the queues (the grid: one program a queue)."""
    w = len(enc.queues)
    table = torch.zeros(2 * w + (w + 2) * by_sm, dtype=torch.int32, device=device)
    table[:2 * w] = torch.as_tensor(enc.queues, dtype=torch.int32).flatten()
    return table, table[:2 * w].view(w, 2)


def build_ahead(compiled, dtype: torch.dtype, device="cuda", source: str | None = None) -> None:
    """Build the kernel for this GPU without launching it, from stand-in arguments of a launch's
    dtypes and alignment, so that a later launch (here or in another process) finds it in
    Triton's cache (``source``: a changed copy of the generated module instead). Nothing to
    build under the interpreter."""
    from types import SimpleNamespace

    if torch.device(device).type != "cuda":
        return
    small = lambda dt: torch.zeros(8, dtype=dt, device=device)
    i32, i64 = small(torch.int32), small(torch.int64)
    stand_in = SimpleNamespace(ins=i32, waits=i32, queues=i32, counters=i32, error=i32,
                               weights=small(dtype), act=small(dtype),
                               f32=small(torch.float32), inputs=(i64, i64), block_table=i32,
                               epoch=1, spin_limit=1, stamps=small(torch.int64))
    args, kwargs = launch_args(stand_in, small(dtype), compiled.options, 0)
    kernel = load_kernel(source or compiled.kernel.source, compiled.kernel.kernel_name)
    kernel.warmup(*args, grid=(1,), **kwargs)


def arenas(memory, model, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation arena (``dtype``) and the fp32 one, NaN but for the model's constant
    buffers (e.g. the RoPE inverse frequencies) at their fp32 offsets."""
    act = torch.full((max(memory.act_numel, 1),), float("nan"), dtype=dtype, device=device)
    f32 = torch.full((max(memory.f32_numel, 1),), float("nan"), device=device)
    constants = dict(model.named_buffers())
    for name, off in memory.f32.items():
        if name in constants:
            buf = constants[name].float().flatten()
            f32[off: off + buf.numel()] = buf
    return act, f32


def trace_stamps(instructions: int, workers: int, mode: int, device) -> torch.Tensor:
    """The stamps a launch of trace ``mode`` writes: [0] the tick counter (mode 2, the GPU's
    %globaltimer: the instructions' count), then (wait, start, end) per instruction, then (mode
    2) each worker's SM and one more word (a program without a queue, ``queues_by_sm``'s
    error); two unused words without a trace."""
    n = max(instructions, 1)
    stamps = torch.zeros(1 + 3 * n + workers + 1 if mode else 2, dtype=torch.int64,
                         device=device)
    if mode == 2:
        stamps[0] = n
    return stamps


class MegakernelStep:
    def __init__(self, compiled, model, kv_cache: torch.Tensor, spin_limit: int = 1 << 19,
                 trace: bool = False):
        self.compiled, self.spin_limit = compiled, spin_limit
        dims, enc, device = compiled.ops.dims, compiled.encoded, kv_cache.device
        self.kernel = self._load_kernel(compiled, kv_cache.device)
        i32 = lambda a: torch.as_tensor(a, dtype=torch.int32, device=device).contiguous()
        self.weights, offsets = bind_weights(model, enc.memory.weights, device)
        if device.type == "cpu" and self.weights.dtype == torch.bfloat16:
            raise ValueError("a bfloat16 megakernel on the CPU: the Triton interpreter's bf16 "
                             "dots are wrong; run it in float32 or float16")
        if compiled.options.tile.staged_kib and self.weights.element_size() != 2:
            raise ValueError(f"staged_kib={compiled.options.tile.staged_kib}: staged weights "
                             f"must be 2-byte (bf16 or fp16), not {self.weights.dtype}")
        self.ins = i32(resolve_weights(enc.instructions, enc.weight_words, offsets))
        self.waits = i32(enc.waits)
        self.queue_table, self.queues = queue_tables(enc, compiled.options.queues_by_sm, device)
        self.act, self.f32 = arenas(enc.memory, model, self.weights.dtype, device)
        self.counters = torch.zeros(max(compiled.sync.num_counters + compiled.sync.num_tickets,
                                        1), dtype=torch.int32,
                                    device=device)
        self.error = torch.zeros(4, dtype=torch.int32, device=device)
        blocks = dims.max_seq_len // compiled.options.tile.kv_block
        self.block_table = i32(torch.arange(dims.batch * blocks).view(dims.batch, blocks))
        self.tokens = torch.zeros(dims.batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(dims.batch, dtype=torch.int64, device=device)
        self.inputs = (self.tokens, self.positions)          # what the next launch reads
        off = enc.memory.act[compiled.ops.output]
        self.logits = self.act[off: off + dims.batch * dims.vocab].view(dims.batch, 1, dims.vocab)
        self.epoch = 0
        # trace mode: 2 = %globaltimer (GPU), 1 = ticks (interpreter)
        self.trace_mode = 0 if not trace else (2 if device.type == "cuda" else 1)
        self.stamps = trace_stamps(len(enc.instructions), len(compiled.schedule.queues),
                                   self.trace_mode, device)
        self.sm_stamps = self.trace_mode == 2
        self.expected_cache = tuple(compiled.ops.buffers["kv_cache"].shape)
        # instruction index -> (task id, worker): instructions are grouped by worker queue
        self.owners = [(t, w) for w, q in enumerate(compiled.schedule.queues) for t in q]
        self.resident_checked = False
        # the error word of each step, copied back without waiting: (event, pinned copy)
        self.unchecked: list = []
        self.copies_made = 0
        self.error_copies = torch.zeros((MAX_UNCHECKED + 2, 4), dtype=torch.int32,
                                        pin_memory=device.type == "cuda")

    def _load_kernel(self, compiled, device):
        """The kernel a launch runs: the generated Triton module's (``CudaStep``: its own)."""
        return load_kernel(compiled.kernel.source, compiled.kernel.kernel_name)

    def _args(self, kv_cache: torch.Tensor) -> tuple[tuple, dict]:
        return launch_args(self, kv_cache, self.compiled.options, self.trace_mode)

    def launch(self, kv_cache: torch.Tensor) -> None:
        self.epoch += 1
        args, kwargs = self._args(kv_cache)
        if kv_cache.is_cuda and not self.resident_checked:
            built = self.kernel.warmup(*args, grid=(len(self.queues),), **kwargs)
            reserve_staging(built, kwargs["STAGE"])
            check_residency(built, len(self.queues), kwargs["num_warps"], kv_cache.device)
            self.resident_checked = True
        self.kernel[(len(self.queues),)](*args, **kwargs)

    def check(self, wait: bool = False) -> None:
        """Raise for the oldest step whose kernel tripped the watchdog, among the steps that
        have finished (all of them with ``wait``, or while more than MAX_UNCHECKED are left)."""
        while self.unchecked and (wait or len(self.unchecked) > MAX_UNCHECKED
                                  or self.unchecked[0][0].query()):
            done, err = self.unchecked.pop(0)
            done.synchronize()
            self._raise_if(err.tolist())

    def synchronize(self) -> None:
        """Wait for every launched step; raise if one of them tripped the watchdog."""
        if self.error.is_cuda and self.epoch % ERROR_EVERY:    # steps since the last copy
            self._copy_error()
        self.check(wait=True)

    def _record_error(self) -> None:
        if not self.error.is_cuda:          # the interpreter has finished the step already
            self._raise_if(self.error.tolist())
        elif self.epoch % ERROR_EVERY == 0:
            self._copy_error()

    def _copy_error(self) -> None:
        self.copies_made += 1
        slot = self.error_copies[self.copies_made % len(self.error_copies)]
        slot.copy_(self.error, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.unchecked.append((done, slot))

    def _raise_if(self, err: list[int]) -> None:
        if err[0]:
            self.unchecked.clear()
            self.error.zero_()
            self.counters.zero_()
            self.queue_table[2 * len(self.queues):] = 0         # claims (queues_by_sm)
            self.epoch = 0
            if err[1] < 0:
                raise WatchdogError(
                    f"megakernel: SM {-1 - err[1]} has no queue of its own (queues_by_sm: an SM "
                    f"id past the {len(self.queues)} queues, or a second program on that SM); "
                    "build with one worker per SM and queues_by_sm only for that GPU's SMs")
            task = self.compiled.tasks.tasks[self.owners[err[1]][0]]
            raise WatchdogError(
                f"megakernel watchdog: task {task.id} ({task.kind} of {task.op}, {task.args}) "
                f"waited past its bound on counter {err[2]} (seen {err[3]})")

    def __call__(self, tokens, positions, kv_cache):
        if tuple(kv_cache.shape) != self.expected_cache:
            raise ValueError(f"kv_cache has shape {tuple(kv_cache.shape)}, the kernel was "
                             f"compiled for {self.expected_cache}")
        self.check()
        self.inputs = (_readable(tokens, self.tokens), _readable(positions, self.positions))
        self.launch(kv_cache)
        self._record_error()
        return self.logits


def _readable(given: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """``given`` [B, 1] itself where the kernel can read it as the int64 vector ``own`` [B] is
    read (same device, contiguous, 16-byte aligned as the kernel was built for), else ``own``
    holding a copy of it."""
    if (given.dtype == own.dtype and given.device == own.device and given.is_contiguous()
            and given.numel() == own.numel() and given.data_ptr() % 16 == 0):
        return given.view(-1)
    own.copy_(given.reshape(-1))
    return own


def tuned_kernel(model, batch: int, seq: int, target: str):
    """The kernel ``megakernel autotune`` kept for this model, batch size, length and target
    under $MEGAKERNEL_CACHE/autotune, or None."""
    import json
    import warnings

    from megakernel.compiler.artifact import load, model_hash

    want = model_hash(model)
    for path in sorted((cache_dir() / "autotune").glob(f"*/b{batch}/manifest.json")):
        info = json.loads(path.read_text())
        if (info["model_hash"], info["max_seq_len"], info["target"]) == (want, seq, target):
            try:
                return load(path.parent)
            except ValueError as err:                  # tuned by an earlier version
                warnings.warn(f"tuned kernel not used: {err}", stacklevel=2)
    return None


def megakernel_backend(model, kv_cache: torch.Tensor, trace: bool = False, kernel: str = "triton",
                       cuda: dict | None = None, **options):
    """Backend factory: the autotuned kernel for the cache's batch size and length when there is
    one and no options are given, else compile (or reuse) one; bind; return the step. ``kernel``:
    run the compiled tables with the Triton kernel or (``"cuda"``, GPU only) the CUDA
    backend's (``cuda_step``; ``cuda``: its knobs, e.g. ``{"kv_ring": True}``; without
    ``options``, the tuned or default kernel's variant in the form that backend builds)."""
    if kernel not in ("triton", "cuda"):
        raise ValueError(f"kernel {kernel!r} unknown; choose triton or cuda")
    if kernel == "cuda" and not kv_cache.is_cuda:
        raise ValueError("the CUDA backend (megakernel-cuda) runs on a CUDA device; on the CPU "
                         "use the Triton kernel (megakernel) under the interpreter")
    from megakernel.compiler.artifact import compile_cached
    from megakernel.compiler.pipeline import CompileOptions

    target = kernel_target(kv_cache.device.type)
    batch, seq = kv_cache.shape[2], kv_cache.shape[4]
    compiled = None if options else tuned_kernel(model, batch, seq, target)
    if compiled is None:
        opts = CompileOptions(batch, seq, target=target, **options)
        compiled, _ = compile_cached(model, opts, model.config.arch, cache_dir() / "artifacts")
    if kernel == "cuda":
        from .cuda_step import CudaStep, cuda_compiled

        if not options:     # the tuned (or default) kernel's variant as the CUDA backend builds it
            compiled = cuda_compiled(compiled, model, kv_cache.device)
        return CudaStep(compiled, model, kv_cache, trace=trace, **(cuda or {}))
    return MegakernelStep(compiled, model, kv_cache, trace=trace)


class KernelLibrary:
    """Megakernels compiled ahead of time by ``megakernel compile -o DIR`` (one folder per batch
    size). ``pick`` returns the kernel of the exact batch size or of the next larger one."""

    def __init__(self, folder, model):
        import json

        from megakernel.compiler.artifact import check_current, load, model_hash

        self.folder, self.by_batch = Path(folder), {}
        manifests = sorted(self.folder.glob("*/manifest.json"))
        if not manifests:
            raise FileNotFoundError(f"no compiled kernels (*/manifest.json) under {folder}")
        expected = model_hash(model)
        for path in manifests:
            info = json.loads(path.read_text())
            if info["model_hash"] != expected:
                raise ValueError(f"{path.parent} was compiled for another model "
                                 f"({info['model']}, hash {info['model_hash']} != {expected})")
            check_current(info, path.parent)
            self.by_batch[info["batch_size"]] = path.parent
        self._load = load

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(self.by_batch)

    def pick(self, batch: int, positions_needed: int):
        fits = [b for b in self.batch_sizes if b >= batch]
        if not fits:
            raise ValueError(f"batch {batch} is larger than every compiled batch size "
                             f"{self.batch_sizes} in {self.folder}")
        compiled = self._load(self.by_batch[fits[0]])
        if positions_needed > compiled.options.max_seq_len:
            raise ValueError(f"{positions_needed} positions needed, the kernels in {self.folder} "
                             f"hold {compiled.options.max_seq_len}")
        return compiled

    def step(self, compiled, model, kv_cache) -> MegakernelStep:
        kernel_target(kv_cache.device.type)
        return MegakernelStep(compiled, model, kv_cache)
