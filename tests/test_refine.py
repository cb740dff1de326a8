"""The autotuner's refinement (``runtime.refine``): one knob flipped on the fastest variant,
gains compounded, near misses made again on a faster one; rated by the cost model, never
timed twice."""
from dataclasses import replace

import pytest
import torch

from megakernel.compiler.cost import CPU_INTERPRETER, H200
from megakernel.models import load_model
from megakernel.runtime import autotune as tuning, refine
from megakernel.runtime.effective import effective
from megakernel.runtime.variant import Variant, parse_variant

V = Variant(32, 32, 4, 132, stages=1, kv_split=32, qkv_parts=1, split_k=1, norm_first=False)


def tiny_config():
    return load_model("tiny-llama", progress=False).model.config


def test_refinements_flip_a_knob_unless_that_variant_was_timed():
    """The balance refinement of a variant on 132 workers: the same variant with balance on, as
    it will be built, rated; nothing where that variant was timed already."""
    cfg, v = tiny_config(), V
    flips = lambda timed: refine._flips(cfg, torch.float32, 2, 64, H200, v, ("balance",), timed)
    [(u, predicted)] = flips({v.label})
    assert u == replace(v, balance=True) and predicted > 0
    assert flips({v.label, u.label}) == []
    # the keys as the attention dots' M, and back; as built, only where whole pairs are tasks
    pairs = replace(v, attn_pairs=True, kv_split=64)
    assert refine.flip(pairs, "attn_keys_m", 64) == replace(pairs, attn_keys_m=True)
    assert refine.flip(replace(pairs, attn_keys_m=True), "attn_keys_m", 64) == pairs
    ops = refine.op_graph(cfg, torch.float32, 2, 64)
    assert effective(ops, replace(pairs, attn_keys_m=True)).attn_keys_m
    assert not effective(ops, replace(v, attn_keys_m=True)).attn_keys_m
    # q/k/v in 2 K slices and back; as built, only where x is normalised first (tiny-llama's
    # hidden 96 in slices of 48 columns)
    first = replace(v, norm_first=True)
    assert refine.flip(first, "qkv_slices", 64) == replace(first, qkv_slices=2)
    assert refine.flip(replace(first, qkv_slices=2), "qkv_slices", 64) == first
    assert effective(ops, replace(first, qkv_slices=2)).qkv_slices == 2
    assert effective(ops, replace(v, qkv_slices=2)).qkv_slices == 1
    # a head's tasks as built: pieces of 1/slices of them, at least one (q1 as q2 here)
    assert effective(ops, replace(first, qkv_slices=2, qkv_parts=1)) == \
        effective(ops, replace(first, qkv_slices=2, qkv_parts=2))
    assert parse_variant(replace(first, qkv_slices=3).label).qkv_slices == 3
    # as built, a stream keeps its keys a task, no spills and no KV prefetch a task ahead
    spilled = replace(v, attn_pairs=True, attn_spill=True, prefetch_kv_ahead=128, kv_split=64)
    built = effective(ops, replace(spilled, attn_stream=True, fuse_combine=True))
    assert built.attn_stream and built.attn_pairs and (built.kv_split, built.attn_spill,
                                                       built.prefetch_kv_ahead) == (64, False, 0)


