"""Decode attention as one flat stream per program, against the per-unit body, alone on the GPU.

    python -m megakernel.bench.attention_flat --batch-sizes 17,32,64 --context 1024

The (row, kv head) units' keys are laid end to end and program t takes keys
[t * cut, (t + 1) * cut) (cut: an equal share per SM, whole steps), one software-pipelined loop
over its steps whatever units they belong to: no pipeline refill at a unit's start, every SM the
same share. At the last step of a unit's piece the running (max, sum, acc) go to slot u + t
(unique: along the stream u and t never both stay) and start again; the pieces of a unit are
merged on the host here (an attn_combine in the megakernel). Beside it, ``attn_units`` of
``bench.attention`` with one program per SM walking whole units, as the megakernel's workers do
(its settings: 128-key steps, 6 stages, G heads unpadded). Both checked against SDPA.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from megakernel.bench.attention import attn_units, sdpa
from megakernel.bench.sweep import rel_err
from megakernel.compiler.attention_ops import load_kv


@triton.jit
def attn_flat(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, units, cut, layer,
              B: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr,
              D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
              STAGES: tl.constexpr):
    """Program t: steps of CHUNK keys from t * cut on -> acc [slots, G, D] and
    (max, sum) [slots, G, 2] of each unit piece, in slot u + t."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    NCH: tl.constexpr = S // CHUNK
    t = tl.program_id(0)
    c0 = t * (cut // CHUNK)
    c1 = tl.minimum(c0 + cut // CHUNK, units * NCH)
    gs, ds, ss = tl.arange(0, G), tl.arange(0, D), tl.arange(0, CHUNK)
    m = tl.full([G], float("-inf"), tl.float32)
    l = tl.zeros([G], tl.float32)
    acc = tl.zeros([G, D], tl.float32)
    for c in tl.range(c0, c1, num_stages=STAGES):
        u = c // NCH
        row, kv_head, start = u // HKV, u % HKV, (c % NCH) * CHUNK
        hi = tl.load(pos_ptr + row) + 1
        q = tl.load(q_ptr + row * (HQ * D) + (kv_head * G + gs)[:, None] * D + ds[None, :])
        k, v = load_kv(cache_ptr, bt_ptr, row, start, hi, layer, kv_head, B, HKV, S, D, BS, CHUNK,
                       D)                                                    # [CHUNK, D] each
        scores = tl.dot(q, tl.trans(k)) * (D ** -0.5)                        # [G, CHUNK]
        scores = tl.where((start + ss < hi)[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_ref)
        p = tl.exp(scores - m_ref[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(DT), v, acc * alpha[:, None])
        m = m_new
        last = (c % NCH == NCH - 1) | (c == c1 - 1)                 # this unit's piece ends
        part = (u + t) * G + gs
        tl.store(acc_ptr + part[:, None] * D + ds[None, :], acc, mask=last)
        tl.store(ml_ptr + part * 2, m, mask=last)
        tl.store(ml_ptr + part * 2 + 1, l, mask=last)
        m = tl.where(last, float("-inf"), m)
        l = tl.where(last, 0.0, l)
        acc = tl.where(last, 0.0, acc)


def flat_cut(units: int, s: int, programs: int, chunk: int) -> int:
    """Keys per program: an equal share of units * s, rounded up to whole steps."""
    return -(-(-(-units * s // programs)) // chunk) * chunk


def merge_pieces(acc: torch.Tensor, ml: torch.Tensor, units: int, s: int, cut: int):
    """acc [slots, G, D], ml [slots, G, 2] -> [units, G, D]: unit u's pieces are the slots u + t
    for the programs t whose keys meet it."""
    out = []
    for u in range(units):
        first, last = u * s // cut, ((u + 1) * s - 1) // cut
        sl = slice(u + first, u + last + 1)
        m, l, a = ml[sl, :, 0], ml[sl, :, 1], acc[sl]                   # [P, G], [P, G, D]
        w = torch.exp(m - m.max(0).values)
        out.append((w[:, :, None] * a).sum(0) / (w * l).sum(0)[:, None])
    return torch.stack(out)


def run_flat(q, cache, pos, table, hkv: int, programs: int, chunk: int, stages: int,
             warps: int = 4):
    """(launch, outputs): the launch fills fresh NaN-poisoned slots; outputs() merges them."""
    b, s, d, hq = cache.shape[2], cache.shape[4], cache.shape[5], q.shape[1] // cache.shape[5]
    g, units = hq // hkv, b * hkv
    cut = flat_cut(units, s, programs, chunk)
    grid = -(-units * s // cut)
    acc = torch.full((units + grid, g, d), float("nan"), device=q.device)
    ml = torch.full((units + grid, g, 2), float("nan"), device=q.device)
    launch = lambda: attn_flat[(grid,)](q, cache, pos, table, acc, ml, units, cut, 0, b, hq, hkv,
                                        s, d, g, s // table.shape[1], chunk, stages,
                                        num_warps=warps)
    return launch, lambda: merge_pieces(acc, ml, units, s, cut).view(b, -1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="17,32,64")
    p.add_argument("--context", type=int, default=1024)
    args = p.parse_args(argv)
    hq, hkv, d, bs, dev = 32, 8, 64, 16, "cuda"
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for b in (int(x) for x in args.batch_sizes.split(",")):
        s, units = args.context, b * hkv
        cache = torch.randn(1, 2, b, hkv, s, d, device=dev, dtype=torch.bfloat16)
        q = torch.randn(b, hq * d, device=dev, dtype=torch.bfloat16)
        pos = torch.full((b,), s - 1, device=dev, dtype=torch.int32)
        table = torch.arange(b * s // bs, device=dev, dtype=torch.int32).view(b, s // bs)
        nbytes, ref = cache.numel() * cache.element_size(), sdpa(q, cache, hkv)
        show = lambda name, ms, err: print(f"B={b:2d} {name:<24} {ms * 1e3:7.1f} us "
                                           f"{nbytes / ms / 1e9:5.2f} TB/s  rel err {err:.1e}")
        show("sdpa", triton.testing.do_bench(lambda: sdpa(q, cache, hkv)), 0.0)
        out = torch.full_like(q, float("nan"))
        units_run = lambda: attn_units[(min(units, sms),)](
            q, cache, pos, table, out, units, 0, b, hq, hkv, s, d, hq // hkv, bs, 128,
            hq // hkv, 6)
        ms = triton.testing.do_bench(units_run)
        show("per unit c128 s6", ms, rel_err(out, ref))
        for chunk, stages, warps in ((64, 6, 4), (128, 3, 4), (128, 6, 4), (128, 6, 8)):
            launch, outputs = run_flat(q, cache, pos, table, hkv, sms, chunk, stages, warps)
            ms = triton.testing.do_bench(launch)
            show(f"flat c{chunk} s{stages} w{warps}", ms, rel_err(outputs(), ref))


if __name__ == "__main__":
    main()
