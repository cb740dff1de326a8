"""Pair streams with their units' queries stacked as the dots' rows (``@triton.jit``;
``TileConfig.attn_stack``): ``stream_ops.attn_pair_stream_op``'s steps [c0, c1) over units of
a row's pair of kv heads (unit u = row * (HKV // 2) + kv head // 2, NCH steps a unit) in one
pipelined loop whose trip does only a step's loads, dots and softmax.

The units a stream touches (at most STACK) hold their G query heads of each kv head as rows
k * G + g of one [BLOCK_R, BLOCK_D] tile a head (loaded once, before the loop); a step's dots
take every row (the tensor-core M is padded to 16 anyway) and its softmax updates only the rows
of the step's unit (``stacked_step``: the others' weights are exp2(-inf) = 0 and their rescale
1). Where cache blocks hold whole steps, the block-table entries of all the stream's steps are
asked for before the loop (``stream_blocks``). After it, each row goes where its unit's piece
goes: the normalised output of a whole unit into out [B, HQ * D], a cut unit's unnormalised acc
and (max, sum) into its slot (``attention_ops``'s partials; head b's at slot + nslots), in
masked stores, no branch.
"""
import triton
import triton.language as tl

from .attention_keys_m import (LOG2E, empty_states, kv_load, kv_mask, load_kv_groups,
                               merge_groups, step_block)
from .attention_ops import empty_state, load_kv, row_length, store_partial_rows, stream_rows
from .ops import _dot
from .rope_ops import block_slot, cache_block


@triton.jit
def stacked_rows(c0, c1, G: tl.constexpr, NCH: tl.constexpr, UNITS: tl.constexpr,
                 BLOCK_R: tl.constexpr, STACK: tl.constexpr):
    """The stacked rows [BLOCK_R] of a stream over steps [c0, c1): each row's unit within the
    stream (k), query head within its kv head (g), the row and first kv head of its unit, and
    whether it is a real row of a unit the stream touches."""
    rs = tl.arange(0, BLOCK_R)
    k = rs // G
    u = c0 // NCH + k
    live = (rs < STACK * G) & (u * NCH < c1)
    return k, rs % G, u // UNITS, u % UNITS * 2, live


@triton.jit
def stream_blocks(bt_ptr, c0, c1, B: tl.constexpr, S: tl.constexpr, BS: tl.constexpr,
                  CHUNK: tl.constexpr, NCH: tl.constexpr, UNITS: tl.constexpr,
                  STEPS: tl.constexpr):
    """The block-table entries [p2(STEPS)] of a stream's steps c0, c0 + 1, ... (each step
    within one cache block; those past c1 repeat its last)."""
    cs = tl.minimum(c0 + tl.arange(0, triton.next_power_of_2(STEPS)), c1 - 1)
    return cache_block(tl.minimum(cs // NCH // UNITS, B - 1), cs % NCH * CHUNK, bt_ptr, S, BS)


@triton.jit
def load_step_kv(cache_ptr, bt_ptr, blocks, i, row, start, hi, layer, kv_head, B: tl.constexpr,
                 HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, IN_BLOCK: tl.constexpr):
    """Keys and values [CHUNK, BLOCK_D] of the loop's i-th step (positions [start, start +
    CHUNK) of ``row``; those >= hi not read): IN_BLOCK, at fixed offsets from the step's block
    (``stream_blocks``), else through the table key by key (``attention_ops.load_kv``)."""
    if IN_BLOCK:
        ss = tl.arange(0, CHUNK)
        ds = tl.arange(0, BLOCK_D)
        key = block_slot(step_block(blocks, i), start, layer, 0, kv_head, B, HKV, S, D, BS)
        offs = key + ss[:, None] * D + ds[None, :]                       # [CHUNK, BLOCK_D]
        mask = kv_mask((start + ss < hi)[:, None], ds[None, :] < D, True, BLOCK_D != D)
        k = kv_load(cache_ptr + offs, mask)
        v = kv_load(cache_ptr + offs + B * HKV * S * D, mask)
    else:
        k, v = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B, HKV, S, D, BS,
                       CHUNK, BLOCK_D)
    return k, v


@triton.jit
def stacked_weights(raw, m, cur, scale, AXIS: tl.constexpr):
    """``attention_keys_m.softmax_weights`` of a step's raw scores (the keys along AXIS) for
    the rows ``cur`` (broadcast to m's shape) only: the others keep their max, rescale by 1
    and weigh every key exp2(-inf) = 0 (their max as +inf in the weights' one subtraction, not
    a select over the scores)."""
    m_new = tl.where(cur, tl.maximum(m, tl.max(raw, axis=AXIS) * scale), m)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)         # no key yet: adds nothing
    alpha = tl.where(cur, tl.exp2((m - m_ref) * LOG2E), 1.0)
    p = tl.exp2(raw * (scale * LOG2E) -
                tl.expand_dims(tl.where(cur, m_ref * LOG2E, float("inf")), AXIS))
    return m_new, alpha, p


