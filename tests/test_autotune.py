"""The autotuner on the CPU (interpreter timings): search, persistence, resume, served winners."""
from dataclasses import replace

import pytest
import torch

from megakernel.compiler.cost import H200
from megakernel.models import load_model
from megakernel.runtime import allocate_kv_cache, autotune as tuning
from megakernel.runtime.megakernel import KernelLibrary, megakernel_backend
from megakernel.runtime.variant import variant_of

SPACE = {"block_n": (16, 32), "block_k": (32,), "stages": (1, 2), "num_warps": (4,),
         "workers_per_sm": (1,), "kv_split": (16, 32), "qkv_parts": (1, 2)}


def test_autotune_keeps_a_correct_winner_per_batch_size_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    loaded = load_model("tiny-llama", progress=False)
    model, folder = loaded.model, tmp_path / "autotune" / "tiny-llama"
    run = lambda jobs: tuning.autotune(model, "tiny-llama", [1, 2], 64, folder, space=SPACE,
                                       classes=1, iters=1, progress=False,
                                       cache_root=tmp_path / "c", processes=jobs)
    def no_compiling(*args, **kwargs):
        raise AssertionError("variants are compiled in the worker processes, not here")

    with monkeypatch.context() as patch:
        patch.setattr("megakernel.compiler.artifact.compile_model", no_compiling)
        winners = run(2)                  # compiled in two worker processes, timed here
    assert [w.batch for w in winners] == [1, 2]
    assert all(w.ms > 0 and w.failed == 0 and w.timed >= 2 for w in winners)
    ledger = tuning.Ledger(folder / "autotune.json")
    assert len(ledger.rows) == sum(w.timed for w in winners)
    assert {(r["batch"], r["variant"]) for r in ledger.rows} >= {(w.batch, w.label) for w in winners}

    def no_timing(*args, **kwargs):
        raise AssertionError("a rerun must not time what autotune.json already holds")

    def no_rating(*args, **kwargs):
        raise AssertionError("a rerun reads each batch size's shortlist from autotune.json")

    monkeypatch.setattr(tuning, "time_variant", no_timing)
    monkeypatch.setattr(tuning, "_plan", no_rating)
    with monkeypatch.context() as patch:  # the kept winners are not compiled or loaded again
        patch.setattr(tuning, "compile_cached", no_compiling)
        assert run(1) == winners
        patch.setattr(tuning, "rules_hash", lambda: "other rules")
        with pytest.raises(AssertionError, match="shortlist"):   # kept plans are rated again
            run(1)

    library = KernelLibrary(folder, model)
    assert library.batch_sizes == [1, 2]
    compiled = library.pick(2, 64)
    assert compiled.options.tile.block_n == int(winners[1].label.split("x")[0])
    cache = allocate_kv_cache(model.config, 2, 64, dtype=torch.float32, device="cpu")
    cache.normal_(generator=torch.Generator().manual_seed(3))
    ref_cache = cache.clone()
    tokens, positions = torch.tensor([[5], [77]]), torch.tensor([[9], [30]])
    got = library.step(compiled, model, cache)(tokens, positions, cache)
    ref = model(tokens, positions, ref_cache)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    # the megakernel backend finds the tuned kernel by itself; explicit options still compile
    assert variant_of(megakernel_backend(model, cache).compiled).label == winners[1].label
    assert megakernel_backend(model, cache, num_warps=8).compiled.options.num_warps == 8


