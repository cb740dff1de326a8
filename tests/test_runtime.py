"""Sampling, the engine's guards, FX tracing and the CLI on the built-in tiny models."""
import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megakernel.cli import main
from megakernel.models import ByteTokenizer, load_model
from megakernel.runtime import (Engine, NonFiniteLogitsError, SamplingParams, allocate_kv_cache,
                                sample)
from megakernel.runtime.sampling import filter_logits


def test_greedy_is_argmax():
    logits = torch.randn(4, 50)
    assert torch.equal(sample(logits, SamplingParams(), None, 0), logits.argmax(-1))


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 20), seed=st.integers(0, 2**31 - 1))
def test_top_k_samples_only_from_the_k_largest(k, seed):
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(seed))
    params = SamplingParams(temperature=1.5, top_k=k, seed=seed)
    allowed = torch.topk(logits, k, dim=-1).indices
    gen = params.generator("cpu")
    for step in range(5):
        tok = sample(logits, params, gen, step)
        assert all(tok[b] in allowed[b] for b in range(3))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = torch.isfinite(filter_logits(probs.log(), 0, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(filter_logits(probs.log(), 0, 0.1))
    assert kept.tolist() == [[True, False, False, False]]


def test_seeded_sampling_repeats_and_seeds_differ():
    logits = torch.randn(2, 1000)
    draw = lambda seed: [sample(logits, SamplingParams(1.0, seed=seed), g, i).tolist()
                         for g in [SamplingParams(seed=seed).generator("cpu")] for i in range(8)]
    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def test_non_finite_logits_name_step_and_sequence():
    logits = torch.randn(3, 10)
    logits[2, 4] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match=r"step 7.*\[2\]"):
        sample(logits, SamplingParams(), None, 7)


def test_engine_raises_on_nan_weights():
    loaded = load_model("tiny-llama", progress=False)
    loaded.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match="step 0"):
        Engine(loaded.model, max_seq_len=32).generate([[1, 2, 3], [4]], 4)


def test_engine_reports_a_late_watchdog_trip_before_the_logits_it_spoiled(monkeypatch):
    """A decode step whose kernel tripped (reported only on a later read of its error word)
    hands back NaN logits: the engine raises the watchdog's error, not the NaN it caused."""
    from megakernel.runtime.megakernel import WatchdogError

    class Tripped:
        def __call__(self, tokens, positions, cache):
            return torch.full((tokens.shape[0], 1, 8), float("nan"))

        def synchronize(self):
            raise WatchdogError("megakernel watchdog: task 3 waited past its bound")

    engine = Engine(load_model("tiny-llama", progress=False).model, max_seq_len=32)
    plan = engine._plan
    monkeypatch.setattr(engine, "_plan", lambda *a: plan(*a)[:2] + (Tripped(),))
    with pytest.raises(WatchdogError, match="task 3"):
        engine.generate([[1, 2, 3]], 4)


@pytest.mark.parametrize("prompts, steps, message", [
    ([], 4, "no prompts"),
    ([[1], []], 4, "prompt 1 is empty"),
    ([[1, 999]], 4, "999"),
    ([[1] * 30], 4, "max_seq_len"),
    ([[1]], 0, "max_new_tokens"),
])
def test_engine_rejects_bad_input(prompts, steps, message):
    engine = Engine(load_model("tiny-qwen3", progress=False).model, max_seq_len=32)
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, steps)


def test_batch_rows_equal_single_rows():
    """A row's tokens must not depend on its neighbours or on padding."""
    engine = Engine(load_model("tiny-llama", progress=False).model, max_seq_len=64)
    prompts = [[256, 1, 2, 3, 4, 5, 6], [256, 9], [256, 40, 41, 42]]
    batch = engine.generate(prompts, 12).generated_ids
    assert batch == [engine.generate([p], 12).generated_ids[0] for p in prompts]


