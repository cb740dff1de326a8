"""Attention over groups of a row's kv heads as batched dots (``@triton.jit``): the keys and
values of NH heads at once (``load_kv_heads``), one online-softmax step of NH heads
(``group_step``), and a whole group over all its keys as one tile task (``attn_group_op``);
streams over such groups: ``stream_ops``.

Inputs as ``attention_ops``'s: q [B, HQ * D], the cache [L, 2, B, Hkv, S, D] through the block
table, the rows' positions; output the normalised attention [B, HQ * D].
"""
import triton
import triton.language as tl

from .attention_keys_m import (empty_states, full_step, kv_load, kv_mask, online_keys_m,
                               softmax_weights, step_block, step_blocks, step_counts,
                               step_rotation)
from .ops import _dot
from .rope_ops import block_slot, cache_slots


@triton.jit
def load_kv_heads(cache_ptr, bt_ptr, row, start, hi, layer, heads, B: tl.constexpr,
                  HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                  CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, IN_BLOCK: tl.constexpr,
                  V_T: tl.constexpr = False, block=None, MASKED: tl.constexpr = True):
    """``attention_ops.load_kv`` of the kv heads ``heads`` [NH] of one row at once: keys and
    values [NH, CHUNK, BLOCK_D] (V_T: values transposed, [NH, BLOCK_D, CHUNK]; ``block``: the
    step's cache block where IN_BLOCK, ``attention_keys_m.step_block``, else one gathered
    here); not MASKED: every key is below ``hi``."""
    ss = start + tl.arange(0, CHUNK)
    ds = tl.arange(0, BLOCK_D)
    if IN_BLOCK and block is not None:
        first = block_slot(block, start, layer, 0, heads, B, HKV, S, D, BS)            # [NH]
        key = first[:, None] + tl.arange(0, CHUNK)[None, :] * D                  # [NH, CHUNK]
    elif IN_BLOCK:
        first = cache_slots(row, tl.minimum(start, S - 1), bt_ptr, layer, 0, heads, B, HKV, S,
                            D, BS)                                                   # [NH]
        key = first[:, None] + tl.arange(0, CHUNK)[None, :] * D                  # [NH, CHUNK]
    else:
        key = cache_slots(row, tl.minimum(ss, S - 1)[None, :], bt_ptr, layer, 0,
                          heads[:, None], B, HKV, S, D, BS)                      # [NH, CHUNK]
    offs = key[:, :, None] + ds[None, None, :]                         # [NH, CHUNK, BLOCK_D]
    live = ss < hi
    mask = kv_mask(live[None, :, None], ds[None, None, :] < D, MASKED, BLOCK_D != D)
    v_shift = B * HKV * S * D
    if V_T:
        v = kv_load(cache_ptr + v_shift + key[:, None, :] + ds[None, :, None],
                    kv_mask(live[None, None, :], ds[None, :, None] < D, MASKED, BLOCK_D != D))
    else:
        v = kv_load(cache_ptr + offs + v_shift, mask)
    return kv_load(cache_ptr + offs, mask), v


