"""The autotuner's search space and shortlist (``runtime.search``): candidates that fit the
target, variants rated by the cost model as they will be built, the schedule classes timed."""
from dataclasses import replace

import pytest

from megakernel.compiler.capture import capture
from megakernel.compiler.cost import CPU_INTERPRETER, H200
from megakernel.compiler.lower import lower
from megakernel.models import load_model
from megakernel.runtime import search
from megakernel.runtime.effective import effective
from megakernel.runtime.variant import Variant, parse_variant

SPACE = {"block_n": (16, 32), "block_k": (32,), "stages": (1, 2), "num_warps": (4,),
         "workers_per_sm": (1,), "kv_split": (16, 32), "qkv_parts": (1, 2)}


def test_candidates_respect_shared_memory_and_the_interpreter():
    big = dict(SPACE, block_n=(128,), block_k=(512,), stages=(4,), workers_per_sm=(1, 2))
    assert search.candidates(H200, big) == []                 # 1 MB of stages per program
    wide = dict(SPACE, block_n=(128,), block_k=(128, 256), stages=(2, 3))
    assert {(v.block_k, v.stages) for v in search.candidates(H200, wide)} == {
        (128, 2), (128, 3), (256, 2)}                         # 128 x 256 in 3 stages: 295 KB
    fits = search.candidates(H200, dict(SPACE, workers_per_sm=(1, 2), prefetch_kv=(False, True),
                                        prefetch_kb=(64, 256)))
    assert {v.workers for v in fits} == {132, 264}
    assert {v.prefetch_kv for v in fits} == {False, True}
    assert {v.prefetch_kb for v in fits} == {64, 256}
    cpu = search.candidates(CPU_INTERPRETER, dict(SPACE, workers_per_sm=(1, 2),
                                                  prefetch_kv=(False, True), prefetch_kb=(64, 256)))
    assert {v.workers for v in cpu} == {1}
    # GPU-only switches: no duplicates
    assert not any(v.prefetch_kv for v in cpu) and {v.prefetch_kb for v in cpu} == {64}
    # cache blocks: only where the keys per task are whole blocks (streams: their tasks ignore
    # the keys per task, set to a block's)
    blocks = search.candidates(H200, search.SPACE)
    assert {v.kv_block for v in blocks} == {16, 128}
    assert all(v.kv_split % v.kv_block == 0 and v.tile.kv_block == v.kv_block for v in blocks)
    assert {v.kv_split for v in blocks if v.kv_block == 128} == {128}
    assert any(v.attn_stream for v in blocks if v.kv_block == 128)


def test_the_shortlist_takes_the_largest_cache_block_of_variants_alike():
    """Variants equal but for the cache block (and a stream's keys per task, which follow it):
    only the one with the largest block stays, in order; others stay as they are."""
    v = Variant(32, 32, 4, 132, kv_split=128)
    small, large = v, replace(v, kv_block=128)
    other = replace(v, kv_split=64)
    stream = replace(v, attn_stream=True, kv_split=64)
    stream_large = replace(stream, kv_block=128, kv_split=128)
    kept = search.largest_blocks([small, other, stream, large, stream_large])
    assert kept == [other, large, stream_large]


def test_rating_tiles_each_repeated_op_once_and_adds_up_to_the_whole_graph():
    from megakernel.compiler.cost import op_waves_us
    from megakernel.compiler.tile import tile_tasks

    for name in ("tiny-llama", "tiny-qwen3"):
        ops = lower(capture(load_model(name, progress=False).model, 3, 64), 4)
        alike = search.alike_ops(ops)
        assert sum(n for _, n in alike) == len(ops.ops) and ops.dims.layers > 1
        assert len(alike) < len(ops.ops)                          # the layers' ops tile alike
        for label in ("32x64x4x132xs3", "16x64x4x264xs3xkv32xat4xsk2xhn0"):
            v = parse_variant(label)
            whole = op_waves_us(tile_tasks(ops, v.tile, v.workers).tasks,
                                replace(H200, workers_per_sm=-(-v.workers // H200.sms)),
                                v.workers)
            assert search.predict(ops, v, H200) == pytest.approx(whole, rel=1e-9)


def test_a_shared_memo_rates_each_variant_as_tiling_it_again():
    """``predict`` with one memo over a shortlist's variants (each op's cost kept with the tile
    knobs its tiler read) gives every variant the figure a fresh tiling gives, reusing most."""
    from megakernel.compiler.pipeline import model_ops

    ops = model_ops(load_model("tiny-llama", progress=False).model, 3, 64)
    space = dict(SPACE, split_k=(1, 2), attn_stream=(False, True), norm_first=(False, True),
                 workers_per_sm=(1, 2))
    variants = list(dict.fromkeys(effective(ops, v) for v in search.candidates(H200, space)))
    costs, alike = {}, search.alike_ops(ops)
    for v in variants:
        assert search.predict(ops, v, H200, alike, costs) == search.predict(ops, v, H200, alike)
    assert len({v.workers for v in variants}) == 2
    assert sum(map(len, costs.values())) < len(variants) * len(alike) // 4


def test_shortlist_times_the_default_and_every_attention_layout_near_it():

    ops = lower(capture(load_model("tiny-llama", progress=False).model, 3, 64), 4)
    space = dict(SPACE, block_n=(32, 64), block_k=(256,), stages=(3,), num_warps=(4, 8),
                 kv_split=(16, 32, 64), split_k=(1, 2),        # the default's values too
                 attn_pairs=(False, True))
    picks = search.shortlist(ops, H200, space, 1)
    default, variants = picks[0][0], [v for v, _ in picks]
    home = search.schedule_class(default)
    assert len(set(variants)) == len(variants)
    # the default's schedule class with each code-level knob
    assert {v.num_warps for v in variants if search.schedule_class(v) == home} == {4, 8}
    layouts = {v.kv_split for v in search.candidates(H200, space)
               for v in [effective(ops, v)] if v.workers == default.workers}
    assert len(layouts) > 1 and {v.kv_split for v in variants} == layouts
    # each layout's class is the one nearest the default: only the attention knobs differ
    for span in layouts - {default.kv_split}:
        nearest = [v for v in variants if v.kv_split == span and v.split_k == default.split_k
                   and v.qkv_parts == default.qkv_parts and v.block_n == default.block_n]
        assert nearest, span
    # pairs of kv heads are a layout of their own wherever they apply
    paired = {v.kv_split for v in search.candidates(H200, space)
              for v in [effective(ops, v)] if v.attn_pairs and v.workers == default.workers}
    assert paired and paired == {v.kv_split for v in variants if v.attn_pairs}
    # each class timed is timed with the K slices' reduce fused with the norm too, where it can be
    # (8 rows: norm first by default)
    ops = lower(capture(load_model("tiny-llama", progress=False).model, 8, 64), 4)
    fusable = dict(space, split_k=(1, 4), norm_first=(False, True), reduce_norm=(False, True))
    timed = {search.schedule_class(v) for v, _ in search.shortlist(ops, H200, fusable, 1)}
    rated = {search.schedule_class(effective(ops, v))
             for v in search.candidates(H200, fusable)}
    siblings = {search.fused_sibling(k) for k in timed} & rated
    assert siblings and siblings <= timed
    # cache blocks that do not divide the context (64 keys) are never timed
    wide = dict(space, kv_block=(16, 128), kv_split=(64, 128), attn_stream=(False, True))
    blocks = {v.kv_block for v, _ in search.shortlist(ops, H200, wide, 1)}
    assert blocks == {16}