@triton.jit
def stacked_step(q, k, v, live, cur, m, l, acc, scale, DT: tl.constexpr):
    """One step of keys k and values v [CHUNK, BLOCK_D] (the first ``live`` of them below the
    row's length) into the running max m and sum l [BLOCK_R] and acc [BLOCK_R, BLOCK_D] of the
    stacked queries q, only the rows ``cur`` [BLOCK_R] (the step's unit's) changed."""
    raw = _dot(q, tl.trans(k.to(DT)), tl.zeros([q.shape[0], k.shape[0]], tl.float32), DT)
    # the keys' mask made here, in the scores' layout (one shared with the loads' masks would
    # be converted between layouts through shared memory every step)
    raw = tl.where(tl.arange(0, k.shape[0])[None, :] < live, raw, float("-inf"))
    m_new, alpha, p = stacked_weights(raw, m, cur, scale, 1)
    return m_new, l * alpha + tl.sum(p, axis=1), _dot(p.to(DT), v.to(DT),
                                                      acc * alpha[:, None], DT)


@triton.jit
def stacked_step_keys_m(qt, k, vt, live, cur, m, l, acc_t, scale, DT: tl.constexpr):
    """``stacked_step`` with the keys as the dots' M in W groups (``attention_keys_m``'s
    ``online_keys_m``: k [W, CW, BLOCK_D], vt [W, BLOCK_D, CW], key j of group w the step's
    w * CW + j; qt [W, BLOCK_D, BLOCK_R]; m [W, BLOCK_R], per-key sums l [W, CW, BLOCK_R],
    acc_t [W, BLOCK_D, BLOCK_R]), only the rows ``cur`` [BLOCK_R] changed."""
    zeros = tl.zeros([k.shape[0], k.shape[1], qt.shape[2]], tl.float32)
    raw = _dot(k.to(DT), qt, zeros, DT)                                   # [W, CW, BR]
    key = tl.arange(0, k.shape[0])[:, None] * k.shape[1] + tl.arange(0, k.shape[1])[None, :]
    raw = tl.where((key < live)[:, :, None], raw, float("-inf"))
    m_new, alpha, p = stacked_weights(raw, m, tl.broadcast_to(cur[None, :], m.shape), scale, 1)
    return (m_new, l * alpha[:, None, :] + p,
            _dot(vt.to(DT), p.to(DT), acc_t * alpha[:, None, :], DT))


@triton.jit
def stacked_pair_step(qa, qb, cache_ptr, bt_ptr, blocks, i, row, kv0, start, hi, layer, cur, ma,
                      la, acc_a, mb, lb, acc_b, scale, B: tl.constexpr, HKV: tl.constexpr,
                      S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
                      BLOCK_D: tl.constexpr, IN_BLOCK: tl.constexpr, W: tl.constexpr):
    """The loop's i-th step (keys [start, start + CHUNK) of kv heads kv0 and kv0 + 1 of
    ``row``) into both heads' stacked states: W > 1, the keys as the dots' M in W groups."""
    DT: tl.constexpr = qa.dtype
    if W > 1:
        block = step_block(blocks, i) if IN_BLOCK else None
        ka, va = load_kv_groups(cache_ptr, bt_ptr, row, start, hi, layer, kv0, B, HKV, S, D,
                                BS, CHUNK, BLOCK_D, W, IN_BLOCK, block)
        kb, vb = load_kv_groups(cache_ptr, bt_ptr, row, start, hi, layer, kv0 + 1, B, HKV, S,
                                D, BS, CHUNK, BLOCK_D, W, IN_BLOCK, block)
        ma, la, acc_a = stacked_step_keys_m(qa, ka, va, hi - start, cur, ma, la, acc_a, scale, DT)
        mb, lb, acc_b = stacked_step_keys_m(qb, kb, vb, hi - start, cur, mb, lb, acc_b, scale, DT)
    else:
        ka, va = load_step_kv(cache_ptr, bt_ptr, blocks, i, row, start, hi, layer, kv0, B, HKV,
                              S, D, BS, CHUNK, BLOCK_D, IN_BLOCK)
        kb, vb = load_step_kv(cache_ptr, bt_ptr, blocks, i, row, start, hi, layer, kv0 + 1, B,
                              HKV, S, D, BS, CHUNK, BLOCK_D, IN_BLOCK)
        ma, la, acc_a = stacked_step(qa, ka, va, hi - start, cur, ma, la, acc_a, scale, DT)
        mb, lb, acc_b = stacked_step(qb, kb, vb, hi - start, cur, mb, lb, acc_b, scale, DT)
    return ma, la, acc_a, mb, lb, acc_b


