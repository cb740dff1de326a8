"""The CUDA backend's generated source, without a GPU: what it builds, what it refuses, and (where
nvcc is installed) that it compiles for sm_90a without spills. Its results are compared on the
GPU in test_cuda_gpu.py."""
import re
import shutil

import pytest
import torch

from megakernel.compiler.cuda_codegen import CUDA_OPS, generate_cuda
from megakernel.compiler.pipeline import CompileOptions, compile_model
from megakernel.compiler.tile import TileConfig
from megakernel.models import load_model

CUDA_TILE = TileConfig(norm_first=True, norm_sums=True, split_k=1)


def no_spills(log: str) -> bool:
    """ptxas's report (``build_cubin``'s .log) names spills of no function (the kernel and
    any function it calls)."""
    counts = re.findall(r"(\d+) bytes spill (?:stores|loads)", log)
    return bool(counts) and not any(int(c) for c in counts)


def compiled(name="tiny-llama", batch=1, tile=CUDA_TILE, workers=16):
    model = load_model(name, progress=False, dtype="bfloat16").model
    return compile_model(model, CompileOptions(batch, 64, tile=tile, num_workers=workers))


@pytest.mark.parametrize("batch", [1, 3])
def test_every_opcode_gets_a_branch_for_both_sides(batch):
    c = compiled(batch=batch)
    src = generate_cuda(c.encoded, "tiny", batch, len(c.tasks.tasks))
    for op, kind, _, _ in c.encoded.variants:
        assert CUDA_OPS[kind].struct in src.source
        assert len(re.findall(rf"case {op}:  // {kind}\n", src.source)) == 2   # pages and run
    assert src.num_workers == 16 and src.threads == 288
    assert src.smem <= 232448


def test_unbuilt_variants_are_refused_by_name():
    c = compiled(tile=TileConfig(norm_first=False, split_k=1))
    with pytest.raises(ValueError, match=r"opcode \d+ \((qkv_rope|linear|gate_up)\): an RMSNorm"):
        generate_cuda(c.encoded, "tiny", 1, len(c.tasks.tasks))
    q = compiled(name="tiny-qwen3")
    with pytest.raises(ValueError, match="head RMSNorm"):
        generate_cuda(q.encoded, "tiny", 1, len(q.tasks.tasks))


