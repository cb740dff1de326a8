"""Artifacts, the compile cache, the compile CLI, and building generated kernels for sm_90."""
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megakernel.cli import main, parse_batch_sizes
from megakernel.compiler.artifact import cache_key, compile_cached, gc_paused
from megakernel.compiler.pipeline import CompileOptions, compile_model, model_ops
from megakernel.models import PRESETS
from megakernel.models.weights import empty_model

ROOT = Path(__file__).resolve().parent.parent


def test_cache_hit_reuses_the_compiled_kernel(tmp_path):
    model = empty_model(PRESETS["tiny-qwen3"])
    opts = CompileOptions(2, 64, target="h200", num_workers=8)
    first, hit = compile_cached(model, opts, "tiny-qwen3", tmp_path)
    assert not hit
    t0 = time.perf_counter()
    again, hit = compile_cached(model, opts, "tiny-qwen3", tmp_path,
                                lambda: pytest.fail("a cache hit asked for the op graph"))
    assert hit and time.perf_counter() - t0 < 1.0
    assert again.kernel.source == first.kernel.source
    # a miss compiles from the op graph the caller gives: the same kernel
    other = CompileOptions(2, 64, target="h200", num_workers=4)
    given, hit = compile_cached(model, other, "tiny-qwen3", tmp_path,
                                lambda: model_ops(model, 2, 64))
    assert not hit
    assert given.kernel.source == compile_model(model, other, "tiny-qwen3").kernel.source
    assert cache_key(model, opts) != cache_key(model, CompileOptions(3, 64, target="h200"))
    assert cache_key(model, opts) != cache_key(empty_model(PRESETS["tiny-llama"]), opts)


def test_compile_cli_writes_artifacts(tmp_path, capsys):
    assert main(["compile", "tiny-llama", "--batch-sizes", "1,3", "--max-seq-len", "64",
                 "--device", "cpu", "-o", str(tmp_path)]) == 0
    for b in (1, 3):
        folder = tmp_path / f"b{b}"
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["batch_size"] == b and manifest["model_hash"]
        assert {"kernel.py", "schedule.json", "instructions.npz", "compiled.pkl"} <= {
            p.name for p in folder.iterdir()}
    assert "makespans" in capsys.readouterr().out


def test_compile_options_refuse_empty_batches_and_contexts():
    from megakernel.compiler.pipeline import CompileOptions

    for batch, context in ((0, 64), (1, 0), (1, -16)):
        with pytest.raises(ValueError, match="both must be at least 1"):
            CompileOptions(batch, context)
    with pytest.raises(ValueError, match="multiple of the cache block"):
        CompileOptions(1, 40)


def test_batch_size_ranges():
    assert parse_batch_sizes("1,4,8-10") == [1, 4, 8, 9, 10]
    assert parse_batch_sizes("3, 1-4,17") == [3, 1, 2, 4, 17]          # each size once
    for bad in ("0", "1,2-1,3", "x", "1-", "-2", "1,,2", "1.5"):
        with pytest.raises(ValueError, match="not a positive integer or an ascending range"):
            parse_batch_sizes(bad)