def test_refinements_flip_cache_blocks_and_pipeline_depths():
    """The largest other cache block that fits, and deeper pipelines (GPUs only)."""
    cfg, v = tiny_config(), V
    # the cache block flips to the largest other one that fits the context and the keys per
    # task (streams: their keys per task follow it); where none does, nothing changes
    wide = replace(v, kv_split=128)
    assert refine.flip(wide, "kv_block", 1024) == replace(wide, kv_block=128)
    assert refine.flip(replace(wide, kv_block=128), "kv_block", 1024) == wide
    assert refine.flip(wide, "kv_block", 64) == wide and refine.flip(v, "kv_block", 1024) == v
    stream = replace(v, attn_stream=True, kv_split=64)
    assert refine.flip(stream, "kv_block", 1024) == replace(stream, kv_block=128, kv_split=128)
    # deeper pipelines: the interpreter ignores them, so they are flipped for GPUs only
    assert refine._flips(cfg, torch.float32, 2, 64, CPU_INTERPRETER, v, ("stage_kib",),
                         {v.label}) == []
    deep = refine.flip(v, "stage_kib", 64)
    assert deep == replace(v, stage_kib=refine.DEEP_STAGES_KIB) and "xsm" in deep.label
    assert refine.flip(deep, "stage_kib", 64) == v
    steps = refine.flip(v, "step_weights", 64)
    assert steps == replace(v, step_weights=2) and parse_variant(steps.label) == steps
    assert refine.flip(steps, "step_weights", 64) == v
    assert refine._flips(cfg, torch.float32, 2, 64, CPU_INTERPRETER, v, ("step_weights",),
                         {v.label}) == []
    longer = refine.flip(v, "attn_stages", 64)
    assert longer == replace(v, attn_stages=refine.DEEP_ATTN_STAGES) and "xas8" in longer.label
    assert refine.flip(longer, "attn_stages", 64) == v
    assert refine._flips(cfg, torch.float32, 2, 64, CPU_INTERPRETER, v, ("attn_stages",),
                         {v.label}) == []


def test_refinements_flip_slices_norm_sums_and_calls():
    """K slices and their reduce, norms from sums of squares, op bodies as calls."""
    cfg, v = tiny_config(), V
    # K slices reducing themselves on (with the norm from sums of squares where the reduce took
    # it by rows) or off
    assert refine.flip(v, "fuse_reduce", 64) == replace(v, fuse_reduce=True)
    by_rows = replace(v, norm_first=True, split_k=4, reduce_norm=True)
    assert refine.flip(by_rows, "fuse_reduce", 64) == \
        replace(by_rows, reduce_norm=False, norm_sums=True, fuse_reduce=True)
    assert refine.flip(refine.flip(v, "fuse_reduce", 64), "fuse_reduce", 64) == v
    # K slices on (their reduce fused with the norm where it comes first) or off
    first = replace(v, norm_first=True)
    sliced = refine.flip(first, "split_k", 64)
    assert sliced == replace(first, split_k=4, reduce_norm=True) and "xrnxsk4" in sliced.label
    assert refine.flip(sliced, "split_k", 64) == first
    assert refine.flip(v, "split_k", 64) == replace(v, split_k=4)
    gpu = refine._flips(cfg, torch.float32, 2, 64, H200, v, ("split_k",), {v.label})
    assert [(u.split_k, u.num_warps) for u, _ in gpu] == [(4, 4)]
    [(cpu, _)] = refine._flips(cfg, torch.float32, 2, 64, CPU_INTERPRETER, v, ("split_k",),
                               {v.label})
    assert cpu == gpu[0][0]
    # norms from their inputs' writers' sums of squares: norm first then too (without it the
    # flip would build the variant itself), or none
    summed = refine.flip(v, "norm_sums", 64)
    assert summed == replace(v, norm_sums=True, norm_first=True) and "xnfxns" in summed.label
    assert refine.flip(summed, "norm_sums", 64) == replace(summed, norm_sums=False)
    [(u, _)] = refine._flips(cfg, torch.float32, 2, 64, H200, v, ("norm_sums",), {v.label})
    assert u.norm_sums and u.norm_first
    # op bodies as calls: at each warp count on GPUs, not at all on the interpreter
    calls = refine._flips(cfg, torch.float32, 2, 64, H200, v, ("noinline",), {v.label})
    assert [(u.noinline, u.num_warps) for u, _ in calls] == [(True, 4), (True, 8)]
    assert refine._flips(cfg, torch.float32, 2, 64, CPU_INTERPRETER, v, ("noinline",),
                         {v.label}) == []
    # the other warp count (the shortlists hold 4 only): 8 and back, on GPUs only, and not
    # where two programs an SM would need 16 warps' registers
    assert refine.flip(v, "num_warps", 64) == replace(v, num_warps=8)
    assert refine.flip(replace(v, num_warps=8), "num_warps", 64) == v
    [(u, _)] = refine._flips(cfg, torch.float32, 2, 64, H200, v, ("num_warps",), {v.label})
    assert u.num_warps == 8
    assert refine._flips(cfg, torch.float32, 2, 64, CPU_INTERPRETER, v, ("num_warps",),
                         {v.label}) == []
    assert refine._flips(cfg, torch.float32, 2, 64, H200, replace(v, workers=264),
                         ("num_warps",), set()) == []
    # nor where the projections' dots are warpgroup MMAs (64 padded rows, or weight rows as M)
    assert refine._flips(cfg, torch.float32, 33, 64, H200, v, ("noinline",), {v.label}) == []
    assert refine._flips(cfg, torch.float32, 2, 64, H200, replace(v, swap_ab=True),
                         ("noinline",), set()) == []


