"""Grouped attention streams (``@triton.jit``, one tile task each): ``attention_ops``'s stream
over units of NH kv heads of a row (unit u = row * (HKV // NH) + kv head // NH, its keys
[u * S, (u + 1) * S) laid end to end), so that streams of equal shares fill every worker and
keep the heads side by side: pairs as two chains of loads and dots (``attn_pair_stream_op``),
larger groups as one batch of score tiles a step (``attn_group_stream_op``); and the combine of
a cut unit's heads.

Partials as ``attention_ops``'s, fp32 acc [P, G, D] and (max, sum) [P, G, 2]; a cut piece's
slot p (numbered in stream order over the pieces, ``tile_attention.stream_plan``) holds head h
of its unit at p + h * NSLOTS (NSLOTS pieces in all), so that each head's pieces of one unit
stay consecutive for its combine.
"""
import triton
import triton.language as tl

from .attention_group_ops import group_step, group_steps, load_kv_heads
from .attention_keys_m import empty_states, pair_steps_keys_m
from .attention_ops import (attn_combine_op, empty_state, last_ticket, pair_step, step_frame,
                            second_cut, store_partial, stream_rows, stream_step)
from .stacked_stream import pair_stream_stacked


@triton.jit
def store_group_partial(acc_ptr, ml_ptr, slot, nslots, m, l, acc, NH: tl.constexpr,
                        G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """NH heads' acc [NH, BLOCK_G, BLOCK_D] and (max, sum) [NH, BLOCK_G] into slots
    slot + h * nslots."""
    hs = tl.arange(0, NH)
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    part = (slot + hs[:, None] * nslots) * G + gs[None, :]                        # [NH, BG]
    gmask = (gs[None, :] < G) & (hs[:, None] < NH)
    tl.store(acc_ptr + part[:, :, None] * D + ds[None, None, :], acc,
             mask=gmask[:, :, None] & (ds[None, None, :] < D))
    tl.store(ml_ptr + part * 2, m, mask=gmask)
    tl.store(ml_ptr + part * 2 + 1, l, mask=gmask)


@triton.jit
def attn_group_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, f0, f1,
                         layer, slot0, nslots, counters_ptr, epoch, ticket, first, count_a,
                         count_b, scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr,
                         HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                         BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                         BLOCK_D: tl.constexpr, STAGES: tl.constexpr, ROWS: tl.constexpr,
                         NH: tl.constexpr, FUSED: tl.constexpr = False,
                         BLOCK_SPLIT: tl.constexpr = 1, KEYS_M: tl.constexpr = False):
    """Keys [f0, f1) of the units of NH kv heads laid end to end (f0, f1 and S multiples of
    CHUNK) in one pipelined loop of CHUNK-key steps, whatever unit each step belongs to
    (``group_stream_steps``). Where a unit's piece ends:
    the whole unit -> its heads' normalised outputs in out [B, HQ * D]; a part of one (only the
    first and the last piece can be) -> each head's acc and (max, sum) in slots slot0 (or
    slot0 + 1 for the last where the first was a part too) + h * nslots. FUSED: after the loop,
    each cut piece takes its unit's ticket, and the one that takes its last merges the unit's
    heads (``merge_stream_cuts``; ticket, first and count_a: the first cut piece's unit, its
    first slot and its pieces; the second's are ticket + 1, slot0 + 1, count_b). ROWS:
    ``attention_ops.stream_step``'s. KEYS_M: the keys as the dots' M, a loop a unit's piece
    (``group_stream_pieces_keys_m``)."""
    NCH: tl.constexpr = S // CHUNK
    UNITS: tl.constexpr = HKV // NH                                    # units of a row
    c0 = f0 // CHUNK
    c1 = f1 // CHUNK
    if KEYS_M:
        group_stream_pieces_keys_m(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr,
                                   c0, c1, layer, slot0, nslots, scale, B, HQ, HKV, S, D, G, BS,
                                   CHUNK, BLOCK_G, BLOCK_D, STAGES, NH)
    else:
        group_stream_steps(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, c0, c1,
                           layer, slot0, nslots, scale, B, HQ, HKV, S, D, G, BS, CHUNK, BLOCK_G,
                           BLOCK_D, STAGES, ROWS, NH)
    if FUSED:                   # after the loop: an atomic in it would stop its pipelining
        merge_stream_cuts(acc_ptr, ml_ptr, out_ptr, c0, c1, slot0, nslots, counters_ptr, epoch,
                          ticket, first, count_a, count_b, NCH, UNITS, HQ, D, G, BLOCK_G,
                          BLOCK_SPLIT, BLOCK_D, NH)


