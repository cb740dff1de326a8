"""``runtime.effective``: a variant normalised to the kernel the compiler builds from it for one
op graph (tiny-llama and tiny-qwen3 at 3 rows, context 64), so that variants alike build once."""
from dataclasses import replace
from functools import cache

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from megakernel.compiler.capture import capture
from megakernel.compiler.lower import lower
from megakernel.compiler.tile import TileConfig
from megakernel.models import load_model
from megakernel.runtime.effective import effective
from megakernel.runtime.variant import SWITCHES, Variant, parse_variant

V = Variant(32, 64, 4, 132, kv_split=16, qkv_parts=4)


@cache
def graph(name: str, batch: int):
    """The op graph of a tiny model at ``batch`` rows, context 64 (lowered once)."""
    return lower(capture(load_model(name, progress=False).model, batch, 64), 4)


@pytest.fixture(scope="module")
def ops():
    """tiny-qwen3 (head norms, 2 kv heads) at 3 rows."""
    return graph("tiny-qwen3", 3)


@pytest.fixture(scope="module")
def llama():
    return graph("tiny-llama", 3)


def test_qkv_pieces_and_keys_per_task_as_the_tiler_builds_them(ops):
    v = V
    for name, hn, parts in [("tiny-llama", False, 4), ("tiny-qwen3", False, 1),  # head norms
                            ("tiny-qwen3", True, 4)]:
        built = effective(graph(name, 3), replace(v, split_head_norm=hn))
        assert built.qkv_parts == parts and built.split_head_norm == (hn or name == "tiny-llama")
        assert built.kv_split >= 16 and 64 % built.kv_split == 0
    assert effective(ops, replace(v, workers=1)).kv_split == 64   # one worker: one split
    # keys per task beyond the context (64) build what the whole context does
    assert effective(ops, replace(v, kv_split=128)) == \
        effective(ops, replace(v, kv_split=64))
    # a higher attention task limit: more splits where the limit raised the span, else the
    # same kernel as the default limit
    few, more = (effective(ops, replace(v, workers=4, attn_tasks_per_worker=a))
                 for a in (2, 8))
    assert more.kv_split < few.kv_split and more.attn_tasks_per_worker == 8
    assert effective(ops, replace(v, attn_tasks_per_worker=8)) == effective(ops, v)
    # a limit that only raised the span to what the default limit keeps: the same kernel
    low = effective(ops, replace(v, workers=4, attn_tasks_per_worker=1))
    assert low.kv_split > 16
    assert low == effective(ops, replace(v, workers=4, kv_split=low.kv_split))
    # streamed attention: keys per task, their limit and balance mean nothing there
    streamed = effective(ops, replace(v, attn_stream=True))
    assert streamed.attn_stream and streamed.kv_split == TileConfig.kv_split
    assert effective(ops, replace(v, attn_stream=True, kv_split=32, attn_balance=True,
                                         attn_tasks_per_worker=8)) == streamed
    assert parse_variant(streamed.label) == streamed
    blocked = effective(ops, replace(v, attn_stream=True, kv_block=32, kv_split=32))
    assert blocked.kv_split == TileConfig.kv_split and blocked.kv_block == 32
    wide = effective(ops, replace(v, attn_stream=True, kv_block=128, kv_split=128))
    assert wide.kv_split == 128 and parse_variant(wide.label) == wide
    # the KV cache a task ahead: streams have no prefetch body
    assert effective(ops, replace(v, attn_stream=True, prefetch_kv_ahead=128)) == streamed
    ahead = effective(ops, replace(v, prefetch_kv_ahead=128))
    assert ahead.prefetch_kv_ahead == 128 and parse_variant(ahead.label) == ahead
    # their evict_last priority only with a KV prefetch to give it to
    assert effective(ops, replace(v, prefetch_kv_last=True)) == effective(ops, v)
    last = effective(ops, replace(v, prefetch_kv_ahead=128, prefetch_kv_last=True))
    assert last.prefetch_kv_last and "xkn128xke" in last.label
    assert parse_variant(last.label) == last