def test_eos_stops_a_row():
    engine = Engine(load_model("tiny-llama", progress=False).model, max_seq_len=64)
    free = engine.generate([[256, 7, 8]], 10).generated_ids[0]
    stopped = engine.generate([[256, 7, 8]], 10, eos_ids=(free[2],)).generated_ids[0]
    assert stopped == free[: free.index(free[2]) + 1]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_fx_trace_matches_eager(name):
    model = load_model(name, progress=False).model
    traced = torch.fx.symbolic_trace(model, concrete_args={"logit_index": None})
    tokens = torch.randint(0, 259, (3, 1))
    positions = torch.tensor([[4], [0], [9]])
    caches = [allocate_kv_cache(model.config, 3, 16, dtype=torch.float32, device="cpu")
              for _ in range(2)]
    for c in caches:
        c.normal_(generator=torch.Generator().manual_seed(0))
    out_eager, out_traced = model(tokens, positions, caches[0]), traced(tokens, positions, caches[1])
    assert torch.equal(out_eager, out_traced)
    assert torch.equal(caches[0], caches[1])


def test_byte_tokenizer_round_trips():
    tok = ByteTokenizer()
    text = "héllo, wörld"
    assert tok.decode(tok.encode(text)) == text


def test_cli_generate_json(capsys):
    assert main(["generate", "--model", "tiny-llama", "--prompt", "hello", "--prompt", "hi there",
                 "--max-new-tokens", "16", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_ids"][0] == ByteTokenizer().encode("hello")
    assert [len(g) for g in out["generated_ids"]] == [16, 16]
    assert len(out["text"]) == 2


def test_the_cli_loads_triton_only_once_a_command_runs():
    """On the CPU the CLI turns the Triton interpreter on when a command asks for it, which
    works only if nothing imported triton before: not the module, not its parser."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import sys, megakernel.cli as c; c.build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_console_script_reports_bad_model():
    proc = subprocess.run([sys.executable, "-m", "megakernel", "generate", "--model", "no-such",
                           "--prompt", "x", "--device", "cpu"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "no-such" in proc.stderr and "tiny-llama" in proc.stderr


def test_bench_decode_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = ["bench", "decode", "--model", "tiny-qwen3", "--batch-sizes", "1,2", "--context", "16",
            "--backends", "eager", "--device", "cpu", "--warmup", "1", "--iters", "3"]
    assert main(args + ["--json", str(out), "--plot", str(png)]) == 0
    report = json.loads(out.read_text())
    assert [(r["batch_size"], r["backend"]) for r in report["results"]] == [(1, "eager"), (2, "eager")]
    assert all(r["ms_per_token"] > 0 and r["achieved_TBps"] > 0 for r in report["results"])
    assert png.stat().st_size > 1000
    assert main(args[:5] + ["3", *args[6:], "--json", str(out)]) == 0  # merges, keeps old rows
    assert len(json.loads(out.read_text())["results"]) == 3
    # a plot format matplotlib does not write: refused before anything is timed
    assert main(args + ["--json", str(tmp_path / "no.json"), "--plot", str(tmp_path / "r.txt")]) == 1
    assert "format .txt" in capsys.readouterr().err and not (tmp_path / "no.json").exists()


def test_bench_decode_times_eager_after_every_other_backend():
    from megakernel.bench.decode import timing_order

    assert timing_order([1, 8], ["eager", "torch-compile", "megakernel"]) == [
        (1, ["torch-compile", "megakernel"]), (8, ["torch-compile", "megakernel"]),
        (1, ["eager"]), (8, ["eager"])]
    assert timing_order([2], ["eager"]) == [(2, ["eager"])]
    assert timing_order([2], ["megakernel"]) == [(2, ["megakernel"])]


def test_bench_decode_times_the_kernels_of_a_folder(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["compile", "tiny-qwen3", "--batch-sizes", "2", "--max-seq-len", "16",
                 "--device", "cpu", "--scheduler", "greedy", "-o", str(tmp_path / "k")]) == 0
    args = ["bench", "decode", "--model", "tiny-qwen3", "--context", "16", "--device", "cpu",
            "--backends", "megakernel", "--warmup", "0", "--iters", "1",
            "--kernels", str(tmp_path / "k"), "--json", str(out)]
    assert main(args + ["--batch-sizes", "2"]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["backend"] == "megakernel" and row["variant"].startswith("64x256x4x1x")
    assert main(args + ["--batch-sizes", "1"]) == 1
    assert "no kernel for batch 1" in capsys.readouterr().err
    out.unlink()
    assert main(args + ["--batch-sizes", "2,1"]) == 1         # the rows timed before it are kept
    assert [r["batch_size"] for r in json.loads(out.read_text())["results"]] == [2]


class _Event:
    """Stands in for a CUDA event of a step that has finished or not."""

    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_late_watchdog_errors_surface_from_later_calls_or_synchronize():
    """The GPU path's bookkeeping, driven by stand-in events: a step that tripped is raised once
    it has finished, or once more than MAX_UNCHECKED newer steps wait, or by synchronize()."""
    from megakernel.runtime.megakernel import MAX_UNCHECKED, WatchdogError, megakernel_backend

    model = load_model("tiny-llama", progress=False).model
    cache = allocate_kv_cache(model.config, 1, 64, dtype=torch.float32, device="cpu")
    step = megakernel_backend(model, cache)
    fine = torch.zeros(4, dtype=torch.int32)
    tripped = torch.tensor([1, 0, 7, 3], dtype=torch.int32)            # flag, task, counter, seen
    step.unchecked = [(_Event(True), fine), (_Event(False), tripped)]
    step.check()                                  # the tripped step is still running
    assert len(step.unchecked) == 1
    with pytest.raises(WatchdogError, match="counter 7"):
        step.synchronize()
    assert step.unchecked == [] and step.epoch == 0
    step.unchecked = [(_Event(False), fine) for _ in range(MAX_UNCHECKED)]
    step.unchecked.append((_Event(False), tripped))
    step.check()                                  # too many waiting: the oldest is waited for
    assert len(step.unchecked) == MAX_UNCHECKED
    step.unchecked[-1][0].done = True
    step.unchecked[0][0].done = True
    with pytest.raises(WatchdogError):
        step(torch.tensor([[3]]), torch.tensor([[5]]), cache)   # a later call reports it


def test_a_step_reads_int64_inputs_where_they_are_and_copies_the_rest():
    """No copy kernel between two steps when the caller's tokens or positions are already what
    the kernel reads (contiguous int64, 16-byte aligned); anything else lands in the step's own
    int64 buffer with the same values."""
    from megakernel.runtime.megakernel import _readable

    own = torch.full((4,), -1, dtype=torch.int64)
    given = torch.tensor([[5], [6], [7], [8]])                                    # [B, 1] int64
    assert _readable(given, own).data_ptr() == given.data_ptr()
    assert own.tolist() == [-1] * 4
    int32, strided = given.to(torch.int32), torch.arange(8).view(4, 2)[:, :1]
    misaligned = torch.arange(5)[1:].view(4, 1)                     # 8 bytes into its storage
    for other in (int32, strided, misaligned):
        got = _readable(other, own)
        assert got is own and own.tolist() == other.reshape(-1).tolist()
    with pytest.raises(RuntimeError):
        _readable(torch.zeros(3, 1, dtype=torch.int64), own)


def test_profile_counts_overlapping_gpu_activity_once():
    from megakernel.bench.profile import busy_us

    assert busy_us([(0, 2), (1, 3), (5, 6)]) == 4
    assert busy_us([(0, 10), (2, 3), (4, 12)]) == 12
    assert busy_us([]) == 0


def test_dependent_launch_is_a_launch_switch():
    """The flag ``dl`` sets ``dependent_launch``: the kernel's PDL switch on the GPU (off under
    the interpreter), and a launch with ``launch_pdl`` there only (its sm_90 build:
    ``test_artifacts``; steps back to back on the GPU: ``test_megakernel_gpu``)."""
    from types import SimpleNamespace

    from megakernel.compiler.pipeline import CompileOptions
    from megakernel.runtime.megakernel import launch_args
    from megakernel.runtime.variant import parse_variant

    v = parse_variant("64x256x4x132xs3xdl")
    assert "dl" in v.label.split("x") and v.options(132)["dependent_launch"]
    assert "dl" not in parse_variant("64x256x4x132xs3").label.split("x")
    opts = CompileOptions(2, 64, **v.options(132))
    assert (opts.switches()["PDL"], opts.switches(cuda=False)["PDL"]) == (1, 0)
    assert CompileOptions(2, 64).switches()["PDL"] == 0
    t = torch.zeros(1)
    step = SimpleNamespace(ins=t, waits=t, queues=t, counters=t, error=t, weights=t, act=t,
                           f32=t, inputs=(t, t), block_table=t, epoch=1, spin_limit=1, stamps=t)
    gpu = SimpleNamespace(is_cuda=True)
    assert launch_args(step, gpu, opts, 0)[1]["launch_pdl"] is True
    assert "launch_pdl" not in launch_args(step, t, opts, 0)[1]
    assert "launch_pdl" not in launch_args(step, gpu, CompileOptions(2, 64), 0)[1]
