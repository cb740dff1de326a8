"""Attention steps with the keys as the dots' M (``@triton.jit``; ``TileConfig.attn_keys_m``):
score tiles [keys, query rows] and the output [head dim, query rows], so that a kv head's few
query rows pad the tensor-core N to 8 rather than its M to 16, and each warp's keys are reduced
within the warp: a pair's step in W groups of keys with running states of their own, merged
after the loop (``pair_steps_keys_m``), or a group's heads one a warp (``attention_ops``'s
``attn_group_op``).

Inputs: the cache [L, 2, B, Hkv, S, D] through the block table (``rope_ops.cache_slots``), the
queries transposed [.., BLOCK_D, BLOCK_G]; outputs: per head (max, sum) [BLOCK_G] and acc
[BLOCK_G, BLOCK_D], as ``attention_ops.pair_steps`` returns them. Also the pieces every key
loop shares: the softmax weights as exp2 of the raw scores (``softmax_weights``; the running
max in scaled units) and the split of a loop into steps without masks and one masked step
(``step_counts``, ``full_step``, ``kv_mask``, ``kv_load``).
"""
import triton
import triton.language as tl

from .ops import _dot
from .rope_ops import block_slot, cache_block, cache_slots


@triton.jit
def step_blocks(row, lo, bt_ptr, S: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
                NCHUNK: tl.constexpr):
    """The block-table entries of a task's NCHUNK steps of CHUNK keys from key ``lo`` (each step
    within one cache block), asked for at once before its loop: [NB] (NB >= NCHUNK)."""
    steps = tl.arange(0, triton.next_power_of_2(NCHUNK))
    return cache_block(row, tl.minimum(lo + steps * CHUNK, S - 1), bt_ptr, S, BS)


@triton.jit
def step_block(blocks, c):
    """Step c's entry of ``step_blocks``, taken from registers: the loop's loads then wait on
    no load of the loop, so that its pipeline keeps STAGES - 1 steps in flight (a table entry
    gathered in the loop holds half of them back)."""
    return tl.sum(tl.where(tl.arange(0, blocks.shape[0]) == c, blocks, 0))