@triton.jit
def group_frame(G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                CHUNK: tl.constexpr, NH: tl.constexpr):
    """The aranges of a group's heads [NH], query rows, dims and a step's keys, and the query
    tiles' mask [NH, BLOCK_G, BLOCK_D]."""
    hs = tl.arange(0, NH)
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    qmask = (gs[None, :, None] < G) & (ds[None, None, :] < D) & (hs[:, None, None] < NH)
    return hs, gs, ds, tl.arange(0, CHUNK), qmask


@triton.jit
def group_offsets(row, kv0, hs, gs, ds, HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr):
    """Offsets [NH, BLOCK_G, BLOCK_D] of row ``row``'s query heads of kv heads kv0 + hs in
    [B, HQ * D]."""
    return ((row * HQ + (kv0 + hs[:, None]) * G + gs[None, :])[:, :, None] * D +
            ds[None, None, :])


@triton.jit
def group_stream_steps(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, c0, c1,
                       layer, slot0, nslots, scale, B: tl.constexpr, HQ: tl.constexpr,
                       HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                       BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                       BLOCK_D: tl.constexpr, STAGES: tl.constexpr, ROWS: tl.constexpr,
                       NH: tl.constexpr):
    """``attn_group_stream_op``'s steps [c0, c1) in one pipelined loop, each step's unit
    worked out from its index (``stream_step``), each piece ended where its unit's steps end."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    UNITS: tl.constexpr = HKV // NH
    hs, gs, ds, ss, qmask = group_frame(G, D, BLOCK_G, BLOCK_D, CHUNK, NH)
    m, l, acc = empty_states(NH, BLOCK_G, BLOCK_D)
    rows = stream_rows(c0, pos_ptr, B, NCH, UNITS)
    for c in tl.range(c0, c1, num_stages=STAGES):
        row, kv0, start, hi, ends, whole, second = stream_step(c, c0, c1, pos_ptr, rows, NCH,
                                                               UNITS, NH, CHUNK, ROWS)
        offs = group_offsets(row, kv0, hs, gs, ds, HQ, G, D)               # [NH, BG, BD]
        q = tl.load(q_ptr + offs, mask=qmask, other=0.0).to(DT)
        k, v = load_kv_heads(cache_ptr, bt_ptr, row, start, hi, layer, kv0 + hs, B, HKV, S, D,
                             BS, CHUNK, BLOCK_D, BS % CHUNK == 0)  # steps start at CHUNK multiples
        m, l, acc = group_step(q, k, v, start + ss < hi, m, l, acc, scale, DT)
        if ends:                # where this unit's piece ends (the epilogue once a piece)
            end_group_piece(out_ptr, acc_ptr, ml_ptr, offs, qmask, whole, slot0 + second, nslots,
                            m, l, acc, NH, G, D, BLOCK_G, BLOCK_D)
            m, l, acc = empty_states(NH, BLOCK_G, BLOCK_D)


@triton.jit
def stream_piece(u, c0, c1, pos_ptr, NCH: tl.constexpr, UNITS: tl.constexpr, NH: tl.constexpr):
    """Unit u's piece of a stream over steps [c0, c1) (NCH steps a unit, UNITS units of NH kv
    heads a row): its first and end step within the unit, the unit's row and first kv head,
    and the row's length."""
    row = u // UNITS
    return (tl.maximum(c0, u * NCH) - u * NCH, tl.minimum(c1, (u + 1) * NCH) - u * NCH, row,
            u % UNITS * NH, tl.load(pos_ptr + row).to(tl.int32) + 1)


