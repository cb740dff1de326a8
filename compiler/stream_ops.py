"""Streamed attention op bodies of the megakernel (``@triton.jit``, one tile task each): the keys
of consecutive units laid end to end, one worker's equal share of them in one pipelined loop of
CHUNK-key steps, whatever unit each step belongs to (``tile_attention.tile_attention_stream``).
A unit is a (row, kv head) (``attn_stream_op``) or a (row, pair of kv heads) whose two heads run
side by side in the loop (``attn_pair_stream_op``).

Inputs: q [B, HQ * D], the cache [L, 2, B, Hkv, S, D] through the block table, positions [B].
Outputs: a whole unit's normalised heads into out [B, HQ * D]; a unit's piece (only a stream's
first and last piece can be one) its unnormalised acc [G, D] and (max, sum) [G, 2] in fp32 into a
partial slot, merged by the unit's attn_combine.
"""
import triton
import triton.language as tl

from .attention_ops import load_kv, online_step


@triton.jit
def piece_end(out_ptr, acc_ptr, ml_ptr, heads, slot, m, l, acc, last, whole, qmask, gs, ds,
              G: tl.constexpr, D: tl.constexpr):
    """After a step of one kv head's queries (rows ``heads`` [BLOCK_G] of out [B * HQ, D]): where
    the unit's piece ends (``last``), its normalised output if the piece is the ``whole`` unit,
    else acc and (max, sum) into partial slot ``slot``; then the running state (m, l, acc),
    reset where the piece ended."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(out_ptr + heads[:, None] * D + ds[None, :], out.to(DT), mask=qmask & whole)
    part = slot * G + gs
    split = last & ~whole
    tl.store(acc_ptr + part[:, None] * D + ds[None, :], acc, mask=qmask & split)
    tl.store(ml_ptr + part * 2, m, mask=(gs < G) & split)
    tl.store(ml_ptr + part * 2 + 1, l, mask=(gs < G) & split)
    return (tl.where(last, float("-inf"), m), tl.where(last, 0.0, l),
            tl.where(last, 0.0, acc))


@triton.jit
def attn_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, f0, f1, layer,
                   slot0, scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr,
                   HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                   BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_D: tl.constexpr, STAGES: tl.constexpr):
    """Keys [f0, f1) of the (row, kv head) units laid end to end (unit u = row * HKV + kv head
    holds keys [u * S, (u + 1) * S); f0, f1 and S multiples of CHUNK). Where a unit's piece ends:
    the whole unit -> its normalised output; a part of one -> partial slot slot0, or slot0 + 1
    for the last where the first was a part too."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    ss = tl.arange(0, CHUNK)
    qmask = (gs[:, None] < G) & (ds[None, :] < D)
    c0 = f0 // CHUNK
    c1 = f1 // CHUNK
    first_cut = c0 % NCH != 0               # the first piece is a part (and not the last)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for c in tl.range(c0, c1, num_stages=STAGES):
        u = c // NCH
        row = u // HKV
        kv_head = u % HKV
        start = (c % NCH) * CHUNK
        hi = tl.load(pos_ptr + row) + 1
        heads = row * HQ + kv_head * G + gs                            # [BLOCK_G] of [B * HQ]
        q = tl.load(q_ptr + heads[:, None] * D + ds[None, :], mask=qmask, other=0.0).to(DT)
        k, v = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B, HKV, S, D, BS,
                       CHUNK, BLOCK_D, BS % CHUNK == 0)           # steps start at CHUNK multiples
        m, l, acc = online_step(q, k, v, (start + ss) < hi, m, l, acc, scale, DT)
        last = (c % NCH == NCH - 1) | (c == c1 - 1)                # this unit's piece ends
        whole = (c % NCH == NCH - 1) & (u * NCH >= c0)
        slot = slot0 + ((u != c0 // NCH) & first_cut).to(tl.int32)
        m, l, acc = piece_end(out_ptr, acc_ptr, ml_ptr, heads, slot, m, l, acc, last, whole,
                              qmask, gs, ds, G, D)


@triton.jit
def attn_pair_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, f0, f1,
                        layer, slot0, half, scale: tl.constexpr, B: tl.constexpr,
                        HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                        G: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr):
    """``attn_stream_op`` over (row, pair of kv heads) units (unit u = row * HKV / 2 + p: kv
    heads 2p and 2p + 1, keys [u * S, (u + 1) * S)), both heads' steps side by side in the loop.
    A piece's partial slot (as ``attn_stream_op``'s) is head 2p's; head 2p + 1's is ``half``
    slots later."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    HP: tl.constexpr = HKV // 2
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    ss = tl.arange(0, CHUNK)
    qmask = (gs[:, None] < G) & (ds[None, :] < D)
    c0 = f0 // CHUNK
    c1 = f1 // CHUNK
    first_cut = c0 % NCH != 0
    ma = tl.full([BLOCK_G], float("-inf"), tl.float32)
    mb = tl.full([BLOCK_G], float("-inf"), tl.float32)
    la = tl.zeros([BLOCK_G], tl.float32)
    lb = tl.zeros([BLOCK_G], tl.float32)
    acc_a = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    acc_b = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for c in tl.range(c0, c1, num_stages=STAGES):
        u = c // NCH
        row = u // HP
        kv_head = (u % HP) * 2
        start = (c % NCH) * CHUNK
        hi = tl.load(pos_ptr + row) + 1
        heads = row * HQ + kv_head * G + gs                  # [BLOCK_G] of [B * HQ], head a
        qa = tl.load(q_ptr + heads[:, None] * D + ds[None, :], mask=qmask, other=0.0).to(DT)
        qb = tl.load(q_ptr + (heads + G)[:, None] * D + ds[None, :], mask=qmask,
                     other=0.0).to(DT)
        ka, va = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B, HKV, S, D, BS,
                         CHUNK, BLOCK_D, BS % CHUNK == 0)
        kb, vb = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head + 1, B, HKV, S, D,
                         BS, CHUNK, BLOCK_D, BS % CHUNK == 0)
        valid = (start + ss) < hi
        ma, la, acc_a = online_step(qa, ka, va, valid, ma, la, acc_a, scale, DT)
        mb, lb, acc_b = online_step(qb, kb, vb, valid, mb, lb, acc_b, scale, DT)
        last = (c % NCH == NCH - 1) | (c == c1 - 1)
        whole = (c % NCH == NCH - 1) & (u * NCH >= c0)
        slot = slot0 + ((u != c0 // NCH) & first_cut).to(tl.int32)
        ma, la, acc_a = piece_end(out_ptr, acc_ptr, ml_ptr, heads, slot, ma, la, acc_a, last,
                                  whole, qmask, gs, ds, G, D)
        mb, lb, acc_b = piece_end(out_ptr, acc_ptr, ml_ptr, heads + G, slot + half, mb, lb,
                                  acc_b, last, whole, qmask, gs, ds, G, D)
