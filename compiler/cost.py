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
    sm_groups: tuple = ()         # SMs (by %smid) that share a rate: busy ones beside idle ones
                                  # stream faster (``placement``; () where not known)

    @property
    def max_workers(self) -> int:
        return self.sms * self.workers_per_sm


# Fitted (2026-12-04) to the autotune ledgers of llama-3.2-1b on the H200 (12 batch sizes each):
# figures that rank the schedule classes timed by their fastest variant and estimate their step
# (``bench.model_rank``): a task takes ~1 us plus its bytes (x from L2 included) at up to 80 GB/s
# per SM, ops no faster than HBM at 3.82 TB/s nor the tensor cores at 235 TFLOP/s; an attention
# task ~2.8 us plus its bytes at 26.7 GB/s for one kv head, n kv heads side by side n ** 0.26
# times as fast; 0.7 us a cross-worker dependency. Mean Spearman of rated against measured
# classes over the batch sizes, ledgers of the forty-seventh / forty-ninth / fifty-second
# sessions (the first and last fitted, the second held out): 0.490 / 0.357 / 0.484 with the
# figures fitted to traces before (2 us + 43 GB/s, attention 2.15 us + 30 GB/s and 2 ** 0.1,
# 1 us, 4 TB/s, 700 TFLOP/s) -> 0.608 / 0.539 / 0.631; the fastest class rated 2.9 / 3.2 / 2.5
# -> 2.3 / 2.3 / 2.2th on average; a 2026-12-01 ledger (older kernels) 0.499 -> 0.638. The mean
# error of the rated step against the fastest of a class 6.3 / 7.4 / 7.1% -> 5.1 / 6.0 / 5.5%.
# Schedules do not change (instruction tables and queues of 13 winners and candidates equal).
def gh100_sm_groups() -> tuple[tuple[int, ...], ...]:
    """SMs of a 132-SM GH100 (H100 SXM, H200) that share a rate, as read off H100 traces of the
    megakernel's attention (fifty-seventh session's notes; a hypothesis): at 24 rows, busy SMs
    in a group with idle ones streamed up to 28% faster, in pairs. Each stretch of 16 SM ids
    from b = 0 to 63: {b, b+1, b+12, b+13}, {b+2..b+5}, {b+6, b+7, b+14, b+15}, {b+8..b+11};
    each of 14 from 64 to 119: {b..b+3}, {b+4, b+5, b+12, b+13}, {b+6..b+9}, {b+10, b+11};
    120-131 in pairs (no sharing seen there)."""
    groups: list[tuple[int, ...]] = []
    for b in range(0, 64, 16):
        groups += [(b, b + 1, b + 12, b + 13), tuple(range(b + 2, b + 6)),
                   (b + 6, b + 7, b + 14, b + 15), tuple(range(b + 8, b + 12))]
    for b in range(64, 120, 14):
        groups += [tuple(range(b, b + 4)), (b + 4, b + 5, b + 12, b + 13),
                   tuple(range(b + 6, b + 10)), (b + 10, b + 11)]
    return tuple(groups) + tuple((s, s + 1) for s in range(120, 132, 2))


H200 = Target("h200", sms=132, workers_per_sm=1, hbm_bytes_per_us=3.82e6, flops_per_us=2.35e8,
              sync_us=0.7, task_overhead_us=1.0, smem_bytes=228 * 1024, sm_bytes_per_us=8.0e4,
              attn_bytes_per_us=2.67e4, attn_task_us=2.8, attn_chain_gain=0.26,
              sm_groups=gh100_sm_groups())
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
