"""How fast the chip streams the KV cache in the attention tasks' pattern, with next to no
arithmetic and with the megakernel's attention bodies: separates the memory system's rate for
that pattern from the bodies' own.

    python -m megakernel.bench.kv_probe --batch-sizes 24,48,64 [--bodies 2:4:128:4:4] [--stamps]
        [--forms plain,polling] [--unit-streams 2:4:128:4,4:4:128:4,2:4:128:4:1] [--hot-rows 1]

Programs walk tasks of (row, NH consecutive kv heads) over the cache [L, 2, B, Hkv, S, D]
(bf16), every layer's tasks in one launch (the layers one after another in each program, no
waits between them), so that a launch's start and end weigh little: a one-layer launch at 24
rows (50 MB) takes about 24 us even as flat contiguous spans, twice what its bytes do.
``kv_tasks`` sums each step's keys and values (CHUNK keys of each head, loaded as the attention
loops load them; ``rot`` starts task t's loop at step (t * 3) mod steps); ``flat_spans``: the
same bytes cut into equal contiguous spans, one a program; ``body_tasks``: the attention bodies
(``attn_pair_op``, ``attn_group_op``) for each --bodies entry (heads a task : key groups W :
keys a step : stages : warps); where a body has fewer tasks than the chip has SMs, also on a
program an SM with the busy ones spread over the grid, and with the idle ones polling a
counter the tasks signal (as megakernel workers waiting on attention's outputs do);
``stream_tasks``: the bodies as streams of units over every SM (``stream_ops``, each program
an equal share of whole steps, with the keys as M where W > 1). Prints TB/s of the cache (and
with --stamps each task's time by row and by SM). With --hot-rows N the bodies and streams do the
same work from N rows' cache (block tables pointing there): with few layers it stays in L2, and
what they reach is their own rate rather than the memory's.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from megakernel.bench.attention import sdpa
from megakernel.bench.attention_flat import merge_slots, stream_buffers
from megakernel.bench.sweep import rel_err
from megakernel.compiler import attention_group_ops, attention_ops, kernel_loop, stream_ops
from megakernel.compiler.registry import p2
from megakernel.compiler.tile import TileConfig
from megakernel.compiler.tile_attention import rows_spanned, stream_shares, unit_slots

# a body task's stamps (``body_tasks``): start and end (ns), SM, SM clock cycles between them
FIELDS = 4
STAMP_FIELDS = tl.constexpr(FIELDS)


@triton.jit
def kv_tasks(cache_ptr, out_ptr, ntasks, layers, B: tl.constexpr, HKV: tl.constexpr,
             S: tl.constexpr, D: tl.constexpr, NH: tl.constexpr, CHUNK: tl.constexpr,
             STAGES: tl.constexpr, ROT: tl.constexpr, ROUNDS: tl.constexpr):
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    NCHUNK: tl.constexpr = S // CHUNK
    offs = tl.arange(0, CHUNK)[:, None] * D + tl.arange(0, D)[None, :]         # [CHUNK, D]
    acc = tl.zeros([CHUNK, D], tl.float32)
    for i in range(0, layers * ROUNDS):
        layer, t = i // ROUNDS, pid + (i % ROUNDS) * nprog
        if t < ntasks:
            row, g = t // (HKV // NH), (t % (HKV // NH)) * NH
            plane = ((tl.cast(layer, tl.int64) * 2) * B + row) * HKV + g       # K plane
            for c in tl.range(0, NCHUNK, num_stages=STAGES):
                cc = (c + t * 3) % NCHUNK if ROT else c
                for h in tl.static_range(NH):
                    base = ((plane + h) * S + cc * CHUNK) * D
                    k = tl.load(cache_ptr + base + offs)
                    v = tl.load(cache_ptr + base + B * HKV * S * D + offs)
                    acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + pid * CHUNK * D + offs, acc)


@triton.jit
def body_tasks(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, ntasks, layers, B: tl.constexpr,
               HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
               G: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
               STAGES: tl.constexpr, NH: tl.constexpr, W: tl.constexpr, ROUNDS: tl.constexpr,
               SPREAD: tl.constexpr = False, stamp_ptr=None, STAMPS: tl.constexpr = 0,
               done_ptr=None, SPIN: tl.constexpr = 0, ACROSS: tl.constexpr = False,
               ROTATE: tl.constexpr = False):
    """``kv_tasks`` with the megakernel's attention bodies (NH 2: ``attn_pair_op``, W key
    groups; NH 4: ``attn_group_op``, keys as M where W > 1) in place of the sums. SPREAD (one
    round, fewer tasks than programs): task t on program t * programs // tasks, the busy
    programs spread over the grid instead of its first ones. STAMPS (2 on the GPU, 1 under the
    interpreter): each task's start, end, SM and SM clock cycles into stamp_ptr [layers, tasks,
    FIELDS]. SPIN (one round): each task signals done_ptr[layer] (release) and the programs
    without a task poll it (acquire, as the megakernel's waits do; SPIN > 1: sleeping SPIN ns
    between polls) until the layer's tasks are done, as workers waiting on attention's outputs
    do. ACROSS: task t is row t % B's (t // B)-th group of heads (tasks side by side read
    different rows), else row t // (HKV // NH)'s (t % (HKV // NH))-th, as the tiler orders
    them. ROTATE: each task's key loop from its own step on (``TileConfig.attn_rotate``)."""
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    for i in range(0, layers * ROUNDS):
        layer, t = i // ROUNDS, pid + (i % ROUNDS) * nprog
        if SPREAD:
            t = (pid * ntasks + nprog - 1) // nprog
            t = tl.where((t * nprog) // ntasks == pid, t, ntasks)
        if t < ntasks:
            if ACROSS:
                row, g = t % B, (t // B) * NH
            else:
                row, g = t // (HKV // NH), (t % (HKV // NH)) * NH
            if STAMPS:
                stamp = stamp_ptr + (layer * ntasks + t) * STAMP_FIELDS
                tick = stamp_ptr + layers * ntasks * STAMP_FIELDS
                tl.store(stamp, kernel_loop.clock(tick, STAMPS))
                c0 = cycles(STAMPS)
            if NH == 2:
                attention_ops.attn_pair_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, row, g,
                                           layer, D ** -0.5, B, HQ, HKV, S, D, G, BS, CHUNK,
                                           BLOCK_G, D, STAGES, True, W, ROTATE)
            else:
                attention_group_ops.attn_group_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr,
                                                  row, g, layer, D ** -0.5, B, HQ, HKV, S, D,
                                                  G, BS, CHUNK, BLOCK_G, D, STAGES, True, NH,
                                                  W > 1, ROTATE)
            if STAMPS:
                tl.store(stamp + 1, kernel_loop.clock(tick, STAMPS))
                tl.store(stamp + 2, sm_id(STAMPS))
                tl.store(stamp + 3, cycles(STAMPS) - c0)
            if SPIN:
                kernel_loop.signal_counter(done_ptr, layer)
        elif SPIN:
            while kernel_loop.poll(done_ptr + layer, 0) < ntasks:
                if SPIN > 1:
                    tl.inline_asm_elementwise("nanosleep.u32 $1; mov.u32 $0, 0;", "=r,r",
                                              [layer * 0 + SPIN], dtype=tl.int32,
                                              is_pure=False, pack=1)


