"""Attention op bodies of the megakernel (``@triton.jit``, one tile task each): a partial over
one key range of one row's query heads of a kv head, a pair (or a group) of a row's kv heads
over all its keys, a stream over the keys of consecutive (row, kv head) units, and the combine
of partials (their L2 prefetches: ``kv_prefetch``; groups of kv heads as batched dots:
``attention_group_ops``; the dots of whole pairs and groups with the keys as M:
``attention_keys_m``).

The cache is [L, 2, B, Hkv, S, D], read through the block table as in ``rope_ops.cache_slots``;
partials are fp32 acc [P, G, D] and (max, sum) [P, G, 2], one slot per key range (P in all), the
ranges of one (row, kv head) in consecutive slots.
"""
import triton
import triton.language as tl

from .attention_keys_m import (full_step, kv_load, kv_mask, pair_steps_keys_m,
                               softmax_weights, step_counts, step_rotation)
from .ops import _dot
from .rope_ops import cache_slots


@triton.jit
def load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B: tl.constexpr, HKV: tl.constexpr,
            S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
            BLOCK_D: tl.constexpr, IN_BLOCK: tl.constexpr = False,
            MASKED: tl.constexpr = True):
    """Keys and values [CHUNK, BLOCK_D] at positions [start, start + CHUNK), each through the
    block table (one gather, one memory latency); positions >= hi are not read. The table
    entries do not wait for hi (the row's length, itself a load): positions are only kept
    within the table's row (S), where every entry names a block of the cache. IN_BLOCK (the
    caller's promise: the step lies in one cache block, as where BS and start are multiples of
    CHUNK): one table entry per step, the keys at fixed offsets from the first. Not MASKED:
    every key is below ``hi``."""
    ss = start + tl.arange(0, CHUNK)
    ds = tl.arange(0, BLOCK_D)
    if IN_BLOCK:
        first = cache_slots(row, tl.minimum(start, S - 1), bt_ptr, layer, 0, kv_head, B, HKV,
                            S, D, BS)
        key = first + tl.arange(0, CHUNK) * D                           # [CHUNK]
    else:
        key = cache_slots(row, tl.minimum(ss, S - 1), bt_ptr, layer, 0, kv_head, B, HKV, S, D,
                          BS)
    offs = key[:, None] + ds[None, :]                                   # [CHUNK, BLOCK_D]
    mask = kv_mask((ss < hi)[:, None], ds[None, :] < D, MASKED, BLOCK_D != D)
    v_shift = B * HKV * S * D                     # from the K plane to the V plane
    return kv_load(cache_ptr + offs, mask), kv_load(cache_ptr + offs + v_shift, mask)


