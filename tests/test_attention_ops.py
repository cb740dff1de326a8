"""The attention op bodies on their own: partials over key ranges of unequal length (as balanced
attention cuts them, some reaching past the sequence), merged by the combine over the slots
used, against PyTorch in fp32. On the CPU through the Triton interpreter (on a GPU, on the GPU)."""
import pytest
import torch
import triton
import triton.language as tl

from megakernel.compiler import attention_group_ops, attention_ops, stream_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
B, HQ, HKV, S, D, BS = 2, 4, 2, 64, 16, 16
G = HQ // HKV


@triton.jit
def pieces_kernel(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, los_ptr,
                  spans_ptr, ticket_ptr, row, kv_head, layer, count, B: tl.constexpr,
                  HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                  G: tl.constexpr, SLOTS: tl.constexpr, KV_SPLIT: tl.constexpr, BS: tl.constexpr,
                  IN_BLOCK: tl.constexpr, FUSED: tl.constexpr):
    """The pieces, then their combine (FUSED: the last piece merges them, ticket 0 at epoch 1)."""
    for s in range(count):
        attention_ops.attn_partial_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr,
                                      row, kv_head, s, tl.load(los_ptr + s),
                                      tl.load(spans_ptr + s), layer, ticket_ptr, 1, 0, 0, count,
                                      D ** -0.5, B, HQ, HKV, S, D, G, KV_SPLIT, BS, 16, G, D, 2,
                                      False, 0, IN_BLOCK, FUSED, SLOTS)
    if not FUSED:
        tl.debug_barrier()
        attention_ops.attn_combine_op(acc_ptr, ml_ptr, out_ptr, row, kv_head, 0, count, HQ, D,
                                      G, G, SLOTS, D)


UNEQUAL = [(0, 20), (20, 16), (36, 28)]            # (lo, span); the last past seq_len 30
BLOCKS = [(0, 32), (32, 16), (48, 16)]             # at multiples of a 16- or 32-key block


@pytest.mark.parametrize("seq_len,shuffled,ranges,bs,fused", [
    (50, False, UNEQUAL, BS, False), (30, False, UNEQUAL, BS, False),
    (50, True, UNEQUAL, BS, False), (30, True, UNEQUAL, BS, False),
    (50, True, BLOCKS, 16, False), (30, True, BLOCKS, 32, False), (64, True, BLOCKS, 32, False),
    (50, True, UNEQUAL, BS, True), (30, True, BLOCKS, 32, True)])
