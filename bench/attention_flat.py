"""Streamed decode attention (``attention_ops.attn_stream_op``) alone on the GPU, beside the
per-unit body the megakernel's workers otherwise walk, and SDPA.

    python -m megakernel.bench.attention_flat --batch-sizes 17,32,64 --context 1024

The (row, kv head) units' keys are laid end to end and program t takes keys
[t * cut, (t + 1) * cut) (cut: an equal share per SM, whole steps) in one software-pipelined
loop, whatever units they belong to: no pipeline refill at a unit's start, every SM the same
share. Pieces of units cut between programs go to partial slots (``tile_attention.stream_plan``)
and are merged on the host here (by attn_combine tasks in the megakernel). Beside it,
``attn_units`` of ``bench.attention``: one program per SM walking whole units (128-key steps,
as the megakernel's attention tasks). Each checked against SDPA, for every combination of
``--rows`` and ``--stages``.
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from megakernel.bench.attention import attn_pairs, attn_units, sdpa, show_timed
from megakernel.bench.sweep import rel_err
from megakernel.compiler import attention_ops
from megakernel.compiler.registry import KEY_GROUPS, p2
from megakernel.compiler.stream_ops import attn_pair_stream_op
from megakernel.compiler.tile import TileConfig
from megakernel.compiler.tile_attention import (first_slots, rows_spanned, stream_plan,
                                                 stream_shares, unit_slots)
from megakernel.compiler.vm import merge_partials


@triton.jit
def attn_streams(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, cut, total,
                 slot0_ptr, layer, B: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                 S: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr,
                 STEP: tl.constexpr, STAGES: tl.constexpr, BLOCK_G: tl.constexpr,
                 ROWS: tl.constexpr):
    """Program t: the attn_stream task of keys [t * cut, min((t + 1) * cut, total)), the
    query heads of a kv head padded to BLOCK_G rows."""
    t = tl.program_id(0)
    attention_ops.attn_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr,
                                 t * cut, tl.minimum(t * cut + cut, total), layer,
                                 tl.load(slot0_ptr + t), D ** -0.5, B, HQ, HKV, S, D, G, BS,
                                 STEP, BLOCK_G, D, STAGES, ROWS)


@triton.jit
def attn_pair_streams(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, cut, total,
                      slot0_ptr, nslots, layer, B: tl.constexpr, HQ: tl.constexpr,
                      HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                      BS: tl.constexpr, STEP: tl.constexpr, STAGES: tl.constexpr,
                      BLOCK_G: tl.constexpr, ROWS: tl.constexpr, W: tl.constexpr = 1):
    """Program t: the attn_pair_stream task of keys [t * cut, min((t + 1) * cut, total)) of the
    units of a row's pairs of kv heads laid end to end (unfused: cut units left in slots; W >
    1: the keys as the dots' M in W groups)."""
    t = tl.program_id(0)
    attn_pair_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, t * cut,
                        tl.minimum(t * cut + cut, total), layer, tl.load(slot0_ptr + t), nslots,
                        slot0_ptr, 0, 0, 0, 0, 0, D ** -0.5, B, HQ, HKV, S, D, G, BS, STEP,
                        BLOCK_G, D, STAGES, ROWS, False, 1, W)


