"""The attention op body alone on the GPU, against torch's scaled_dot_product_attention on the
same cache: where the decode attention's time goes without the rest of the megakernel.

    python -m megakernel.bench.attention --batch-size 64 --context 1024

Each (row, kv head) unit's whole span is one ``attn_partial_op`` call (DIRECT: its output
normalised), either one program per unit on an ordinary grid (several programs per SM hide each
other's latencies) or, ``persistent``, one program per SM walking the units in turn as a
megakernel worker does, a kv head's query heads padded as the megakernel pads them
(``TileConfig.attn_rows``). Prints ms and TB/s of keys and values read per configuration
(warps, keys per step, pipeline stages), and checks each output against SDPA's (relative norm of
the difference). ``--loads``: the same loop's loads alone (``kv_loads``), through the block
table (an address per key as the body computes them, or per cache block) and at plain offsets:
what the loads cost without the attention's arithmetic. ``--pairs``: two units per loop
(``attn_pairs``), one unit's arithmetic beside the other's loads; ``--groups 4``: four units
(kv heads of one row) per loop as batched dots (``attn_group_op``). With ``--block`` a multiple
of the keys per step, each step reads one block-table entry (``load_kv``'s IN_BLOCK).
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from megakernel.bench.sweep import rel_err
from megakernel.compiler import attention_group_ops, attention_ops
from megakernel.compiler.rope_ops import cache_slots
from megakernel.compiler.registry import p2
from megakernel.compiler.tile import TileConfig


@triton.jit
def attn_units(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, units, layer, B: tl.constexpr,
               HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
               G: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
               STAGES: tl.constexpr):
    """Units pid, pid + programs, ... (unit u: row u // HKV, kv head u % HKV), all S keys each."""
    u = tl.program_id(0)
    while u < units:
        attention_ops.attn_partial_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, out_ptr, out_ptr,
                                      u // HKV, u % HKV, 0, 0, S, layer, out_ptr, 0, 0, 0, 1,
                                      D ** -0.5, B,
                                      HQ, HKV, S, D, G, S, BS, CHUNK, BLOCK_G, D, STAGES, True,
                                      0, BS % CHUNK == 0)
        u += tl.num_programs(0)


@triton.jit
def attn_pairs(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, units, B: tl.constexpr,
               HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
               G: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
               STAGES: tl.constexpr, W: tl.constexpr = 1):
    """``attn_units`` two units at a time (kv heads h and h + 1 of one row, HKV even) through
    ``attn_pair_op``: each step loads both units' keys and values and runs both online steps,
    so that one unit's arithmetic can overlap the other's loads."""
    pair = tl.program_id(0)
    while pair < units // 2:
        attention_ops.attn_pair_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, (2 * pair) // HKV,
                                   (2 * pair) % HKV, 0, D ** -0.5, B, HQ, HKV, S, D, G, BS,
                                   CHUNK, BLOCK_G, D, STAGES, BS % CHUNK == 0, W)
        pair += tl.num_programs(0)


@triton.jit
def attn_groups(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, units, B: tl.constexpr,
                HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                G: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                STAGES: tl.constexpr, NH: tl.constexpr, KEYS_M: tl.constexpr = False):
    """``attn_units`` NH units at a time (kv heads h .. h + NH - 1 of one row, HKV a multiple
    of NH) through ``attn_group_op`` (KEYS_M: the keys as its dots' M)."""
    group = tl.program_id(0)
    while group < units // NH:
        attention_group_ops.attn_group_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr,
                                    (NH * group) // HKV, (NH * group) % HKV, 0, D ** -0.5, B, HQ,
                                    HKV, S, D, G, BS, CHUNK, BLOCK_G, D, STAGES,
                                    BS % CHUNK == 0, NH, KEYS_M)
        group += tl.num_programs(0)