def test_compound_combines_the_refinements_gains_with_its_fastest(tmp_path, monkeypatch):
    """The fastest of the flips that beat the refined variant, with each of the next COMPOUND
    fastest gains' changes set on it too; nothing where fewer than two flips gained, nothing
    timed already; the plan kept in the ledger (a rerun rates nothing)."""
    model, v = load_model("tiny-llama", progress=False).model, V
    fast, deep, steps, calls = (replace(v, balance=True), replace(v, stage_kib=200),
                                replace(v, step_weights=2), replace(v, noinline=True,
                                                                    num_warps=8))
    times = {v: 1.0, fast: 0.8, deep: 0.85, steps: 0.9, calls: 1.1}
    timed = lambda ms: [(u, {"ms": t, "error": None}) for u, t in ms.items()]
    tried = [(u, 1.0) for u in (fast, deep, steps, calls)]
    ledger = tuning.Ledger(tmp_path / "autotune.json")
    run = lambda ms, base: refine.compound(ledger, base, 2, v, timed(ms), tried, model, 64, H200)
    made = run(times, {"code": "a"})
    assert [u for u, _ in made] == [replace(fast, stage_kib=200), replace(fast, step_weights=2)]
    assert all(predicted > 0 for _, predicted in made)
    assert run({**times, deep: 1.05, steps: 1.2}, {"code": "b"}) == []      # one gain only
    assert [u for u, _ in run({**times, replace(fast, stage_kib=200): 0.7}, {"code": "c"})] == \
        [replace(fast, step_weights=2)]                       # what was timed is not again
    monkeypatch.setattr(refine, "op_graph", lambda *a: pytest.fail("rated again"))
    assert run(times, {"code": "a"}) == made
    monkeypatch.undo()
    # a gain the fastest holds already (calls at the other warp count) leaves its slot to the next
    fastest, own_warps = calls, replace(v, noinline=True)
    again = [(u, 1.0) for u in (fastest, own_warps, deep, steps)]
    made = refine.compound(ledger, {"code": "e"}, 2, v,
                           timed({**times, fastest: 0.7, own_warps: 0.75}), again, model, 64,
                           H200)
    assert [u for u, _ in made] == [replace(fastest, stage_kib=200),
                                    replace(fastest, step_weights=2)]
    # calls are not combined with warpgroup MMAs (weight rows as the dot's M here)
    t = lambda u: replace(u, swap_ab=True)
    rows = timed({t(v): 1.0, t(fast): 0.8, t(calls): 0.85})
    assert refine.compound(ledger, {"code": "d"}, 2, t(v), rows, [(t(fast), 1), (t(calls), 1)],
                           model, 64, H200) == []