@triton.jit
def empty_state(BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    """The running max, sum [BLOCK_G] and unnormalised acc [BLOCK_G, BLOCK_D] of a head before
    any key (``online_step``'s)."""
    return (tl.full([BLOCK_G], float("-inf"), tl.float32), tl.zeros([BLOCK_G], tl.float32),
            tl.zeros([BLOCK_G, BLOCK_D], tl.float32))


@triton.jit
def step_frame(G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
               CHUNK: tl.constexpr):
    """The aranges of a kv head's query rows [BLOCK_G], dims [BLOCK_D] and a step's keys
    [CHUNK], and the query tile's mask [BLOCK_G, BLOCK_D]."""
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    return gs, ds, tl.arange(0, CHUNK), (gs[:, None] < G) & (ds[None, :] < D)


@triton.jit
def online_step(q, k, v, valid, m, l, acc, scale, DT: tl.constexpr,
                MASKED: tl.constexpr = True):
    """One step of keys k and values v [CHUNK, BLOCK_D] (``valid`` [CHUNK]; not MASKED: all
    keys) into the running max m and sum l [BLOCK_G] and the unnormalised output acc [BLOCK_G,
    BLOCK_D] of queries q."""
    scores = _dot(q, tl.trans(k.to(DT)), tl.zeros([q.shape[0], k.shape[0]], tl.float32), DT)
    if MASKED:
        scores = tl.where(valid[None, :], scores, float("-inf"))
    m_new, alpha, p = softmax_weights(scores, m, scale, 1)
    return m_new, l * alpha + tl.sum(p, axis=1), _dot(p.to(DT), v.to(DT), acc * alpha[:, None], DT)


@triton.jit
def attn_partial_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, row, kv_head,
                    slot, lo, span, layer, counters_ptr, epoch, ticket, first, count,
                    scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr,
                    HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                    KV_SPLIT: tl.constexpr, BS: tl.constexpr,
                    CHUNK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                    STAGES: tl.constexpr, DIRECT: tl.constexpr, PF_KEYS: tl.constexpr = 0,
                    IN_BLOCK: tl.constexpr = False, FUSED: tl.constexpr = False,
                    BLOCK_SPLIT: tl.constexpr = 1):
    """Attention of row ``row``'s G query heads of one kv head over keys
    [lo, min(lo + span, len)) (span <= KV_SPLIT) -> unnormalised acc [G, D] and (max, sum) in
    fp32, into partial slot ``slot``; DIRECT (one range holds every key): the
    normalised output into out [B, HQ * D]. FUSED: then the unit's ticket; the piece that takes
    its last (``count`` pieces a launch) merges slots [first, first + count) into out. IN_BLOCK:
    lo and BS are multiples of CHUNK, so that each step reads one block-table entry. (PF_KEYS is
    ``attn_partial_prefetch``'s, which takes the same arguments.)"""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    seq_len = tl.load(pos_ptr + row).to(tl.int32) + 1
    hi = tl.minimum(lo + span, seq_len)
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    ss = tl.arange(0, CHUNK)
    qmask = (gs[:, None] < G) & (ds[None, :] < D)
    q = tl.load(q_ptr + row * (HQ * D) + (kv_head * G + gs)[:, None] * D + ds[None, :],
                mask=qmask, other=0.0).to(DT)
    m, l, acc = empty_state(BLOCK_G, BLOCK_D)
    NCHUNK: tl.constexpr = (KV_SPLIT + CHUNK - 1) // CHUNK
    # the steps whose keys all lie below hi without masks, pipelined (the next chunk streams
    # while this one is used); then the last keys below hi, masked (keys >= hi never read)
    n_full, n_any = step_counts(lo, hi, NCHUNK, CHUNK)
    for c in tl.range(0, n_full, num_stages=STAGES):
        k, v = load_kv(cache_ptr, bt_ptr, row, lo + c * CHUNK, hi, layer, kv_head, B, HKV, S,
                       D, BS, CHUNK, BLOCK_D, IN_BLOCK, False)
        m, l, acc = online_step(q, k, v, None, m, l, acc, scale, DT, False)
    for c in tl.range(n_full, n_any, num_stages=2):
        start = lo + c * CHUNK
        k, v = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B, HKV, S, D, BS,
                       CHUNK, BLOCK_D, IN_BLOCK)
        m, l, acc = online_step(q, k, v, (start + ss) < hi, m, l, acc, scale, DT)
    if DIRECT:
        heads = row * HQ + kv_head * G + gs               # [BLOCK_G] rows of [B * HQ]
        out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
        tl.store(out_ptr + heads[:, None] * D + ds[None, :], out.to(DT), mask=qmask)
    else:
        store_partial(acc_ptr, ml_ptr, slot, m, l, acc, G, D, BLOCK_G)
        if FUSED:
            if last_ticket(counters_ptr + ticket, count, epoch):
                attn_combine_op(acc_ptr, ml_ptr, out_ptr, row, kv_head, first, count, HQ, D, G,
                                BLOCK_G, BLOCK_SPLIT, BLOCK_D)


