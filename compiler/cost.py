"""Hardware numbers and the cost model: every figure the compiler assumes lives here.

``task_us(task, target)`` rates one tile task; ``sync_us`` is charged to each dependency that
crosses workers; ``op_waves_us`` estimates a whole step from its tasks alone. Numbers for the H200
were measured on one (copy 4.2 TB/s, grid-wide wait about 1 us).
"""
from __future__ import annotations

import heapq

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
    task_overhead_us: float   # fixed cost of any task: instruction, wait, pipeline fill, signal
    smem_bytes: int           # shared memory per SM (pipeline stages of resident programs)
    sm_bytes_per_us: float    # what one SM streams at most, shared by its programs
    attn_bytes_per_us: float  # what one SM streams as attention partials (keys through the
                              # block table: two dependent loads per step)
    attn_task_us: float = 2.0     # fixed cost of an attention task (position, table, first keys)
    attn_chain_gain: float = 0.0  # a task over n kv heads side by side streams n ** gain as fast

    @property
    def max_workers(self) -> int:
        return self.sms * self.workers_per_sm


# Fitted to traced llama-3.2-1b steps with folded projections (2026-11-30, one program per SM,
# one wave per op): a task takes ~2 us plus its bytes, projections at ~43 GB/s per SM (batch 1:
# o 64 KB 3.3 us, down 256 KB 8.2, qkv 128 KB 5.5; gate_up and lm_head at the chip's HBM rate).
# Attention (traced tasks, from first load to signal, with one block-table entry per step):
# ~2.15 us plus its bytes at ~30 GB/s for one kv head (16 rows: one head's 256 KB 10.9 us; batch
# 1: 128-key streams 3.4 us), a pair of kv heads in one loop 2 ** 0.1 times as fast (17 rows:
# 512 KB in 18.4 us). With these the autotune ledger of 2026-12-01 (12 batch sizes, the fastest
# of each schedule class) ranks at a mean Spearman of 0.58 against measured (mean error of the
# rated step 2-6% a batch size), 0.40 with the figures of earlier traces (17 GB/s, 2 ** 0.88;
# errors up to 15%).
H200 = Target("h200", sms=132, workers_per_sm=1, hbm_bytes_per_us=4.0e6, flops_per_us=7.0e8,
              sync_us=1.0, task_overhead_us=2.0, smem_bytes=228 * 1024, sm_bytes_per_us=4.3e4,
              attn_bytes_per_us=3.0e4, attn_task_us=2.15, attn_chain_gain=0.1)
# The Triton interpreter runs programs one after another: one worker, a topological queue.
CPU_INTERPRETER = Target("cpu", sms=1, workers_per_sm=1, hbm_bytes_per_us=1.0e4,
                         flops_per_us=1.0e4, sync_us=0.0, task_overhead_us=1.0,
                         smem_bytes=1 << 30, sm_bytes_per_us=1.0e4, attn_bytes_per_us=1.0e4,
                         attn_task_us=1.0)
TARGETS = {"h200": H200, "cpu": CPU_INTERPRETER}
# bf16/fp16 elements of one 128-byte L2 line: the unit of every L2 prefetch (``kernel_loop``,
# ``kv_prefetch``) and of the weight slices the encoder names for one (``encode``)
LINE_ELEMENTS = 64
# bytes of a weight staging area (``staging``) before its data: the mbarrier, and the data
# 128-byte aligned
STAGE_HEAD = 128
# the STAGE switch of an interpreter run with staging: no area, staged rows read in place
STAGE_IN_PLACE = 1
ATTENTION = ("attn_partial", "attn_pair", "attn_pair_part", "attn_group", "attn_stream",
             "attn_pair_stream", "attn_group_stream")


def task_us(task: Task, target: Target, workers: int) -> float:
    """Time of one task on one worker when ``workers`` run at once: a fixed cost, then its bytes
    at its program's share of the SM (programs on one SM share its rate; the op-level HBM limit
    is ``op_waves_us``'s), or its flops at its share of the tensor cores if that is longer.
    Attention tasks have their own fixed cost and rate, the rate growing with the kv heads a
    task runs side by side."""
    per_sm = max(1, -(-min(workers, target.max_workers) // target.sms))
    per_worker_flops = target.flops_per_us / max(1, min(workers, target.sms))
    if task.kind in ATTENTION:
        fixed = target.attn_task_us
        rate = target.attn_bytes_per_us * task.args.get("heads", 1) ** target.attn_chain_gain
    else:
        fixed, rate = target.task_overhead_us, target.sm_bytes_per_us
    return fixed + max(task.bytes * per_sm / rate, task.flops / per_worker_flops)


def packed_us(costs: list[float], workers: int) -> float:
    """Makespan of tasks placed longest first, each on the least loaded of ``workers`` (equal
    tasks: whole waves)."""
    loads = [0.0] * max(1, min(workers, len(costs)))
    for c in sorted(costs, reverse=True):
        heapq.heapreplace(loads, loads[0] + c)
    return max(loads)


def op_waves_us(tasks, target: Target, workers: int) -> float:
    """A quick makespan estimate without dependencies, for ranking many variants: ops run one
    after another (in decode each op reads whole rows of an earlier one), and so do the phases
    of an op (tasks of one kind: attention partials, then their combines), each packed on the
    ``workers`` (``packed_us``) but no faster than HBM streams its bytes, plus one
    synchronisation each."""
    per_op: dict[tuple, list[float]] = {}
    op_bytes: dict[tuple, int] = {}
    for task in tasks:
        phase = (task.op, task.kind)
        per_op.setdefault(phase, []).append(task_us(task, target, workers))
        op_bytes[phase] = op_bytes.get(phase, 0) + task.bytes
    return sum(max(packed_us(c, workers), op_bytes[op] / target.hbm_bytes_per_us)
               + target.sync_us for op, c in per_op.items())