@triton.jit
def step_rotation(row, kv_head, HKV: tl.constexpr, NH: tl.constexpr, NCHUNK: tl.constexpr):
    """The step a whole task of NH kv heads from kv_head on starts its key loop at
    (``TileConfig.attn_rotate``): the task's index among the op's, in the tiler's order, modulo
    the steps, so that tasks side by side do not read the same offsets of their heads at once."""
    return ((row * HKV + kv_head) // NH) % NCHUNK


@triton.jit
def step_counts(lo, hi, n, CHUNK: tl.constexpr):
    """Of ``n`` steps of CHUNK keys from key ``lo``, how many hold only keys below ``hi`` (a
    loop without masks takes them) and how many hold any (the rest, at most one, masked; later
    steps would add nothing)."""
    keys = tl.maximum(hi - lo, 0)
    return tl.minimum(keys // CHUNK, n), tl.minimum((keys + CHUNK - 1) // CHUNK, n)


@triton.jit
def full_step(i, rot, n, ROTATE: tl.constexpr):
    """The step the loop over the ``n`` full steps takes at its i-th trip: i, or (ROTATE) i
    from step ``rot`` (< n) on, wrapping around."""
    c = i + rot
    return tl.where(c >= n, c - n, c) if ROTATE else i


@triton.jit
def kv_mask(live, dims, MASKED: tl.constexpr, PADDED: tl.constexpr):
    """The mask of a load of keys or values: keys below the row's length (``live``) and real
    head dims (``dims``), broadcast together; not MASKED (every key live): the dims alone where
    the head dim is PADDED, else None (no mask)."""
    both = live & dims
    if MASKED:
        mask = both
    elif PADDED:
        mask = tl.broadcast_to(dims, both.shape)
    else:
        mask = None
    return mask


@triton.jit
def kv_load(ptr, mask):
    """A load of keys or values: masked (others 0) where ``mask`` is given, else plain."""
    if mask is None:
        x = tl.load(ptr)
    else:
        x = tl.load(ptr, mask=mask, other=0.0)
    return x


@triton.jit
def empty_states(NH: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                 T: tl.constexpr = False, KEYS: tl.constexpr = 1):
    """The running max [NH, BLOCK_G], sum [NH, BLOCK_G] and unnormalised acc [NH, BLOCK_G,
    BLOCK_D] of NH heads or key groups before any key; T: as ``online_keys_m`` holds them, the
    acc transposed [NH, BLOCK_D, BLOCK_G] and the sum per key of a step, [NH, KEYS, BLOCK_G]."""
    shape: tl.constexpr = [NH, BLOCK_D, BLOCK_G] if T else [NH, BLOCK_G, BLOCK_D]
    sums: tl.constexpr = [NH, KEYS, BLOCK_G] if T else [NH, BLOCK_G]
    return (tl.full([NH, BLOCK_G], float("-inf"), tl.float32), tl.zeros(sums, tl.float32),
            tl.zeros(shape, tl.float32))


@triton.jit
def load_kv_groups(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B: tl.constexpr,
                   HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                   CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, W: tl.constexpr,
                   IN_BLOCK: tl.constexpr, block, MASKED: tl.constexpr = True):
    """``load_kv``'s step in W groups of CW = CHUNK // W keys (key w * CW + j of the step is
    group w's j-th), for ``online_keys_m``: keys [W, CW, BLOCK_D] and values transposed,
    [W, BLOCK_D, CW] (each group's dot takes them as its left operand). IN_BLOCK: the step
    lies in cache block ``block`` (``step_block``); not MASKED: every key is below ``hi``."""
    CW: tl.constexpr = CHUNK // W
    ss = start + tl.arange(0, W)[:, None] * CW + tl.arange(0, CW)[None, :]       # [W, CW]
    ds = tl.arange(0, BLOCK_D)
    if IN_BLOCK:
        key = block_slot(block, start, layer, 0, kv_head, B, HKV, S, D, BS) + (ss - start) * D
    else:
        key = cache_slots(row, tl.minimum(ss, S - 1), bt_ptr, layer, 0, kv_head, B, HKV, S, D,
                          BS)
    v_shift = B * HKV * S * D                     # from the K plane to the V plane
    live = ss < hi
    k = kv_load(cache_ptr + key[:, :, None] + ds[None, None, :],           # [W, CW, BLOCK_D]
                kv_mask(live[:, :, None], ds[None, None, :] < D, MASKED, BLOCK_D != D))
    vt = kv_load(cache_ptr + v_shift + key[:, None, :] + ds[None, :, None],  # [W, BLOCK_D, CW]
                 kv_mask(live[:, None, :], ds[None, :, None] < D, MASKED, BLOCK_D != D))
    return k, vt


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def softmax_weights(raw, m, scale, AXIS: tl.constexpr):
    """A step's unscaled scores ``raw`` (masked keys -inf) against the running max m (scaled
    scores) of the keys before it -> the new max, the factor alpha that rescales the earlier
    sum and acc, and the step's weights p (the shape of raw), each p as one fused multiply-add
    and one exp2 of the raw score (not a scale, a subtraction, a log2(e) and an exp)."""
    m_new = tl.maximum(m, tl.max(raw, axis=AXIS) * scale)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)         # no key yet: adds nothing
    alpha = tl.exp2((m - m_ref) * LOG2E)
    p = tl.exp2(raw * (scale * LOG2E) - tl.expand_dims(m_ref * LOG2E, AXIS))
    return m_new, alpha, p


@triton.jit
def online_keys_m(qt, k, vt, valid, m, l, acc_t, scale, DT: tl.constexpr,
                  MASKED: tl.constexpr = True):
    """``online_step`` over a step's keys in W groups (``load_kv_groups``: k [W, CW, BLOCK_D],
    vt [W, BLOCK_D, CW], valid [W, CW]), each with its own running max m [W, BLOCK_G], sum
    l and acc, the sum kept per key, l [W, CW, BLOCK_G] (the adds of a step's weights run
    within each thread, the reduction over keys once after the loop), and the acc held
    transposed: acc_t [W, BLOCK_D, BLOCK_G]; qt [W, BLOCK_D,
    BLOCK_G] the queries transposed (and broadcast, or a group's own). Batches of W dots spread
    over the warps, so that no reduction over keys crosses a warp, with the keys (and the head
    dim) as their M and the few query rows as N (padded to 8): half the tensor-core steps and
    about half the elementwise work of query rows as M (padded to 16). ``merge_groups`` merges
    a step's groups after the loop. Not MASKED: every key is valid (``valid`` unused)."""
    zeros = tl.zeros([k.shape[0], k.shape[1], qt.shape[2]], tl.float32)
    scores = _dot(k.to(DT), qt, zeros, DT)                                # [W, CW, BG]
    if MASKED:
        scores = tl.where(valid[:, :, None], scores, float("-inf"))
    m_new, alpha, p = softmax_weights(scores, m, scale, 1)
    return (m_new, l * alpha[:, None, :] + p,
            _dot(vt.to(DT), p.to(DT), acc_t * alpha[:, None, :], DT))


@triton.jit
def merge_groups(m, l, acc_t):
    """``online_keys_m``'s W groups, m [W, BG], per-key sums l [W, CW, BG] and acc_t [W, BD,
    BG] -> one max and sum [BG] and acc [BG, BD]."""
    m_all = tl.max(m, axis=0)
    w = tl.exp(m - tl.where(m_all == float("-inf"), 0.0, m_all)[None, :])     # [W, BG]
    return (m_all, tl.sum(tl.sum(l, axis=1) * w, axis=0),
            tl.trans(tl.sum(acc_t * w[:, None, :], axis=0)))


@triton.jit
def pair_steps_keys_m(qa, qb, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, scale,
                     B: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                     BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_D: tl.constexpr, STAGES: tl.constexpr, IN_BLOCK: tl.constexpr,
                     NCHUNK: tl.constexpr, W: tl.constexpr, ROTATE: tl.constexpr, rot,
                     steps=0, PIECE: tl.constexpr = False):
    """``pair_steps`` with the keys as the dots' M, each step's keys in W groups
    (``online_keys_m``); ROTATE: from step ``rot`` on, wrapping around (``step_rotation``).
    PIECE: ``steps`` steps from key ``lo`` (a unit's piece, at most NCHUNK), not NCHUNK. The
    steps whose keys all lie below ``hi`` run first, pipelined and without masks (rotated
    among themselves), then the one that holds the last keys below hi (``step_counts``)."""
    CW: tl.constexpr = CHUNK // W
    ss = tl.arange(0, W)[:, None] * CW + tl.arange(0, CW)[None, :]               # [W, CW]
    qa3 = tl.broadcast_to(tl.trans(qa)[None, :, :], (W, BLOCK_D, BLOCK_G))
    qb3 = tl.broadcast_to(tl.trans(qb)[None, :, :], (W, BLOCK_D, BLOCK_G))
    ma, la, acc_a = empty_states(W, BLOCK_G, BLOCK_D, True, CW)
    mb, lb, acc_b = empty_states(W, BLOCK_G, BLOCK_D, True, CW)
    blocks = step_blocks(row, lo, bt_ptr, S, BS, CHUNK, NCHUNK) if IN_BLOCK else None
    n_full, n_any = step_counts(lo, hi, steps if PIECE else NCHUNK, CHUNK)
    rot = rot % tl.maximum(n_full, 1)
    for i in tl.range(0, n_full, num_stages=STAGES):          # no key masked: no masks
        c = full_step(i, rot, n_full, ROTATE)
        ma, la, acc_a, mb, lb, acc_b = pair_step_keys_m(
            qa3, qb3, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, c, blocks, ss, ma, la,
            acc_a, mb, lb, acc_b, scale, B, HKV, S, D, BS, CHUNK, BLOCK_D, IN_BLOCK, W, False)
    for c in tl.range(n_full, n_any, num_stages=2):           # the last keys below hi
        ma, la, acc_a, mb, lb, acc_b = pair_step_keys_m(
            qa3, qb3, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, c, blocks, ss, ma, la,
            acc_a, mb, lb, acc_b, scale, B, HKV, S, D, BS, CHUNK, BLOCK_D, IN_BLOCK, W, True)
    ma, la, acc_a = merge_groups(ma, la, acc_a)
    mb, lb, acc_b = merge_groups(mb, lb, acc_b)
    return ma, la, acc_a, mb, lb, acc_b


@triton.jit
def pair_step_keys_m(qa3, qb3, cache_ptr, bt_ptr, row, kv_head, layer, lo, hi, c, blocks, ss,
                     ma, la, acc_a, mb, lb, acc_b, scale, B: tl.constexpr, HKV: tl.constexpr,
                     S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
                     BLOCK_D: tl.constexpr, IN_BLOCK: tl.constexpr, W: tl.constexpr,
                     MASKED: tl.constexpr):
    """``pair_steps_keys_m``'s step ``c`` (keys from lo + c * CHUNK; ss [W, CW] the keys'
    offsets in it) of kv heads kv_head and kv_head + 1 into both heads' running states; not
    MASKED: every key is below ``hi``."""
    start = lo + c * CHUNK
    block = step_block(blocks, c) if IN_BLOCK else None
    ka, va = load_kv_groups(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B, HKV, S, D,
                            BS, CHUNK, BLOCK_D, W, IN_BLOCK, block, MASKED)
    kb, vb = load_kv_groups(cache_ptr, bt_ptr, row, start, hi, layer, kv_head + 1, B, HKV, S,
                            D, BS, CHUNK, BLOCK_D, W, IN_BLOCK, block, MASKED)
    valid = start + ss < hi
    ma, la, acc_a = online_keys_m(qa3, ka, va, valid, ma, la, acc_a, scale, qa3.dtype, MASKED)
    mb, lb, acc_b = online_keys_m(qb3, kb, vb, valid, mb, lb, acc_b, scale, qb3.dtype, MASKED)
    return ma, la, acc_a, mb, lb, acc_b