def test_compound_gives_the_gains_to_a_first_round_variant_of_another_class_nearly_as_fast(
        tmp_path):
    """A first-round variant within TIE of the refined one, of another class (not only other
    warps or calls), gets every gain's changes (the faster gain's where two set one field), with
    one gain too; none beyond TIE, none of the same class."""
    model, v = load_model("tiny-llama", progress=False).model, V
    other, warps = replace(v, block_n=16), replace(v, num_warps=8)
    fast, deep = replace(v, balance=True, stage_kib=100), replace(v, stage_kib=200)
    tried = [(fast, 1.0), (deep, 1.0)]
    ledger = tuning.Ledger(tmp_path / "autotune.json")

    def run(ms: dict, code: str) -> list:
        rows = [(u, {"ms": t, "error": None}) for u, t in ms.items()]
        return [u for u, _ in refine.compound(ledger, {"code": code}, 2, v, rows, tried, model,
                                              64, H200)]
    near = 1 + refine.TIE / 2
    times = {v: 1.0, warps: 1.0, other: near, fast: 0.8, deep: 0.9}
    assert run(times, "a") == [replace(fast, stage_kib=200),
                               replace(other, balance=True, stage_kib=100)]
    assert run({**times, deep: 1.1}, "b") == [replace(other, balance=True, stage_kib=100)]
    assert run({**times, deep: 1.1, other: 1 + 2 * refine.TIE}, "c") == []
    assert run({v: 1.0, warps: 1.001, fast: 0.8, deep: 1.1}, "d") == []   # warps: same class
    assert run({**times, fast: 1.1, deep: 1.2}, "e") == []                 # no gain at all


def test_second_look_makes_the_near_misses_again_on_the_fastest(tmp_path, monkeypatch):
    """Once the refinement made a variant faster than the first round's fastest, each flip that
    gained or missed by less than TIE (at most SECOND_LOOK, fastest first) is made again on it
    where it adds a field and sets none that the faster one changed to another value; nothing
    where nothing got faster, nothing beyond TIE, nothing timed already; the plan kept in the
    ledger (a rerun rates nothing)."""
    model, v = load_model("tiny-llama", progress=False).model, V
    fast, deep, steps = (replace(v, balance=True), replace(v, stage_kib=200),
                         replace(v, step_weights=2))
    near, far = 1 + refine.TIE / 2, 1 + 2 * refine.TIE
    times = {v: 1.0, fast: 0.9, deep: near, steps: far}
    tried = [(u, 1.0) for u in (fast, deep, steps)]
    ledger = tuning.Ledger(tmp_path / "autotune.json")

    def run(ms: dict, code: str, tried=tried) -> list:
        rows = [(u, {"ms": t, "error": None}) for u, t in ms.items()]
        return [u for u, _ in refine.second_look(ledger, {"code": code}, 2, v, rows, tried,
                                                 model, 64, H200)]
    assert run(times, "a") == [replace(fast, stage_kib=200)]
    assert run({**times, steps: near}, "b") == [replace(fast, stage_kib=200),
                                                replace(fast, step_weights=2)]
    gain = {**times, steps: 0.95}                                 # a gain the best lacks
    assert run(gain, "g") == [replace(fast, step_weights=2), replace(fast, stage_kib=200)]
    assert run({**times, fast: 1.1}, "c") == []                   # nothing got faster
    assert run({**times, deep: far}, "d") == []                   # no near miss
    assert run({**times, replace(fast, stage_kib=200): 0.85}, "e") == []   # timed already
    best = replace(fast, step_weights=2)                           # a compound, fastest
    both = [(replace(v, balance=True, stage_kib=100), 1.0)]       # agrees on best's balance
    assert run({v: 1.0, best: 0.85, both[0][0]: near}, "f", both) == \
        [replace(best, stage_kib=100)]
    wide = replace(v, stage_kib=200)                              # the fastest sets stage_kib
    other = [(replace(v, stage_kib=100, balance=True), 1.0)]      # to another value than this
    assert run({v: 1.0, wide: 0.9, other[0][0]: near}, "h", other) == []
    monkeypatch.setattr(refine, "op_graph", lambda *a: pytest.fail("rated again"))
    assert run(times, "a") == [replace(fast, stage_kib=200)]
