"""Primitives of the persistent loop (``templates/megakernel.py.jinja``), apart from the op
bodies of ``ops``: acquire-waits on the per-tile counters with a bounded spin and an error word,
the release signal, L2 prefetches (a task's weights, the next instruction's words), the
hand-over between steps of a programmatic dependent launch and trace stamps."""
import triton
import triton.language as tl

from .cost import LINE_ELEMENTS

LINE = tl.constexpr(LINE_ELEMENTS)      # elements an L2 prefetch asks for at once


@triton.jit
def wait_counters(waits_ptr, counters_ptr, error_ptr, first, count, c0, size0, epoch, spin_limit,
                  task, BACKOFF: tl.constexpr = 0, POLL: tl.constexpr = 0, pf_ptr=None,
                  pf_count=0, pf_row=0, pf_stride=0, PF_WAIT: tl.constexpr = 0,
                  PF_START: tl.constexpr = 0, WAITS: tl.constexpr = 1):
    """Acquire-wait until counters[c] >= epoch * size for each (c, size) in the task's wait list
    (the first one passed inline as c0, size0). A spin past ``spin_limit`` (or an error raised
    elsewhere) records the task and counter in error_ptr [flag, task, counter, seen value] and
    returns False. BACKOFF > 0 (GPU only): sleep that many ns between polls, so that the
    producers' increments do not queue behind every consumer's atomic reads of one counter;
    POLL 1 (GPU only): read the counter with acquire loads instead (see ``poll``); PF_WAIT 1
    (GPU only): between polls, ask L2 for the next 256 lines of the ``pf_count`` elements at
    ``pf_ptr`` (the task's weights; a column slice where ``pf_row`` > 0, see ``prefetch_l2``),
    so that a task whose inputs are ready starts at once and one that waits streams its weights
    meanwhile; PF_WAIT 2: the same lines asked for with L2's evict_last priority; PF_START > 0:
    only once that percentage of the polled counter's producers has signalled, so that the
    prefetches of tasks that wait long do not queue ahead of the loads of the tasks they wait
    for). WAITS > 1 (the most waits a task of the kernel has, a power of two): a task with
    several polls all of them at once (``wait_all``), not one after another."""
    several = False                 # WAITS 1: a constant, so wait_all is never built
    if WAITS > 1:
        several = count > 1
    if several:
        ok = wait_all(waits_ptr, counters_ptr, error_ptr, first, count, c0, size0, epoch,
                      spin_limit, task, BACKOFF, POLL, pf_ptr, pf_count, pf_row, pf_stride,
                      PF_WAIT, PF_START, WAITS)
    else:
        ok = wait_each(waits_ptr, counters_ptr, error_ptr, first, count, c0, size0, epoch,
                       spin_limit, task, BACKOFF, POLL, pf_ptr, pf_count, pf_row, pf_stride,
                       PF_WAIT, PF_START)
    return ok


@triton.jit
def wait_each(waits_ptr, counters_ptr, error_ptr, first, count, c0, size0, epoch, spin_limit,
              task, BACKOFF: tl.constexpr, POLL: tl.constexpr, pf_ptr, pf_count, pf_row,
              pf_stride, PF_WAIT: tl.constexpr, PF_START: tl.constexpr):
    """``wait_counters``, one wait after another (each polled until reached)."""
    ok = True
    pf_done = 0
    j = 0
    while j < count:
        c = c0
        size = size0
        if j > 0:
            c = tl.load(waits_ptr + 2 * (first + j))
            size = tl.load(waits_ptr + 2 * (first + j) + 1)
        need = size * epoch
        seen = poll(counters_ptr + c, POLL)
        spins = 0
        while (seen < need) & (spins < spin_limit):
            # this epoch's signals so far, against the share asked for
            started = (seen - need + size) * 100 >= size * PF_START
            pf_done = between_polls(pf_ptr, pf_done, pf_count, pf_row, pf_stride, started,
                                    spins, BACKOFF, PF_WAIT, PF_START)
            seen = poll(counters_ptr + c, POLL)
            spins = next_spin(error_ptr, spins, spin_limit)
        if seen < need:
            record_error(error_ptr, task, c, seen)
            ok = False
            j = count
        j += 1
    return ok