@triton.jit
def load_kv_blocks(cache_ptr, bt_ptr, row, start, hi, head, B: tl.constexpr, HKV: tl.constexpr,
                   S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr):
    """``attention_ops.load_kv``'s keys and values [CHUNK, D] of layer 0 with one block-table
    entry and one address per cache block of BS keys (start a multiple of BS), the keys of a
    block at constant offsets from it (a block of whole steps: ``load_kv``'s IN_BLOCK)."""
    if BS >= CHUNK:
        return attention_ops.load_kv(cache_ptr, bt_ptr, row, start, hi, 0, head, B, HKV, S, D,
                                     BS, CHUNK, D, True)
    NB: tl.constexpr = CHUNK // BS
    first = tl.minimum(start + tl.arange(0, NB) * BS, hi - 1)             # [NB] a key of each
    base = cache_slots(row, first, bt_ptr, 0, 0, head, B, HKV, S, D, BS) - (first % BS) * D
    ks = tl.arange(0, BS)
    ds = tl.arange(0, D)
    offs = base[:, None, None] + (ks * D)[None, :, None] + ds[None, None, :]     # [NB, BS, D]
    mask = ((start + tl.arange(0, NB) * BS)[:, None] + ks[None, :] < hi)[:, :, None]
    k = tl.load(cache_ptr + offs, mask=mask, other=0.0)
    v = tl.load(cache_ptr + offs + B * HKV * S * D, mask=mask, other=0.0)
    return tl.reshape(k, [CHUNK, D]), tl.reshape(v, [CHUNK, D])