@triton.jit
def attn_group_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, row, kv_head, layer,
                  scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                  S: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr,
                  CHUNK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                  STAGES: tl.constexpr, IN_BLOCK: tl.constexpr, NH: tl.constexpr,
                  KEYS_M: tl.constexpr = False, ROTATE: tl.constexpr = False):
    """``attention_ops.attn_pair_op`` for NH kv heads kv_head .. kv_head + NH - 1 of row
    ``row``: their steps as one batch of NH [BLOCK_G, CHUNK] score tiles (batched dots) in one
    pipelined loop -> their normalised outputs in out [B, HQ * D]. KEYS_M: the tiles
    transposed, the keys as the dots' M (``online_keys_m``, a head a group; queries and acc
    [NH, BLOCK_D, BLOCK_G]). ROTATE: the keys from the task's own step on, wrapping around
    (``attention_keys_m.step_rotation``)."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    hi = tl.load(pos_ptr + row).to(tl.int32) + 1
    hs = tl.arange(0, NH)
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, BLOCK_D)
    ss = tl.arange(0, CHUNK)
    heads = row * HQ + (kv_head + hs[:, None]) * G + gs[None, :]        # [NH, BLOCK_G] of B * HQ
    if KEYS_M:                  # queries and output transposed
        offs = heads[:, None, :] * D + ds[None, :, None]                # [NH, BLOCK_D, BLOCK_G]
        qmask = (gs[None, None, :] < G) & (ds[None, :, None] < D)
    else:
        offs = heads[:, :, None] * D + ds[None, None, :]                # [NH, BLOCK_G, BLOCK_D]
        qmask = (gs[None, :, None] < G) & (ds[None, None, :] < D)
    q = tl.load(q_ptr + offs, mask=qmask, other=0.0).to(DT)
    NCHUNK: tl.constexpr = (S + CHUNK - 1) // CHUNK
    rot = step_rotation(row, kv_head, HKV, NH, NCHUNK) if ROTATE else 0
    m, l, acc = group_steps(q, cache_ptr, bt_ptr, row, kv_head, layer, 0, hi, scale, B, HKV, S,
                            D, BS, CHUNK, BLOCK_G, BLOCK_D, STAGES, IN_BLOCK, NH, KEYS_M, NCHUNK,
                            ROTATE, rot)
    if KEYS_M:
        out = acc / tl.where(l == 0.0, 1.0, l)[:, None, :]
    else:
        out = acc / tl.where(l == 0.0, 1.0, l)[:, :, None]
    tl.store(out_ptr + offs, out.to(DT), mask=qmask)


@triton.jit
def group_steps(q, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, scale, B: tl.constexpr,
                HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                STAGES: tl.constexpr, IN_BLOCK: tl.constexpr, NH: tl.constexpr,
                KEYS_M: tl.constexpr, NCHUNK: tl.constexpr, ROTATE: tl.constexpr, rot,
                steps=0, PIECE: tl.constexpr = False):
    """``attn_group_op``'s loop: NCHUNK steps of CHUNK keys from key ``lo`` (PIECE: ``steps``
    of them, a unit's piece) of NH kv heads from kv_head of row ``row``, those below hi (the
    steps with every key below it unmasked, then the last one masked) -> their running max
    and sum [NH, BLOCK_G] and unnormalised acc (KEYS_M: transposed, [NH, BLOCK_D, BLOCK_G],
    else [NH, BLOCK_G, BLOCK_D]) of queries q as ``attn_group_op`` loads them; ROTATE: the
    full steps from step ``rot`` on, wrapping around."""
    m, l, acc = empty_states(NH, BLOCK_G, BLOCK_D, KEYS_M, CHUNK)
    HOISTED: tl.constexpr = KEYS_M and IN_BLOCK              # the steps' entries asked for first
    blocks = step_blocks(row, lo, bt_ptr, S, BS, CHUNK, NCHUNK) if HOISTED else None
    n_full, n_any = step_counts(lo, hi, steps if PIECE else NCHUNK, CHUNK)
    rot = rot % tl.maximum(n_full, 1)
    for i in tl.range(0, n_full, num_stages=STAGES):          # no key masked: no masks
        m, l, acc = group_step_at(q, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi,
                                  full_step(i, rot, n_full, ROTATE), blocks, m, l, acc, scale, B,
                                  HKV, S, D, BS, CHUNK, BLOCK_D, IN_BLOCK, NH, KEYS_M, False)
    for c in tl.range(n_full, n_any, num_stages=2):           # the last keys below hi
        m, l, acc = group_step_at(q, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, c, blocks,
                                  m, l, acc, scale, B, HKV, S, D, BS, CHUNK, BLOCK_D, IN_BLOCK,
                                  NH, KEYS_M, True)
    if KEYS_M:              # the per-key sums of online_keys_m
        l = tl.sum(l, axis=1)
    return m, l, acc


@triton.jit
def group_step_at(q, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, c, blocks, m, l, acc,
                  scale, B: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                  BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
                  IN_BLOCK: tl.constexpr, NH: tl.constexpr, KEYS_M: tl.constexpr,
                  MASKED: tl.constexpr):
    """``group_steps``'s step ``c`` (keys from lo + c * CHUNK) of NH kv heads from kv_head into
    their running states (``blocks``: the steps' table entries, or None); not MASKED: every
    key is below ``hi``."""
    start = lo + c * CHUNK
    k, v = load_kv_heads(cache_ptr, bt_ptr, row, start, hi, layer, kv_head + tl.arange(0, NH),
                         B, HKV, S, D, BS, CHUNK, BLOCK_D, IN_BLOCK, KEYS_M,
                         None if blocks is None else step_block(blocks, c), MASKED)
    valid = start + tl.arange(0, CHUNK) < hi
    if KEYS_M:              # a head a group of online_keys_m
        m, l, acc = online_keys_m(q, k, v, tl.broadcast_to(valid[None, :], (NH, CHUNK)), m, l,
                                  acc, scale, q.dtype, MASKED)
    else:
        m, l, acc = group_step(q, k, v, valid, m, l, acc, scale, q.dtype, MASKED)
    return m, l, acc


@triton.jit
def group_step(q, k, v, valid, m, l, acc, scale, DT: tl.constexpr,
               MASKED: tl.constexpr = True):
    """``attention_ops.online_step`` of NH heads at once: keys and values [NH, CHUNK,
    BLOCK_D] (``valid`` [CHUNK]; not MASKED: all keys) into m, l [NH, BLOCK_G] and acc [NH,
    BLOCK_G, BLOCK_D] of queries q [NH, BLOCK_G, BLOCK_D], as one batch of score tiles."""
    scores = _dot(q, tl.permute(k.to(DT), (0, 2, 1)),
                  tl.zeros([q.shape[0], q.shape[1], k.shape[1]], tl.float32), DT)
    if MASKED:
        scores = tl.where(valid[None, None, :], scores, float("-inf"))
    m_new, alpha, p = softmax_weights(scores, m, scale, 2)
    return m_new, l * alpha + tl.sum(p, axis=2), _dot(p.to(DT), v.to(DT),
                                                      acc * alpha[:, :, None], DT)
