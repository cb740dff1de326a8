"""The cache lines the KV prefetch a task ahead asks for (``kv_prefetch.ahead_slots`` then
``rope_ops.block_slot``, as ``prefetch_ahead`` addresses them) are the keys and values the
attention task reads first: row ``row``'s positions lo, lo + 1, ... through a shuffled block
table, whatever the row's length. On the CPU through the Triton interpreter."""
import pytest
import torch
import triton
import triton.language as tl

from megakernel.compiler import kv_prefetch, rope_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
L, B, HKV, S, D, BS = 2, 3, 2, 64, 16, 16


@triton.jit
def ahead_kernel(bt_ptr, out_ptr, row, kv_head, lo, n, layer, B: tl.constexpr,
                 HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                 AHEAD: tl.constexpr):
    ss, block = kv_prefetch.ahead_slots(bt_ptr, row, lo, n, S, BS, AHEAD)
    key = rope_ops.block_slot(block, ss, layer, 0, kv_head, B, HKV, S, D, BS)
    tl.store(out_ptr + tl.arange(0, AHEAD), key)


@pytest.mark.parametrize("row,kv_head,lo,n,layer,ahead", [
    (0, 0, 0, 16, 0, 16), (2, 1, 0, 32, 1, 32), (1, 1, 48, 32, 1, 32), (1, 0, 16, 5, 0, 8)])
def test_ahead_slots_name_the_first_keys_and_values_a_task_reads(row, kv_head, lo, n, layer,
                                                                ahead):
    gen = torch.Generator().manual_seed(row * 7 + lo)
    cache = torch.randn(L, 2, B, HKV, S, D, generator=gen)
    table = torch.randperm(B * S // BS, generator=gen).to(torch.int32).view(B, S // BS)
    out = torch.full((ahead,), -1, dtype=torch.int64, device=DEVICE)
    ahead_kernel[(1,)](table.to(DEVICE), out, row, kv_head, lo, n, layer, B, HKV, S, D, BS,
                       ahead)
    # the logical cache: block j of row r is physical block table[r, j]
    blocks = cache.view(L, 2, B, HKV, S // BS, BS, D).permute(0, 1, 3, 2, 4, 5, 6) \
        .reshape(L, 2, HKV, B * S // BS, BS, D)                   # [L, 2, Hkv, block, BS, D]
    flat, v_shift = cache.flatten(), B * HKV * S * D
    for i, o in enumerate(out.cpu().tolist()):
        pos = (lo + min(i, n - 1)) % S
        block = table[row, pos // BS].item()
        for kv, shift in ((0, 0), (1, v_shift)):
            want = blocks[layer, kv, kv_head, block, pos % BS]
            assert torch.equal(flat[o + shift:o + shift + D], want), (i, kv)