@triton.jit
def kv_loads(cache_ptr, pos_ptr, bt_ptr, out_ptr, units, B: tl.constexpr, HKV: tl.constexpr,
             S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
             STAGES: tl.constexpr, TABLE: tl.constexpr):
    """The attention loop's loads alone, units walked as ``attn_units`` walks them: each unit's
    keys plus values summed -> out [units, D] fp32 (so that no load is dropped); TABLE 1:
    through the block table as ``attn_partial_op`` reads them (an entry and an address per key),
    2: through it by whole blocks (``load_kv_blocks``), 0: at their plain offsets (the cache
    rows in order, as an identity table lays them)."""
    u = tl.program_id(0)
    ss = tl.arange(0, CHUNK)
    ds = tl.arange(0, D)
    while u < units:
        row, head = u // HKV, u % HKV
        hi = tl.load(pos_ptr + row) + 1
        acc = tl.zeros([CHUNK, D], tl.float32)
        for c in tl.range(0, S // CHUNK, num_stages=STAGES):
            if TABLE == 2:
                k, v = load_kv_blocks(cache_ptr, bt_ptr, row, c * CHUNK, hi, head, B, HKV, S, D,
                                      BS, CHUNK)
            elif TABLE == 1:
                k, v = attention_ops.load_kv(cache_ptr, bt_ptr, row, c * CHUNK, hi, 0, head, B,
                                             HKV, S, D, BS, CHUNK, D, BS % CHUNK == 0)
            else:
                keys = c * CHUNK + ss
                offs = ((row * HKV + head) * S + keys)[:, None] * D + ds[None, :]
                k = tl.load(cache_ptr + offs, mask=(keys < hi)[:, None], other=0.0)
                v = tl.load(cache_ptr + offs + B * HKV * S * D, mask=(keys < hi)[:, None],
                            other=0.0)
            acc += k.to(tl.float32) + v.to(tl.float32)
        tl.store(out_ptr + u * D + ds, tl.sum(acc, axis=0))
        u += tl.num_programs(0)


@triton.jit
def tma_kv(desc, bt_ptr, row, start, hi, head, B: tl.constexpr,
           HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
           CHUNK: tl.constexpr):
    """Keys and values [CHUNK, D] of layer 0 at positions [start, start + CHUNK) (one cache
    block holds them) as two tensor-descriptor (TMA) loads of the cache's rows; the values of
    positions >= hi zeroed (what lies there is not a key)."""
    first = cache_slots(row, tl.minimum(start, hi - 1), bt_ptr, 0, 0, head, B, HKV, S, D, BS)
    r = (first // D).to(tl.int32)
    k = desc.load([r, 0])
    v = desc.load([r + B * HKV * S, 0])
    valid = (start + tl.arange(0, CHUNK)) < hi
    return k, tl.where(valid[:, None], v, 0.0)


@triton.jit
def attn_units_tma(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, units, B: tl.constexpr,
                   HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                   G: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
                   BLOCK_G: tl.constexpr, STAGES: tl.constexpr, NH: tl.constexpr):
    """``attn_units`` (NH 1) or ``attn_pairs`` (NH 2) with the keys and values loaded through a
    tensor descriptor over the cache's [2 * B * HKV * S, D] rows (``tma_kv``; BS a multiple of
    CHUNK), the descriptor made once per program."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    desc = tl.make_tensor_descriptor(cache_ptr, shape=[2 * B * HKV * S, D], strides=[D, 1],
                                     block_shape=[CHUNK, D])
    gs = tl.arange(0, BLOCK_G)
    ds = tl.arange(0, D)
    ss = tl.arange(0, CHUNK)
    qmask = (gs[:, None] < G) & (ds[None, :] < D)
    scale: tl.constexpr = D ** -0.5
    u = tl.program_id(0) * NH
    while u < units:
        row, head = u // HKV, u % HKV
        hi = tl.load(pos_ptr + row).to(tl.int32) + 1
        offs = (row * HQ + head * G + gs)[:, None] * D + ds[None, :]
        qa = tl.load(q_ptr + offs, mask=qmask, other=0.0)
        ma = tl.full([BLOCK_G], float("-inf"), tl.float32)
        la = tl.zeros([BLOCK_G], tl.float32)
        acc_a = tl.zeros([BLOCK_G, D], tl.float32)
        if NH == 2:
            qb = tl.load(q_ptr + offs + G * D, mask=qmask, other=0.0)
            mb = tl.full([BLOCK_G], float("-inf"), tl.float32)
            lb = tl.zeros([BLOCK_G], tl.float32)
            acc_b = tl.zeros([BLOCK_G, D], tl.float32)
        for c in tl.range(0, S // CHUNK, num_stages=STAGES):
            start = c * CHUNK
            valid = start + ss < hi
            ka, va = tma_kv(desc, bt_ptr, row, start, hi, head, B, HKV, S, D, BS,
                            CHUNK)
            ma, la, acc_a = attention_ops.online_step(qa, ka, va, valid, ma, la, acc_a, scale,
                                                      DT)
            if NH == 2:
                kb, vb = tma_kv(desc, bt_ptr, row, start, hi, head + 1, B, HKV, S,
                                D, BS, CHUNK)
                mb, lb, acc_b = attention_ops.online_step(qb, kb, vb, valid, mb, lb, acc_b,
                                                          scale, DT)
        tl.store(out_ptr + offs, (acc_a / tl.where(la == 0.0, 1.0, la)[:, None]).to(DT),
                 mask=qmask)
        if NH == 2:
            tl.store(out_ptr + offs + G * D,
                     (acc_b / tl.where(lb == 0.0, 1.0, lb)[:, None]).to(DT), mask=qmask)
        u += tl.num_programs(0) * NH


def sdpa(q: torch.Tensor, cache: torch.Tensor, hkv: int) -> torch.Tensor:
    """q [B, HQ * D], cache [1, 2, B, HKV, S, D] -> [B, HQ * D] by SDPA with grouped heads."""
    b, s, d = cache.shape[2], cache.shape[4], cache.shape[5]
    qh = q.view(b, -1, 1, d)                                                 # [B, HQ, 1, D]
    out = torch.nn.functional.scaled_dot_product_attention(qh, cache[0, 0], cache[0, 1],
                                                           enable_gqa=True)
    return out.reshape(b, -1)


def show_timed(name: str, run, nbytes: int, check) -> None:
    """Print ``name``, the us of ``run`` and the TB/s of its ``nbytes``, and ``check()`` (a
    relative error); a build that fails (shared memory beyond the SM's) is reported instead."""
    try:
        ms = triton.testing.do_bench(run)
    except Exception as err:
        print(f"{name}: {type(err).__name__}")
        return
    print(f"{name} {ms * 1e3:8.1f} us  {nbytes / ms / 1e9:5.2f} TB/s  rel err {check():.1e}")


def time_loads(cache, pos, table, bs, sms, persistent, warps, chunks, stages) -> None:
    """``kv_loads`` at each setting, through the block table by keys and by blocks and at plain
    offsets, against PyTorch's sum of the keys and values."""
    _, _, b, hkv, s, d = cache.shape
    units, nbytes = b * hkv, cache.numel() * cache.element_size()
    ref = (cache[0, 0].float() + cache[0, 1].float()).sum(2).view(units, d)     # [units, D]
    for per, w, chunk, st, use_table in itertools.product(persistent, warps, chunks, stages,
                                                          (1, 2, 0)):
        out = torch.full((units, d), float("nan"), device=cache.device)
        grid = (min(units, sms) if per else units,)
        run = lambda: kv_loads[grid](cache, pos, table, out, units, b, hkv, s, d, bs, chunk, st,
                                     use_table, num_warps=w)
        show_timed(f"loads table={use_table} persistent={per:d} warps={w} chunk={chunk:3d} "
                   f"stages={st}", run, nbytes, lambda: rel_err(out, ref))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block", type=int, default=16, help="cache block (tokens)")
    p.add_argument("--warps", default="4,8")
    p.add_argument("--chunks", default="64,128,256", help="keys per step")
    p.add_argument("--stages", default="3,6")
    p.add_argument("--persistent", default="0,1", help="0: a program per unit; 1: per SM")
    p.add_argument("--pairs", action="store_true",
                   help="also time two units per loop (attn_pairs)")
    p.add_argument("--groups", default="",
                   help="also time N units per loop as batched dots (attn_group_op), e.g. 4")
    p.add_argument("--loads", action="store_true",
                   help="also time the loop's loads alone (kv_loads): by key, by block, plain")
    p.add_argument("--tma", action="store_true",
                   help="also time the bodies with keys and values through a tensor descriptor "
                        "(attn_units_tma, one program per SM; --block a multiple of the step)")
    args = p.parse_args(argv)
    b, s, d, hq, hkv, bs = (args.batch_size, args.context, args.head_dim, args.heads,
                            args.kv_heads, args.block)
    dev, g = "cuda", hq // hkv
    cache = torch.randn(1, 2, b, hkv, s, d, device=dev, dtype=torch.bfloat16)
    q = torch.randn(b, hq * d, device=dev, dtype=torch.bfloat16)
    pos = torch.full((b,), s - 1, device=dev, dtype=torch.int32)
    table = torch.arange(b * s // bs, device=dev, dtype=torch.int32).view(b, s // bs)
    nbytes = cache.numel() * cache.element_size()
    ref = sdpa(q, cache, hkv)
    ms = triton.testing.do_bench(lambda: sdpa(q, cache, hkv))
    print(f"B={b} S={s} sdpa {ms * 1e3:8.1f} us  {nbytes / ms / 1e9:5.2f} TB/s")
    units, sms = b * hkv, torch.cuda.get_device_properties(dev).multi_processor_count
    ints = lambda text: [int(x) for x in text.split(",")]
    if args.loads:
        time_loads(cache, pos, table, bs, sms, ints(args.persistent), ints(args.warps),
                   ints(args.chunks), ints(args.stages))
    per_loop = [1] + [2] * args.pairs + (ints(args.groups) if args.groups else [])
    for persistent, warps, chunk, stages, n in itertools.product(
            ints(args.persistent), ints(args.warps), ints(args.chunks), ints(args.stages),
            per_loop):
        out = torch.full_like(q, float("nan"))
        grid = (min(units // n, sms) if persistent else units // n,)
        body, extra, tail = {1: (attn_units, (0,), ()), 2: (attn_pairs, (), ())}.get(
            n, (attn_groups, (), (n,)))
        run = lambda: body[grid](q, cache, pos, table, out, units, *extra, b, hq, hkv, s, d, g,
                                 bs, chunk, p2(g, TileConfig.attn_rows), stages, *tail,
                                 num_warps=warps)
        name = {1: "", 2: "pairs "}.get(n, f"groups of {n} ")
        show_timed(f"{name}persistent={persistent:d} warps={warps} chunk={chunk:3d} "
                   f"stages={stages}", run, nbytes, lambda: rel_err(out, ref))
        if args.tma and persistent and n <= 2 and bs % chunk == 0:
            triton.set_allocator(lambda size, align, stream: torch.empty(
                size, dtype=torch.int8, device=dev))
            run = lambda: attn_units_tma[grid](q, cache, pos, table, out, units, b, hq, hkv, s, d,
                                               g, bs, chunk, p2(g, TileConfig.attn_rows), stages,
                                               n, num_warps=warps)
            out.fill_(float("nan"))
            show_timed(f"tma {name}persistent=1 warps={warps} chunk={chunk:3d} "
                       f"stages={stages}", run, nbytes, lambda: rel_err(out, ref))


if __name__ == "__main__":
    main()