HOPPER_SCRIPT = """
from megakernel.compiler.hopper import compile_for_hopper
from megakernel.compiler.pipeline import CompileOptions, compile_model
from megakernel.models import PRESETS
from megakernel.models.weights import empty_model
from megakernel.runtime.megakernel import load_kernel
import torch
from megakernel.compiler.tile import TileConfig
# (the attention dots of 4 query rows: tiny-qwen3's 2 heads per kv head, tiny-llama's 3;
# streamed attention with q/k/v pieces across heads)
for name, batch, gemv, split, stream, rows in [("tiny-llama", 3, False, False, False, 16),
                                               ("tiny-qwen3", 1, True, False, False, 4),
                                               ("qwen3-0.6b", 8, False, True, False, 16),
                                               ("tiny-llama", 5, False, False, True, 4)]:
    model = empty_model(PRESETS[name]).to(torch.bfloat16)
    opts = CompileOptions(batch, 64, target="h200", tile=TileConfig(
        gemv=gemv, split_head_norm=split, swap_ab=split, attn_stream=stream, attn_rows=rows,
        qkv_cross=stream))
    c = compile_model(model, opts, name)
    assert ("CROSS=1" in c.kernel.source) == stream, name
    assert ("attn_stream_op" in c.kernel.source) == stream, name
    assert f"BLOCK_G={rows}," in c.kernel.source, name
    kernel = load_kernel(c.kernel.source, c.kernel.kernel_name)
    # values that change every launch must not select another build
    assert [p.name for p in kernel.params if p.do_not_specialize] == ["epoch", "spin_limit"]
    out = compile_for_hopper(kernel)
    ptx = out.asm["ptx"]
    assert "globaltimer" not in ptx and "call.uni" not in ptx     # op bodies inlined
    assert "%smid" not in ptx
    traced = compile_for_hopper(kernel, trace=2).asm["ptx"]
    assert "globaltimer" in traced and "%smid" in traced           # stamps, and each SM
    if name == "tiny-llama" and not stream:
        assert "nanosleep" in compile_for_hopper(kernel, switches={"BACKOFF": 128}).asm["ptx"]
        assert "ld.acquire.gpu" in compile_for_hopper(kernel, switches={"POLL": 1}).asm["ptx"]
        assert ".maxnreg 255" in compile_for_hopper(kernel, max_registers=255).asm["ptx"]
        ptx_of = lambda **sw: compile_for_hopper(kernel, switches=sw).asm["ptx"]
        before = ptx_of(PREFETCH=1).count("prefetch.global.L2")    # weights before the waits
        assert ptx_of(PREFETCH=3).count("prefetch.global.L2") > before    # + the next words
        # weights prefetched between the polls of a wait, the KV cache by attention, none
        between = ptx_of(PREFETCH=4).count("prefetch.global.L2")
        assert between > 0 and ptx_of(PREFETCH=6).count("prefetch.global.L2") > between
        late = ptx_of(PREFETCH=4, PF_START=50)     # begun once half the producers signalled
        assert late != ptx_of(PREFETCH=4) and "prefetch.global.L2" in late
        assert "prefetch.global.L2" in ptx_of(PREFETCH=8)
        assert "prefetch.global.L2" not in ptx_of(PREFETCH=0)
        # the weights with evict_last priority (64), between polls or before the waits; the
        # next instruction's words and the KV cache as before
        assert "L2::evict_last" not in ptx_of(PREFETCH=6) + ptx_of(PREFETCH=3)
        for bits in (4 | 64, 6 | 64, 1 | 64):
            last = ptx_of(PREFETCH=bits)
            assert "prefetch.global.L2::evict_last" in last, bits
            assert last.count("prefetch.global.L2") == ptx_of(PREFETCH=bits - 64).count(
                "prefetch.global.L2"), bits
        # the next task's earlier keys and values asked for while this one waits
        assert "prefetch.global.L2" in ptx_of(PREFETCH=16, KV_AHEAD=16)
        # or once it has signalled: the prefetches after the release
        late = ptx_of(PREFETCH=32, KV_AHEAD=16)
        assert late.rfind("prefetch.global.L2") > late.rfind("release.add") > 0
        # the keys and values with evict_last priority (128), the weights as before
        for bits, ahead in ((8, 0), (16, 16), (16 | 1, 16)):
            plain = ptx_of(PREFETCH=bits, KV_AHEAD=ahead)
            last = ptx_of(PREFETCH=bits | 128, KV_AHEAD=ahead)
            assert "L2::evict_last" not in plain, bits
            assert "prefetch.global.L2::evict_last" in last, bits
            assert last.count("prefetch.global.L2") == plain.count("prefetch.global.L2"), bits
            assert last.count("prefetch.global.L2 ") == ptx_of(PREFETCH=bits & 7).count(
                "prefetch.global.L2 "), bits
    assert ".target sm_90" in ptx and len(out.asm["cubin"]) > 0
    assert "prefetch.global.L2" in ptx and ".release" in ptx and ".acquire" in ptx
    # weight rows as the dot's M (64 and more): Hopper's warpgroup MMA
    assert ("wgmma.mma_async" in ptx) == split, name
    print(name, batch, "sm_90 ok", len(out.asm["cubin"]))
# op bodies as calls: functions of their own in the PTX
model = empty_model(PRESETS["tiny-llama"]).to(torch.bfloat16)
c = compile_model(model, CompileOptions(3, 64, target="h200", noinline=True), "tiny-llama")
ptx = compile_for_hopper(load_kernel(c.kernel.source, c.kernel.kernel_name)).asm["ptx"]
assert ".func megakernel_" in ptx and "call.uni" in ptx and "linear_op" in ptx
# the largest batch of the batch-size range: one program's shared memory fits an H200 SM
model = empty_model(PRESETS["llama-3.2-1b"]).to(torch.bfloat16)
c = compile_model(model, CompileOptions(64, 64, target="h200"), "llama-3.2-1b")
out = compile_for_hopper(load_kernel(c.kernel.source, c.kernel.kernel_name))
assert out.metadata.shared <= 233472 - 1024, out.metadata.shared
print("llama-3.2-1b", 64, "sm_90 ok", out.metadata.shared)
# attention over groups of 4 kv heads: batched dots, half the keys per step
tile = TileConfig(attn_pairs=True, attn_group=4, kv_split=1024, norm_first=True, split_k=4)
c = compile_model(model, CompileOptions(64, 1024, target="h200", tile=tile), "llama-3.2-1b")
assert {t.kind for t in c.tasks.tasks} >= {"attn_group"}
kernel = load_kernel(c.kernel.source, c.kernel.kernel_name)
out = compile_for_hopper(kernel)
assert out.metadata.shared <= 233472 - 1024, out.metadata.shared
ahead = compile_for_hopper(kernel, switches={"PREFETCH": 22, "KV_AHEAD": 256}).asm["ptx"]
assert ahead.count("prefetch.global.L2") > out.asm["ptx"].count("prefetch.global.L2")
print("llama-3.2-1b", 64, "attn_group sm_90 ok", out.metadata.shared)
# pairs of kv heads over key ranges, merged by combines
tile = TileConfig(attn_pairs=True, attn_pair_ranges=True, kv_split=512, kv_block=128)
c = compile_model(model, CompileOptions(16, 1024, target="h200", tile=tile), "llama-3.2-1b")
assert {t.kind for t in c.tasks.tasks} >= {"attn_pair_part", "attn_combine"}
out = compile_for_hopper(load_kernel(c.kernel.source, c.kernel.kernel_name))
print("llama-3.2-1b", 16, "attn_pair_part sm_90 ok", out.metadata.shared)
# units spilled over the workers, norms from the reduces' sums of squares, q/k/v in K slices
tile = TileConfig(attn_spill=True, kv_split=1024, kv_block=128, norm_first=True, split_k=4,
                  norm_sums=True, qkv_slices=2)
c = compile_model(model, CompileOptions(17, 1024, target="h200", tile=tile), "llama-3.2-1b")
kinds = {t.kind for t in c.tasks.tasks}
assert {"attn_combine", "qkv_part_rope"} <= kinds
assert not kinds & {"rms_norm", "reduce_norm", "qkv_rope"}
assert all(t.args.get("sums") for t in c.tasks.tasks if t.kind in ("gate_up", "embed"))
out = compile_for_hopper(load_kernel(c.kernel.source, c.kernel.kernel_name))
assert out.metadata.shared <= 233472 - 1024, out.metadata.shared
print("llama-3.2-1b", 17, "spill and sums sm_90 ok", out.metadata.shared)
# q/k/v pieces across heads: streams that wait on several counters, polled at once
from megakernel.compiler.codegen import most_waits
tile = TileConfig(attn_stream=True, qkv_cross=True, kv_block=128, kv_split=128, norm_first=True,
                  norm_sums=True)
c = compile_model(model, CompileOptions(1, 1024, target="h200", tile=tile), "llama-3.2-1b")
assert most_waits(c.encoded) > 1
out = compile_for_hopper(load_kernel(c.kernel.source, c.kernel.kernel_name))
print("llama-3.2-1b", 1, "several waits sm_90 ok", out.metadata.shared)
# streams over a row's pair of kv heads whose cut units merge themselves: the tickets taken
# after the loop, which stays software-pipelined (its copies asynchronous; an atomic in it would
# stop that), in a function of its own
import re
model = empty_model(PRESETS["tiny-llama"]).to(torch.bfloat16)
tile = TileConfig(attn_stream=True, attn_pairs=True, fuse_combine=True, kv_step=256)
c = compile_model(model, CompileOptions(3, 64, target="h200", num_workers=5, tile=tile,
                                        noinline=True), "tiny-llama")
assert any("merges" in t.args for t in c.tasks.tasks if t.kind == "attn_pair_stream")
ptx = compile_for_hopper(load_kernel(c.kernel.source, c.kernel.kernel_name)).asm["ptx"]
body = max((f for f in re.split(r"\\n(?=\\.func)", ptx)           # its definition, not its
            if "attn_pair_stream_op" in f.split("(")[0]), key=len)   # declaration
assert "cp.async" in body and "atom.global" in body
print("tiny-llama", 3, "fused pair streams sm_90 ok")
# projection weights staged in shared memory by bulk copies before the waits (GPU switch STAGE)
model = empty_model(PRESETS["tiny-llama"]).to(torch.bfloat16)
opts = CompileOptions(1, 64, target="h200", tile=TileConfig(staged_kib=8, split_k=1))
c = compile_model(model, opts, "tiny-llama")
kernel = load_kernel(c.kernel.source, c.kernel.kernel_name)
staged = compile_for_hopper(kernel, switches=opts.switches()).asm["ptx"]
plain = compile_for_hopper(kernel).asm["ptx"]
for needle in ("cp.async.bulk.shared::cluster.global", "mbarrier.try_wait.parity",
               "%dynamic_smem_size"):
    assert needle in staged and needle not in plain, needle
print("tiny-llama", 1, "staged sm_90 ok", opts.switches()["STAGE"])
# each program takes the queue of its SM (GPU switch BY_SM): %smid claimed with an exchange
opts = CompileOptions(2, 64, target="h200", num_workers=132, queues_by_sm=True)
c = compile_model(model, opts, "tiny-llama")
kernel = load_kernel(c.kernel.source, c.kernel.kernel_name)
by_sm = compile_for_hopper(kernel, switches=opts.switches()).asm["ptx"]
assert "%smid" in by_sm and "exch" in by_sm and "exch" not in plain
print("tiny-llama", 2, "queues by SM sm_90 ok")
# each step a programmatic dependent launch (GPU switch PDL): the hand-over between steps
opts = CompileOptions(2, 64, target="h200", dependent_launch=True)
dl = compile_for_hopper(kernel, switches=opts.switches()).asm["ptx"]
for needle in ("griddepcontrol.launch_dependents", "griddepcontrol.wait"):
    assert needle in dl and needle not in plain and needle not in by_sm, needle
print("tiny-llama", 2, "dependent launch sm_90 ok")
# streams of pairs and of groups of 4 kv heads with the keys as M: a loop a unit's piece
from dataclasses import replace
for group, kv in ((2, PRESETS["tiny-llama"].num_kv_heads), (4, 4)):
    tile = TileConfig(attn_stream=True, attn_pairs=True, attn_group=group, attn_keys_m=True,
                      kv_step=1024, kv_block=64)
    cfg = replace(PRESETS["tiny-llama"], num_heads=2 * kv, num_kv_heads=kv)
    c = compile_model(empty_model(cfg).to(torch.bfloat16),
                      CompileOptions(3, 64, target="h200", num_workers=5, tile=tile), "tiny-llama")
    assert ("W=4" if group == 2 else "KEYS_M=True") in c.kernel.source
    ptx = compile_for_hopper(load_kernel(c.kernel.source, c.kernel.kernel_name)).asm["ptx"]
    assert "cp.async" in ptx
    print("tiny-llama", kv, "kv heads, streams with the keys as M sm_90 ok")
"""


