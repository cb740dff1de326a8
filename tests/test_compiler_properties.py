"""Properties of the compiler stages on random small models and random task graphs."""
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megakernel.compiler.capture import capture
from megakernel.compiler.cost import H200
from megakernel.compiler.ir import (Buffer, Dims, OpGraph, Region, Schedule, Task, TaskGraph,
                                    merged_writes)
from megakernel.compiler.lower import LoweringError, is_, lower
from megakernel.compiler.schedule import schedule
from megakernel.compiler.sync import plan_sync
from megakernel.compiler.deps import derive_deps
from megakernel.compiler.tile import TileConfig, tile
from megakernel.compiler.validate import (ScheduleError, cache_cells, check_written_once,
                                          cover_counts, validate)
from megakernel.models import ModelConfig
from megakernel.models.weights import empty_model

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def small_models(draw):
    kv, group = draw(st.sampled_from([1, 2, 3, 4])), draw(st.integers(1, 3))
    cfg = ModelConfig(
        arch=draw(st.sampled_from(["llama", "qwen3"])), vocab_size=draw(st.integers(40, 300)),
        hidden_size=draw(st.integers(24, 160) | st.sampled_from([48, 96, 144])),  # K slices
        intermediate_size=draw(st.integers(24, 200)),
        num_layers=draw(st.integers(1, 3)), num_heads=kv * group, num_kv_heads=kv,
        head_dim=draw(st.sampled_from([16, 24, 32])), rms_norm_eps=1e-5, rope_theta=1e4,
        max_position_embeddings=512, tie_word_embeddings=draw(st.booleans()))
    batch, seq = draw(st.integers(1, 5)), 16 * draw(st.integers(1, 6))
    tiles = TileConfig(block_n=draw(st.sampled_from([16, 32, 64])), kv_block=16,
                       kv_split=16 * draw(st.integers(1, 4)),
                       min_block_n=draw(st.sampled_from([4, 16])),
                       qkv_parts=draw(st.sampled_from([1, 2, 3, 8])),
                       qkv_slices=draw(st.sampled_from([1, 2, 3])),
                       split_head_norm=draw(st.booleans()), balance=draw(st.booleans()),
                       split_k=draw(st.sampled_from([1, 2, 3])),
                       split_long=draw(st.booleans()),
                       long_slices=draw(st.sampled_from([0, 2, 3])),
                       attn_balance=draw(st.booleans()), attn_stream=draw(st.booleans()),
                       kv_step=16 * draw(st.sampled_from([16, 32, 512])),
                       norm_first=draw(st.booleans()),
                       reduce_norm=draw(st.booleans()), qkv_cross=draw(st.booleans()),
                       attn_pairs=draw(st.booleans()),
                       attn_group=draw(st.sampled_from([2, 4])),
                       attn_pair_ranges=draw(st.booleans()), attn_spill=draw(st.booleans()),
                       norm_sums=draw(st.booleans()), fuse_reduce=draw(st.booleans()),
                       fuse_combine=draw(st.booleans()))
    spread = draw(st.integers(1, 64))      # workers an op's tasks are spread over (narrower tiles)
    return cfg, batch, seq, tiles, spread


def build(cfg, batch, seq, tiles, spread=1):
    gm = capture(empty_model(cfg), batch, seq)
    return gm, tile(lower(gm, 4), tiles, spread)


def graph_flops(gm, batch, seq) -> int:
    params = dict(gm.named_parameters(remove_duplicate=False))
    total = 0
    for n in gm.graph.nodes:
        if is_(n, "Linear"):
            out, k = params[f"{n.target}.weight"].shape
            total += 2 * batch * out * k
        elif is_(n, "scaled_dot_product_attention"):
            q = n.args[0].meta["tensor_meta"].shape        # [B, H, 1, D]
            total += 4 * q[0] * q[1] * seq * q[3]
    return total


@SETTINGS
@given(small_models())
def test_tiling_writes_every_output_once_and_keeps_the_flops(model):
    cfg, batch, seq, tiles, spread = model
    gm, tg = build(cfg, batch, seq, tiles, spread)
    paint = {name: np.zeros(b.shape if b.space != "cache" else cache_cells(b.shape), np.int32)
             for name, b in tg.ops.buffers.items() if b.space in ("act", "f32", "cache")
             and not name.startswith("inv_freq")}
    # the tasks of one ticket all declare what the last of them writes (a merge or a reduce)
    merged = set()
    for task in tg.tasks:
        mine = merged_writes(task)
        for r in task.writes:
            if r in mine:
                if (mine[r], r) in merged:
                    continue
                merged.add((mine[r], r))
            box = cache_cells(r.box) if r.buffer == "kv_cache" else r.box
            paint[r.buffer][tuple(slice(lo, hi) for lo, hi in box)] += 1
    for name, counts in paint.items():
        assert counts.min() == 1 and counts.max() == 1, name
    assert sum(t.flops for t in tg.tasks) == graph_flops(gm, batch, seq)