@triton.jit
def stacked_states(qa, qb, W: tl.constexpr, CHUNK: tl.constexpr):
    """Before the loop: both heads' stacked queries [BLOCK_R, BLOCK_D] as the steps take them
    (W > 1: transposed and broadcast over the W key groups) and their empty running states."""
    BLOCK_R: tl.constexpr = qa.shape[0]
    BLOCK_D: tl.constexpr = qa.shape[1]
    if W > 1:
        qa = tl.broadcast_to(tl.trans(qa)[None, :, :], (W, BLOCK_D, BLOCK_R))
        qb = tl.broadcast_to(tl.trans(qb)[None, :, :], (W, BLOCK_D, BLOCK_R))
        m, l, acc = empty_states(W, BLOCK_R, BLOCK_D, True, CHUNK // W)
    else:
        m, l, acc = empty_state(BLOCK_R, BLOCK_D)
    return qa, qb, m, l, acc


@triton.jit
def pair_stream_stacked(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, c0, c1,
                        layer, slot0, nslots, scale, B: tl.constexpr, HQ: tl.constexpr,
                        HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                        BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
                        STAGES: tl.constexpr, ROWS: tl.constexpr, STACK: tl.constexpr,
                        STEPS: tl.constexpr, W: tl.constexpr):
    """``attn_pair_stream_op``'s steps [c0, c1) (at most STEPS, over at most STACK units) with
    the units' queries stacked (the module's form; W > 1: the keys as the dots' M in W groups,
    the stacked rows as N) -> each piece's output or partials."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    UNITS: tl.constexpr = HKV // 2
    IN_BLOCK: tl.constexpr = BS % CHUNK == 0                  # steps start at CHUNK multiples
    # the dots' least rows as M (16) or as N (8): no row padded by copies of others
    BLOCK_R: tl.constexpr = max(8 if W > 1 else 16, triton.next_power_of_2(STACK * G))
    ks, gs, urow, ukv, live = stacked_rows(c0, c1, G, NCH, UNITS, BLOCK_R, STACK)
    ds = tl.arange(0, BLOCK_D)
    qmask = live[:, None] & (ds[None, :] < D)
    offs = (urow * HQ + ukv * G + gs)[:, None] * D + ds[None, :]      # head a's [BR, BD]
    qa, qb, ma, la, acc_a = stacked_states(
        tl.load(q_ptr + offs, mask=qmask, other=0.0).to(DT),
        tl.load(q_ptr + offs + G * D, mask=qmask, other=0.0).to(DT), W, CHUNK)
    mb, lb, acc_b = ma, la, acc_a
    blocks = stream_blocks(bt_ptr, c0, c1, B, S, BS, CHUNK, NCH, UNITS, STEPS) if IN_BLOCK \
        else None
    rows = stream_rows(c0, pos_ptr, B, NCH, UNITS)
    for i in tl.range(0, c1 - c0, num_stages=STAGES):
        c = c0 + i
        row = c // NCH // UNITS
        ma, la, acc_a, mb, lb, acc_b = stacked_pair_step(
            qa, qb, cache_ptr, bt_ptr, blocks, i, row, c // NCH % UNITS * 2, c % NCH * CHUNK,
            row_length(row, pos_ptr, rows, ROWS),
            layer, ks == c // NCH - c0 // NCH, ma, la, acc_a, mb, lb, acc_b, scale, B, HKV, S,
            D, BS, CHUNK, BLOCK_D, IN_BLOCK, W)
    if W > 1:
        ma, la, acc_a = merge_groups(ma, la, acc_a)
        mb, lb, acc_b = merge_groups(mb, lb, acc_b)
    whole = live & (c0 <= (c0 // NCH + ks) * NCH) & ((c0 // NCH + ks + 1) * NCH <= c1)
    slot = slot0 + ((ks > 0) & (c0 % NCH != 0)).to(tl.int32)       # a cut piece's slot
    end_stacked(out_ptr, acc_ptr, ml_ptr, offs, whole, live & ~whole, slot * G + gs, ma, la,
                acc_a, G, D)
    end_stacked(out_ptr + G * D, acc_ptr, ml_ptr, offs, whole, live & ~whole,
                (slot + nslots) * G + gs, mb, lb, acc_b, G, D)


@triton.jit
def end_stacked(out_ptr, acc_ptr, ml_ptr, offs, whole, cut, part, m, l, acc, G: tl.constexpr,
                D: tl.constexpr):
    """One head's stacked rows after the loop: rows of whole units normalised into out + offs,
    rows of cut units into partial rows ``part`` [BLOCK_R] (acc [P * G, D], ml [P * G, 2])."""
    ds = tl.arange(0, acc.shape[1])
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty),
             mask=whole[:, None] & (ds[None, :] < D))
    store_partial_rows(acc_ptr, ml_ptr, part, cut, m, l, acc, D)