def merge_slots(out: torch.Tensor, acc: torch.Tensor, ml: torch.Tensor, slots: dict,
                hkv: int, heads: int = 1) -> torch.Tensor:
    """out [B, HQ * D] with each cut unit's output merged from its slots of acc [P, G, D] and
    (max, sum) ml [P, G, 2], as attn_combine does; units of ``heads`` kv heads of a row, head h
    of piece p in slot p + h * P / heads."""
    n, width = acc.shape[0] // heads, acc.shape[1] * acc.shape[2]
    out = out.clone()
    for u, used in slots.items():
        row, unit = divmod(u, hkv // heads)
        for h in range(heads):
            col = (heads * unit + h) * width
            idx = [p + h * n for p in used]
            out[row, col:col + width] = merge_partials(acc[idx], ml[idx]).flatten().to(out.dtype)
    return out


def stream_buffers(q: torch.Tensor, units: int, s: int, cut: int, heads: int, g: int, d: int):
    """The streams of ``units`` units of ``s`` keys cut every ``cut`` keys (``stream_plan``)
    and what they fill, NaN-poisoned: (streams, cut pieces' slots, each stream's first slot,
    slots n, acc [heads * n, g, d], (max, sum) [heads * n, g, 2], out like q)."""
    streams, _, slot_of = stream_plan(units, s, cut)
    slot0 = torch.tensor(first_slots(streams, slot_of), dtype=torch.int32, device=q.device)
    n = max(1, len(slot_of))
    return (streams, slot_of, slot0, n, *(torch.full((heads * n, g, w), float("nan"),
                                                      device=q.device) for w in (d, 2)),
            torch.full_like(q, float("nan")))


def run_flat(q, cache, pos, table, hkv: int, programs: int, step: int, stages: int,
             warps: int = 4, layer: int = 0, rows: int = TileConfig.attn_rows, heads: int = 1,
             groups: int = 1):
    """(launch, outputs): the launch fills NaN-poisoned outputs and slots from layer ``layer``
    of the cache, the query heads of a kv head padded to ``rows`` (at least) as
    ``TileConfig.attn_rows`` pads them; outputs() merges. Units of one kv head
    (``attn_stream_op``) or (``heads`` 2) of a row's pair of kv heads
    (``attn_pair_stream_op``, the keys as its dots' M in ``groups`` groups where above 1)."""
    b, s, d = cache.shape[2], cache.shape[4], cache.shape[5]
    g, units = q.shape[1] // d // hkv, b * hkv // heads
    step, cut = stream_shares(units * s, s, programs, step)
    streams, slot_of, slot0, n, acc, ml, out = stream_buffers(q, units, s, cut, heads, g, d)
    sizes = (b, q.shape[1] // d, hkv, s, d, g, s // table.shape[1], step, stages, p2(g, rows),
             rows_spanned(streams, s, hkv // heads))
    if heads == 1:
        launch = lambda: attn_streams[(len(streams),)](
            q, cache, pos, table, acc, ml, out, cut, units * s, slot0, layer, *sizes,
            num_warps=warps)
    else:
        launch = lambda: attn_pair_streams[(len(streams),)](
            q, cache, pos, table, acc, ml, out, cut, units * s, slot0, n, layer, *sizes, groups,
            num_warps=warps)
    return launch, lambda: merge_slots(out, acc, ml, unit_slots(slot_of), hkv, heads)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="17,32,64")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--rows", default="4,16", help="attention rows (TileConfig.attn_rows) timed")
    p.add_argument("--stages", default="6",
                   help="pipeline stages (TileConfig.attn_stages) timed; the block-table gather "
                        "keeps (stages - 1) // 2 steps in flight: 6 two, 9 four")
    p.add_argument("--pairs", action="store_true",
                   help="also units of a row's pairs of kv heads: whole pairs a program "
                        "(attn_pair_op) beside pair streams (attn_pair_stream_op), each with "
                        "the rows or the keys as its dots' M")
    p.add_argument("--block", type=int, default=16,
                   help="cache block (keys); 128: a step's keys in one block (IN_BLOCK)")
    p.add_argument("--layers", type=int, default=1,
                   help="cache layers, the last one read (the megakernel's cache holds all)")
    args = p.parse_args(argv)
    hq, hkv, d, bs, dev = 32, 8, 64, args.block, "cuda"
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for b in (int(x) for x in args.batch_sizes.split(",")):
        s, units = args.context, b * hkv
        layer = args.layers - 1
        cache = torch.randn(args.layers, 2, b, hkv, s, d, device=dev, dtype=torch.bfloat16)
        q = torch.randn(b, hq * d, device=dev, dtype=torch.bfloat16)
        pos = torch.full((b,), s - 1, device=dev, dtype=torch.int32)
        table = torch.arange(b * s // bs, device=dev, dtype=torch.int32).view(b, s // bs)
        nbytes, ref = cache[layer].numel() * cache.element_size(), sdpa(q, cache[layer:], hkv)
        show = lambda name, ms, err: print(f"B={b:2d} {name:<30} {ms * 1e3:7.1f} us "
                                           f"{nbytes / ms / 1e9:5.2f} TB/s  rel err {err:.1e}")
        show("sdpa", triton.testing.do_bench(lambda: sdpa(q, cache[layer:], hkv)), 0.0)
        for rows, stages in itertools.product(*(map(int, v.split(",")) for v in (
                args.rows, args.stages))):
            block_g, tag = p2(hq // hkv, rows), f"s{stages} ar{rows}"
            out = torch.full_like(q, float("nan"))
            units_run = lambda: attn_units[(min(units, sms),)](
                q, cache, pos, table, out, units, layer, b, hq, hkv, s, d, hq // hkv, bs, 128,
                block_g, stages)
            ms = triton.testing.do_bench(units_run)
            show(f"per unit c128 {tag}", ms, rel_err(out, ref))
            for warps in (4, 8):
                launch, outputs = run_flat(q, cache, pos, table, hkv, sms, 128, stages, warps,
                                           layer, rows)
                ms = triton.testing.do_bench(launch)
                show(f"streams c128 w{warps} {tag}", ms, rel_err(outputs(), ref))
            if args.pairs:
                time_pairs(args, q, cache, pos, table, hkv, sms, stages, rows, ref)


def time_pairs(args, q, cache, pos, table, hkv, sms, stages, rows, ref) -> None:
    """Whole pairs (one program each, at most one per SM) beside pair streams over every SM,
    each with the query rows as the dots' M, or the keys (``km``)."""
    b, s, d = cache.shape[2], cache.shape[4], cache.shape[5]
    g, tag, layer = q.shape[1] // d // hkv, f"s{stages} ar{rows}", args.layers - 1
    nbytes = cache[layer].numel() * cache.element_size()
    for w, form in ((1, ""), (KEY_GROUPS, " km")):
        out = torch.full_like(q, float("nan"))
        run = lambda: attn_pairs[(min(b * hkv // 2, sms),)](
            q, cache[layer:], pos, table, out, b * hkv, b, q.shape[1] // d, hkv, s, d, g,
            s // table.shape[1], 128, p2(g, rows), stages, w)
        show_timed(f"B={b:2d} pairs{form} c128 {tag}", run, nbytes, lambda: rel_err(out, ref))
    for w, form in ((1, ""), (KEY_GROUPS, " km")):
        launch, outputs = run_flat(q, cache, pos, table, hkv, sms, 128, stages, 4, layer, rows,
                                   2, w)
        show_timed(f"B={b:2d} pair streams{form} c128 {tag}", launch, nbytes,
                   lambda: rel_err(outputs(), ref))


if __name__ == "__main__":
    main()