@triton.jit
def last_ticket(ticket_ptr, count, epoch):
    """Whether this task is the last of its unit's ``count`` pieces to take the unit's ticket
    this launch: every thread's stores before it are released, and the other pieces' stores
    acquired by the last (its loads after it then read them from L2)."""
    tl.debug_barrier()
    return tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == count * epoch - 1


@triton.jit
def pair_steps(q_ptr, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, offs, qmask, scale,
               B: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
               G: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
               BLOCK_D: tl.constexpr, STAGES: tl.constexpr, IN_BLOCK: tl.constexpr,
               NCHUNK: tl.constexpr, W: tl.constexpr, ROTATE: tl.constexpr):
    """Keys [lo, hi) of kv heads kv_head and kv_head + 1 of row ``row`` in CHUNK-key steps (at
    most NCHUNK: those whose keys all lie below hi unmasked, then the last one masked,
    ``attention_keys_m.step_counts``), the two heads side by side in one pipelined loop (two
    independent chains of loads and dots: one's arithmetic overlaps the other's loads), queries
    at q_ptr + offs (head a) and + G * D (head b) -> (max, sum, unnormalised acc) of each head.
    ROTATE: the loop over the full steps starts at the task's own step and wraps around
    (``attention_keys_m.step_rotation``)."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    qa = tl.load(q_ptr + offs, mask=qmask, other=0.0).to(DT)
    qb = tl.load(q_ptr + offs + G * D, mask=qmask, other=0.0).to(DT)
    rot = step_rotation(row, kv_head, HKV, 2, NCHUNK) if ROTATE else 0
    if W > 1:
        ma, la, acc_a, mb, lb, acc_b = pair_steps_keys_m(
            qa, qb, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, scale, B, HKV, S, D, BS,
            CHUNK, BLOCK_G, BLOCK_D, STAGES, IN_BLOCK, NCHUNK, W, ROTATE, rot)
    else:
        ss = tl.arange(0, CHUNK)
        ma, la, acc_a = empty_state(BLOCK_G, BLOCK_D)
        mb, lb, acc_b = empty_state(BLOCK_G, BLOCK_D)
        n_full, n_any = step_counts(lo, hi, NCHUNK, CHUNK)
        rot = rot % tl.maximum(n_full, 1)
        for i in tl.range(0, n_full, num_stages=STAGES):      # no key masked: no masks
            ma, la, acc_a, mb, lb, acc_b = pair_step(
                qa, qb, cache_ptr, bt_ptr, row, kv_head, layer,
                lo + full_step(i, rot, n_full, ROTATE) * CHUNK, hi, ss, ma, la, acc_a, mb, lb,
                acc_b, scale, B, HKV, S, D, BS, CHUNK, BLOCK_D, IN_BLOCK, DT, False)
        for c in tl.range(n_full, n_any, num_stages=2):       # the last keys below hi
            ma, la, acc_a, mb, lb, acc_b = pair_step(
                qa, qb, cache_ptr, bt_ptr, row, kv_head, layer, lo + c * CHUNK, hi, ss, ma, la,
                acc_a, mb, lb, acc_b, scale, B, HKV, S, D, BS, CHUNK, BLOCK_D, IN_BLOCK, DT)
    return ma, la, acc_a, mb, lb, acc_b


@triton.jit
def pair_step(qa, qb, cache_ptr, bt_ptr, row, kv_head, layer, start, hi, ss, ma, la, acc_a, mb,
              lb, acc_b, scale, B: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr,
              D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
              IN_BLOCK: tl.constexpr, DT: tl.constexpr, MASKED: tl.constexpr = True):
    """One step of keys [start, start + CHUNK) (ss: arange(CHUNK)) of kv heads kv_head and
    kv_head + 1 of row ``row`` (keys >= hi masked; not MASKED: none is) into both heads'
    running states."""
    valid = start + ss < hi
    ka, va = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B, HKV, S, D, BS, CHUNK,
                     BLOCK_D, IN_BLOCK, MASKED)
    kb, vb = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head + 1, B, HKV, S, D, BS,
                     CHUNK, BLOCK_D, IN_BLOCK, MASKED)
    ma, la, acc_a = online_step(qa, ka, va, valid, ma, la, acc_a, scale, DT, MASKED)
    mb, lb, acc_b = online_step(qb, kb, vb, valid, mb, lb, acc_b, scale, DT, MASKED)
    return ma, la, acc_a, mb, lb, acc_b


@triton.jit
def attn_pair_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, row, kv_head, layer,
                 scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                 S: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                 STAGES: tl.constexpr, IN_BLOCK: tl.constexpr, W: tl.constexpr = 1,
                 ROTATE: tl.constexpr = False):
    """Row ``row``'s query heads of kv heads kv_head and kv_head + 1 over all its keys
    (``pair_steps``) -> both normalised outputs in out [B, HQ * D]. IN_BLOCK: BS a multiple of
    CHUNK (one block-table entry per step and head); W: a step's keys in W groups; ROTATE: the
    keys from the task's own step on (``attention_keys_m.step_rotation``)."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCHUNK: tl.constexpr = (S + CHUNK - 1) // CHUNK
    hi = tl.load(pos_ptr + row).to(tl.int32) + 1
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    qmask = (gs[:, None] < G) & (ds[None, :] < D)
    heads = row * HQ + kv_head * G + gs                   # [BLOCK_G] rows of [B * HQ], head a
    offs = heads[:, None] * D + ds[None, :]                               # [BLOCK_G, BLOCK_D]
    ma, la, acc_a, mb, lb, acc_b = pair_steps(
        q_ptr, cache_ptr, bt_ptr, row, kv_head, layer, 0, hi, offs, qmask, scale, B, HKV, S, D,
        G, BS, CHUNK, BLOCK_G, BLOCK_D, STAGES, IN_BLOCK, NCHUNK, W, ROTATE)
    tl.store(out_ptr + offs, (acc_a / tl.where(la == 0.0, 1.0, la)[:, None]).to(DT), mask=qmask)
    tl.store(out_ptr + offs + G * D, (acc_b / tl.where(lb == 0.0, 1.0, lb)[:, None]).to(DT),
             mask=qmask)