def test_attention_layouts_only_where_they_apply(ops):
    v, streamed = V, effective(ops, replace(V, attn_stream=True))
    # pairs of kv heads per task: only where each unit's keys are one task's; or streamed
    # units of a row's pairs (groups) of kv heads
    paired = effective(ops, replace(v, attn_pairs=True, kv_split=64))
    assert paired.attn_pairs and parse_variant(paired.label) == paired
    assert effective(ops, replace(v, attn_pairs=True)) == effective(ops, v)
    grouped = effective(ops, replace(v, attn_pairs=True, attn_stream=True))
    assert grouped.attn_pairs and grouped.attn_stream and parse_variant(grouped.label) == grouped
    # the keys as the dots' M: whole pairs and streams of pairs (or groups), not of single heads
    assert effective(ops, replace(grouped, attn_keys_m=True)).attn_keys_m
    assert effective(ops, replace(paired, attn_keys_m=True)).attn_keys_m
    assert effective(ops, replace(streamed, attn_keys_m=True)) == streamed
    # stacked queries: pair streams' own loop (with the keys as M too)
    stacked = effective(ops, replace(grouped, attn_stack=True))
    assert stacked.attn_stack and parse_variant(stacked.label) == stacked
    assert effective(ops, replace(streamed, attn_stack=True)) == streamed
    assert effective(ops, replace(grouped, attn_stack=True, attn_keys_m=True)).attn_stack
    assert effective(ops, replace(paired, attn_stack=True)) == paired
    # groups of 4 kv heads: not with 2 kv heads (tiny-qwen3), and the size means nothing alone
    assert effective(ops, replace(v, attn_pairs=True, attn_group=4, kv_split=64)) == \
        effective(ops, replace(v, kv_split=64))
    assert effective(ops, replace(v, attn_pairs=True, attn_group=4, attn_stream=True)) == \
        streamed
    assert effective(ops, replace(v, attn_group=4)) == effective(ops, v)
    # pairs over key ranges: where units have several, and only with pairs
    ranged = effective(ops, replace(v, attn_pairs=True, attn_pair_ranges=True,
                                           attn_tasks_per_worker=0))
    assert ranged.attn_pairs and ranged.attn_pair_ranges and parse_variant(ranged.label) == ranged
    assert not effective(ops, replace(v, attn_pair_ranges=True)).attn_pair_ranges
    assert not effective(ops, replace(v, attn_pairs=True, attn_pair_ranges=True,
                                             kv_split=64)).attn_pair_ranges
    # spilled units: only where units overrun whole rounds of the workers by a few (tiny-qwen3
    # at 3 rows: 6 units, 5 workers: the sixth cut in 16-key pieces), never with pairs
    spilled = effective(ops, replace(v, workers=5, kv_split=64, attn_spill=True))
    assert spilled.attn_spill and parse_variant(spilled.label) == spilled
    for other in (dict(workers=6), dict(workers=7), dict(attn_pairs=True),
                  dict(kv_split=32, attn_tasks_per_worker=0)):
        spill = dict(workers=5, kv_split=64, attn_spill=True) | other
        assert not effective(ops, replace(v, **spill)).attn_spill
    # fused combines: only where some unit has several pieces of plain attention tasks or of
    # pairs over key ranges
    fused = effective(ops, replace(v, fuse_combine=True, kv_split=16, attn_tasks_per_worker=0))
    assert fused.fuse_combine and parse_variant(fused.label) == fused
    ranged = dict(attn_pairs=True, attn_pair_ranges=True, attn_tasks_per_worker=0)
    assert effective(ops, replace(v, fuse_combine=True, kv_split=16, **ranged)).fuse_combine
    for other in (dict(kv_split=64), dict(attn_stream=True), ranged | dict(kv_split=64)):
        assert not effective(ops, replace(v, fuse_combine=True, **other)).fuse_combine


