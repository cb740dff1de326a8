"""Encode: (TaskGraph, Schedule, SyncPlan) -> int32 instruction tables the kernel walks.

    instructions [T, NUM_WORDS]  per task, grouped by worker in queue order: opcode, first
                                 wait, number of waits, counter to signal, weight tile to
                                 prefetch (id, offset, count; row, stride of a column
                                 slice, else 0), the first wait again (counter,
                                 size: no table lookup in the common case), the op's fields
    waits        [N, 2]          (counter, producers per epoch)
    queues       [W, 2]          (first instruction, number of instructions) per worker
Memory: activations and fp32 scratch get element offsets in two arenas, which their words hold
in units of ALIGN elements (every buffer starts on such a boundary); weight words hold a
weight id, which the runtime replaces by that weight's arena offset / ALIGN when a model is bound
(``weight_words`` marks them). An int field's words hold its value over the field's unit in its
opcode: the largest power of two up to ALIGN dividing every task's value, so that the kernel's
``word * unit`` tells Triton what divides a column or K offset (16-byte loads) without a hint on
the word itself, which other opcodes read as other fields. Field order comes from the registry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .cost import LINE_ELEMENTS
from .ir import Prefetch, Schedule, SyncPlan, TaskGraph
from .registry import HEADER, HEADER_WORDS, NUM_WORDS, REGISTRY, variant_key
from .tile import TileConfig

ALIGN = 64


@dataclass(frozen=True)
class MemoryPlan:
    weights: tuple[str, ...]     # weight id -> parameter name
    act: dict                    # buffer -> element offset in the activation arena
    act_numel: int
    f32: dict                    # buffer -> element offset in the fp32 arena
    f32_numel: int


@dataclass(frozen=True)
class Encoded:
    instructions: np.ndarray
    waits: np.ndarray
    queues: np.ndarray
    variants: tuple              # (opcode, kind, constexpr dict, int units) per opcode; units:
                                 # field name -> unit of its words (int fields only)
    memory: MemoryPlan
    weight_words: np.ndarray     # [T, NUM_WORDS] bool: words holding a weight id (the runtime
                                 # replaces them by the weight's arena offset / ALIGN)


def _pack(buffers, space: str, aligns: dict | None = None) -> tuple[dict, int]:
    """Element offsets of the ``space`` buffers, each on a multiple of its ``aligns`` entry
    (ALIGN where it has none) and ALIGN elements long at least."""
    offsets, top = {}, 0
    for name in sorted(b.name for b in buffers.values() if b.space == space):
        step = (aligns or {}).get(name, ALIGN)
        top = -(-top // step) * step
        offsets[name] = top
        top += -(-buffers[name].numel // ALIGN) * ALIGN
    return offsets, top


def row_aligns(graph: TaskGraph) -> dict[str, int]:
    """act buffer -> the alignment it needs: whole rows of every weight matrix's row length a
    task reads it with (the CUDA kernel's tensor copies read a projection's x as rows of the
    activation arena, ``megakernel_mma.cuh``)."""
    bufs, aligns = graph.ops.buffers, {}
    for task in graph.tasks:
        ks = {bufs[r.buffer].shape[-1] for r in task.reads
              if bufs[r.buffer].space == "weight" and len(bufs[r.buffer].shape) == 2}
        for r in task.reads:
            if ks and bufs[r.buffer].space == "act":
                aligns[r.buffer] = math.lcm(aligns.get(r.buffer, ALIGN), *ks)
    return aligns


def plan_memory(graph: TaskGraph) -> MemoryPlan:
    bufs = graph.ops.buffers
    act, act_n = _pack(bufs, "act", row_aligns(graph))
    f32, f32_n = _pack(bufs, "f32")
    weights = tuple(sorted(b.name for b in bufs.values() if b.space == "weight"))
    return MemoryPlan(weights, act, act_n, f32, f32_n)


def _word(field, value, mem: MemoryPlan, weight_id: dict, tickets: int) -> int:
    """``tickets``: the counter index of ticket 0 (``SyncPlan``)."""
    if value is None:
        return 0                      # unused by the variant; any valid address will do
    if field.space == "ticket":
        return tickets + value
    if field.space == "act":
        return mem.act[value] // ALIGN
    if field.space == "f32":
        return mem.f32[value] // ALIGN
    if field.space == "weight":
        return weight_id[value]
    return int(value)


def int_units(instructions: np.ndarray, variants) -> tuple:
    """Divide each int field's words by its unit in their opcode (see the module docstring), in
    place; the variants with their units."""
    out = []
    for op, kind, cx in variants:
        mine, units = instructions[:, 0] == op, {}
        for j, f in enumerate(REGISTRY[kind].words):
            if f.space != "int":
                continue
            col, unit = HEADER_WORDS + j, ALIGN
            while unit > 1 and (instructions[mine, col] % unit).any():
                unit //= 2
            instructions[mine, col] //= unit
            units[f.name] = unit
        out.append((op, kind, cx, units))
    return tuple(out)


def weight_ranges(task, buffers, weight_id: dict, boxes: bool = False,
                  columns: bool = False) -> list[list[int]]:
    """The task's weight regions as [weight id, element offset, count, row, stride], largest
    first (ties in read order): those that are one contiguous row-major range each (row 0; with
    ``columns`` a matrix's whole rows as a box of them, row and stride its row length, so that
    a cap can cut columns), and with ``boxes`` also the column slices of some of a matrix's rows
    (``row`` elements at a time, ``stride`` apart: a K slice of a projection), where a slice's
    row is whole 128-byte lines (not of all rows: that is a gather's bound, as the embedding's,
    not what it reads)."""
    out = []
    for r in task.reads:
        buf = buffers[r.buffer]
        if buf.space != "weight":
            continue
        (r0, r1), rest = r.box[0], r.box[1:]
        k = buf.shape[1] if len(buf.shape) == 2 else 0
        if all(lo == 0 and hi == n for (lo, hi), n in zip(rest, buf.shape[1:])):
            box = columns and k % LINE_ELEMENTS == 0 and k > 0
            out.append([weight_id[r.buffer], r0 * (r.numel // (r1 - r0)), r.numel,
                        k if box else 0, k if box else 0])
        elif (boxes and k and r1 - r0 < buf.shape[0]
              and (rest[0][1] - rest[0][0]) % LINE_ELEMENTS == 0):
            (k0, k1) = rest[0]
            out.append([weight_id[r.buffer], r0 * k + k0, r.numel, k1 - k0, k])
    return sorted(out, key=lambda x: -x[2])


def prefetch_plan(ranges: list[list[list[int]]], cap: int, ahead: int = 0,
                  fill: bool = False, columns: bool = False) -> list[list[int]]:
    """Per position of one queue, the weight range [id, offset, count, row, stride] prefetched
    into L2 before its waits, from each task's ``ranges`` (see ``weight_ranges``), at most
    ``cap`` elements (0: no cap): of a box (row > 0) its first whole rows (at least one), or
    with ``columns`` its first columns of every row (whole lines, at least one), what a
    projection's loop over K reads first; a task's largest range, or (``ahead``) that of the
    task so many places later (the last tasks of a queue prefetch nothing); with ``fill``, a
    task that reads no weights (attention) takes the next task's."""
    def clip(w, off, n, row, stride):
        if not cap or n <= cap:
            return [w, off, n, row, stride]
        if not row:
            return [w, off, cap, 0, 0]
        if not columns:
            return [w, off, max(cap // row, 1) * row, row, stride]
        cut = max(cap // (n // row) // LINE_ELEMENTS, 1) * LINE_ELEMENTS
        return [w, off, n // row * min(cut, row), min(cut, row), stride]

    def pick(j: int) -> list[int]:
        k = j + ahead
        if fill and k + 1 < len(ranges) and not ranges[k]:
            k += 1
        return clip(*ranges[k][0]) if k < len(ranges) and ranges[k] else [0, 0, 0, 0, 0]
    return [pick(j) for j in range(len(ranges))]


def encode(graph: TaskGraph, schedule: Schedule, sync: SyncPlan, cfg: TileConfig,
           prefetch: Prefetch = Prefetch()) -> Encoded:
    """Each task's weight prefetch as ``prefetch`` says (``weight_ranges``, ``prefetch_plan``)."""
    mem = plan_memory(graph)
    weight_id = {name: i for i, name in enumerate(mem.weights)}
    opcodes: dict = {}
    rows, waits, queues, marks = [], [], [], []
    header_marks = [h == "prefetch_weight" for h in HEADER]     # words holding a weight id
    for queue in schedule.queues:
        queues.append((len(rows), len(queue)))
        ranges = [weight_ranges(graph.tasks[t], graph.ops.buffers, weight_id, prefetch.slices,
                                prefetch.columns) for t in queue]
        plan = prefetch_plan(ranges, prefetch.cap_bytes // graph.ops.dims.itemsize,
                             prefetch.ahead, prefetch.fill, prefetch.columns)
        for t, pf in zip(queue, plan):
            task = graph.tasks[t]
            key = variant_key(task, graph.ops.dims, cfg)
            opcode = opcodes.setdefault(key, len(opcodes))
            mine = [(c, sync.counter_size[c]) for c in sync.waits[t]]
            named = dict(op=opcode, first_wait=len(waits), num_waits=len(mine),
                         signal=sync.signal[t], prefetch_weight=pf[0], prefetch_offset=pf[1],
                         prefetch_count=pf[2], prefetch_row=pf[3], prefetch_stride=pf[4],
                         wait0_counter=mine[0][0] if mine else 0,
                         wait0_size=mine[0][1] if mine else 0)
            header = [named[h] for h in HEADER]
            waits.extend(mine)
            spec = REGISTRY[task.kind]
            fields = [_word(f, task.args.get(f.name), mem, weight_id, sync.num_counters)
                      for f in spec.words]
            rows.append(header + fields + [0] * (NUM_WORDS - HEADER_WORDS - len(fields)))
            is_weight = header_marks + [f.space == "weight" for f in spec.words]
            marks.append(is_weight + [False] * (NUM_WORDS - len(is_weight)))
    as_i32 = lambda a, cols: np.asarray(a, dtype=np.int32).reshape(-1, cols)
    instructions = as_i32(rows, NUM_WORDS)
    variants = int_units(instructions, [(op, key[0], dict(key[1])) for key, op in opcodes.items()])
    return Encoded(instructions, as_i32(waits or [(0, 0)], 2), as_i32(queues, 2),
                   variants, mem, np.asarray(marks, dtype=bool).reshape(-1, NUM_WORDS))