def run_without_interpreter(script: str, cache) -> str:
    """Run ``script`` in a fresh Python without TRITON_INTERPRET (``triton.compile`` for sm_90
    needs the real backend), its compile cache in ``cache``; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["MEGAKERNEL_CACHE"] = str(cache)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_generated_kernels_compile_for_sm90(tmp_path):
    assert run_without_interpreter(HOPPER_SCRIPT, tmp_path).count("sm_90 ok") == 15


MASK_SCRIPT = """
import inspect, re, torch
from megakernel.compiler import attention_ops
from megakernel.compiler.hopper import compile_for_hopper
from megakernel.compiler.pipeline import CompileOptions, compile_model
from megakernel.compiler.tile import TileConfig
from megakernel.models import PRESETS
from megakernel.models.weights import empty_model
from megakernel.runtime.megakernel import load_kernel
model = empty_model(PRESETS["llama-3.2-1b"]).to(torch.bfloat16)
# 40 units of 1024 keys in streams of 384 keys: units of 3 and 4 pieces
tile = TileConfig(attn_stream=True, norm_first=True, split_k=4, kv_block=128, kv_split=512)
c = compile_model(model, CompileOptions(5, 1024, target="h200", tile=tile), "llama-3.2-1b")
counts = {t.args["count"] for t in c.tasks.tasks if t.kind == "attn_combine"}
lanes = [cx["BLOCK_SPLIT"] for _, k, cx, _ in c.encoded.variants if k == "attn_combine"]
assert min(counts) < max(lanes), (counts, lanes)      # some combines mask lanes off
ptx = compile_for_hopper(load_kernel(c.kernel.source, c.kernel.kernel_name),
                        num_warps=8).asm["ptx"]
