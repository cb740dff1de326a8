"""In-kernel trace stamps (tick order under the interpreter) and the timeline."""
import json

import numpy as np
import pytest
import torch

from megakernel.cli import main
from megakernel.compiler.pipeline import CompileOptions
from megakernel.compiler.tile import TileConfig
from megakernel.models import load_model
from megakernel.runtime import allocate_kv_cache
from megakernel.runtime.megakernel import megakernel_backend
from megakernel.runtime.trace import (LOG_WORDS, TaskTrace, chunk_lines, chunk_table,
                                      critical_path, kind_table, path_table, phase_table,
                                      spread_table, tail_table, trace_step, wait_entries)
from megakernel.runtime.variant import parse_variant


def test_trace_stamps_every_task_in_order():
    model = load_model("tiny-qwen3", progress=False).model
    cache = allocate_kv_cache(model.config, 2, 64, dtype=torch.float32, device="cpu")
    step = megakernel_backend(model, cache, trace=True)
    step(torch.tensor([[3], [4]]), torch.tensor([[0], [9]]), cache)
    traces = trace_step(step)
    assert sorted(t.task for t in traces) == list(range(len(step.compiled.tasks.tasks)))
    by_worker = {}
    for t in traces:
        assert t.wait < t.start < t.end
        by_worker.setdefault(t.worker, []).append(t)
    for queue in by_worker.values():
        assert all(a.end < b.wait for a, b in zip(queue, queue[1:]))
    table = kind_table(traces, step.compiled, 1.0)
    assert sum(r["tasks"] for r in table) == len(traces)
    phases = phase_table(traces, step.compiled, 1.0)     # each layer's phases, in layer order
    assert sum(r["ops"] * r["tasks"] for r in phases) == len(traces)
    layers = model.config.num_layers
    assert [(r["phase"], r["ops"]) for r in phases if r["ops"] == layers][-2:] == \
        [("gate_up", layers), ("down_proj linear", layers)]
    assert all(r["span_us"] >= r["task_us"] > 0 for r in phases)
    spread = spread_table(traces, step.compiled, 1.0)    # no SM under the interpreter
    assert list(spread) == ["by row", "by kv head"] and list(spread["by row"]) == [0, 1]
    assert list(spread["by kv head"]) == list(range(model.config.num_kv_heads))
    assert all(t.sm == -1 for t in traces)
    # one worker under the interpreter: the critical path is its whole queue
    chain = critical_path(traces, step.compiled)
    assert [link.trace.task for link in chain] == list(step.compiled.schedule.queues[0])
    assert chain[0].held_by == "" and {link.held_by for link in chain[1:]} == {"queue"}
    path = path_table(chain, step.compiled, 1.0)
    assert sum(r["tasks"] for r in path) == len(chain)
    assert sum(r["op_us"] + r["hop_us"] + r["dispatch_us"] for r in path) == \
        chain[-1].trace.end - chain[0].trace.start


def test_phase_table_counts_the_counters_each_task_polls():
    """Two layers' o projections, two tasks each, polling 0 + 1 and 3 + 1 counters: one phase
    of 2 ops, 2 tasks an op, 5 / 4 waits a task."""
    from types import SimpleNamespace as NS

    ops = [NS(name=f"o{i}", kind="linear", params={"weight": f"layers.{i}.o_proj.weight"})
           for i in range(2)]
    tasks = [NS(op="o0"), NS(op="o0"), NS(op="o1"), NS(op="o1")]
    compiled = NS(tasks=NS(tasks=tasks, ops=NS(ops=ops)),
                  sync=NS(waits=((), (0,), (0, 1, 2), (1,))))
    traces = [TaskTrace(i, "linear", i, 0, 1 + i, 3 + i) for i in range(4)]
    [row] = phase_table(traces, compiled, 1.0)
    assert (row["phase"], row["ops"], row["tasks"], row["waits"]) == ("o_proj linear", 2, 2, 1.25)
    assert (row["span_us"], row["task_us"]) == (3.0, 2.0)   # o0 from 1 to 4, o1 from 3 to 6


