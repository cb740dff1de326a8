"""RoPE and the KV cache's slots in the megakernel (``@triton.jit`` pieces of the q/k/v op
bodies of ``ops`` and of attention's loads): a head's rotation rounded as eager's bf16 RoPE
rounds it, its store into q or the cache, and cache addressing through the block table.

The cache is [L, 2, B, Hkv, S, D], addressed through a block table [B, S / BS] of physical
block ids (block p is the (p % (S / BS))-th block of row p // (S / BS) of the static cache);
every entry of a row names a block, so positions need only stay below S to be looked up.
"""
import triton
import triton.language as tl

from .norm_ops import _round


@triton.jit
def cache_block(row, pos, bt_ptr, S: tl.constexpr, BS: tl.constexpr):
    """The block-table entry of ``row``'s position ``pos``: the physical block holding it."""
    NBPR: tl.constexpr = S // BS
    return tl.load(bt_ptr + row * NBPR + pos // BS).to(tl.int64)


@triton.jit
def block_slot(block, pos, layer, kv, head, B: tl.constexpr, HKV: tl.constexpr,
               S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):
    """Element offset of cache[layer, kv, row, head, pos, 0] where ``block`` is the
    ``cache_block`` of that row and position."""
    NBPR: tl.constexpr = S // BS
    phys_row, phys_blk = block // NBPR, block % NBPR
    plane = ((tl.cast(layer, tl.int64) * 2 + kv) * B + phys_row) * HKV + head
    return (plane * S + phys_blk * BS + pos % BS) * D


@triton.jit
def cache_slots(row, pos, bt_ptr, layer, kv, head, B: tl.constexpr, HKV: tl.constexpr,
                S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):
    """Element offset of cache[layer, kv, row, head, pos, 0] through the block table."""
    return block_slot(cache_block(row, pos, bt_ptr, S, BS), pos, layer, kv, head, B, HKV, S, D,
                      BS)


@triton.jit
def rope_inputs(pos_ptr, bt_ptr, inv_ptr, pair, npairs, B: tl.constexpr, D: tl.constexpr,
                S: tl.constexpr, BS: tl.constexpr, BLOCK_B: tl.constexpr):
    """What a head's RoPE and cache store take besides its values: each row's position [BB],
    the block-table entry of its slot [BB] and the frequencies of pairs ``pair`` [HALF] (counted
    over heads; the first ``npairs`` real). Asked for before a q/k/v task's loop, so that these
    dependent loads do not follow it (q/k/v tasks are on each layer's critical path)."""
    rows = tl.arange(0, BLOCK_B)
    pos = tl.load(pos_ptr + rows, mask=rows < B, other=0).to(tl.int32)
    block = cache_block(tl.minimum(rows, B - 1), pos, bt_ptr, S, BS)
    ds = tl.arange(0, pair.shape[0])
    inv = tl.load(inv_ptr + pair % (D // 2), mask=ds < npairs, other=0.0)
    return pos, block, inv


@triton.jit
def norm_rope_store(lo, hi, hn_ptr, inv, pos, block, q_ptr, cache_ptr, kind, head,
                    layer, col, d0, end, qk_eps: tl.constexpr, B: tl.constexpr, D: tl.constexpr,
                    HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, BS: tl.constexpr,
                    HAS_HEAD_NORM: tl.constexpr, BLOCK_B: tl.constexpr, HALF: tl.constexpr,
                    Q_COLS: tl.constexpr):
    """Dims [d0, d0 + end) of each half of a head ([BB, HALF] each, fp32 holding DT values): for
    Q and K the head RMSNorm (whole heads) and RoPE; Q into q [B, Q_COLS] from column col + d0,
    K and V into the cache. ``inv``, ``pos``, ``block``: as ``rope_inputs`` gives them."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    D2: tl.constexpr = D // 2
    rows = tl.arange(0, BLOCK_B)
    ds = tl.arange(0, HALF)
    if kind < 2:
        if HAS_HEAD_NORM:
            hr = tl.math.rsqrt((tl.sum(lo * lo, axis=1) + tl.sum(hi * hi, axis=1)) / D + qk_eps)
            w_lo = tl.load(hn_ptr + ds, mask=ds < D2, other=0.0).to(tl.float32)
            w_hi = tl.load(hn_ptr + D2 + ds, mask=ds < D2, other=0.0).to(tl.float32)
            lo = _round(w_lo[None, :] * _round(lo * hr[:, None], DT), DT)
            hi = _round(w_hi[None, :] * _round(hi * hr[:, None], DT), DT)
        lo, hi = rope(lo, hi, pos, inv, DT)
    mask = (rows[:, None] < B) & (ds[None, :] < end)
    if kind == 0:
        _store_halves(q_ptr, rows[:, None] * Q_COLS + col + d0 + ds[None, :], lo, hi, mask, D2)
    else:
        slot = block_slot(block, pos, layer, kind - 1, head, B, HKV, S, D, BS)
        _store_halves(cache_ptr, slot[:, None] + d0 + ds[None, :], lo, hi, mask, D2)


@triton.jit
def rope(lo, hi, pos, inv, DT: tl.constexpr):
    """Pairs (lo, hi) [BB, HALF] rotated by positions pos [BB] times frequencies inv [HALF],
    each product rounded to DT as eager's bf16 RoPE rounds it."""
    freqs = pos.to(tl.float32)[:, None] * inv[None, :]
    cos, sin = _round(tl.cos(freqs), DT), _round(tl.sin(freqs), DT)
    return (_round(_round(lo * cos, DT) + _round(-hi * sin, DT), DT),
            _round(_round(hi * cos, DT) + _round(lo * sin, DT), DT))


@triton.jit
def cross_rope_store(lo, hi, inv, pos, block, q_ptr, cache_ptr, kind, head, layer, col,
                     d0, end, B: tl.constexpr, D: tl.constexpr, HKV: tl.constexpr,
                     S: tl.constexpr, BS: tl.constexpr, BLOCK_B: tl.constexpr,
                     HALF: tl.constexpr, Q_COLS: tl.constexpr):
    """``norm_rope_store`` without a head norm for pairs d0 + i (i < end) counted from
    ``head``'s first on, each in head + (d0 + i) // (D / 2) at dim (d0 + i) % (D / 2)."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    D2: tl.constexpr = D // 2
    rows = tl.arange(0, BLOCK_B)
    pair = d0 + tl.arange(0, HALF)                                          # [HALF]
    over, dim = pair // D2, pair % D2                   # heads past ``head``, dim in the head
    if kind < 2:
        lo, hi = rope(lo, hi, pos, inv, DT)
    mask = (rows[:, None] < B) & (pair[None, :] < d0 + end)
    if kind == 0:
        offs = rows[:, None] * Q_COLS + col + (over * D + dim)[None, :]
        _store_halves(q_ptr, offs, lo, hi, mask, D2)
    else:
        slot = block_slot(block[:, None], pos[:, None], layer, kind - 1, head + over[None, :], B,
                          HKV, S, D, BS)                                     # [BB, HALF]
        _store_halves(cache_ptr, slot + dim[None, :], lo, hi, mask, D2)


@triton.jit
def _store_halves(ptr, offs, lo, hi, mask, D2: tl.constexpr):
    """A head's dims in two RoPE halves: lo [BB, HALF] at ``offs``, hi D/2 further."""
    DT: tl.constexpr = ptr.dtype.element_ty
    tl.store(ptr + offs, lo.to(DT), mask=mask)
    tl.store(ptr + offs + D2, hi.to(DT), mask=mask)