@SETTINGS
@given(small_models(), st.integers(1, 40))
def test_validator_accepts_every_produced_schedule(model, workers):
    _, tg = build(*model)
    sched = schedule(tg, H200, workers)
    validate(tg, sched, plan_sync(tg, sched), H200)


@SETTINGS
@given(small_models(), st.integers(2, 24), st.data())
def test_validator_rejects_mutations(model, workers, data):
    _, tg = build(*model)
    sched = schedule(tg, H200, workers)
    sync = plan_sync(tg, sched)
    with_deps = [t for t, d in enumerate(tg.deps) if d]
    t = data.draw(st.sampled_from(with_deps))
    d = data.draw(st.sampled_from(tg.deps[t]))
    dropped = replace(tg, deps=tuple(tuple(x for x in ds if (i, x) != (t, d))
                                     for i, ds in enumerate(tg.deps)))
    with pytest.raises(ScheduleError, match="without depending"):
        validate(dropped, sched, sync, H200)
    cyclic = replace(tg, deps=tuple(ds + ((t,) if i == d else ()) for i, ds in enumerate(tg.deps)))
    with pytest.raises(ScheduleError, match="cycle"):
        validate(cyclic, sched, sync, H200)
    wide = Schedule(H200.max_workers + 1, sched.queues + ((),) * (H200.max_workers + 1 - workers),
                    0.0, "mutated")
    with pytest.raises(ScheduleError, match="resident"):
        validate(tg, wide, sync, H200)
    crossing = [(i, c) for i, ws in enumerate(sync.waits) for c in ws]
    if crossing:
        i, c = data.draw(st.sampled_from(crossing))
        waits = tuple(tuple(x for x in ws if (j, x) != (i, c)) for j, ws in enumerate(sync.waits))
        with pytest.raises(ScheduleError, match="without waiting"):
            validate(tg, sched, replace(sync, waits=waits), H200)