def test_norm_and_slicing_switches_only_where_they_change_the_kernel(ops, llama):
    v = V
    # norms from their inputs' writers' sums of squares: only with norm first, then no fused
    # reduce and norm
    both = dict(norm_first=True, split_k=2, reduce_norm=True)
    summed = effective(ops, replace(v, norm_sums=True, **both))
    assert summed.norm_sums and not summed.reduce_norm and parse_variant(summed.label) == summed
    assert not effective(ops, replace(v, norm_sums=True, **(both | dict(norm_first=False)))
                         ).norm_sums
    whole = effective(ops, replace(v, norm_sums=True, **(both | dict(split_k=1))))
    assert whole.norm_sums and not whole.reduce_norm      # whole columns write the sums too
    # K slices that reduce themselves: only where some are reduced by columns (not with the
    # reduce by rows and the norm, nor without slices)
    reduced = effective(ops, replace(v, split_k=2, fuse_reduce=True))
    assert reduced.fuse_reduce and parse_variant(reduced.label) == reduced
    assert effective(ops, replace(v, fuse_reduce=True, norm_sums=True, **both)).fuse_reduce
    for other in (dict(split_k=1), both):
        assert not effective(ops, replace(v, fuse_reduce=True, **other)).fuse_reduce
    # slices of the long projections only: where that leaves some unsliced (tiny-llama's o has
    # K 96 as its hidden size, down 224); where it leaves none sliced, no slices
    long = effective(llama, replace(v, split_k=2, split_long=True))
    assert (long.split_k, long.split_long) == (2, True) and long.label.endswith("xsk2xkl")
    assert parse_variant(long.label) == long
    assert effective(llama, replace(v, split_k=4, split_long=True)) == \
        effective(llama, replace(v, split_k=4))           # 224 is not 4 slices of 16s: none
    assert effective(ops, replace(v, split_k=2, split_long=True)) == \
        effective(ops, replace(v, split_k=2))    # qwen3: o's K 96 over its hidden 80, down whole
    assert effective(llama, replace(v, split_k=2, split_long=True, norm_first=True,
                                    reduce_norm=True)).label.endswith("xnfxrnxsk2xkl")
    # the long projections' own slices: kept where they change some projection's (down's 224
    # in 2; o's 96 in 3, or whole)
    own = effective(llama, replace(v, split_k=3, long_slices=2))
    assert (own.split_k, own.long_slices) == (3, 2) and own.label.endswith("xsk3xls2")
    assert parse_variant(own.label) == own
    down_only = effective(llama, replace(v, split_k=1, long_slices=2, norm_first=True,
                                         reduce_norm=True))
    assert (down_only.split_k, down_only.long_slices, down_only.reduce_norm) == (1, 2, True)
    assert effective(llama, replace(v, split_k=2, long_slices=2)) == \
        effective(llama, replace(v, split_k=2))
    assert effective(llama, replace(v, split_k=3, split_long=True, long_slices=2)) == \
        effective(llama, replace(v, split_k=2, split_long=True))
    assert effective(llama, replace(v, split_k=1, long_slices=4)) == \
        effective(llama, replace(v, split_k=1))          # 224 is not 4 slices of 16s: none


def test_qkv_across_heads_and_attention_rows(ops, llama):
    v = V
    # q/k/v pieces across heads: none with head norms (tiny-qwen3 here); elsewhere their
    # pieces per head mean nothing
    assert effective(ops, replace(v, qkv_cross=True)) == effective(ops, v)
    cross = effective(llama, replace(v, qkv_cross=True, qkv_parts=4))
    assert cross.qkv_cross and cross.qkv_parts == TileConfig.qkv_parts
    assert parse_variant(cross.label) == cross and "xqc" in cross.label
    # attention rows: kept where they pad a kv head's query heads to another size
    group = ops.dims.heads // ops.dims.kv_heads
    for rows in (8, 16):
        kept = effective(ops, replace(v, attn_rows=rows)).attn_rows
        pads = [max(r, 1 << (group - 1).bit_length()) for r in (rows, TileConfig.attn_rows)]
        assert kept == (rows if pads[0] != pads[1] else TileConfig.attn_rows)


PREFETCH = ["pn0", "pw0", "pf0", "pf128", "pa2", "pt50", "ps0", "fw", "pc", "pk"]
assert not any("x" in flag for flag in SWITCHES)      # "x" separates a label's flags
FLAGS = sorted(set(SWITCHES) - set(PREFETCH)) + [
    "s2", "sm200", "sw2", "kv32", "kv64", "q1", "q2", "qs2", "ag4", "sk1", "sk2", "ls2", "kb32",
    "at0", "ar8", "kn32", "bo100", "rg128", "tm16", "ru0", "fo1", "fr32", "as4"]


@settings(max_examples=150, deadline=None)
@example("tiny-llama", 1, [], [], ["pt50", "pw0"])     # a start without prefetches between polls
@given(st.sampled_from(["tiny-llama", "tiny-qwen3"]), st.sampled_from([1, 3, 8]),
       st.lists(st.sampled_from(FLAGS), max_size=6), st.sampled_from([[], ["np"]]),
       st.lists(st.sampled_from(PREFETCH), max_size=3))
def test_a_variant_as_built_is_built_as_itself_and_its_label_says_it(name, batch, flags, off,
                                                                     prefetch):
    """``effective`` is idempotent, and its result's label parses back to it (the ledger keys
    variants by label), whatever flags are asked together (the weights' prefetch settings
    with or without the prefetch)."""
    ops = graph(name, batch)
    built = effective(ops, parse_variant("x".join(["32x64x4x132", *flags, *prefetch, *off])))
    assert effective(ops, built) == built
    assert parse_variant(built.label) == built