def test_critical_path_follows_the_later_of_inputs_and_queue():
    """Worker 0 runs a then c, worker 1 runs b; c polls b's counter. Where b ends after a, c was
    held up by its input (a hop of c.start - b.end); where a ends later, by its queue."""
    from types import SimpleNamespace

    compiled = SimpleNamespace(sync=SimpleNamespace(signal=(-1, 0, -1), waits=((), (), (0,))),
                               schedule=SimpleNamespace(queues=((0, 2), (1,))))
    late_b = [TaskTrace(0, "linear", 0, 0, 1, 10), TaskTrace(1, "linear", 1, 0, 1, 12),
              TaskTrace(2, "gate_up", 0, 11, 15, 20)]
    chain = critical_path(late_b, compiled)
    assert [(x.trace.task, x.held_by, x.gap) for x in chain] == [(1, "", 0), (2, "input", 3)]
    late_a = [late_b[0], TaskTrace(1, "linear", 1, 0, 1, 8), late_b[2]]
    chain = critical_path(late_a, compiled)
    assert [(x.trace.task, x.held_by, x.gap) for x in chain] == [(0, "", 0), (2, "queue", 5)]


def test_tail_table_tells_a_late_input_from_a_slow_task():
    """Producers p0 (ends 4) and p1 (ends 10) signal counters 0 and 1; consumers c0 polls 0, c1
    polls 1. Where c1 is the last to end, the phase's inputs were ready 0 to 6 ticks apart and
    the last task's came 6 after the first; where c0 runs long and ends last, its input was the
    first one ready."""
    from types import SimpleNamespace as NS

    ops = [NS(name="p", kind="linear", params={"weight": "layers.0.o_proj.weight"}),
           NS(name="c", kind="gate_up", params={})]
    compiled = NS(tasks=NS(tasks=[NS(op="p"), NS(op="p"), NS(op="c"), NS(op="c")],
                           ops=NS(ops=ops)),
                  sync=NS(signal=(0, 1, -1, -1), waits=((), (), (0,), (1,))))
    producers = [TaskTrace(0, "linear", 0, 0, 1, 4), TaskTrace(1, "linear", 1, 0, 1, 10)]
    late = producers + [TaskTrace(2, "gate_up", 0, 4, 5, 9), TaskTrace(3, "gate_up", 1, 10, 11, 15)]
    row = tail_table(late, compiled, 1.0)[1]
    assert row["phase"] == "gate_up"
    assert (row["ready_spread_us"], row["task_us"], row["longest_us"]) == (6.0, 4.0, 4.0)
    assert (row["last_ready_us"], row["last_task_us"], row["end_us"]) == (6.0, 4.0, 11.0)
    slow = producers + [TaskTrace(2, "gate_up", 0, 4, 5, 20), TaskTrace(3, "gate_up", 1, 10, 11, 15)]
    row = tail_table(slow, compiled, 1.0)[1]
    assert (row["last_ready_us"], row["last_task_us"], row["longest_us"]) == (0.0, 15.0, 15.0)


def test_untraced_step_writes_no_stamps():
    model = load_model("tiny-llama", progress=False).model
    cache = allocate_kv_cache(model.config, 1, 64, dtype=torch.float32, device="cpu")
    step = megakernel_backend(model, cache)
    step(torch.tensor([[3]]), torch.tensor([[5]]), cache)
    assert not step.trace_mode and not step.stamps.any()


def test_trace_cli_draws_a_timeline(tmp_path, capsys):
    png, stamps = tmp_path / "timeline.png", tmp_path / "trace.json"
    assert main(["trace", "tiny-llama", "--batch-size", "2", "--context", "64",
                 "--device", "cpu", "--steps", "1", "-o", str(png), "--json", str(stamps),
                 "--variant", "32x64x4x1xgxs1xkv32"]) == 0
    out = capsys.readouterr().out
    assert "qkv_rope" in out and "attn_partial" in out and "what ends each phase" in out
    # what was traced, by its label as the compiler resolved it (keys per task, q/k/v pieces,
    # norm first and K slices decided for this batch)
    assert "kernel: 32x64x4x1xgxs1xkv64xq1xnf0xsk1\n" in out
    assert png.stat().st_size > 5000
    rows = json.loads(stamps.read_text())
    assert sorted(r["task"] for r in rows) == list(range(len(rows)))
    assert {"linear", "gate_up"} <= {r["kind"] for r in rows}