def test_autotune_never_keeps_a_variant_with_wrong_logits(tmp_path, monkeypatch):
    """Each timed step's logits are checked against eager's: a variant whose kernel computes
    something else (here: every 16-column projection step's logits doubled) is recorded as wrong
    with its distance, and the winner is a right one."""
    from megakernel.runtime.megakernel import MegakernelStep

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    model = load_model("tiny-llama", progress=False).model
    call = MegakernelStep.__call__

    def corrupt(self, *args):
        out = call(self, *args)
        return out * 2 if self.compiled.options.tile.block_n == 16 else out

    monkeypatch.setattr(MegakernelStep, "__call__", corrupt)
    space = dict(SPACE, stages=(1,), kv_split=(32,), qkv_parts=(1,))
    folder = tmp_path / "tuned"
    [winner] = tuning.autotune(model, "tiny-llama", [1], 64, folder, space=space, classes=2,
                               iters=1, progress=False, cache_root=tmp_path / "c")
    rows = tuning.Ledger(folder / "autotune.json").rows
    bad = [r for r in rows if r["variant"].startswith("16x")]
    assert bad and all(r["error"].startswith("wrong logits") and r["rel_err"] > 0.5
                       for r in bad)
    assert not winner.label.startswith("16x") and winner.failed == len(bad)
    assert all(r["rel_err"] < 1e-4 for r in rows if r not in bad)


def test_candidates_respect_shared_memory_and_the_interpreter():
    big = dict(SPACE, block_n=(128,), block_k=(512,), stages=(4,), workers_per_sm=(1, 2))
    assert tuning.candidates(H200, big) == []                 # 1 MB of stages per program
    wide = dict(SPACE, block_n=(128,), block_k=(128, 256), stages=(2, 3))
    assert {(v.block_k, v.stages) for v in tuning.candidates(H200, wide)} == {
        (128, 2), (128, 3), (256, 2)}                         # 128 x 256 in 3 stages: 295 KB
    fits = tuning.candidates(H200, dict(SPACE, workers_per_sm=(1, 2), prefetch_kv=(False, True),
                                        prefetch_kb=(64, 256)))
    assert {v.workers for v in fits} == {132, 264}
    assert {v.prefetch_kv for v in fits} == {False, True}
    assert {v.prefetch_kb for v in fits} == {64, 256}
    from megakernel.compiler.cost import CPU_INTERPRETER

    cpu = tuning.candidates(CPU_INTERPRETER, dict(SPACE, workers_per_sm=(1, 2),
                                                  prefetch_kv=(False, True), prefetch_kb=(64, 256)))
    assert {v.workers for v in cpu} == {1}
    # GPU-only switches: no duplicates
    assert not any(v.prefetch_kv for v in cpu) and {v.prefetch_kb for v in cpu} == {64}


