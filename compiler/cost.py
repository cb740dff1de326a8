"""Hardware numbers and the cost model: every figure the compiler assumes lives here.

``task_us(task, target)`` rates one tile task; ``sync_us`` is charged to each dependency that
crosses workers; ``op_waves_us`` estimates a whole step from its tasks alone. Numbers for the H200
were measured on one (copy 4.2 TB/s, grid-wide wait about 1 us).
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import Task


@dataclass(frozen=True)
class Target:
    name: str
    sms: int
    workers_per_sm: int       # resident persistent programs per SM the kernel is built for
    hbm_bytes_per_us: float   # achievable streaming bandwidth, whole chip
    flops_per_us: float       # achievable bf16 tensor-core rate, whole chip
    sync_us: float            # one cross-worker dependency (release, then acquire elsewhere)
    task_overhead_us: float   # decode one instruction and dispatch
    smem_bytes: int           # shared memory per SM (pipeline stages of resident programs)
    program_bytes_per_us: float  # what one program streams at most (bytes in flight / latency)

    @property
    def max_workers(self) -> int:
        return self.sms * self.workers_per_sm


H200 = Target("h200", sms=132, workers_per_sm=1, hbm_bytes_per_us=4.0e6, flops_per_us=7.0e8,
              sync_us=1.0, task_overhead_us=0.3, smem_bytes=228 * 1024,
              # 16-20 GB/s per 4-warp program inside the megakernel (trace, llama-3.2-1b batch 1)
              program_bytes_per_us=2.0e4)
# The Triton interpreter runs programs one after another: one worker, a topological queue.
CPU_INTERPRETER = Target("cpu", sms=1, workers_per_sm=1, hbm_bytes_per_us=1.0e4,
                         flops_per_us=1.0e4, sync_us=0.0, task_overhead_us=1.0,
                         smem_bytes=1 << 30, program_bytes_per_us=1.0e4)
TARGETS = {"h200": H200, "cpu": CPU_INTERPRETER}


def task_us(task: Task, target: Target, workers: int) -> float:
    """Time of one task on one worker when ``workers`` stream at once and share HBM."""
    per_worker_bw = min(target.hbm_bytes_per_us / max(1, min(workers, target.max_workers)),
                        target.program_bytes_per_us)
    per_worker_flops = target.flops_per_us / max(1, min(workers, target.sms))
    return max(task.bytes / per_worker_bw, task.flops / per_worker_flops) + target.task_overhead_us


def op_waves_us(tasks, target: Target, workers: int) -> float:
    """A quick makespan estimate without dependencies, for ranking many variants: ops run one
    after another (in decode each op reads whole rows of an earlier one), each in waves of
    ``workers`` tasks, plus one synchronisation per op."""
    per_op: dict[str, list[float]] = {}
    for task in tasks:
        per_op.setdefault(task.op, []).append(task_us(task, target, workers))
    return sum(-(-len(c) // workers) * max(c) + target.sync_us for c in per_op.values())
