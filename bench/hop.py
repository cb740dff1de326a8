"""What one phase boundary costs, alone. P programs (one per SM) run R rounds; in each round
every program writes its slice of a vector, then reads the whole vector that all programs wrote
in that round and folds it into its next slice. A megakernel phase boundary at batch 1 has this
shape: each q/k/v task reads all of h, each gate_up task all of the o projection's output. Two
ways for a reader to know that the slices are there:

    counter  each program stores its slice, then adds 1 to a round counter with release
             semantics (``kernel_loop.signal_counter``); readers wait for the counter as a
             task waits (``kernel_loop.wait_counters``, atomic reads), then load the vector:
             the megakernel's protocol.
    acquire  the same, the counter read with acquire loads (``pl``)
    flagged  each 4-byte value travels with its round number in one 8-byte store (single-copy
             atomic); readers load the vector until every word carries this round's number: no
             fence and no counter, one memory round trip fewer on each side.

Rounds alternate between two halves of the buffer: a program writes a half again only after
every program has written the round in between, so after everyone has read that half.

    python -m megakernel.bench.hop --slices 1,16,64 --rounds 2000

Prints microseconds per round for each protocol and slice length; both must agree on the
values (a reference computed in PyTorch).
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from megakernel.compiler import kernel_loop


@triton.jit
def counter_rounds(buf_ptr, counter_ptr, out_ptr, error_ptr, rounds, spin_limit,
                   P: tl.constexpr, SLICE: tl.constexpr, BLOCK: tl.constexpr,
                   POLL: tl.constexpr):
    """buf fp32 [2, P * SLICE]; counter_ptr[0] counts the slices written, over all rounds;
    error_ptr as ``wait_counters`` records a wait that spun too long."""
    pid = tl.program_id(0)
    idx = tl.arange(0, BLOCK)
    mine = tl.arange(0, SLICE)
    acc = pid + 0.25 * mine.to(tl.float32)
    r = 0
    while r < rounds:
        half = buf_ptr + (r % 2) * (P * SLICE)
        tl.store(half + pid * SLICE + mine, acc)
        kernel_loop.signal_counter(counter_ptr, 0)
        if not kernel_loop.wait_counters(counter_ptr, counter_ptr, error_ptr, 0, 1, 0, P, r + 1,
                                         spin_limit, pid, 0, POLL):
            r = rounds
        v = tl.load(half + idx, mask=idx < P * SLICE, other=0.0)
        acc = acc * 0.5 + tl.sum(v) / (P * SLICE)
        r += 1
    tl.store(out_ptr + pid * SLICE + mine, acc)


@triton.jit
def flagged_rounds(buf_ptr, out_ptr, error_ptr, rounds, spin_limit, P: tl.constexpr,
                   SLICE: tl.constexpr, BLOCK: tl.constexpr):
    """buf int64 [2, P * SLICE], zeros at first: (round + 1) << 32 | the fp32 value's bits."""
    pid = tl.program_id(0)
    idx = tl.arange(0, BLOCK)
    valid = idx < P * SLICE
    mine = tl.arange(0, SLICE)
    acc = pid + 0.25 * mine.to(tl.float32)
    r = 0
    while r < rounds:
        half = buf_ptr + (r % 2) * (P * SLICE)
        tag = (r + 1).to(tl.int64)
        bits = acc.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
        tl.store(half + pid * SLICE + mine, (tag << 32) | bits)
        w = tl.load(half + idx, mask=valid, other=0, volatile=True)
        spins = 0
        while (tl.sum((((w >> 32) != tag) & valid).to(tl.int32), axis=0) > 0) \
                & (spins < spin_limit):
            w = tl.load(half + idx, mask=valid, other=0, volatile=True)
            spins += 1
        if spins >= spin_limit:
            tl.atomic_add(error_ptr, 1)
            r = rounds
        v = (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
        acc = acc * 0.5 + tl.sum(tl.where(valid, v, 0.0)) / (P * SLICE)
        r += 1
    tl.store(out_ptr + pid * SLICE + mine, acc)


def reference(programs: int, slice_len: int, rounds: int) -> torch.Tensor:
    """What both kernels compute, in PyTorch: [P * SLICE] fp32."""
    acc = (torch.arange(programs, dtype=torch.float32)[:, None]
           + 0.25 * torch.arange(slice_len, dtype=torch.float32)).flatten()
    for _ in range(rounds):
        acc = acc * 0.5 + acc.mean()
    return acc


POLLS = {"counter": 0, "acquire": 1}      # kernel_loop.poll's POLL


def run(protocol: str, programs: int, slice_len: int, rounds: int, device,
        spin_limit: int = 1 << 20) -> torch.Tensor:
    """One launch of ``protocol``'s kernel; its programs' final slices [P * SLICE]."""
    n, block = programs * slice_len, triton.next_power_of_2(programs * slice_len)
    out = torch.full((n,), float("nan"), device=device)
    error = torch.zeros(4, dtype=torch.int32, device=device)
    if protocol in POLLS:
        buf = torch.zeros(2 * n, device=device)
        counter = torch.zeros(1, dtype=torch.int32, device=device)
        counter_rounds[(programs,)](buf, counter, out, error, rounds, spin_limit, programs,
                                    slice_len, block, POLLS[protocol])
    else:
        buf = torch.zeros(2 * n, dtype=torch.int64, device=device)
        flagged_rounds[(programs,)](buf, out, error, rounds, spin_limit, programs, slice_len,
                                    block)
    if int(error[0].item()):
        raise RuntimeError(f"{protocol}: a program spun past {spin_limit} polls")
    return out


def time_round_us(protocol: str, programs: int, slice_len: int, rounds: int) -> float:
    run(protocol, programs, slice_len, rounds, "cuda")  # build and warm: the same round count,
    # since Triton specialises integer arguments (divisible by 16 or not) and would build again
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = run(protocol, programs, slice_len, rounds, "cuda")
    end.record()
    torch.cuda.synchronize()
    ref = reference(programs, slice_len, rounds).to(out.device)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    return start.elapsed_time(end) * 1e3 / rounds


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--programs", type=int, default=0, help="default: one per SM")
    p.add_argument("--slices", default="1,16,64", help="values each program writes per round")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--protocols", default="counter,flagged,acquire")
    args = p.parse_args(argv)
    programs = args.programs or torch.cuda.get_device_properties(0).multi_processor_count
    for s in (int(v) for v in args.slices.split(",")):
        times = {proto: time_round_us(proto, programs, s, args.rounds)
                 for proto in args.protocols.split(",")}
        print(f"{programs} programs x {s:4d} values: " + "  ".join(
            f"{proto} {us:6.2f} us/round" for proto, us in times.items()))


if __name__ == "__main__":
    main()