@SETTINGS
@given(small_models(), st.data())
def test_validator_rejects_a_write_lost_or_made_twice(model, data):
    _, tg = build(*model)
    check_written_once(tg)
    volume = lambda r: np.prod([hi - lo for lo, hi in r.box])
    t = data.draw(st.sampled_from([t.id for t in tg.tasks if t.writes and not merged_writes(t)
                                   and volume(t.writes[0])]))
    mutated = lambda writes: replace(tg, tasks=tuple(
        replace(u, writes=writes(u.writes)) if u.id == t else u for u in tg.tasks))
    with pytest.raises(ScheduleError, match="written 0 to 1 times"):
        check_written_once(mutated(lambda w: w[1:]))
    with pytest.raises(ScheduleError, match="written 1 to 2 times"):
        check_written_once(mutated(lambda w: w + w[:1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4).flatmap(lambda shape: st.tuples(
    st.just(tuple(shape)), st.lists(st.tuples(*[st.tuples(st.integers(0, n + 2),
                                                          st.integers(0, n + 2))
                                                for n in shape]), max_size=6))))
def test_cells_cut_at_the_boxes_edges_count_as_every_element(case):
    """The validator counts writes per cell between box edges: the same extremes (all it
    reads) as counting every element, boxes past the shape cut at its end."""
    shape, boxes = case
    boxes = [tuple((min(a, b), max(a, b)) for a, b in box) for box in boxes]
    elements = np.zeros(shape, dtype=np.int32)
    for box in boxes:
        elements[tuple(slice(lo, hi) for lo, hi in box)] += 1
    cells = cover_counts(shape, boxes)
    assert (cells.min(), cells.max()) == (elements.min(), elements.max())
    assert cells.size <= elements.size


@st.composite
def task_graphs(draw):
    n = draw(st.integers(2, 40))
    buffers, tasks = {}, []
    for i in range(n):
        preds = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        buffers[f"b{i}"] = Buffer(f"b{i}", "act", (1,))
        tasks.append(Task(i, f"op{i // 4}", "synthetic", {},
                          tuple(Region(f"b{p}", ((0, 1),)) for p in preds),
                          (Region(f"b{i}", ((0, 1),)),),
                          draw(st.integers(1, 10 ** 6)), draw(st.integers(0, 10 ** 7))))
    dims = Dims(1, 16, 16, 16, 1, 1, 16, 16, 1, 2)
    graph = OpGraph(dims, buffers, (), "b0")
    return TaskGraph(graph, tuple(tasks), derive_deps(tasks))


@SETTINGS
@given(small_models(), st.integers(1, 24))
def test_cpsat_is_never_worse_than_greedy_on_models(model, workers):
    _, tg = build(*model)
    greedy = schedule(tg, H200, workers, "greedy")
    best = schedule(tg, H200, workers, "cpsat")
    assert best.makespan_us <= greedy.makespan_us + 1e-9
    assert dict(best.rated)["greedy"] == pytest.approx(greedy.makespan_us)
    validate(tg, best, plan_sync(tg, best), H200)


@settings(max_examples=25, deadline=None)
@given(task_graphs(), st.integers(1, 8))
def test_cpsat_is_never_worse_than_greedy(graph, workers):
    greedy = schedule(graph, H200, workers, "greedy")
    best = schedule(graph, H200, workers, "cpsat")
    assert best.makespan_us <= greedy.makespan_us + 1e-9
    validate(graph, best, plan_sync(graph, best), H200)


def test_unknown_nodes_are_listed():
    cfg = ModelConfig(arch="llama", vocab_size=50, hidden_size=32, intermediate_size=48,
                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-5,
                      rope_theta=1e4, max_position_embeddings=64, tie_word_embeddings=False)
    gm = capture(empty_model(cfg), 1, 16)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        odd = gm.graph.call_function(torch.tanh, (out.args[0],))
    odd.meta = dict(out.args[0].meta)
    out.args = (odd,)
    with pytest.raises(LoweringError, match="tanh"):
        lower(gm, 4)


def test_deeper_projection_pipelines_fill_the_shared_memory_asked_and_never_shorten():
    """``stage_kib``: each projection loop as many stages as fit (weights of each matrix and
    x per step), never fewer than ``stages``, at most MAX_STAGES; without it, ``stages``."""
    from megakernel.compiler.registry import MAX_STAGES, stages

    d = Dims(batch=64, max_seq_len=1024, hidden=2048, intermediate=8192, heads=32, kv_heads=8,
             head_dim=64, vocab=128256, layers=16, itemsize=2)
    assert stages(64, 128, 64, d, TileConfig()) == TileConfig.stages
    deep = TileConfig(stage_kib=200)
    assert stages(64, 128, 64, d, deep) == 6                     # 32 KiB a stage
    assert stages(64, 128, 64, d, deep, weights=2) == 4          # gate and up: 48 KiB
    assert stages(256, 32, 64, d, deep) == MAX_STAGES            # 20 KiB: 10 would fit
    assert stages(64, 512, 64, d, deep, weights=2) == TileConfig.stages   # 192 KiB: one fits
    with pytest.raises(ValueError, match="stage_kib"):
        TileConfig(stage_kib=-1)


@given(k=st.sampled_from([64, 100, 192, 2048, 3072, 8192]), bn=st.integers(1, 256),
       kib=st.integers(0, 200), weights=st.sampled_from([1, 2]))
def test_staged_rows_fit_the_area(k, bn, kib, weights):
    """``staged_kib``: a staging task's rows, a power of two of at most its own, the most that
    fit the area for every matrix; nothing staged where one row does not fit or rows are not
    whole 16-byte groups."""
    from megakernel.compiler.registry import _staged

    d = Dims(batch=1, max_seq_len=64, hidden=k, intermediate=k, heads=1, kv_heads=1,
             head_dim=64, vocab=k, layers=1, itemsize=2)
    got = _staged(k, bn, d, TileConfig(staged_kib=kib), weights)
    if weights * k * 2 > kib * 1024 or k % 8:
        assert got == {}
        return
    sr = got["STAGED_ROWS"]
    assert sr & (sr - 1) == 0 and sr <= bn and weights * sr * k * 2 <= kib * 1024
    assert 2 * sr > min(bn, kib * 1024 // (weights * k * 2))       # the largest that fits


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_one_matrix_steps_deepen_only_within_gate_ups_step(batch):
    """``step_weights=2``: each one-matrix projection step as deep as with 1 or deeper, a
    deepened one holding no more elements (its weight rows' and x's) than gate_up's step; the
    tasks otherwise the same."""
    from megakernel.compiler.registry import p2

    cfg = ModelConfig(arch="llama", vocab_size=32768, hidden_size=2048, intermediate_size=4096,
                      num_layers=1, num_heads=32, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5,
                      rope_theta=1e4, max_position_embeddings=128, tie_word_embeddings=True)
    ops = lower(capture(empty_model(cfg), batch, 128), 2)
    plain, deep = (tile(ops, TileConfig(step_weights=sw), 132).tasks for sw in (1, 2))
    assert [(t.kind, t.reads, t.writes) for t in plain] == [(t.kind, t.reads, t.writes)
                                                            for t in deep]
    elements = lambda t, weights=1: (p2(t.args["bn"]) * weights + p2(batch)) * t.args["bk"]
    [gate] = {elements(t, 2) for t in deep if t.kind == "gate_up"}
    deeper = 0
    for a, b in zip(plain, deep):
        if a.kind in ("linear", "linear_part", "qkv_rope"):
            assert b.args["bk"] >= a.args["bk"]
        if a.kind in ("linear", "linear_part") and b.args["bk"] > a.args["bk"]:
            assert elements(b) <= gate
            deeper += 1
    assert deeper                                   # lm_head's steps, at least
    with pytest.raises(ValueError, match="step_weights"):
        TileConfig(step_weights=3)


def test_spilled_units_run_their_pieces_first():
    """``attn_spill`` at 17 rows of llama-3.2-1b's attention on 132 workers: 132 whole units,
    the 4 left over in 128-key pieces, each piece first on its worker (before a whole unit),
    each combine on a worker with no piece; the step rated shorter than with pairs."""
    cfg = ModelConfig(arch="llama", vocab_size=4096, hidden_size=2048, intermediate_size=4096,
                      num_layers=1, num_heads=32, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5,
                      rope_theta=1e4, max_position_embeddings=1024, tie_word_embeddings=True)
    ops = lower(capture(empty_model(cfg), 17, 1024), 2)
    tiles = TileConfig(kv_split=1024, kv_block=128, attn_spill=True)
    graph = tile(ops, tiles, 132)
    sched = schedule(graph, H200, 132)
    kind = lambda i: (graph.tasks[i].kind, graph.tasks[i].args.get("direct"))
    queues = [[kind(i) for i in q if graph.tasks[i].kind.startswith("attn")]
              for q in sched.queues]
    assert sum(q.count(("attn_partial", False)) for q in queues) == 32
    assert sum(q.count(("attn_partial", True)) for q in queues) == 132
    for q in queues:
        assert q in ([("attn_partial", True)], [("attn_partial", False), ("attn_partial", True)],
                     [("attn_partial", True), ("attn_combine", None)])
    pairs = schedule(tile(ops, replace(tiles, attn_spill=False, attn_pairs=True), 132), H200, 132)
    assert sched.makespan_us < pairs.makespan_us


@given(st.lists(st.integers(-2 ** 20, 2 ** 20), min_size=1, max_size=8), st.integers(0, 3))
def test_int_words_hold_their_value_over_the_largest_unit_that_divides_them(values, scale):
    """An opcode's int field: its words times the unit give the values back, and the unit is the
    largest power of two up to ALIGN dividing every value; another opcode's words are left."""
    from megakernel.compiler.encode import ALIGN, int_units
    from megakernel.compiler.registry import HEADER_WORDS, NUM_WORDS, REGISTRY

    values = [v << scale for v in values]
    col = HEADER_WORDS + [f.name for f in REGISTRY["linear_part"].words].index("k0")
    ins = np.zeros((len(values) + 1, NUM_WORDS), dtype=np.int32)
    ins[:-1, 0], ins[-1, 0] = 0, 1
    ins[:-1, col], ins[-1, col] = values, 3
    [(_, _, _, units), (_, _, _, other)] = int_units(ins, [(0, "linear_part", {}),
                                                          (1, "attn_combine", {})])
    unit = units["k0"]
    assert ins[:-1, col].tolist() == [v // unit for v in values] and ins[-1, col] == 3
    assert unit & (unit - 1) == 0 and unit <= ALIGN
    assert unit == ALIGN or any(v % (2 * unit) for v in values)
    assert set(units) == {"n0", "n1", "k0", "s"} and set(other) == {"row", "kv_head", "first",
                                                                   "count"}