@triton.jit
def stream_tasks(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, slot0_ptr, nslots,
                 cut, total, layers, B: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                 S: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK_G: tl.constexpr, STAGES: tl.constexpr,
                 ROWS: tl.constexpr, NH: tl.constexpr, W: tl.constexpr,
                 STACK: tl.constexpr = 0, STEPS: tl.constexpr = 0):
    """``body_tasks`` as streams: program t takes keys [t * cut, (t + 1) * cut) of the units of
    NH kv heads laid end to end (``stream_ops``' pair or group streams; W > 1: the keys as the
    dots' M; STACK: pairs with their units' queries stacked, ``stacked_stream``), every layer
    one after another; cut units' pieces left in their slots."""
    t = tl.program_id(0)
    f0 = t * cut
    f1 = tl.minimum(f0 + cut, total)
    slot0 = tl.load(slot0_ptr + t)
    for layer in range(0, layers):
        if NH == 2:
            stream_ops.attn_pair_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr,
                                           out_ptr, f0, f1, layer, slot0, nslots, slot0_ptr, 0,
                                           0, 0, 0, 0, D ** -0.5, B, HQ, HKV, S, D, G, BS,
                                           CHUNK, BLOCK_G, D, STAGES, ROWS, False, 1, W,
                                           STACK, STEPS)
        else:
            stream_ops.attn_group_stream_op(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr,
                                            out_ptr, f0, f1, layer, slot0, nslots, slot0_ptr, 0,
                                            0, 0, 0, 0, D ** -0.5, B, HQ, HKV, S, D, G, BS,
                                            CHUNK, BLOCK_G, D, STAGES, ROWS, NH, False, 1, W > 1)