files = dict(re.findall(r'\\.file\\s+(\\d+) "([^"]+)"', ptx))
src, first = inspect.getsourcelines(attention_ops.attn_combine_op.fn)
line = first + next(i for i, s in enumerate(src) if "m = tl.load(ml_ptr" in s)
fid = next(k for k, v in files.items() if v.endswith("attention_ops.py"))
preds, on = set(), False
for text in ptx.splitlines():
    if text.strip().startswith(".loc"):
        on = text.split()[1:3] == [fid, str(line)]
    elif on and "ld.global" in text:
        preds.add(text.split("ld.global")[0].strip())
print("predicates", sorted(preds))
assert len(preds) > 1, preds            # each slot lane has its own predicate
# int words say what divides them (K slices start at multiples of 512): x and weight loads stay
# 16 bytes wide (with int words unhinted, 151 two-byte loads here; with their units, 1)
assert ptx.count("ld.global.b16") < 8, ptx.count("ld.global.b16")
"""


def test_instruction_words_say_what_divides_them_and_nothing_more(tmp_path):
    """An instruction word is an act/f32 field of some opcodes and an int field of others. A
    hint on the word itself (``tl.multiple_of(w, 64)``) would make a combine's slot mask
    (``lanes < count``, count from the same word elsewhere a buffer offset) look constant
    across its lanes on sm_90, so lanes past ``count`` were read: each lane's load must keep its
    own predicate. Without any fact about int words, a K slice's offset would split its 16-byte
    loads into 2-byte ones: the units of int words keep them."""
    run_without_interpreter(MASK_SCRIPT, tmp_path)


def test_top_level_compile_gives_one_kernel_per_batch_size():
    import megakernel
    from megakernel.models import load_model

    model = load_model("tiny-qwen3", progress=False).model
    kernels = megakernel.compile(model, batch_sizes=[1, 2], max_seq_len=64, target="cpu")
    assert sorted(kernels) == [1, 2]
    assert all(k.ops.dims.batch == b and "@triton.jit" in k.kernel.source
               for b, k in kernels.items())


def test_gc_paused_leaves_the_collector_as_it_found_it():
    """Loads and compiles pause the cyclic collector, then restore it: on where it was on (also
    after an error), off where the caller had turned it off."""
    assert gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        assert not gc.isenabled()
        raise KeyError("inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


KEY_SCRIPT = """
import sys, torch
from megakernel.compiler.pipeline import CompileOptions, compile_model
from megakernel.models import PRESETS
from megakernel.models.weights import empty_model
from megakernel.runtime.megakernel import load_kernel
model = empty_model(PRESETS["tiny-llama"]).to(torch.float32)
for calls in map(int, sys.argv[1:]):
    c = compile_model(model, CompileOptions(1, 64, target="cpu", noinline=bool(calls)), "t")
    print(calls, *[load_kernel(c.kernel.source, c.kernel.kernel_name).cache_key for _ in "ab"])
"""


def test_a_generated_kernel_has_one_triton_cache_key_in_every_process(tmp_path):
    """The kernel loaded first in a process (an autotune worker's first build), and later, or
    in another process (the autotuner timing it): one key, so Triton's cache serves it where
    another process built it. (Op bodies inlined or as calls, each loaded first once.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["MEGAKERNEL_CACHE"] = str(tmp_path)
    keys: dict = {}
    for order in (["0", "1"], ["1", "0"]):
        out = subprocess.run([sys.executable, "-c", KEY_SCRIPT, *order], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=600, check=True).stdout
        for line in out.splitlines():
            calls, *loaded = line.split()
            keys.setdefault(calls, set()).update(loaded)
    assert sorted(keys) == ["0", "1"] and all(len(k) == 1 for k in keys.values()), keys
