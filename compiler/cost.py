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
    task_overhead_us: float   # fixed cost of any task: instruction, wait, epilogue, signal
    pipeline_fill_us: float   # more for a task that streams weights through the pipeline
    smem_bytes: int           # shared memory per SM (pipeline stages of resident programs)
    sm_bytes_per_us: float    # what one SM streams at most, shared by its programs

    @property
    def max_workers(self) -> int:
        return self.sms * self.workers_per_sm


# Fitted to the traced llama-3.2-1b batch-1 step (one program per SM, one wave per op): a
# projection task takes ~6.5 us plus its bytes at ~43 GB/s (qkv 128 KB 9.4 us, gate_up 512 KB
# 18.3 us, o/down/lm_head within 3%), an attention task ~2.8 us plus its bytes.
H200 = Target("h200", sms=132, workers_per_sm=1, hbm_bytes_per_us=4.0e6, flops_per_us=7.0e8,
              sync_us=1.0, task_overhead_us=2.5, pipeline_fill_us=4.0, smem_bytes=228 * 1024,
              sm_bytes_per_us=4.3e4)
# The Triton interpreter runs programs one after another: one worker, a topological queue.
CPU_INTERPRETER = Target("cpu", sms=1, workers_per_sm=1, hbm_bytes_per_us=1.0e4,
                         flops_per_us=1.0e4, sync_us=0.0, task_overhead_us=1.0,
                         pipeline_fill_us=0.0, smem_bytes=1 << 30, sm_bytes_per_us=1.0e4)
TARGETS = {"h200": H200, "cpu": CPU_INTERPRETER}
PIPELINED = {"linear", "gate_up", "qkv_rope"}     # kinds that stream weights through a pipeline


def task_us(task: Task, target: Target, workers: int) -> float:
    """Time of one task on one worker when ``workers`` run at once: a fixed cost, then its bytes
    at its program's share of the SM (programs on one SM share its rate; the op-level HBM limit
    is ``op_waves_us``'s), or its flops at its share of the tensor cores if that is longer."""
    per_sm = max(1, -(-min(workers, target.max_workers) // target.sms))
    per_worker_flops = target.flops_per_us / max(1, min(workers, target.sms))
    fixed = target.task_overhead_us + target.pipeline_fill_us * (task.kind in PIPELINED)
    return fixed + max(task.bytes * per_sm / target.sm_bytes_per_us,
                       task.flops / per_worker_flops)


def op_waves_us(tasks, target: Target, workers: int) -> float:
    """A quick makespan estimate without dependencies, for ranking many variants: ops run one
    after another (in decode each op reads whole rows of an earlier one), and so do the phases
    of an op (tasks of one kind: attention partials, then their combines), each in waves of
    ``workers`` tasks but no faster than HBM streams its bytes, plus one synchronisation each."""
    per_op: dict[tuple, list[float]] = {}
    op_bytes: dict[tuple, int] = {}
    for task in tasks:
        phase = (task.op, task.kind)
        per_op.setdefault(phase, []).append(task_us(task, target, workers))
        op_bytes[phase] = op_bytes.get(phase, 0) + task.bytes
    return sum(max(-(-len(c) // workers) * max(c), op_bytes[op] / target.hbm_bytes_per_us)
               + target.sync_us for op, c in per_op.items())