def test_trace_cli_takes_one_model_first_or_by_option(capsys):
    with pytest.raises(SystemExit):
        main(["trace", "tiny-llama", "--model", "tiny-qwen3", "-o", "t.png"])
    assert "two models named" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["trace", "-o", "t.png"])
    assert "a model is required" in capsys.readouterr().err


def test_wait_entries_read_the_logs_as_the_kernel_writes_them():
    """Two workers' logs of n = 3 entries a stream (unused entries zero): consumer entries are
    [index << 32 | chunks << 16 | chunk, top, requested, page landed, synced, products issued],
    producer entries [index << 32 | bytes, begun, flight ok, empty ok, 0, 0]."""
    n = 3
    words = [0] * (2 * 3 * n * LOG_WORDS)

    def put(worker, stream, i, entry):
        at = ((3 * worker + stream) * n + i) * LOG_WORDS
        words[at:at + LOG_WORDS] = entry

    put(1, 0, 0, [7 << 32 | 32 << 16 | 0, 100, 160, 290, 500, 470])
    put(1, 0, 1, [7 << 32 | 32 << 16 | 1, 800, 810, 900, 1000, 990])
    put(1, 0, 2, [9 << 32 | 4 << 16 | 0, 2000, 2001, 2002, 2004, 2003])
    put(0, 2, 0, [5 << 32 | 16384, 50, 80, 90, 0, 0])
    recs = wait_entries(words, n)
    assert [(r["worker"], r["stream"], r["index"]) for r in recs] == [(0, 2, 5), (1, 0, 7),
                                                                      (1, 0, 7), (1, 0, 9)]
    first = recs[1]
    assert (first["chunk"], first["chunks"], first["request"], first["page"], first["x"],
            first["sync"], first["period"]) == (0, 32, 60, 130, 180, 30, 700)
    assert recs[2]["period"] is None and recs[3]["period"] is None   # last of their task
    assert (recs[0]["bytes"], recs[0]["flight"], recs[0]["empty"]) == (16384, 30, 10)
    table = chunk_table([dict(r, kind="k") for r in recs])
    assert [(row["stream"], row["n"]) for row in table] == [("warp 0", 3), ("producer", 1)]
    assert table[0]["period"] == 700 and table[0]["page"] == 90
    assert chunk_lines(table)[1] == ("stream=producer  kind=k  n=1  flight=30  empty=10  "
                                     "period=None")