def stream_probe(q, cache, pos, table, programs: int, nh: int, w: int, chunk: int,
                 stages: int, warps: int = 4, stack: bool = False):
    """(launch, outputs) of ``stream_tasks`` over ``programs`` equal shares of whole steps (of
    ``chunk`` keys for a pair, as many keys x heads for a group; ``stack``: pairs with their
    units' queries stacked): outputs() the last layer's attention, its cut units merged from
    their slots on the host."""
    layers, _, b, hkv, s, d = cache.shape
    g, units = q.shape[1] // d // hkv, b * hkv // nh
    step, cut = stream_shares(units * s, s, programs, chunk * 2 // max(2, nh))
    streams, slot_of, slot0, n, acc, ml, out = stream_buffers(q, units, s, cut, nh, g, d)
    launch = lambda: stream_tasks[(len(streams),)](
        q, cache, pos, table, acc, ml, out, slot0, n, cut, units * s, layers, b, q.shape[1] // d,
        hkv, s, d, g, s // table.shape[1], step, p2(g, TileConfig.attn_rows), stages,
        rows_spanned(streams, s, hkv // nh), nh, w,
        max((f1 - 1) // s - f0 // s + 1 for f0, f1 in streams) if stack else 0,
        max(f1 - f0 for f0, f1 in streams) // step, num_warps=warps)
    return launch, lambda: merge_slots(out, acc, ml, unit_slots(slot_of), hkv, nh)


@triton.jit
def cycles(STAMPS: tl.constexpr):
    """The SM's clock counter (%clock64; 0 under the interpreter): cycles over a task's
    nanoseconds give the SM's clock rate while it ran."""
    if STAMPS == 2:
        return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64,
                                         is_pure=False, pack=1)
    else:
        return tl.zeros([], tl.int64)


@triton.jit
def sm_id(STAMPS: tl.constexpr):
    """The SM this program runs on (0 under the interpreter)."""
    if STAMPS == 2:
        return kernel_loop.sm_id()
    else:
        return tl.zeros([], tl.int64)


@triton.jit
def flat_spans(src_ptr, out_ptr, span, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    base = tl.cast(pid, tl.int64) * span
    for i in tl.range(0, span // BLOCK, num_stages=STAGES):
        acc += tl.load(src_ptr + base + i * BLOCK + offs).to(tl.float32)
    tl.store(out_ptr + pid * BLOCK + offs, acc)


def time_ms(fn, iters: int = 30) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def probe_batch(b: int, layers: int, hkv: int, s: int, d: int, stages: int, sms: int,
                bodies: list[tuple[int, ...]], streams: bool, stamps: bool = False,
                only: tuple[str, ...] = (), unit_streams: list[tuple[int, ...]] = (),
                stream_programs: tuple[int, ...] = (), hot: int = 0) -> None:
    cache = torch.randn(layers, 2, b, hkv, s, d, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(max(sms, b * hkv) * 128 * d, dtype=torch.float32, device="cuda")
    if streams:
        time_streams(cache, out, stages, sms)
    time_bodies(cache, bodies, sms, stamps, only, hot)
    for programs in stream_programs or (sms,):
        time_unit_streams(cache, unit_streams, programs, hot)


def time_unit_streams(cache: torch.Tensor, specs: list[tuple[int, ...]], sms: int,
                      hot: int = 0) -> None:
    """Each stream body (kv heads a unit, key groups W, keys a step of a pair, stages, and
    optionally 1: pairs with their units' queries stacked) over every layer on ``sms``
    programs (``stream_probe``), checked against SDPA (``hot``: ``body_inputs``')."""
    layers, _, b, hkv, s, d = cache.shape
    q, pos, table = body_inputs(cache, hot=hot)
    ref = sdpa(q, read_rows(cache, hot)[layers - 1:], hkv)
    for nh, w, chunk, st, *stack in specs:
        launch, outputs = stream_probe(q, cache, pos, table, sms, nh, w, chunk, st,
                                       stack=bool(stack and stack[0]))
        try:
            ms = time_ms(launch)
        except Exception as err:
            print(f"B={b} streams heads/unit {nh} W {w}: {type(err).__name__}")
            continue
        print(f"B={b} streams heads/unit {nh} W {w} keys {chunk} stages {st} programs {sms}"
              f"{' stacked' * bool(stack and stack[0])}: "
              f"{ms * 1e3:7.1f} us  {cache.numel() * 2 / ms / 1e9:5.2f} TB/s  rel err "
              f"{rel_err(outputs(), ref):.1e}", flush=True)


def time_streams(cache: torch.Tensor, out: torch.Tensor, stages: int, sms: int) -> None:
    layers, _, b, hkv, s, d = cache.shape
    nbytes = cache.numel() * 2
    for nh in (1, 2, 4):
        ntasks = b * hkv // nh
        for progs in sorted({min(ntasks, sms), sms}):
            for rot in (0, 1):
                st = min(stages, 1 + 192 // (32 * nh))     # at most 192 KB of copies in flight
                ms = time_ms(lambda: kv_tasks[(progs,)](cache, out, ntasks, layers, b, hkv, s, d,
                                                        nh, 128, st, rot, -(-ntasks // progs),
                                                        num_warps=4))
                print(f"B={b} heads/task {nh} tasks {ntasks} programs {progs} rot {rot}: "
                      f"{ms * 1e3:7.1f} us  {nbytes / ms / 1e9:5.2f} TB/s", flush=True)
    flat = cache.reshape(-1)
    for progs in (96, 128, sms):
        span = flat.numel() // progs // 4096 * 4096
        ms = time_ms(lambda: flat_spans[(progs,)](flat, out, span, 4096, stages, num_warps=4))
        print(f"B={b} flat spans, programs {progs}: {ms * 1e3:7.1f} us  "
              f"{span * progs * 2 / ms / 1e9:5.2f} TB/s", flush=True)


def stamp_summary(stamps: torch.Tensor, heads_per_task: int, hkv: int,
                  across: int = 0) -> list[str]:
    """Lines on ``body_tasks``'s stamps [layers, tasks, FIELDS] (the first and last layer left
    out): a layer's span, its tasks' times and the SMs' clock rate over them (where cycles were
    counted), and the tasks' mean time by row and by SM (%smid);
    ``across``: the batch's rows where tasks go across them
    (``body_tasks``' ACROSS)."""
    st = stamps[1:-1].double()
    dur = (st[..., 1] - st[..., 0]) / 1e3                                 # [L - 2, T] us
    span = (st[..., 1].max(1).values - st[..., 0].min(1).values) / 1e3
    t = torch.arange(dur.shape[1])
    rows = t % across if across else t // (hkv // heads_per_task)
    by_row = [dur[:, rows == r].mean().item() for r in range(int(rows.max()) + 1)]
    sm = st[..., 2].long()
    by_sm = {k: dur[sm == k].mean().item() for k in sm.unique().tolist()}
    q = torch.quantile(dur.flatten(), torch.tensor([0.1, 0.5, 0.9], dtype=dur.dtype))
    ticks = st[..., 3].sum()
    clock = f"; SM clock {ticks / dur.sum():.0f} MHz" if ticks > 0 else ""     # cycles a us
    return [f"  layer span {span.mean():.1f} us; task mean {dur.mean():.1f}, p10 {q[0]:.1f}, "
            f"median {q[1]:.1f}, p90 {q[2]:.1f}, max {dur.max():.1f}{clock}",
            "  by row: " + " ".join(f"{x:.1f}" for x in by_row),
            "  by SM: " + " ".join(f"{k}:{x:.1f}" for k, x in by_sm.items())]


def body_inputs(cache: torch.Tensor, hq: int = 32, hot: int = 0, block: int = 128):
    """What the bodies read besides the cache [L, 2, B, Hkv, S, D]: random queries [B, hq * D]
    (of the cache's dtype), every row at its last position, and the block table of ``block``-key
    blocks in order; ``hot`` > 0: row r's table points at row r % hot's blocks, from its block
    r % blocks on (wrapping around), so that the bodies do the same work from only ``hot`` rows'
    cache (``read_rows``), which stays in L2 where it is small, and rows side by side read
    different blocks at once."""
    _, _, b, _, s, d = cache.shape
    nb, dev = s // block, cache.device
    q = torch.randn(b, hq * d, device=dev, dtype=cache.dtype)
    pos = torch.full((b,), s - 1, device=dev, dtype=torch.int32)
    table = torch.arange(b * nb, device=dev, dtype=torch.int32).view(b, nb)
    if hot:
        r, j = torch.arange(b, device=dev)[:, None], torch.arange(nb, device=dev)[None, :]
        table = ((r % hot) * nb + (j + r) % nb).to(torch.int32)
    return q, pos, table


def read_rows(cache: torch.Tensor, hot: int = 0) -> torch.Tensor:
    """The cache [L, 2, B, Hkv, S, D] as ``body_inputs``' table of ``hot`` rows reads it (the
    keys of a row in another order, which attention over all of them does not see)."""
    b = cache.shape[2]
    return cache[:, :, torch.arange(b, device=cache.device) % hot] if hot else cache


# the bodies' forms (``time_bodies``): the last three only where tasks are fewer than SMs
FORMS = ("plain", "across", "rotated", "spread", "polling", "sleeping")


def time_bodies(cache: torch.Tensor, bodies: list[tuple[int, ...]], sms: int,
                stamps: bool = False, only: tuple[str, ...] = (), hot: int = 0) -> None:
    """Each body (heads a task, key groups W, keys a step, stages, warps) over every layer, in
    each form (``only``: those of FORMS named; ``hot``: ``body_inputs``');
    ``stamps``: then once more with each task's start, end and SM stamped (``stamp_summary``)."""
    layers, _, b, hkv, s, d = cache.shape
    nbytes = cache.numel() * 2
    hq, g = 32, 4
    q, pos, table = body_inputs(cache, hq, hot)
    att = torch.empty_like(q)
    for nh, w, chunk, st, warps in bodies:
        ntasks = b * hkv // nh
        done = torch.zeros(layers, dtype=torch.int32, device="cuda")
        one = min(ntasks, sms)
        forms = {"plain": (one, False, 0, False, False), "across": (one, False, 0, True, False),
                 "rotated": (one, False, 0, False, True)}
        if ntasks < sms:
            forms |= {"spread": (sms, True, 0, False, False),
                      "polling": (sms, False, 1, False, False),
                      "sleeping": (sms, False, 200, False, False)}
        for progs, spread, spin, across, rotate in (f for k, f in forms.items()
                                                    if not only or k in only):
            name = (f"B={b} body heads/task {nh} W {w} keys {chunk} stages {st} warps {warps}"
                    f" tasks {ntasks} programs {progs}{' spread' * spread}"
                    f"{f' idle polling (sleep {spin if spin > 1 else 0} ns)' * bool(spin)}"
                    f"{' rows across' * across}{' rotated' * rotate}")

            def run(marks=None):
                if spin:
                    done.zero_()
                body_tasks[(progs,)](q, cache, pos, table, att, ntasks, layers, b, hq, hkv, s,
                                     d, g, 128, chunk, 4, st, nh, w, -(-ntasks // progs), spread,
                                     marks, 0 if marks is None else 2, done, spin, across,
                                     rotate, num_warps=warps)
            try:
                ms = time_ms(run)
            except Exception as err:
                print(f"{name}: {type(err).__name__}")
                continue
            print(f"{name}: {ms * 1e3:7.1f} us  {nbytes / ms / 1e9:5.2f} TB/s", flush=True)
            if stamps:
                marks = torch.zeros(layers * ntasks * FIELDS + 1, dtype=torch.int64,
                                    device="cuda")
                run(marks)
                summary = stamp_summary(marks[:-1].view(layers, ntasks, FIELDS).cpu(), nh, hkv,
                                        b if across else 0)
                print("\n".join(summary), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="24,48,64")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--bodies", default="2:1:128:6:4,2:4:128:4:4,4:1:128:4:4",
                   help="heads a task:key groups:keys a step:stages:warps, comma-separated")
    p.add_argument("--no-streams", action="store_true", help="time the bodies only")
    p.add_argument("--stamps", action="store_true",
                   help="also each body task's time by row and by SM (stamp_summary)")
    p.add_argument("--unit-streams", default="",
                   help="also streams over every SM: kv heads a unit:key groups W:keys a step "
                        "of a pair:stages[:1 stacked], e.g. 2:4:128:4,2:1:128:4:1 (W > 1: keys "
                        "as M)")
    p.add_argument("--stream-programs", default="",
                   help="the unit streams on these many programs each, e.g. 96,132 (default: "
                        "one an SM)")
    p.add_argument("--forms", default="",
                   help="bodies' forms timed, e.g. plain,polling (default: every form)")
    p.add_argument("--hot-rows", type=int, default=0,
                   help="the bodies and streams read only this many rows' cache (the same work; "
                        "from L2 where small: their own rate, not the memory's)")
    a = p.parse_args(argv)
    only = tuple(f for f in a.forms.split(",") if f)
    if set(only) - set(FORMS):
        p.error(f"--forms: {sorted(set(only) - set(FORMS))} not among {', '.join(FORMS)}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bodies = [tuple(int(x) for x in spec.split(":")) for spec in a.bodies.split(",") if spec]
    for b in (int(x) for x in a.batch_sizes.split(",")):
        probe_batch(b, a.layers, 8, 1024, 64, a.stages, sms, bodies, not a.no_streams,
                    a.stamps, only, [tuple(int(x) for x in spec.split(":"))
                                     for spec in a.unit_streams.split(",") if spec],
                    tuple(int(x) for x in a.stream_programs.split(",") if x), a.hot_rows)


if __name__ == "__main__":
    main()