FUSED_TILE = TileConfig(norm_first=True, norm_sums=True, split_k=1, kv_block=16, kv_split=16,
                        attn_tasks_per_worker=0, fuse_combine=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("batch,lanes,tile,kv_ring,kv_l2", [
    (1, False, CUDA_TILE, False, False), (3, None, CUDA_TILE, False, False),
    (1, True, CUDA_TILE, False, False), (1, None, FUSED_TILE, False, True),
    (2, None, FUSED_TILE, True, False)])
def test_builds_for_sm90a_without_spills(batch, lanes, tile, kv_ring, kv_l2, tmp_path,
                                         monkeypatch):
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    c = compiled(batch=batch, tile=tile)
    src = generate_cuda(c.encoded, "tiny", batch, len(c.tasks.tasks), lanes=lanes,
                        kv_ring=kv_ring, kv_l2=kv_l2)
    # AttnPartial's last four template arguments: FUSED, LANES, KV_RING, KV_L2
    form = re.search(r"AttnPartial<[^>]*, (\w+), (\w+), (\w+), (\w+)>::run",
                     src.source).groups()
    assert form == tuple("true" if f else "false"
                         for f in (tile.fuse_combine, lanes is not False, kv_ring, kv_l2))
    cubin = build_cubin(src.source)
    assert cubin.stat().st_size > 0
    log = cubin.with_suffix(".log").read_text()
    assert no_spills(log), log


@pytest.mark.parametrize("label", ["64x256x4x16xs3xkv16xkb16xnf0xsk4",
                                   "64x256x4x16xs3xkv16xkb16xafxrnxsk4",
                                   "64x256x4x24xs3xkv16xkb16xnfxapxqcxsk1"])
def test_any_variant_in_cuda_form_is_built(label):
    """The bench's megakernel-cuda row: a tuned variant the CUDA backend refuses, put in the
    form it builds (``cuda_form``), builds (at most one worker an SM, combines fused)."""
    from megakernel.runtime.effective import cuda_form
    from megakernel.runtime.variant import parse_variant

    model = load_model("tiny-llama", progress=False, dtype="bfloat16").model
    given = parse_variant(label)
    c = compile_model(model, CompileOptions(3, 64, **given.options(16)))
    with pytest.raises(ValueError, match="the CUDA backend cannot build this kernel"):
        generate_cuda(c.encoded, "tiny", 3, len(c.tasks.tasks))
    form = cuda_form(given, sms=16)
    c = compile_model(model, CompileOptions(3, 64, **form.options(16)))
    src = generate_cuda(c.encoded, "tiny", 3, len(c.tasks.tasks))
    assert src.num_workers == 16
    assert "attn_combine" not in {kind for _, kind, _, _ in c.encoded.variants}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("knobs,line", [
    ({"probe": 2}, "#define MK_PROBE 2"), ({"acquire": "both"}, "#define MK_ACQUIRE_TICKET 1")])
def test_knob_kernels_build(knobs, line, tmp_path, monkeypatch):
    """A probe kernel (a trace's end stamps at a mark of each body, ``--probes``) and one whose
    waits and ticket are acquire operations build for sm_90a without spills."""
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    c = compiled(batch=1, tile=FUSED_TILE)
    src = generate_cuda(c.encoded, "tiny", 1, len(c.tasks.tasks), **knobs)
    assert line in src.source
    log = build_cubin(src.source).with_suffix(".log").read_text()
    assert no_spills(log), log


@pytest.mark.parametrize("knobs", [{"probe": 6}, {"flight": 0}, {"acquire": "all"}])
def test_knobs_out_of_range_are_refused(knobs):
    c = compiled(batch=1)
    with pytest.raises(ValueError, match=f"{next(iter(knobs))}=(0|6|'all')"):
        generate_cuda(c.encoded, "tiny", 1, len(c.tasks.tasks), **knobs)


def test_megakernel_cuda_backend_on_the_cpu_is_refused_by_name():
    from megakernel.runtime import allocate_kv_cache
    from megakernel.runtime.backends import get_backend

    model = load_model("tiny-llama", progress=False).model
    cache = allocate_kv_cache(model.config, 1, 64, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="megakernel-cuda.*CUDA device"):
        get_backend("megakernel-cuda")(model, cache)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_hop_benchmark_builds_without_spills(tmp_path, monkeypatch):
    """``bench/hop_cuda.py``'s kernel (a phase boundary by counter or by flagged values, with a
    producer warp streaming bulk copies) builds for sm_90a without spills."""
    from megakernel.bench.hop_cuda import SOURCE
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    log = build_cubin(SOURCE).with_suffix(".log").read_text()
    assert no_spills(log), log


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_wait_costs_benchmark_builds_without_spills(tmp_path, monkeypatch):
    """``bench/wait_costs.py``'s kernel (a timer read, a completed barrier's try_wait, an
    arrival and a shared-memory round trip timed beside a stream of bulk copies) builds for
    sm_90a without spills."""
    from megakernel.bench.wait_costs import SOURCE
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    log = build_cubin(SOURCE).with_suffix(".log").read_text()
    assert no_spills(log), log


def test_hop_reference_is_a_mean_field_per_round():
    """The hop benchmark's float64 reference: one round by hand on 2 blocks of 2 values."""
    from megakernel.bench.hop_cuda import reference

    v = torch.tensor([[0.0, 0.25], [1.0, 1.25]], dtype=torch.float64)
    b = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    want = 0.5 * v + 0.5 * v.mean() + b % 5
    assert torch.allclose(reference(2, 2, 1), want.flatten())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("batch,rows", [(17, 16), (64, 32)])
def test_mma_benchmark_builds_without_spills(batch, rows, tmp_path, monkeypatch):
    """``bench/mma_cuda.py``'s tensor-core projection (x from L2, weight rows through a ring of
    8-row groups) builds for sm_90a without spills, its ring and scratch within shared
    memory."""
    from megakernel.bench.mma_cuda import SMEM_LIMIT, config_source, ring_groups, smem_bytes
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    groups = ring_groups(batch, 2048, rows)
    assert rows // 8 <= groups and smem_bytes(batch, 2048, groups) <= SMEM_LIMIT
    log = build_cubin(config_source(batch, 2048, rows, groups)).with_suffix(".log").read_text()
    assert no_spills(log), log


def test_mma_benchmark_refuses_a_task_larger_than_the_ring():
    from megakernel.bench.mma_cuda import ring_groups

    with pytest.raises(SystemExit, match="does not fit"):
        ring_groups(64, 8192, 32)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("batch,rows,cluster", [(17, 128, 1), (64, 256, 2), (32, 128, 4)])
def test_mma_tiles_form_builds_without_spills(batch, rows, cluster, tmp_path, monkeypatch):
    """The ``tiles`` form (x's chunk in shared memory, TMA tensor copies, ``ldmatrix``; in
    clusters x multicast by block 0) builds for sm_90a without spills within shared memory."""
    from megakernel.bench.mma_tiles import SMEM_LIMIT, tiles_source
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    source, smem = tiles_source(batch, 2048, rows, cluster)
    assert smem <= SMEM_LIMIT
    log = build_cubin(source).with_suffix(".log").read_text()
    assert no_spills(log), log


@pytest.mark.parametrize("rows,cluster,match", [(64, 1, "64 rows a task"),
                                               (384, 1, "384 rows a task"),
                                               (128, 3, "not 3")])
def test_mma_tiles_form_refuses_other_shapes(rows, cluster, match):
    from megakernel.bench.mma_tiles import tiles_source

    with pytest.raises(SystemExit, match=match):
        tiles_source(16, 2048, rows, cluster)