def test_rating_tiles_each_repeated_op_once_and_adds_up_to_the_whole_graph():
    from megakernel.compiler.capture import capture
    from megakernel.compiler.cost import op_waves_us
    from megakernel.compiler.lower import lower
    from megakernel.compiler.tile import tile_tasks
    from megakernel.runtime.variant import parse_variant

    for name in ("tiny-llama", "tiny-qwen3"):
        ops = lower(capture(load_model(name, progress=False).model, 3, 64), 4)
        alike = tuning.alike_ops(ops)
        assert sum(n for _, n in alike) == len(ops.ops) and ops.dims.layers > 1
        assert len(alike) < len(ops.ops)                          # the layers' ops tile alike
        for label in ("32x64x4x132xs3", "16x64x4x264xs3xkv32xat4xsk2xhn0"):
            v = parse_variant(label)
            whole = op_waves_us(tile_tasks(ops, v.tile, v.workers).tasks,
                                replace(H200, workers_per_sm=-(-v.workers // H200.sms)),
                                v.workers)
            assert tuning.predict(ops, v, H200) == pytest.approx(whole, rel=1e-9)


def test_variants_are_rated_as_they_will_be_built():
    from megakernel.compiler.capture import capture
    from megakernel.compiler.lower import lower
    from megakernel.compiler.tile import TileConfig
    from megakernel.runtime.variant import Variant, parse_variant

    v = Variant(32, 64, 4, 132, kv_split=16, qkv_parts=4)
    for name, hn, parts in [("tiny-llama", False, 4), ("tiny-qwen3", False, 1),  # head norms
                            ("tiny-qwen3", True, 4)]:
        model = load_model(name, progress=False).model
        ops = lower(capture(model, 3, 64), 4)
        built = tuning.effective(ops, replace(v, split_head_norm=hn))
        assert built.qkv_parts == parts and built.split_head_norm == (hn or name == "tiny-llama")
        assert built.kv_split >= 16 and 64 % built.kv_split == 0
    assert tuning.effective(ops, replace(v, workers=1)).kv_split == 64   # one worker: one split
    # a higher attention task limit: more splits where the limit raised the span, else the
    # same kernel as the default limit
    few, more = (tuning.effective(ops, replace(v, workers=4, attn_tasks_per_worker=a))
                 for a in (2, 8))
    assert more.kv_split < few.kv_split and more.attn_tasks_per_worker == 8
    assert tuning.effective(ops, replace(v, attn_tasks_per_worker=8)) == tuning.effective(ops, v)
    # a limit that only raised the span to what the default limit keeps: the same kernel
    low = tuning.effective(ops, replace(v, workers=4, attn_tasks_per_worker=1))
    assert low.kv_split > 16
    assert low == tuning.effective(ops, replace(v, workers=4, kv_split=low.kv_split))
    # streamed attention: keys per task, their limit and balance mean nothing there
    streamed = tuning.effective(ops, replace(v, attn_stream=True))
    assert streamed.attn_stream and streamed.kv_split == TileConfig.kv_split
    assert tuning.effective(ops, replace(v, attn_stream=True, kv_split=32, attn_balance=True,
                                         attn_tasks_per_worker=8)) == streamed
    assert parse_variant(streamed.label) == streamed
    # q/k/v pieces across heads: none with head norms (tiny-qwen3 here); elsewhere their
    # pieces per head mean nothing
    assert tuning.effective(ops, replace(v, qkv_cross=True)) == tuning.effective(ops, v)
    llama = lower(capture(load_model("tiny-llama", progress=False).model, 3, 64), 4)
    cross = tuning.effective(llama, replace(v, qkv_cross=True, qkv_parts=4))
    assert cross.qkv_cross and cross.qkv_parts == TileConfig.qkv_parts
    assert parse_variant(cross.label) == cross and "xqc" in cross.label
    # attention rows: kept where they pad a kv head's query heads to another size
    group = ops.dims.heads // ops.dims.kv_heads
    for rows in (8, 16):
        kept = tuning.effective(ops, replace(v, attn_rows=rows)).attn_rows
        pads = [max(r, 1 << (group - 1).bit_length()) for r in (rows, TileConfig.attn_rows)]
        assert kept == (rows if pads[0] != pads[1] else TileConfig.attn_rows)


def test_shortlist_times_the_default_and_every_attention_layout_near_it():
    from megakernel.compiler.capture import capture
    from megakernel.compiler.lower import lower

    ops = lower(capture(load_model("tiny-llama", progress=False).model, 3, 64), 4)
    space = dict(SPACE, block_n=(32, 64), block_k=(256,), stages=(3,), num_warps=(4, 8),
                 kv_split=(16, 32, 64), split_k=(1, 2))        # the default's values too
    picks = tuning.shortlist(ops, H200, space, 1)
    default, variants = picks[0][0], [v for v, _ in picks]
    home = tuning.schedule_class(default)
    assert len(set(variants)) == len(variants)
    # the default's schedule class with each code-level knob
    assert {v.num_warps for v in variants if tuning.schedule_class(v) == home} == {4, 8}
    layouts = {v.kv_split for v in tuning.candidates(H200, space)
               for v in [tuning.effective(ops, v)] if v.workers == default.workers}
    assert len(layouts) > 1 and {v.kv_split for v in variants} == layouts
    # each layout's class is the one nearest the default: only the attention knobs differ
    for span in layouts - {default.kv_split}:
        nearest = [v for v in variants if v.kv_split == span and v.split_k == default.split_k
                   and v.qkv_parts == default.qkv_parts and v.block_n == default.block_n]
        assert nearest, span