@triton.jit
def group_stream_pieces_keys_m(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, c0,
                               c1, layer, slot0, nslots, scale, B: tl.constexpr,
                               HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr,
                               D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr,
                               CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                               BLOCK_D: tl.constexpr, STAGES: tl.constexpr, NH: tl.constexpr):
    """``group_stream_steps`` with the keys as the dots' M (a head a group): each unit's piece
    of steps [c0, c1) in a loop of its own, whole groups' (``group_steps`` over the piece's
    steps), then the piece's epilogue."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    UNITS: tl.constexpr = HKV // NH
    hs, gs, ds, _, qmask = group_frame(G, D, BLOCK_G, BLOCK_D, CHUNK, NH)
    qmask_t = (gs[None, None, :] < G) & (ds[None, :, None] < D) & (hs[:, None, None] < NH)
    u = c0 // NCH
    while u * NCH < c1:
        lo, hi, row, kv0, length = stream_piece(u, c0, c1, pos_ptr, NCH, UNITS, NH)
        heads = row * HQ + (kv0 + hs[:, None]) * G + gs[None, :]                 # [NH, BG]
        q = tl.load(q_ptr + heads[:, None, :] * D + ds[None, :, None], mask=qmask_t,
                    other=0.0).to(DT)                                             # [NH, BD, BG]
        m, l, acc = group_steps(q, cache_ptr, bt_ptr, row, kv0, layer, lo * CHUNK,
                                tl.minimum(length, hi * CHUNK), scale, B, HKV, S, D, BS, CHUNK,
                                BLOCK_G, BLOCK_D, STAGES, BS % CHUNK == 0, NH, True, NCH, False,
                                0, hi - lo, True)
        end_group_piece(out_ptr, acc_ptr, ml_ptr, group_offsets(row, kv0, hs, gs, ds, HQ, G, D),
                        qmask, (lo == 0) & (hi == NCH), slot0 + second_cut(u, c0, NCH), nslots,
                        m, l, tl.permute(acc, (0, 2, 1)), NH, G, D, BLOCK_G, BLOCK_D)
        u += 1


@triton.jit
def end_group_piece(out_ptr, acc_ptr, ml_ptr, offs, qmask, whole, slot, nslots, m, l, acc,
                    NH: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """A group's piece ended: the whole unit's heads' normalised outputs at out + offs, or
    their partials in slots slot + h * nslots."""
    if whole:
        out = acc / tl.where(l == 0.0, 1.0, l)[:, :, None]
        tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=qmask)
    else:
        store_group_partial(acc_ptr, ml_ptr, slot, nslots, m, l, acc, NH, G, D, BLOCK_G, BLOCK_D)


@triton.jit
def attn_pair_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, f0, f1,
                        layer, slot0, nslots, counters_ptr, epoch, ticket, first, count_a,
                        count_b, scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr,
                        HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                        BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_D: tl.constexpr, STAGES: tl.constexpr, ROWS: tl.constexpr,
                        FUSED: tl.constexpr = False, BLOCK_SPLIT: tl.constexpr = 1,
                        W: tl.constexpr = 1, STACK: tl.constexpr = 0, STEPS: tl.constexpr = 0):
    """``attn_group_stream_op`` over units of a row's pairs of kv heads, the two heads as two
    independent chains of loads and dots (``attention_ops.pair_steps``'s form: one's
    arithmetic overlaps the other's loads) instead of a batch of score tiles. W > 1: the keys
    as the dots' M in W groups, a loop a unit's piece (``pair_stream_pieces_keys_m``). STACK
    (the most units a stream touches; STEPS its most steps): the units' queries stacked as the
    dots' rows (W > 1: as N), one loop (``stacked_stream``)."""
    NCH: tl.constexpr = S // CHUNK
    c0 = f0 // CHUNK
    c1 = f1 // CHUNK
    if STACK > 0:
        pair_stream_stacked(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, c0, c1,
                            layer, slot0, nslots, scale, B, HQ, HKV, S, D, G, BS, CHUNK, BLOCK_D,
                            STAGES, ROWS, STACK, STEPS, W)
    elif W > 1:
        pair_stream_pieces_keys_m(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr,
                                  c0, c1, layer, slot0, nslots, scale, B, HQ, HKV, S, D, G, BS,
                                  CHUNK, BLOCK_G, BLOCK_D, STAGES, W)
    else:
        pair_stream_steps(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, c0, c1,
                          layer, slot0, nslots, scale, B, HQ, HKV, S, D, G, BS, CHUNK, BLOCK_G,
                          BLOCK_D, STAGES, ROWS)
    if FUSED:                   # after the loop: an atomic in it would stop its pipelining
        merge_stream_cuts(acc_ptr, ml_ptr, out_ptr, c0, c1, slot0, nslots, counters_ptr, epoch,
                          ticket, first, count_a, count_b, NCH, HKV // 2, HQ, D, G, BLOCK_G,
                          BLOCK_SPLIT, BLOCK_D, 2)


@triton.jit
def pair_stream_steps(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, c0, c1, layer,
                      slot0, nslots, scale, B: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                      S: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr,
                      CHUNK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                      STAGES: tl.constexpr, ROWS: tl.constexpr):
    """``attn_pair_stream_op``'s steps [c0, c1) in one pipelined loop, each step's unit worked
    out from its index (``stream_step``), each piece ended where its unit's steps end."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    gs, ds, ss, qmask = step_frame(G, D, BLOCK_G, BLOCK_D, CHUNK)
    ma, la, acc_a = empty_state(BLOCK_G, BLOCK_D)
    mb, lb, acc_b = empty_state(BLOCK_G, BLOCK_D)
    rows = stream_rows(c0, pos_ptr, B, NCH, HKV // 2)
    for c in tl.range(c0, c1, num_stages=STAGES):
        row, kv0, start, hi, ends, whole, second = stream_step(c, c0, c1, pos_ptr, rows, NCH,
                                                               HKV // 2, 2, CHUNK, ROWS)
        offs = (row * HQ + kv0 * G + gs)[:, None] * D + ds[None, :]       # head a's [BG, BD]
        qa = tl.load(q_ptr + offs, mask=qmask, other=0.0).to(DT)
        qb = tl.load(q_ptr + offs + G * D, mask=qmask, other=0.0).to(DT)
        ma, la, acc_a, mb, lb, acc_b = pair_step(
            qa, qb, cache_ptr, bt_ptr, row, kv0, layer, start, hi, ss, ma, la, acc_a, mb, lb,
            acc_b, scale, B, HKV, S, D, BS, CHUNK, BLOCK_D, BS % CHUNK == 0, DT)
        if ends:                # where this unit's piece ends (the epilogue once a piece)
            end_pair_piece(out_ptr, acc_ptr, ml_ptr, offs, qmask, whole, slot0 + second, nslots,
                           ma, la, acc_a, mb, lb, acc_b, G, D, BLOCK_G, BLOCK_D)
            ma, la, acc_a = empty_state(BLOCK_G, BLOCK_D)
            mb, lb, acc_b = empty_state(BLOCK_G, BLOCK_D)


@triton.jit
def pair_stream_pieces_keys_m(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, c0,
                              c1, layer, slot0, nslots, scale, B: tl.constexpr,
                              HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr,
                              D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr,
                              CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                              BLOCK_D: tl.constexpr, STAGES: tl.constexpr, W: tl.constexpr):
    """``pair_stream_steps`` with the keys as the dots' M in W groups a step: each unit's
    piece of steps [c0, c1) in a loop of its own, whole pairs' (``pair_steps_keys_m`` over
    the piece's steps: its queries and block-table entries asked for before it, no branch in
    it), then the piece's epilogue; one pipeline fill a piece instead of one a stream."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    UNITS: tl.constexpr = HKV // 2
    gs, ds, _, qmask = step_frame(G, D, BLOCK_G, BLOCK_D, CHUNK)
    u = c0 // NCH
    while u * NCH < c1:
        lo, hi, row, kv0, length = stream_piece(u, c0, c1, pos_ptr, NCH, UNITS, 2)
        offs = (row * HQ + kv0 * G + gs)[:, None] * D + ds[None, :]       # head a's [BG, BD]
        qa = tl.load(q_ptr + offs, mask=qmask, other=0.0).to(DT)
        qb = tl.load(q_ptr + offs + G * D, mask=qmask, other=0.0).to(DT)
        ma, la, acc_a, mb, lb, acc_b = pair_steps_keys_m(
            qa, qb, cache_ptr, bt_ptr, row, kv0, layer, lo * CHUNK,
            tl.minimum(length, hi * CHUNK), scale, B, HKV, S, D, BS, CHUNK, BLOCK_G, BLOCK_D,
            STAGES, BS % CHUNK == 0, NCH, W, False, 0, hi - lo, True)
        end_pair_piece(out_ptr, acc_ptr, ml_ptr, offs, qmask, (lo == 0) & (hi == NCH),
                       slot0 + second_cut(u, c0, NCH), nslots, ma, la, acc_a, mb, lb, acc_b, G,
                       D, BLOCK_G, BLOCK_D)
        u += 1