@triton.jit
def store_partial(acc_ptr, ml_ptr, slot, m, l, acc, G: tl.constexpr, D: tl.constexpr,
                  BLOCK_G: tl.constexpr):
    """A key range's acc [G, D] and (max, sum) [G, 2] into partial slot ``slot``."""
    gs = tl.arange(0, BLOCK_G)
    store_partial_rows(acc_ptr, ml_ptr, slot * G + gs, gs < G, m, l, acc, D)


@triton.jit
def store_partial_rows(acc_ptr, ml_ptr, part, rows, m, l, acc, D: tl.constexpr):
    """Rows ``rows`` [R] of acc [R, BLOCK_D] and (max, sum) [R] into partial rows ``part`` [R]
    (acc [P, D], ml [P, 2])."""
    ds = tl.arange(0, acc.shape[1])
    tl.store(acc_ptr + part[:, None] * D + ds[None, :], acc,
             mask=rows[:, None] & (ds[None, :] < D))
    tl.store(ml_ptr + part * 2, m, mask=rows)
    tl.store(ml_ptr + part * 2 + 1, l, mask=rows)


@triton.jit
def attn_pair_part_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, row,
                      kv_head, slot, lo, span, layer, counters_ptr, epoch, ticket, first, count,
                      scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr,
                      HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                      KV_SPLIT: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
                      BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr,
                      IN_BLOCK: tl.constexpr, FUSED: tl.constexpr = False,
                      BLOCK_SPLIT: tl.constexpr = 1):
    """``attn_pair_op`` over keys [lo, min(lo + span, len)) (span <= KV_SPLIT) -> each head's
    unnormalised acc and (max, sum) into partial slots ``slot`` (kv_head) and ``slot + count``
    (kv_head + 1; ``count`` ranges a unit), for their units' combines. IN_BLOCK: lo and BS
    multiples of CHUNK. FUSED: then the pair's ticket; the part that takes its last (``count``
    parts a launch) merges both units, slots [first, first + count) and the next ``count``,
    into out."""
    hi = tl.minimum(lo + span, tl.load(pos_ptr + row).to(tl.int32) + 1)
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    qmask = (gs[:, None] < G) & (ds[None, :] < D)
    offs = (row * HQ + kv_head * G + gs)[:, None] * D + ds[None, :]
    ma, la, acc_a, mb, lb, acc_b = pair_steps(
        q_ptr, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, offs, qmask, scale, B, HKV, S, D,
        G, BS, CHUNK, BLOCK_G, BLOCK_D, STAGES, IN_BLOCK, (KV_SPLIT + CHUNK - 1) // CHUNK, 1,
        False)
    store_partial(acc_ptr, ml_ptr, slot, ma, la, acc_a, G, D, BLOCK_G)
    store_partial(acc_ptr, ml_ptr, slot + count, mb, lb, acc_b, G, D, BLOCK_G)
    if FUSED:
        if last_ticket(counters_ptr + ticket, count, epoch):
            for h in tl.static_range(2):
                attn_combine_op(acc_ptr, ml_ptr, out_ptr, row, kv_head + h, first + h * count,
                                count, HQ, D, G, BLOCK_G, BLOCK_SPLIT, BLOCK_D)