@triton.jit
def wait_all(waits_ptr, counters_ptr, error_ptr, first, count, c0, size0, epoch, spin_limit,
             task, BACKOFF: tl.constexpr, POLL: tl.constexpr, pf_ptr, pf_count, pf_row,
             pf_stride, PF_WAIT: tl.constexpr, PF_START: tl.constexpr, WAITS: tl.constexpr):
    """``wait_counters`` for a task with 2 to WAITS waits: its wait list read in one load and
    every counter polled at once each round, one memory latency a round instead of two per
    wait (the list's entry, then its counter). PF_START counts the least advanced counter."""
    js = tl.arange(0, WAITS)
    later = (js > 0) & (js < count)
    cs = tl.where(later, tl.load(waits_ptr + 2 * (first + js), mask=later, other=0), c0)
    sizes = tl.where(later, tl.load(waits_ptr + 2 * (first + js) + 1, mask=later, other=0),
                     size0)
    need = tl.where(js < count, sizes * epoch, 0)   # lanes past the list: c0 again, met at 0
    seen = poll(counters_ptr + cs, POLL)                                         # [WAITS]
    short = tl.sum((seen < need).to(tl.int32), axis=0)
    pf_done = 0
    spins = 0
    while (short > 0) & (spins < spin_limit):
        started = tl.min((seen - need + sizes) * 100 - sizes * PF_START, axis=0) >= 0
        pf_done = between_polls(pf_ptr, pf_done, pf_count, pf_row, pf_stride, started, spins,
                                BACKOFF, PF_WAIT, PF_START)
        seen = poll(counters_ptr + cs, POLL)
        short = tl.sum((seen < need).to(tl.int32), axis=0)
        spins = next_spin(error_ptr, spins, spin_limit)
    if short > 0:
        unmet = tl.argmax((seen < need).to(tl.int32), axis=0)       # the first one short
        record_error(error_ptr, task, tl.sum(tl.where(js == unmet, cs, 0), axis=0),
                     tl.sum(tl.where(js == unmet, seen, 0), axis=0))
    return short == 0


@triton.jit
def between_polls(pf_ptr, pf_done, pf_count, pf_row, pf_stride, started, spins,
                  BACKOFF: tl.constexpr, PF_WAIT: tl.constexpr, PF_START: tl.constexpr):
    """What a waiting task does between two polls (GPU only): ask L2 for the next 256 lines of
    its weights (PF_WAIT; with PF_START, once ``started``), sleep BACKOFF ns -> the weights asked
    for so far."""
    if PF_WAIT:
        ask = pf_done < pf_count
        if PF_START > 0:
            ask = ask & started
        if ask:
            prefetch_l2(pf_ptr, tl.minimum(pf_count - pf_done, 256 * LINE), pf_row, pf_stride,
                        pf_done, LAST=PF_WAIT == 2)
            pf_done += 256 * LINE
    if BACKOFF > 0:
        tl.inline_asm_elementwise("nanosleep.u32 $1; mov.u32 $0, 0;", "=r,r",
                                  [spins * 0 + BACKOFF], dtype=tl.int32, is_pure=False, pack=1)
    return pf_done


@triton.jit
def next_spin(error_ptr, spins, spin_limit):
    """The spin count after one more poll; every 1024 spins, spin_limit where an error has been
    raised elsewhere (so that every worker stops)."""
    spins += 1
    if spins % 1024 == 0:
        if tl.atomic_add(error_ptr, 0, sem="relaxed") != 0:
            spins = spin_limit
    return spins


@triton.jit
def record_error(error_ptr, task, c, seen):
    """The first error of the launch: error_ptr [flag, task, counter, seen value]."""
    if tl.atomic_cas(error_ptr, 0, 1) == 0:
        tl.store(error_ptr + 1, task)
        tl.store(error_ptr + 2, c)
        tl.store(error_ptr + 3, seen)