@pytest.mark.parametrize("flag,late", [("kn128", False), ("kd128", True)])
def test_kv_ahead_labels_set_where_the_prefetch_is_issued(flag, late):
    """``knN``: the next attention task's first N keys asked for before the waits (PREFETCH bit
    16); ``kdN``: once the task has signalled (bit 32)."""
    kv = parse_variant(f"64x64x4x132xkv1024xapx{flag}")
    opts = kv.options(132)
    assert (opts["prefetch_kv_ahead"], opts["prefetch_kv_late"]) == (128, late)
    assert parse_variant(kv.label) == kv and flag in kv.label
    bits = CompileOptions(24, 1024, **opts).switches()["PREFETCH"]
    assert (bits // 16 % 2, bits // 32 % 2) == (not late, late)


def test_evict_last_prefetch_is_the_default_and_el0_turns_it_off():
    """PREFETCH bit 64: the weights asked of L2 with evict_last priority, unless ``el0``; a label
    says only the exception, and ``el`` (the default) still parses."""
    on, off = parse_variant("64x64x4x132"), parse_variant("64x64x4x132xel0")
    assert on == parse_variant("64x64x4x132xel") and "el" not in on.label.split("x")
    assert not off.prefetch_last and parse_variant(off.label) == off and "el0" in off.label
    bits = [CompileOptions(24, 1024, **v.options(132)).switches()["PREFETCH"] for v in (on, off)]
    assert (bits[0] // 64 % 2, bits[1] // 64 % 2) == (1, 0) and bits[0] - bits[1] == 64
    assert CompileOptions(24, 1024).switches(cuda=False)["PREFETCH"] == 0


def test_variant_labels():
    v = parse_variant("64x256x8x264xgxs2xkv32xnp")
    opts = v.options(sms=132)
    assert (opts["num_warps"], opts["num_workers"], opts["workers_per_sm"], opts["prefetch"]) == (
        8, 264, 2, False)
    assert opts["tile"] == TileConfig(block_n=64, block_k=256, gemv=True, stages=2, kv_split=32)
    assert parse_variant(v.label) == v and parse_variant("64x64x4x132").prefetch
    sliced = parse_variant("64x64x4x132xsk4xkl")
    assert sliced.tile.split_long and parse_variant(sliced.label) == sliced
    own = parse_variant("64x64x4x132xsk4xls8")
    assert own.tile.long_slices == 8 and parse_variant(own.label) == own
    assert parse_variant("64x64x4x132xq4").options(132)["tile"].qkv_parts == 4
    rows = parse_variant("64x64x4x132xafxar16")
    assert rows.tile.attn_rows == 16 and rows.label.endswith("xafxar16")
    assert parse_variant(rows.label) == rows
    with pytest.raises(ValueError, match="attn_rows=2"):
        parse_variant("64x64x4x132xar2").tile
    capped = parse_variant("64x64x4x132xpf128")
    assert capped.options(132)["prefetch_kb"] == 128 and parse_variant(capped.label) == capped
    whole = parse_variant("64x64x4x132xpf0")
    assert whole.options(132)["prefetch_kb"] == 0 and parse_variant(whole.label) == whole
    ahead = parse_variant("64x64x4x132xpa1")
    assert ahead.options(132)["prefetch_ahead"] == 1 and parse_variant(ahead.label) == ahead
    late = parse_variant("64x64x4x132xpt50")
    assert late.options(132)["prefetch_start"] == 50 and parse_variant(late.label) == late
    with pytest.raises(ValueError, match="percentage"):
        CompileOptions(1, 64, prefetch_start=150)
    with pytest.raises(ValueError, match="unknown flag 'ka2'"):     # keys asked ahead: removed
        parse_variant("64x64x4x132xafxka2")
    nxt = parse_variant("64x64x4x132xpnxhnxtxru0")
    assert nxt.options(132)["tile"].rms_unroll == 0
    assert nxt.options(132)["prefetch_next"] and parse_variant(nxt.label) == nxt
    assert nxt.options(132)["tile"].split_head_norm and nxt.options(132)["tile"].form == 2
    knobs = parse_variant("64x64x4x132xfo4xfr32xks4096xas3xat4xhn0xplxkv256xkb128")
    tile = knobs.options(132)["tile"]
    assert (tile.fold, tile.fold_rows, tile.kv_step, tile.attn_stages,
            tile.attn_tasks_per_worker, tile.kv_block) == (4, 32, 4096, 3, 4, 128)
    assert not tile.split_head_norm and knobs.options(132)["poll_load"]
    assert parse_variant(knobs.label) == knobs
    slow = parse_variant("64x64x4x132xbo128")
    assert slow.options(132)["spin_backoff_ns"] == 128 and parse_variant(slow.label) == slow
    pairs = parse_variant("64x64x8x132xkv1024xap")
    assert pairs.options(132)["tile"].attn_pairs and parse_variant(pairs.label) == pairs
    wide = parse_variant("64x64x8x132xrg255xaf")
    assert wide.options(132)["max_registers"] == 255 and wide.options(132)["tile"].attn_stream
    assert parse_variant(wide.label) == wide
    calls = parse_variant("64x64x8x132xni")
    assert calls.options(132)["noinline"] and parse_variant(calls.label) == calls
    assert calls.label.endswith("xni") and not parse_variant("64x64x8x132xni0").noinline
    with pytest.raises(ValueError, match="max_registers"):
        CompileOptions(1, 64, max_registers=300)
    with pytest.raises(ValueError, match="unknown flag"):
        parse_variant("64x64x4x132xq")
    deep = parse_variant("64x64x4x132xs3xsm200xkv1024")
    assert deep.options(132)["tile"].stage_kib == 200 and parse_variant(deep.label) == deep


def test_a_compiled_kernel_names_its_variant_and_that_label_builds_it_again():
    """``variant_of``: the options as the compiler resolved them, as a label; compiled again
    from that label, the same kernel and the same queues."""
    from megakernel.compiler.pipeline import compile_model
    from megakernel.runtime.effective import variant_of

    model = load_model("tiny-llama", progress=False).model
    build = lambda label: compile_model(model, CompileOptions(
        2, 64, target="cpu", **parse_variant(label).options(1)), "tiny-llama")
    first = build("32x64x4x1xs2xsm16xkv16xbal")
    again = build(variant_of(first).label)
    assert variant_of(first).stage_kib == 16 and variant_of(first).balance
    assert again.kernel.source == first.kernel.source
    assert again.schedule.queues == first.schedule.queues


def test_prefetch_cap_limits_every_task():
    import megakernel
    from megakernel.compiler.registry import HEADER

    model = load_model("tiny-llama", progress=False).model
    count = HEADER.index("prefetch_count")
    whole, capped = (megakernel.compile(model, 1, 64, target="cpu", prefetch_kb=kb)[1]
                     for kb in (0, 1))
    per_elem = whole.ops.dims.itemsize
    assert whole.encoded.instructions[:, count].max() * per_elem > 1024
    assert capped.encoded.instructions[:, count].max() * per_elem == 1024


def test_prefetch_ahead_names_the_next_tasks_weights():
    import megakernel
    from megakernel.compiler.registry import HEADER

    model = load_model("tiny-llama", progress=False).model
    words = [HEADER.index(h) for h in ("prefetch_weight", "prefetch_offset", "prefetch_count")]
    own, ahead = (megakernel.compile(model, 1, 64, target="cpu", prefetch_ahead=a)[1].encoded
                  for a in (0, 1))
    for first, count in own.queues:
        rows = slice(first, first + count)
        mine, next_ = own.instructions[rows][:, words], ahead.instructions[rows][:, words]
        assert (next_[:-1] == mine[1:]).all() and (next_[-1] == 0).all()
    assert own.instructions[:, words[2]].any()


def test_prefetch_plan_takes_each_tasks_largest_range_capped_a_later_or_the_next_tasks():
    from megakernel.compiler.encode import prefetch_plan

    # attention (no weights), a small projection, one of two ranges, one range, one again, and
    # a column slice of 64 rows of 128 elements (a K slice): capped to whole rows, at least one
    ranges = [[], [[3, 100, 50, 0, 0]], [[4, 0, 600, 0, 0], [6, 0, 300, 0, 0]],
              [[5, 0, 300, 0, 0]], [[7, 0, 10, 0, 0]], [[8, 64, 64 * 128, 128, 512]]]
    assert prefetch_plan(ranges, 256) == [[0, 0, 0, 0, 0], [3, 100, 50, 0, 0],
                                          [4, 0, 256, 0, 0], [5, 0, 256, 0, 0],
                                          [7, 0, 10, 0, 0], [8, 64, 256, 128, 512]]
    assert prefetch_plan(ranges, 100)[5] == [8, 64, 128, 128, 512]
    assert prefetch_plan(ranges, 0, ahead=1) == [[3, 100, 50, 0, 0], [4, 0, 600, 0, 0],
                                                 [5, 0, 300, 0, 0], [7, 0, 10, 0, 0],
                                                 [8, 64, 64 * 128, 128, 512], [0, 0, 0, 0, 0]]
    # columns: every row's first whole lines instead of the first rows (at least one line)
    assert prefetch_plan(ranges, 4096, columns=True)[5] == [8, 64, 64 * 64, 64, 512]
    assert prefetch_plan(ranges, 256, columns=True)[5] == [8, 64, 64 * 64, 64, 512]
    assert prefetch_plan(ranges, 0, columns=True)[5] == ranges[5][0]
    # fill: the attention task (no weights) takes the small projection's range; last stays empty
    assert prefetch_plan(ranges, 256, fill=True)[:2] == [[3, 100, 50, 0, 0]] * 2
    assert prefetch_plan(ranges + [[]], 256, fill=True)[-1] == [0, 0, 0, 0, 0]


def test_prefetch_slices_name_the_k_slices_weights():
    """With ``prefetch_slices`` each K slice of o and down (linear_part) prefetches its own
    column slice of the weight (the slice's row, the matrix's row length as stride, whole rows
    up to the cap); without, none; other tasks alike either way."""
    import megakernel
    from megakernel.compiler.registry import HEADER

    from megakernel.models import PRESETS
    from megakernel.models.weights import empty_model

    model = empty_model(PRESETS["llama-3.2-1b"]).to(torch.bfloat16)    # slices of whole lines
    words = [HEADER.index(h) for h in ("prefetch_weight", "prefetch_offset", "prefetch_count",
                                       "prefetch_row", "prefetch_stride")]
    plain, slices = (megakernel.compile(model, 2, 64, target="h200", tile=TileConfig(split_k=4),
                                        prefetch_slices=p)[2] for p in (False, True))
    kinds = [slices.tasks.tasks[t].kind for q in slices.schedule.queues for t in q]
    parts = np.array([k == "linear_part" for k in kinds])
    assert parts.any()
    a, b = plain.encoded.instructions[:, words], slices.encoded.instructions[:, words]
    assert (a[~parts] == b[~parts]).all() and (a[parts] == 0).all()
    order = [t for q in slices.schedule.queues for t in q]
    for t, row in zip(np.array(order)[parts], b[parts]):
        task, (w, off, count, width, stride) = slices.tasks.tasks[t], row
        weight = next(r for r in task.reads if r.buffer == task.args["weight"])
        (n0, n1), (k0, k1) = weight.box
        k = slices.ops.buffers[weight.buffer].shape[1]
        assert (off, width, stride) == (n0 * k + k0, k1 - k0, k)
        assert count % width == 0 and 0 < count <= min(weight.numel, 64 * 1024 // 2)


def test_prefetch_columns_take_every_rows_first_lines():
    """With ``prefetch_columns`` a capped projection's prefetch (lm_head's, down's slices) names
    all of its weight rows and the first columns of each (the most whole lines within the 64 KiB
    cap): what its loop over K reads first; an uncapped one (o's slices) stays whole."""
    import megakernel
    from megakernel.compiler.registry import HEADER
    from megakernel.models import PRESETS
    from megakernel.models.weights import empty_model

    model = empty_model(PRESETS["llama-3.2-1b"]).to(torch.bfloat16)
    words = [HEADER.index(h) for h in ("prefetch_offset", "prefetch_count", "prefetch_row",
                                       "prefetch_stride")]
    c = megakernel.compile(model, 2, 64, target="h200", tile=TileConfig(split_k=4),
                           prefetch_columns=True)[2]
    order = [t for q in c.schedule.queues for t in q]
    seen = set()
    for t, (off, count, width, stride) in zip(order, c.encoded.instructions[:, words]):
        task = c.tasks.tasks[t]
        weight = next((r for r in task.reads if r.buffer == task.args.get("weight")), None)
        if weight is None or not count or len(weight.box) != 2:
            continue
        (n0, n1), (k0, k1) = weight.box
        k = c.ops.buffers[weight.buffer].shape[1]
        cap, rows = 64 * 1024 // 2, n1 - n0
        assert (off, stride, count) == (n0 * k + k0, k, rows * width) and width % 64 == 0
        if width < k1 - k0:                    # cut: the most whole lines a row the cap holds
            assert count <= cap and (width + 64) * rows > cap
        seen.add((task.kind, width < k1 - k0))
    assert {("linear", True), ("linear_part", True), ("linear_part", False)} <= seen