@triton.jit
def attn_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, f0, f1, layer,
                   slot0, scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr,
                   HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                   BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_D: tl.constexpr, STAGES: tl.constexpr, ROWS: tl.constexpr):
    """Keys [f0, f1) of the (row, kv head) units laid end to end (unit u = row * HKV + kv head
    holds keys [u * S, (u + 1) * S); f0, f1 and S multiples of CHUNK) in one pipelined loop of
    CHUNK-key steps, whatever unit each step belongs to. Where a unit's piece ends: the whole
    unit -> its normalised output in out [B, HQ * D]; a part of one (only the first and the last
    piece can be) -> acc and (max, sum) in partial slot slot0, or slot0 + 1 for the last where
    the first was a part too. ROWS: ``stream_step``'s."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    gs, ds, ss, qmask = step_frame(G, D, BLOCK_G, BLOCK_D, CHUNK)
    c0 = f0 // CHUNK
    c1 = f1 // CHUNK
    m, l, acc = empty_state(BLOCK_G, BLOCK_D)
    rows = stream_rows(c0, pos_ptr, B, NCH, HKV)
    for c in tl.range(c0, c1, num_stages=STAGES):
        row, kv_head, start, hi, ends, whole, second = stream_step(c, c0, c1, pos_ptr, rows, NCH,
                                                                   HKV, 1, CHUNK, ROWS)
        heads = row * HQ + kv_head * G + gs                            # [BLOCK_G] of [B * HQ]
        q = tl.load(q_ptr + heads[:, None] * D + ds[None, :], mask=qmask, other=0.0).to(DT)
        k, v = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B, HKV, S, D, BS,
                       CHUNK, BLOCK_D, BS % CHUNK == 0)           # steps start at CHUNK multiples
        m, l, acc = online_step(q, k, v, (start + ss) < hi, m, l, acc, scale, DT)
        # where this unit's piece ends (a branch: the epilogue's stores and layout changes run
        # once a piece, not masked at every step)
        if ends:
            if whole:
                out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
                tl.store(out_ptr + heads[:, None] * D + ds[None, :], out.to(DT), mask=qmask)
            else:
                store_partial(acc_ptr, ml_ptr, slot0 + second, m, l, acc, G, D, BLOCK_G)
            m, l, acc = empty_state(BLOCK_G, BLOCK_D)


@triton.jit
def stream_rows(c0, pos_ptr, B: tl.constexpr, NCH: tl.constexpr, UNITS: tl.constexpr):
    """Before a stream's loop from step c0 (NCH steps a unit, UNITS units a row): its first
    row and the lengths of that row and the next (the last row's own where there is none)."""
    row = c0 // NCH // UNITS
    return (row, tl.load(pos_ptr + row).to(tl.int32) + 1,
            tl.load(pos_ptr + tl.minimum(row + 1, B - 1)).to(tl.int32) + 1)


@triton.jit
def row_length(row, pos_ptr, rows, ROWS: tl.constexpr):
    """The length of a stream's row ``row``: with ROWS (the most rows a stream of the op
    spans) up to 2, picked from ``rows`` (``stream_rows``), so that no load in the loop waits on
    another; more, loaded here."""
    if ROWS <= 2:
        row_a, hi_a, hi_b = rows
        hi = tl.where(row == row_a, hi_a, hi_b)
    else:
        hi = tl.load(pos_ptr + row).to(tl.int32) + 1
    return hi


@triton.jit
def second_cut(u, c0, NCH: tl.constexpr):
    """1 where unit u's piece is the second cut piece of a stream from step c0 (NCH steps a
    unit: the stream began inside another unit), else 0; its slot is then slot0 + 1."""
    return ((u != c0 // NCH) & (c0 % NCH != 0)).to(tl.int32)


@triton.jit
def stream_step(c, c0, c1, pos_ptr, rows, NCH: tl.constexpr, UNITS: tl.constexpr,
                NH: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr):
    """Step c of a stream over steps [c0, c1) of units of NH kv heads laid end to end (NCH
    steps a unit, UNITS units a row): its unit's row, first kv head and first key, the row's
    length; whether a piece of the unit ends with it, whether that piece is the whole unit,
    and whether it is the stream's second cut piece (1; its slot is slot0 + 1: the first piece
    was cut too, only the first and the last piece can be). ROWS, the most rows a stream of
    the op spans: up to 2, the length is picked from ``rows`` (``stream_rows``), so that no
    load in the loop waits on another (the keys' masks on the length); more, loaded here."""
    u = c // NCH
    row = u // UNITS
    hi = row_length(row, pos_ptr, rows, ROWS)
    unit_end = c % NCH == NCH - 1
    second = second_cut(u, c0, NCH)
    return (row, (u % UNITS) * NH, (c % NCH) * CHUNK, hi, unit_end | (c == c1 - 1),
            unit_end & (u * NCH >= c0), second)


@triton.jit
def attn_combine_op(acc_ptr, ml_ptr, out_ptr, row, kv_head, first, count, HQ: tl.constexpr,
                    D: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
                    BLOCK_SPLIT: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge partial slots [first, first + count) of row ``row``'s G heads of one kv head:
    out = sum_s w_s acc_s / sum_s w_s l_s."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    gs = tl.arange(0, BLOCK_G)
    ss = tl.arange(0, BLOCK_SPLIT)
    ds = tl.arange(0, BLOCK_D)
    part = (first + ss)[None, :] * G + gs[:, None]                            # [BG, BSPLIT]
    pmask = (gs[:, None] < G) & (ss[None, :] < count)
    m = tl.load(ml_ptr + part * 2, mask=pmask, other=float("-inf"))
    l = tl.load(ml_ptr + part * 2 + 1, mask=pmask, other=0.0)
    m_max = tl.max(m, axis=1)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)                      # padded heads
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max[:, None]))         # [BG, BSPLIT]
    acc = tl.load(acc_ptr + part[:, :, None] * D + ds[None, None, :],
                  mask=pmask[:, :, None] & (ds[None, None, :] < D), other=0.0)
    den = tl.sum(w * l, axis=1)
    out = tl.sum(w[:, :, None] * acc, axis=1) / tl.where(den == 0.0, 1.0, den)[:, None]
    omask = (gs[:, None] < G) & (ds[None, :] < D)
    tl.store(out_ptr + row * (HQ * D) + (kv_head * G + gs)[:, None] * D + ds[None, :],
             out.to(DT), mask=omask)