@triton.jit
def end_pair_piece(out_ptr, acc_ptr, ml_ptr, offs, qmask, whole, slot, nslots, ma, la, acc_a, mb,
                   lb, acc_b, G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """A pair's piece ended: the whole unit's two normalised outputs at out + offs (head a)
    and + G * D (head b), or its heads' partials in slots ``slot`` and slot + nslots."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    if whole:
        tl.store(out_ptr + offs, (acc_a / tl.where(la == 0.0, 1.0, la)[:, None]).to(DT),
                 mask=qmask)
        tl.store(out_ptr + offs + G * D, (acc_b / tl.where(lb == 0.0, 1.0, lb)[:, None]).to(DT),
                 mask=qmask)
    else:
        store_partial(acc_ptr, ml_ptr, slot, ma, la, acc_a, G, D, BLOCK_G)
        store_partial(acc_ptr, ml_ptr, slot + nslots, mb, lb, acc_b, G, D, BLOCK_G)


@triton.jit
def merge_stream_cuts(acc_ptr, ml_ptr, out_ptr, c0, c1, slot0, nslots, counters_ptr, epoch,
                      ticket, first, count_a, count_b, NCH: tl.constexpr, UNITS: tl.constexpr,
                      HQ: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
                      BLOCK_SPLIT: tl.constexpr, BLOCK_D: tl.constexpr, NH: tl.constexpr):
    """The cut pieces of steps [c0, c1) (NCH steps a unit, UNITS units a row), once their
    partials are stored: the first piece where the stream begins inside its unit, the last
    where it ends inside its unit (the second cut piece where the first was one too and of
    another unit), each through ``merge_cut_unit``."""
    first_cut = c0 % NCH != 0
    ua = c0 // NCH
    ub = (c1 - 1) // NCH
    last_cut = (c1 % NCH != 0) & ((ub != ua) | (c0 % NCH == 0))
    for k in range(2):          # a loop, not two call sites: one copy of the merge's code
        if tl.where(k == 0, first_cut, last_cut):
            u = tl.where(k == 0, ua, ub)
            second = tl.where(k == 0, 0, ((ub != ua) & first_cut).to(tl.int32))
            merge_cut_unit(acc_ptr, ml_ptr, out_ptr, u // UNITS, u % UNITS * NH, second, slot0,
                           nslots, counters_ptr, epoch, ticket, first, count_a, count_b, HQ, D,
                           G, BLOCK_G, BLOCK_SPLIT, BLOCK_D, NH)


@triton.jit
def merge_cut_unit(acc_ptr, ml_ptr, out_ptr, row, kv0, second, slot0, nslots, counters_ptr,
                   epoch, ticket, first, count_a, count_b, HQ: tl.constexpr, D: tl.constexpr,
                   G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SPLIT: tl.constexpr,
                   BLOCK_D: tl.constexpr, NH: tl.constexpr):
    """After a stream's first (``second`` 0) or second (1) cut piece stored its partials: its
    unit's ticket, and where this piece takes the last, ``attn_group_combine_op`` of the unit
    (the first piece's: ``ticket``, slots from ``first``, ``count_a`` pieces; the second's:
    ticket + 1, from slot0 + 1, ``count_b``)."""
    count = tl.where(second == 1, count_b, count_a)
    if last_ticket(counters_ptr + ticket + second, count, epoch):
        attn_group_combine_op(acc_ptr, ml_ptr, out_ptr, row, kv0,
                              tl.where(second == 1, slot0 + 1, first), count, nslots, HQ, D, G,
                              BLOCK_G, BLOCK_SPLIT, BLOCK_D, NH)


@triton.jit
def attn_group_combine_op(acc_ptr, ml_ptr, out_ptr, row, kv_head, first, count, nslots,
                          HQ: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                          BLOCK_G: tl.constexpr, BLOCK_SPLIT: tl.constexpr,
                          BLOCK_D: tl.constexpr, NH: tl.constexpr):
    """``attention_ops.attn_combine_op`` of each of a cut unit's NH kv heads kv_head + h: its
    slots [first + h * nslots, first + h * nslots + count)."""
    for h in range(NH):         # a loop, not NH copies of the combine
        attn_combine_op(acc_ptr, ml_ptr, out_ptr, row, kv_head + h, first + h * nslots, count,
                        HQ, D, G, BLOCK_G, BLOCK_SPLIT, BLOCK_D)
