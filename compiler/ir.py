"""The compiler's IR: small frozen dataclasses, one per stage boundary.

    Graph (torch.fx) --lower--> OpGraph --tile--> TaskGraph --schedule--> Schedule
        --sync--> SyncPlan --validate--> (checked) --generate--> KernelSource

Buffers live in four spaces: ``weight`` (the model's parameters, model dtype), ``act``
(activations, model dtype), ``f32`` (fp32 scratch such as attention partials) and ``cache`` (the KV
cache [L, 2, B, Hkv, S, D]); ``input`` holds tokens and positions. Regions are half-open boxes, one
``(lo, hi)`` per dimension of their buffer; a task's dependencies are exactly the earlier tasks whose
write regions overlap its read regions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Buffer:
    name: str
    space: str                  # weight | act | f32 | cache | input
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Region:
    buffer: str
    box: Box

    def overlaps(self, other: "Region") -> bool:
        return self.buffer == other.buffer and all(
            a_lo < b_hi and b_lo < a_hi for (a_lo, a_hi), (b_lo, b_hi) in zip(self.box, other.box))

    @property
    def numel(self) -> int:
        n = 1
        for lo, hi in self.box:
            n *= hi - lo
        return n


@dataclass(frozen=True)
class Op:
    """One fused operation of the decode step (e.g. norm + QKV + RoPE + cache write)."""
    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    layer: int = -1


@dataclass(frozen=True)
class Dims:
    """Static sizes every stage needs."""
    batch: int
    max_seq_len: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int
    itemsize: int               # bytes per element of the model dtype


@dataclass(frozen=True)
class OpGraph:
    dims: Dims
    buffers: dict[str, Buffer] = field(hash=False, compare=False)
    ops: tuple[Op, ...]
    output: str                 # the logits buffer [B, V]


@dataclass(frozen=True)
class Task:
    id: int
    op: str                     # name of the Op it belongs to
    kind: str                   # opcode kind in the registry
    args: dict[str, Any] = field(hash=False, compare=False)
    reads: tuple[Region, ...] = ()
    writes: tuple[Region, ...] = ()
    bytes: int = 0              # bytes moved through HBM
    flops: int = 0


def merged_writes(task: Task) -> dict[Region, int]:
    """The task's writes that one task of a ticket's does for all that take it (a fused merge's
    or reduce's), each with its ticket: every write of a task with a ``ticket``, or those its
    ``merges`` [(ticket, region)] name (a stream's cut units, two tickets at most)."""
    if "merges" in task.args:
        return {r: t for t, r in task.args["merges"]}
    return {r: task.args["ticket"] for r in task.writes} if "ticket" in task.args else {}


@dataclass(frozen=True)
class TaskGraph:
    ops: OpGraph
    tasks: tuple[Task, ...]
    deps: tuple[tuple[int, ...], ...]   # deps[t] = ids of tasks t must wait for


@dataclass(frozen=True)
class Schedule:
    num_workers: int
    queues: tuple[tuple[int, ...], ...]  # queues[w] = task ids in execution order
    makespan_us: float                   # as rated by the cost model
    scheduler: str                       # the scheduler whose answer this is
    rated: tuple = ()                    # (scheduler, makespan_us) of every candidate compared


@dataclass(frozen=True)
class SyncPlan:
    """Counters between workers: each task adds 1 to ``signal[t]`` when done; a task waits until
    every counter in ``waits[t]`` reaches epoch * ``counter_size`` of it. Tickets (fused attention
    merges: each piece of a unit adds 1, the one that makes it epoch * pieces merges) follow the
    counters in the same array: ticket u is counter num_counters + u (K slices reducing their
    column group, ``fuse_reduce``, take tickets the same way)."""
    num_counters: int
    counter_size: tuple[int, ...]
    signal: tuple[int, ...]
    waits: tuple[tuple[int, ...], ...]
    num_tickets: int = 0


@dataclass(frozen=True)
class Prefetch:
    """What each task asks L2 for before its waits (``encode.prefetch_plan``): at most
    ``cap_bytes`` of a weight range (0: all of it), that of the task ``ahead`` places later in
    its queue, K slices' column slices too (``slices``), a weightless task the next task's
    (``fill``), a capped range's first columns of every row rather than its first rows
    (``columns``)."""
    cap_bytes: int = 0
    ahead: int = 0
    slices: bool = False
    fill: bool = False
    columns: bool = False


@dataclass(frozen=True)
class KernelSource:
    source: str
    kernel_name: str
    num_workers: int
    encoded: Any = field(hash=False, compare=False)        # the tables the kernel walks