def test_partials_over_unequal_ranges_combine_to_attention(seq_len, shuffled, ranges, bs, fused):
    """shuffled: the rows' blocks at random places of the cache, through the block table.
    Ranges at block multiples read one table entry per 16-key step (IN_BLOCK). fused: the last
    piece to take the ticket merges (and the ticket counts every piece)."""
    gen = torch.Generator().manual_seed(seq_len)
    row, kv_head = 1, 1
    q = torch.randn(B, HQ * D, generator=gen)
    cache = torch.randn(1, 2, B, HKV, S, D, generator=gen)
    positions = torch.full((B,), seq_len - 1, dtype=torch.int32)
    order = torch.randperm(B * S // bs, generator=gen) if shuffled else torch.arange(B * S // bs)
    table = order.to(torch.int32).view(B, S // bs)                          # physical blocks
    acc = torch.full((4, G, D), float("nan"))                                # slot 3 never used
    ml = torch.full((4, G, 2), float("nan"))
    out = torch.full((B, HQ * D), float("nan"))
    los, spans = (torch.tensor(v, dtype=torch.int32) for v in zip(*ranges))
    ticket = torch.zeros(1, dtype=torch.int32)
    args = [t.to(DEVICE) for t in (q, cache, positions, table, acc, ml, out, los, spans, ticket)]
    pieces_kernel[(1,)](*args, row, kv_head, 0, len(ranges), B, HQ, HKV, S, D, G, 4, 32, bs,
                        ranges is BLOCKS, fused)
    assert args[9].item() == (len(ranges) if fused else 0)
    heads = slice(kv_head * G * D, (kv_head + 1) * G * D)
    qh = q[row, heads].view(G, D)                                            # [G, D]
    blocks = cache[0].view(2, B, HKV, S // bs, bs, D).permute(1, 3, 0, 2, 4, 5) \
        .reshape(B * S // bs, 2, HKV, bs, D)                       # [block, 2, Hkv, BS, D]
    logical = blocks[table[row].long()].permute(1, 2, 0, 3, 4).reshape(2, HKV, S, D)
    k, v = logical[0, kv_head, :seq_len], logical[1, kv_head, :seq_len]
    ref = torch.softmax(qh @ k.T * D ** -0.5, -1) @ v                        # [G, D]
    torch.testing.assert_close(args[6].cpu()[row, heads].view(G, D), ref, atol=1e-5, rtol=1e-5)


def test_attention_probe_matches_sdpa():
    """``bench/attention.py``'s kernel (each unit's whole span through attn_partial_op, programs
    walking the units in turn) against SDPA with grouped heads."""
    from megakernel.bench.attention import attn_units, sdpa

    gen = torch.Generator().manual_seed(5)
    cache = torch.randn(1, 2, B, HKV, S, D, generator=gen)
    q = torch.randn(B, HQ * D, generator=gen)
    positions = torch.full((B,), S - 1, dtype=torch.int32)
    table = torch.arange(B * S // BS, dtype=torch.int32).view(B, S // BS)
    out = torch.full_like(q, float("nan"))
    args = [t.to(DEVICE) for t in (q, cache, positions, table, out)]
    attn_units[(3,)](*args, B * HKV, 0, B, HQ, HKV, S, D, G, BS, 16, 16, 2)
    torch.testing.assert_close(args[4].cpu(), sdpa(q, cache, HKV), atol=1e-5, rtol=1e-5)


@triton.jit
def pair_kernel(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, B: tl.constexpr, HQ: tl.constexpr,
                HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                BS: tl.constexpr, CHUNK: tl.constexpr, IN_BLOCK: tl.constexpr,
                W: tl.constexpr, ROTATE: tl.constexpr = False):
    for row in range(B):
        for h in range(0, HKV, 2):
            attention_ops.attn_pair_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, row, h, 1,
                                       D ** -0.5, B, HQ, HKV, S, D, G, BS, CHUNK, G, D, 2,
                                       IN_BLOCK, W, ROTATE)


def paged_inputs(seed: int, bs: int, layers: int, lengths: list[int], hq=HQ, hkv=HKV, s=S):
    """q [B, hq * D], a cache [layers, 2, B, hkv, s, D], positions and a shuffled block table
    of ``bs``-key blocks."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, hq * D, generator=gen)
    cache = torch.randn(layers, 2, B, hkv, s, D, generator=gen)
    positions = torch.tensor(lengths, dtype=torch.int32) - 1
    table = torch.randperm(B * s // bs, generator=gen).to(torch.int32).view(B, s // bs)
    return q, cache, positions, table


def paged_sdpa(q, layer_cache, table, bs: int, lengths: list[int]) -> torch.Tensor:
    """SDPA of each row over its first ``lengths[r]`` keys, read through the block table from
    layer_cache [2, B, Hkv, S, D] (the physical blocks)."""
    from megakernel.bench.attention import sdpa

    hkv, s = layer_cache.shape[2], layer_cache.shape[3]
    blocks = layer_cache.view(2, B, hkv, s // bs, bs, D).permute(1, 3, 0, 2, 4, 5) \
        .reshape(B * s // bs, 2, hkv, bs, D)                       # [block, 2, Hkv, BS, D]
    logical = blocks[table.long()].permute(2, 0, 3, 1, 4, 5).reshape(1, 2, B, hkv, s, D)
    return torch.cat([sdpa(q[r:r + 1], logical[:, :, r:r + 1, :, :lengths[r]], hkv)
                      for r in range(B)])


@pytest.mark.parametrize("bs,chunk,in_block,w,rotate", [
    (16, 32, False, 1, False), (16, 16, True, 1, False), (32, 16, True, 1, False),
    (16, 32, False, 2, False), (32, 32, True, 2, False), (16, 16, True, 1, True),
    (16, 16, False, 1, True), (32, 32, True, 2, True), (32, 64, False, 4, False),
    (16, 32, False, 2, True)])
def test_pair_op_matches_attention(bs, chunk, in_block, w, rotate):
    """``attn_pair_op``: each row's two kv heads over its keys in one loop (each step's keys in
    ``w`` groups with running states of their own; ``rotate``: from the task's own step on,
    wrapping around its full steps), rows of unequal length (full steps and a masked last one,
    or that one alone), the second layer of a cache read through a shuffled block table,
    against SDPA."""
    # rotated: 4 kv heads, so that tasks 1-3 (row 0's second pair, row 1's) start at later
    # steps (row 0: 43 keys, 1 or 2 full steps and a masked one; row 1: 13 keys, the masked one)
    lengths, hq, hkv = ([S - 21, 13], 4 * G, 4) if rotate else ([S - 21, S], HQ, HKV)
    q, cache, positions, table = paged_inputs(bs + chunk, bs, 2, lengths, hq, hkv)
    out = torch.full_like(q, float("nan"))
    args = [t.to(DEVICE) for t in (q, cache, positions, table, out)]
    pair_kernel[(1,)](*args, B, hq, hkv, S, D, G, bs, chunk, in_block, w, rotate)
    torch.testing.assert_close(args[4].cpu(), paged_sdpa(q, cache[1], table, bs, lengths),
                               atol=1e-5, rtol=1e-5)


@triton.jit
def group_kernel(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, B: tl.constexpr, HQ: tl.constexpr,
                 HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                 BS: tl.constexpr, CHUNK: tl.constexpr, IN_BLOCK: tl.constexpr,
                 NH: tl.constexpr, KEYS_M: tl.constexpr, ROTATE: tl.constexpr = False):
    for row in range(B):
        for h in range(0, HKV, NH):
            attention_group_ops.attn_group_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, row, h, 1,
                                        D ** -0.5, B, HQ, HKV, S, D, G, BS, CHUNK, 4, D, 2,
                                        IN_BLOCK, NH, KEYS_M, ROTATE)


@pytest.mark.parametrize("nh,hkv,bs,chunk,in_block,keys_m,rotate", [
    (4, 4, 16, 32, False, False, False), (4, 8, 16, 16, True, False, False),
    (2, 4, 32, 16, True, False, False), (4, 4, 16, 32, False, True, False),
    (4, 8, 16, 16, True, True, False), (4, 8, 16, 16, True, True, True),
    (2, 4, 32, 16, True, False, True)])
def test_group_op_matches_attention(nh, hkv, bs, chunk, in_block, keys_m, rotate):
    """``attn_group_op``: each row's kv heads in groups of ``nh`` (G = 3 query heads each,
    padded to 4 rows) as batched dots in one loop (or with the keys as their M; ``rotate``:
    from the task's own step on, wrapping around), rows of unequal length, the second layer of
    a cache read through a shuffled block table, against SDPA."""
    lengths, hq = [S - 21, 13] if rotate else [S - 21, S], 3 * hkv
    q, cache, positions, table = paged_inputs(bs + chunk, bs, 2, lengths, hq, hkv)
    out = torch.full_like(q, float("nan"))
    args = [t.to(DEVICE) for t in (q, cache, positions, table, out)]
    group_kernel[(1,)](*args, B, hq, hkv, S, D, 3, bs, chunk, in_block, nh, keys_m, rotate)
    torch.testing.assert_close(args[4].cpu(), paged_sdpa(q, cache[1], table, bs, lengths),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bs", [16, 32])
def test_paired_attention_probe_matches_sdpa(bs):
    """``bench/attention.py``'s two units per loop (kv heads h, h + 1 of a row side by side),
    rows of unequal length through a shuffled block table, against SDPA."""
    from megakernel.bench.attention import attn_pairs

    lengths = [S, S - 21]
    q, cache, positions, table = paged_inputs(bs, bs, 1, lengths)
    out = torch.full_like(q, float("nan"))
    args = [t.to(DEVICE) for t in (q, cache, positions, table, out)]
    attn_pairs[(1,)](*args, B * HKV, B, HQ, HKV, S, D, G, bs, 16, 16, 2)
    torch.testing.assert_close(args[4].cpu(), paged_sdpa(q, cache[0], table, bs, lengths),
                               atol=1e-5, rtol=1e-5)


def test_grouped_attention_probe_matches_sdpa():
    """``bench/attention.py``'s four units per loop (kv heads h .. h + 3 of a row as batched
    dots), rows of unequal length through a shuffled block table, against SDPA."""
    from megakernel.bench.attention import attn_groups

    lengths, hkv = [S, S - 21], 4
    q, cache, positions, table = paged_inputs(5, BS, 1, lengths, 2 * hkv, hkv)
    out = torch.full_like(q, float("nan"))
    args = [t.to(DEVICE) for t in (q, cache, positions, table, out)]
    attn_groups[(1,)](*args, B * hkv, B, 2 * hkv, hkv, S, D, 2, BS, 16, 4, 2, 4)
    torch.testing.assert_close(args[4].cpu(), paged_sdpa(q, cache[0], table, BS, lengths),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_table,chunk,bs", [(1, 32, BS), (1, 16, BS), (2, 32, BS), (2, 16, 32),
                                               (0, 32, BS)])
def test_attention_loads_probe_sums_the_keys_and_values(use_table, chunk, bs):
    """``bench/attention.py``'s loads alone: each unit's keys plus values summed over its
    length, through a shuffled block table by keys or by blocks (or at plain offsets), against
    PyTorch; steps of a whole block (16 keys) read one table entry each, and by blocks steps
    within a block (16 keys of 32) too."""
    from megakernel.bench.attention import kv_loads

    gen = torch.Generator().manual_seed(7)
    cache = torch.randn(1, 2, B, HKV, S, D, generator=gen)
    lengths = [S, S - 21]
    positions = torch.tensor(lengths, dtype=torch.int32) - 1
    order = torch.randperm(B * S // bs, generator=gen) if use_table else torch.arange(B * S // bs)
    table = order.to(torch.int32).view(B, S // bs)
    out = torch.full((B * HKV, D), float("nan"))
    args = [t.to(DEVICE) for t in (cache, positions, table, out)]
    kv_loads[(3,)](*args, B * HKV, B, HKV, S, D, bs, chunk, 2, use_table)
    blocks = cache[0].view(2, B, HKV, S // bs, bs, D).permute(1, 3, 0, 2, 4, 5) \
        .reshape(B * S // bs, 2, HKV, bs, D)                       # [block, 2, Hkv, BS, D]
    ref = torch.stack([blocks[table[r].long()].permute(1, 2, 0, 3, 4).reshape(2, HKV, S, D)
                       [:, :, :lengths[r]].sum((0, 2)) for r in range(B)]).view(B * HKV, D)
    torch.testing.assert_close(args[3].cpu(), ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("heads,groups,step", [(1, 1, 16), (2, 1, 16), (2, 2, 32)])
def test_flat_attention_probe_matches_sdpa(heads, groups, step):
    """``bench/attention_flat.py``: units' keys laid end to end, each program an equal share in
    one loop (3 programs of 96 keys over 4 units of 64: pieces of two units in one program; or
    of 48 keys over 2 units of a row's kv head pair), pieces merged
    on the host; rows of shorter sequences too (and 4 query rows); the second layer of the
    cache; pairs with the keys as the dots' M in ``groups`` groups (steps of ``step`` keys)."""
    from megakernel.bench import attention_flat
    from megakernel.bench.attention import sdpa

    gen = torch.Generator().manual_seed(6)
    cache = torch.randn(2, 2, B, HKV, S, D, generator=gen)
    q = torch.randn(B, HQ * D, generator=gen)
    table = torch.arange(B * S // BS, dtype=torch.int32).view(B, S // BS)
    for lengths, rows in (([S] * B, 16), ([S - 5 - 7 * r for r in range(B)], 4)):
        positions = torch.tensor(lengths, dtype=torch.int32) - 1
        args = [t.to(DEVICE) for t in (q, cache, positions, table)]
        launch, outputs = attention_flat.run_flat(*args, HKV, programs=3, step=step, stages=2,
                                                  layer=1, rows=rows, heads=heads, groups=groups)
        launch()
        ref = torch.cat([sdpa(q[r:r + 1], cache[1:, :, r:r + 1, :, :lengths[r]], HKV)
                         for r in range(B)])
        torch.testing.assert_close(outputs().cpu(), ref, atol=1e-5, rtol=1e-5)


@triton.jit
def streams_kernel(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, f_ptr, slot0_ptr,
                   nstreams, merge_ptr, nmerge, layer, B: tl.constexpr, HQ: tl.constexpr,
                   HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                   BS: tl.constexpr, STEP: tl.constexpr, ROWS: tl.constexpr):
    for i in range(nstreams):
        attention_ops.attn_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr,
                                     tl.load(f_ptr + i), tl.load(f_ptr + i + 1), layer,
                                     tl.load(slot0_ptr + i), D ** -0.5, B, HQ, HKV, S, D, G, BS,
                                     STEP, G, D, 2, ROWS)
    tl.debug_barrier()
    for j in range(nmerge):                    # (unit, first slot, count) of each cut unit
        u = tl.load(merge_ptr + 3 * j)
        attention_ops.attn_combine_op(acc_ptr, ml_ptr, out_ptr, u // HKV, u % HKV,
                                      tl.load(merge_ptr + 3 * j + 1),
                                      tl.load(merge_ptr + 3 * j + 2), HQ, D, G, G, 4, D)


@pytest.mark.parametrize("cut,picked", [(16, True), (48, True), (80, True), (80, False)])
def test_streams_across_units_merge_to_attention(cut, picked):
    """The units' keys end to end, cut every ``cut`` keys: units in four pieces (16), streams
    holding pieces of two units (48), whole units too (80, streams over both rows); rows of
    unequal length through a shuffled block table. Pieces go to slots in stream order, a cut
    unit's slots merged by the combine. Each step's row length ``picked`` from the two loaded
    before the loop (ROWS as spanned), or loaded at each step (ROWS 3)."""
    from megakernel.compiler.tile_attention import (first_slots, rows_spanned, stream_plan,
                                                    unit_slots)

    lengths = [50, 64]
    q, cache, positions, table = paged_inputs(cut, BS, 1, lengths)
    streams, _, slot_of = stream_plan(B * HKV, S, cut)
    edges, slot0 = [f0 for f0, _ in streams] + [B * HKV * S], first_slots(streams, slot_of)
    merge = [[u, used[0], len(used)] for u, used in unit_slots(slot_of).items()]
    n = len(slot_of)
    acc, ml = torch.full((n, G, D), float("nan")), torch.full((n, G, 2), float("nan"))
    out = torch.full((B, HQ * D), float("nan"))
    args = [t.to(DEVICE) for t in (q, cache, positions, table, acc, ml, out,
                                   torch.tensor(edges, dtype=torch.int32),
                                   torch.tensor(slot0, dtype=torch.int32))]
    streams_kernel[(1,)](*args, len(edges) - 1, torch.tensor(merge, dtype=torch.int32).to(DEVICE),
                         len(merge), 0, B, HQ, HKV, S, D, G, BS, 16,
                         rows_spanned(streams, S, HKV) if picked else 3)
    torch.testing.assert_close(args[6].cpu(), paged_sdpa(q, cache[0], table, BS, lengths),
                               atol=1e-5, rtol=1e-5)


@triton.jit
def group_streams_kernel(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, f_ptr,
                         slot0_ptr, merge_ptr, tickets_ptr, nstreams, nslots, nmerge, layer,
                         B: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr,
                         D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr, STEP: tl.constexpr,
                         NH: tl.constexpr, CHAINS: tl.constexpr, FUSED: tl.constexpr,
                         REVERSE: tl.constexpr, ROWS: tl.constexpr, W: tl.constexpr = 1,
                         STACK: tl.constexpr = 0, STEPS: tl.constexpr = 0):
    """The streams (REVERSE: the last first; FUSED: stream i's ticket words at merge_ptr + 4 i,
    each cut unit merged by its last piece, tickets at epoch 1), then (not FUSED) the combine
    of each cut unit (row, first kv head, first slot, count at merge_ptr + 4 j). W > 1: the
    keys as the dots' M (pairs' steps in W groups, a group's heads one a group). STACK: pairs
    with their units' queries stacked (STEPS steps a stream at most)."""
    for k in range(nstreams):
        i = nstreams - 1 - k if REVERSE else k
        f0, f1, slot0 = tl.load(f_ptr + i), tl.load(f_ptr + i + 1), tl.load(slot0_ptr + i)
        w = merge_ptr + 4 * i
        ticket, first, count_a, count_b = (tl.load(w), tl.load(w + 1), tl.load(w + 2),
                                           tl.load(w + 3))
        if CHAINS:                                       # pairs as two chains
            stream_ops.attn_pair_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr,
                                           out_ptr, f0, f1, layer, slot0, nslots, tickets_ptr, 1,
                                           ticket, first, count_a, count_b, D ** -0.5, B, HQ,
                                           HKV, S, D, G, BS, STEP, G, D, 2, ROWS, FUSED, 4, W,
                                           STACK, STEPS)
        else:
            stream_ops.attn_group_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr,
                                            out_ptr, f0, f1, layer, slot0, nslots, tickets_ptr,
                                            1, ticket, first, count_a, count_b, D ** -0.5, B, HQ,
                                            HKV, S, D, G, BS, STEP, G, D, 2, ROWS, NH, FUSED,
                                            4, W > 1)
    if not FUSED:
        tl.debug_barrier()
        for j in range(nmerge):
            w = merge_ptr + 4 * j
            stream_ops.attn_group_combine_op(acc_ptr, ml_ptr, out_ptr, tl.load(w),
                                             tl.load(w + 1), tl.load(w + 2), tl.load(w + 3),
                                             nslots, HQ, D, G, G, 4, D, NH)


@pytest.mark.parametrize("nh,hkv,cut,chains,fused,s,reverse", [
    (2, 2, 16, True, False, S, False), (2, 2, 48, True, False, S, False),
    (2, 4, 80, True, False, S, False), (2, 2, 48, False, False, S, False),
    (4, 4, 48, False, False, S, False), (2, 2, 16, True, True, S, False),
    (2, 4, 48, True, True, 80, False), (2, 4, 48, True, True, 80, True),
    (4, 4, 48, False, True, 80, True), (2, 4, 208, True, False, S, False)])
def test_grouped_streams_merge_to_attention(nh, hkv, cut, chains, fused, s, reverse, w=1,
                                            bs=BS, stack=False):
    """Streams over units of ``nh`` kv heads of a row, laid end to end and cut every ``cut``
    keys (units in pieces, streams holding pieces of two units, whole units too), rows of
    unequal length through a shuffled block table, the second layer of the cache; head h of a
    cut piece in slot p + h * (pieces), a cut unit's heads merged by its group combine, or
    (``fused``) by the last of its pieces to take its ticket (units of ``s`` = 80 keys cut
    every 48: of two and of three pieces, a stream's two cut units unlike; streams in
    ``reverse``, so that a unit's first piece merges it). Pairs as two chains (``chains``; cut
    every 208 keys, a stream over three whole units and a piece of a fourth) or as a batch of
    two score tiles. ``w`` > 1: pairs' keys as the dots' M in ``w`` groups (steps of 16 w keys,
    in ``bs``-key blocks). ``stack``: pairs with their units' queries stacked as the dots'
    rows (``stacked_stream``)."""
    from megakernel.compiler.tile_attention import (first_slots, merge_args, rows_spanned,
                                                    stream_plan, unit_slots)

    lengths, hq = [50, 64], hkv * G
    q, cache, positions, table = paged_inputs(cut + nh, bs, 2, lengths, hq=hq, hkv=hkv, s=s)
    streams, pieces, slot_of = stream_plan(B * hkv // nh, s, cut)
    edges, slot0 = [f0 for f0, _ in streams] + [B * hkv // nh * s], first_slots(streams, slot_of)
    n, slots = len(slot_of), unit_slots(slot_of)
    if fused:                   # each stream's ticket words (merge_args), tickets from 0
        tickets = {u: k for k, u in enumerate(slots)}
        words = [merge_args(cuts, slots, tickets, slot0[i], 4, lambda u: None) if cuts else {}
                 for i, ps in enumerate(pieces)
                 for cuts in [[u for u, _, _ in ps if (i, u) in slot_of]]]
        merge = [[w.get(k, 0) for k in ("ticket", "first", "count_a", "count_b")] for w in words]
    else:
        merge = [[u // (hkv // nh), u % (hkv // nh) * nh, used[0], len(used)]
                 for u, used in slots.items()]
    acc, ml = torch.full((n * nh, G, D), float("nan")), torch.full((n * nh, G, 2), float("nan"))
    out = torch.full((B, hq * D), float("nan"))
    args = [t.to(DEVICE) for t in (q, cache, positions, table, acc, ml, out,
                                   torch.tensor(edges, dtype=torch.int32),
                                   torch.tensor(slot0, dtype=torch.int32),
                                   torch.tensor(merge, dtype=torch.int32),
                                   torch.zeros(len(slots) + 1, dtype=torch.int32))]
    group_streams_kernel[(1,)](*args, len(edges) - 1, n, len(merge), 1, B, hq, hkv, s, D, G, bs,
                               16 * w, nh, chains, fused, reverse,
                               rows_spanned(streams, s, hkv // nh), w,
                               max(map(len, pieces)) if stack else 0,
                               max(f1 - f0 for f0, f1 in streams) // (16 * w))
    torch.testing.assert_close(args[6].cpu(), paged_sdpa(q, cache[1], table, bs, lengths),
                               atol=1e-5, rtol=1e-5)
    if fused:                   # every cut unit's ticket taken by each of its pieces
        assert args[10][:len(slots)].tolist() == [len(used) for used in slots.values()]


@pytest.mark.parametrize("hkv,cut,fused,s,reverse,w,bs", [
    (2, 32, False, S, False, 2, 32), (4, 96, False, S, False, 2, 32),
    (4, 64, True, 96, False, 2, 16), (4, 64, True, 96, True, 2, 32),
    (4, 448, False, 128, False, 4, 64), (4, 192, True, 128, True, 4, 128)])
def test_pair_streams_with_keys_as_m_merge_to_attention(hkv, cut, fused, s, reverse, w, bs):
    """Pair streams with the keys as the dots' M in ``w`` groups (steps of 16 w keys), a loop
    a unit's piece: cut units, streams over two rows and over three whole units, steps in
    single cache blocks (their entries asked for before the loop) or not (``bs`` 16), fused
    merges."""
    test_grouped_streams_merge_to_attention(2, hkv, cut, True, fused, s, reverse, w, bs)


@pytest.mark.parametrize("cut,fused,s,reverse,bs", [
    (96, False, S, False, 32), (32, True, 96, True, 16), (160, False, 96, False, 32)])
def test_group_streams_with_keys_as_m_merge_to_attention(cut, fused, s, reverse, bs):
    """Streams over groups of 4 kv heads with the keys as the dots' M (a head a group, steps
    of 32 keys), a loop a unit's piece: cut units, fused merges, whole units between pieces."""
    test_grouped_streams_merge_to_attention(4, 4, cut, False, fused, s, reverse, 2, bs)


@pytest.mark.parametrize("hkv,cut,fused,s,reverse,bs,w", [
    (2, 16, False, S, False, 16, 1), (2, 48, False, S, False, 16, 1),
    (4, 80, False, S, False, 32, 1), (2, 16, True, S, False, 16, 1),
    (4, 48, True, 80, False, 16, 1), (4, 48, True, 80, True, 16, 1), (2, 48, True, S, True, 32, 1),
    (4, 208, False, S, False, 8, 1), (2, 32, False, S, False, 32, 2),
    (4, 96, False, S, False, 32, 2), (4, 96, True, S, True, 32, 2),
    (4, 448, False, 128, False, 64, 4), (4, 64, True, 96, False, 16, 2)])
def test_stacked_pair_streams_merge_to_attention(hkv, cut, fused, s, reverse, bs, w):
    """Pair streams with their units' queries stacked as the dots' rows: units in four pieces,
    streams over pieces of two units and over two rows, three whole units and a piece of a
    fourth, fused merges from either end; steps in single cache blocks (their entries asked
    for before the loop) or across two (``bs`` 8 or 16 with 32-key steps: through the table
    key by key); ``w`` > 1: the keys as the dots' M in ``w`` groups (steps of 16 w keys), the
    stacked rows as N."""
    test_grouped_streams_merge_to_attention(2, hkv, cut, True, fused, s, reverse, w, bs, True)
