"""Hardware numbers and the cost model: every figure the compiler assumes lives here.

``task_us(task, target)`` rates one tile task; ``SYNC_US`` is charged to each dependency that crosses
workers. Numbers for the H200 were measured on one (copy 4.2 TB/s, grid-wide wait about 1 us).
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

    @property
    def max_workers(self) -> int:
        return self.sms * self.workers_per_sm


H200 = Target("h200", sms=132, workers_per_sm=1, hbm_bytes_per_us=4.0e6, flops_per_us=7.0e8,
              sync_us=1.0, task_overhead_us=0.3, smem_bytes=228 * 1024)
# The Triton interpreter runs programs one after another: one worker, a topological queue.
CPU_INTERPRETER = Target("cpu", sms=1, workers_per_sm=1, hbm_bytes_per_us=1.0e4,
                         flops_per_us=1.0e4, sync_us=0.0, task_overhead_us=1.0,
                         smem_bytes=1 << 30)
TARGETS = {"h200": H200, "cpu": CPU_INTERPRETER}


def task_us(task: Task, target: Target, workers: int) -> float:
    """Time of one task on one worker when ``workers`` stream at once and share HBM."""
    per_worker_bw = target.hbm_bytes_per_us / max(1, min(workers, target.max_workers))
    per_worker_flops = target.flops_per_us / max(1, min(workers, target.sms))
    return max(task.bytes / per_worker_bw, task.flops / per_worker_flops) + target.task_overhead_us