@triton.jit
def poll(ptr, POLL: tl.constexpr):
    """A counter's value with acquire semantics: an atomic read (POLL 0), or (POLL 1, GPU only)
    an ``ld.acquire.gpu`` by every thread, which does not take a turn in L2's atomic unit, where
    the producers' increments of that counter wait behind the consumers' atomic reads."""
    if POLL == 1:
        return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                         dtype=tl.int32, is_pure=False, pack=1)
    else:
        return tl.atomic_add(ptr, 0, sem="acquire")


@triton.jit
def signal_counter(counters_ptr, c):
    """Release: every thread's stores of the task happen before the counter moves."""
    tl.debug_barrier()
    if c >= 0:
        tl.atomic_add(counters_ptr + c, 1, sem="release")


@triton.jit
def prefetch_l2(ptr, count, row=0, stride=0, start=0, LINES: tl.constexpr = 256,
                LAST: tl.constexpr = False):
    """Ask L2 for ``count`` elements from element ``start`` on of the range at ``ptr``, one
    128-byte line per lane (GPU only; 64 bf16/fp16 elements per line): a contiguous range (row
    0), or a column slice of ``row`` elements in each of a matrix's rows, ``stride`` apart;
    LAST: with evict_last priority (``prefetch_line``)."""
    n_lines = (count + LINE - 1) // LINE
    i = 0
    while i < n_lines:
        line = tl.minimum(i + tl.arange(0, LINES), n_lines - 1).to(tl.int64)
        prefetch_line(ptr + range_offsets(start + line * LINE, row, stride), LAST)
        i += LINES


@triton.jit
def range_offsets(e, row, stride):
    """The element offsets of positions ``e`` of a prefetch range laid end to end: themselves
    for a contiguous range (row 0), else in a column slice of ``row`` elements of each of a
    matrix's rows, ``stride`` apart."""
    if row > 0:
        e = e // row * stride + e % row
    return e


@triton.jit
def prefetch_line(ptr, LAST: tl.constexpr = False):
    """Ask L2 for the 128-byte line holding ``ptr`` (or each of a tensor of pointers; GPU
    only); LAST: with evict_last priority, so that the lines outlast the streams of keys,
    values and other weights that pass through L2 before the task reads them."""
    if LAST:
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
                                  "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptr],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def claim_sm(claims_ptr, error_ptr, epoch, NUM: tl.constexpr):
    """The queue of the SM this program runs on (``queues_by_sm``; GPU only): its ``%smid``,
    claimed for this launch in ``claims_ptr`` [NUM] (the launch's epoch swapped in). An SM id
    past the queues, or one a second program of the launch claims, records an error (task
    -1 - the SM id, counter -1) and returns NUM: the queue table's empty entry, so that this
    program does nothing and the others' waits end at the watchdog, never hang."""
    sm = sm_id().to(tl.int32)
    ok = sm < NUM
    seen = tl.atomic_xchg(claims_ptr + tl.minimum(sm, NUM - 1), epoch, mask=ok)
    ok = ok & (seen != epoch)           # not a second program on this SM
    if not ok:
        record_error(error_ptr, -1 - sm, -1, seen)
    return tl.where(ok, sm, NUM)


@triton.jit
def sm_id():
    """The SM this program runs on (``%smid``; GPU only): where a trace puts each worker."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=True, pack=1).to(tl.int64)


@triton.jit
def clock(tick_ptr, CLOCK: tl.constexpr):
    """A trace stamp: %globaltimer in ns on the GPU (CLOCK 2), or the next value of a global
    tick counter (CLOCK 1), which orders events where no timer exists (the interpreter)."""
    if CLOCK == 2:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                         is_pure=False, pack=1)
    else:
        return tl.atomic_add(tick_ptr, 1).to(tl.int64)


@triton.jit
def launch_dependents():
    """Let the next launch in the stream start its programs (programmatic dependent launch,
    sm_90; GPU only): each one takes an SM as soon as one of this launch's programs leaves it,
    instead of after the whole grid has ended and the launch's own latency."""
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def grid_wait():
    """Block until the previous launch in the stream has ended and its writes are visible
    (GPU only; at once where the launch was not a dependent one). A program started early by
    ``launch_dependents`` reads nothing an earlier step wrote (counters, activations, the KV
    cache) before it; L2 prefetches of weights may go first."""
    tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)
