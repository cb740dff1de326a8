"""The pass chain, in order: capture -> lower -> tile -> schedule (-> place, with
``queues_by_sm``) -> sync -> validate -> encode -> generate. Each arrow is a pure function of
the previous stage's output and the options."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from torch import fx

from .capture import capture
from .codegen import generate
from .cost import STAGE_HEAD, STAGE_IN_PLACE, TARGETS
from .encode import Encoded, encode
from .ir import KernelSource, OpGraph, Prefetch, Schedule, SyncPlan, TaskGraph
from .lower import lower
from .placement import place_queues
from .schedule import schedule
from .sync import plan_sync
from .tile import TileConfig, tile
from .validate import validate


@dataclass(frozen=True)
class CompileOptions:
    batch_size: int
    max_seq_len: int
    target: str = "h200"                 # a key of cost.TARGETS
    num_workers: int | None = None       # default: every resident slot of the target
    workers_per_sm: int | None = None    # default: the target's; the runtime checks residency
    scheduler: str = "greedy"
    tile: TileConfig = field(default_factory=TileConfig)
    num_warps: int = 4                   # warps per worker program
    prefetch: bool = True                # L2-prefetch each task's weights before its waits (GPU)
    prefetch_kb: int = 64                # at most this many KiB of them per task (0: all)
    prefetch_ahead: int = 0              # prefetch the weights of the task this many places later
    prefetch_next: bool = True           # with prefetch: L2-prefetch the next instruction's words
                                         # (GPU; llama-3.2-1b on the H200, ms at batch 8 / 64:
                                         # 1.152 / 2.068 -> 1.140 / 2.041, batch 1 even)
    prefetch_wait: bool = True           # prefetch between polls of the waits instead of before
                                         # (llama-3.2-1b on the H200, batch 1: 0.960 -> 0.931 ms,
                                         # 8: 1.216 -> 1.174, 64: 3.154 -> 3.035)
    prefetch_kv: bool = False            # attention asks L2 for earlier steps' keys before waiting
    prefetch_kv_ahead: int = 0           # the task before an attention task in its worker's
                                         # queue asks L2 for the first this many earlier keys of
                                         # each of its units, before its own waits (GPU; 0: no)
    prefetch_kv_late: bool = False       # with prefetch_kv_ahead: once it has signalled instead
    prefetch_kv_last: bool = False       # with prefetch_kv or prefetch_kv_ahead: the keys and
                                         # values asked for with L2's evict_last priority (GPU)
    prefetch_slices: bool = True         # with prefetch: also the weights of K slices (a
                                         # column slice of a matrix's rows, ``encode``; the
                                         # o and down slices of llama-3.2-1b on the H200, each
                                         # winner against itself without, ms: 17 rows 1.123 ->
                                         # 1.102, 32 1.246 -> 1.236, 64 1.569 -> 1.554)
    prefetch_fill: bool = False          # with prefetch: a task that reads no weights
                                         # (attention) asks for the next task's (``encode``)
    prefetch_last: bool = True           # with prefetch: the weights asked for with L2's
                                         # evict_last priority (GPU; PTX ``prefetch.global.L2::
                                         # evict_last``), kept while other streams pass through
                                         # (llama-3.2-1b on an H100, the H200 ledger's winners,
                                         # ms: 1 row 1.057 -> 1.032, 8 1.145 -> 1.129, 24 1.453
                                         # -> 1.428, 32 1.551 -> 1.529, 64 1.972 -> 1.957)
    prefetch_columns: bool = False       # with prefetch: a capped range's first columns of
                                         # every row (what a loop over K reads first), not its
                                         # first rows (``encode``)
    spin_backoff_ns: int = 0             # sleep between polls of a counter not yet reached (GPU)
    poll_load: bool = False              # poll counters with acquire loads, not atomics (GPU)
    prefetch_start: int = 0              # with prefetch_wait: a waiting task asks for its weights
                                         # only once this percentage of the producers it polls
                                         # has signalled (0: from its first poll)
    max_registers: int = 0               # registers per thread ptxas may use (0: its choice;
                                         # llama-3.2-1b at 16 rows, 8 warps: 128 and 72 bytes of
                                         # stack, with 255 none beyond libdevice's 32; but 4 warps
                                         # there, or 8 at 17 rows, spill with 255 and not without)
    noinline: bool = False               # each op body a function of its own (a call): its own
                                         # registers, not the whole dispatch's (GPU builds)
    queues_by_sm: bool = False           # a program runs the queue of the SM it is on (%smid;
                                         # GPU, one worker per SM), the queues placed by
                                         # ``placement`` over the target's SM groups
    dependent_launch: bool = False       # each step a programmatic dependent launch (GPU,
                                         # sm_90): its programs start as the previous step's
                                         # leave their SMs, ask L2 for their first task's
                                         # weights, then wait for that step's end

    def switches(self, cuda: bool = True) -> dict:
        """The kernel's switches (0 under the interpreter but STAGE): PREFETCH bits (1 each task's
        weights before its waits, 2 the next instruction's words, 4 the weights between polls of
        its waits instead, 8 what ops with a prefetch body read of earlier steps, 16 what the
        next task's prefetch body reads, its first KV_AHEAD keys a unit, 32 those after the task's
        signal instead of before its waits, 64 the weights with evict_last priority, 128 the keys
        and values with it), BACKOFF ns of sleep between polls, POLL 1 to poll with acquire
        loads, PF_START the ``prefetch_start`` percentage, STAGE the staging area's bytes
        (``staging``; in place under the interpreter), BY_SM 1 where each program takes the queue
        of its SM (``queues_by_sm``), PDL 1 for a programmatic dependent launch
        (``dependent_launch``; the launch itself passes ``launch_pdl``)."""
        if not cuda:        # staging in place (``staging``): the same rows, read where they are
            return dict(PREFETCH=0, BACKOFF=0, POLL=0, PF_START=0,
                        STAGE=STAGE_IN_PLACE if self.tile.staged_kib else 0, KV_AHEAD=0,
                        BY_SM=0, PDL=0)
        weights = 4 if self.prefetch_wait else 1
        return dict(PREFETCH=weights * self.prefetch | 2 * (self.prefetch and self.prefetch_next)
                    | 8 * self.prefetch_kv | 64 * self.prefetch_last | 128 * self.prefetch_kv_last
                    | (32 if self.prefetch_kv_late else 16) * bool(self.prefetch_kv_ahead),
                    BACKOFF=self.spin_backoff_ns, POLL=int(self.poll_load),
                    PF_START=self.prefetch_start, STAGE=self.stage_bytes,
                    KV_AHEAD=self.prefetch_kv_ahead, BY_SM=int(self.queues_by_sm),
                    PDL=int(self.dependent_launch))

    @property
    def stage_bytes(self) -> int:
        """Shared memory a GPU launch adds for ``staging`` (0: none)."""
        return self.tile.staged_kib and self.tile.staged_kib * 1024 + STAGE_HEAD

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target {self.target!r} unknown; choose one of {', '.join(TARGETS)}")
        if self.max_registers and not 24 <= self.max_registers <= 255:
            raise ValueError(f"max_registers={self.max_registers}: ptxas takes 24 to 255 (or 0)")
        if self.prefetch_kv_ahead & (self.prefetch_kv_ahead - 1):
            raise ValueError(f"prefetch_kv_ahead={self.prefetch_kv_ahead}: keys a unit, a power "
                             "of two (or 0)")
        if not 0 <= self.prefetch_start <= 100:
            raise ValueError(f"prefetch_start={self.prefetch_start} is not a percentage (0-100)")
        if self.batch_size < 1 or self.max_seq_len < 1:
            raise ValueError(f"batch_size={self.batch_size} and max_seq_len={self.max_seq_len}: "
                             "both must be at least 1")
        if self.max_seq_len % self.tile.kv_block:
            raise ValueError(f"max_seq_len={self.max_seq_len} must be a multiple of the cache "
                             f"block ({self.tile.kv_block})")


@dataclass(frozen=True)
class Compiled:
    name: str
    options: CompileOptions
    ops: OpGraph
    tasks: TaskGraph
    schedule: Schedule
    sync: SyncPlan
    encoded: Encoded
    kernel: KernelSource


def compile_graph(gm: fx.GraphModule, options: CompileOptions, itemsize: int,
                  name: str = "model") -> Compiled:
    return compile_ops(lower(gm, itemsize), options, name)


def compile_ops(ops: OpGraph, options: CompileOptions, name: str = "model") -> Compiled:
    """The chain from a lowered op graph on (the same graph serves every variant of one batch
    size: no stage changes it)."""
    target = TARGETS[options.target]
    if options.workers_per_sm:
        target = replace(target, workers_per_sm=options.workers_per_sm)
    workers = options.num_workers or target.max_workers
    tasks = tile(ops, options.tile, workers)
    sched = schedule(tasks, target, workers, options.scheduler)
    if options.queues_by_sm:
        sched = place_queues(tasks, sched, target.sm_groups)
    sync = plan_sync(tasks, sched)
    validate(tasks, sched, sync, target)
    enc = encode(tasks, sched, sync, options.tile, Prefetch(
        options.prefetch_kb * 1024, options.prefetch_ahead, options.prefetch_slices,
        options.prefetch_fill, options.prefetch_columns))
    return Compiled(name, options, ops, tasks, sched, sync, enc,
                    generate(enc, name, options.batch_size, len(tasks.tasks),
                             options.noinline))


def model_ops(model, batch_size: int, max_seq_len: int) -> OpGraph:
    """The model's decode step at ``batch_size`` rows, captured and lowered."""
    itemsize = next(model.parameters()).element_size()
    return lower(capture(model, batch_size, max_seq_len), itemsize)


def compile_model(model, options: CompileOptions, name: str = "model",
                  ops: OpGraph | None = None) -> Compiled:
    """``ops``: ``model_ops`` of this model at the options' batch size and context, where the
    caller has it already."""
    ops = ops if ops is not None else model_ops(model, options.batch_size, options.max_seq_len)
    return compile_ops(ops, options, name)
