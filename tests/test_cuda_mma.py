"""The CUDA backend's tensor-core projections (from 5 batch rows on), without a GPU: what the
generated kernel takes (K slices, weight maps), what it refuses, its shared-memory sums, the
weight arena's alignment the maps need, and (where nvcc is installed) that it builds for sm_90a
without spills. Its results are compared on the GPU in test_cuda_gpu.py."""
import shutil

import pytest
from test_cuda_backend import no_spills

from megakernel.compiler.cuda_codegen import MMA_FROM, NCW, generate_cuda, mma_parts
from megakernel.compiler.pipeline import CompileOptions, compile_model
from megakernel.compiler.tile import TileConfig
from megakernel.models import load_model

SLICED = TileConfig(norm_first=True, norm_sums=True, split_k=2)
nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def compiled(batch: int, tile: TileConfig = SLICED):
    model = load_model("tiny-llama", progress=False, dtype="bfloat16").model
    return compile_model(model, CompileOptions(batch, 64, tile=tile, num_workers=16))


def test_tensor_core_kernel_takes_k_slices_and_a_map_per_row_length():
    c = compiled(17)
    kinds = {kind for _, kind, _, _ in c.encoded.variants}
    assert {"linear_part", "linear_reduce"} <= kinds
    src = generate_cuda(c.encoded, "tiny", 17, len(c.tasks.tasks))
    assert "projections on\n// tensor cores" in src.source
    assert "mk::LinearPart<" in src.source and "mk::LinearReduce<" in src.source
    ks = {cx["K"] for _, kind, cx, _ in c.encoded.variants
          if kind in ("linear", "linear_part", "gate_up", "qkv_rope")}
    assert src.map_ks == tuple(sorted(ks))


def test_k_slices_on_cuda_cores_are_refused_by_name():
    c = compiled(MMA_FROM - 1)
    with pytest.raises(ValueError, match=r"linear_part\): K slices"):
        generate_cuda(c.encoded, "tiny", MMA_FROM - 1, len(c.tasks.tasks))
    src = generate_cuda(c.encoded, "tiny", MMA_FROM - 1, len(c.tasks.tasks), mma=True)
    assert src.map_ks


def test_cuda_core_kernel_takes_no_maps():
    c = compiled(2, TileConfig(norm_first=True, norm_sums=True, split_k=1))
    src = generate_cuda(c.encoded, "tiny", 2, len(c.tasks.tasks))
    assert src.map_ks == () and "CUDA cores" in src.source


@pytest.mark.parametrize("segs,rows", [(1, 8), (2, 16), (2, 64), (1, 128), (2, 12)])
def test_acc_holds_every_task_shape(segs, rows):
    """mma_parts: for every row count up to ``rows``, the rows times their parts (two 8-row
    tiles a warp at most; the warps of a group split the chunks) fit."""
    most = mma_parts(segs, rows)
    for n in range(1, rows + 1):
        tiles = segs * -(-n // 8)
        groups = min([g for g in (1, 2, 4, 8) if 2 * g >= tiles] + [NCW])
        assert segs * n * (NCW // groups) <= most
    assert most >= segs * rows


def test_weight_arena_puts_every_matrix_on_a_whole_row():
    from megakernel.compiler.encode import ALIGN
    from megakernel.runtime.megakernel import bind_weights

    model = load_model("tiny-llama", progress=False, dtype="bfloat16").model
    names = tuple(n for n, p in model.named_parameters() if p.dim() == 2)
    arena, offsets = bind_weights(model, names, "cpu")
    for name, off in zip(names, offsets):
        k = model.get_parameter(name).shape[-1]
        assert off * ALIGN % k == 0, name
        assert model.get_parameter(name).data_ptr() == arena.data_ptr() + 2 * off * ALIGN


def test_projection_inputs_start_on_whole_rows():
    """x's tensor copies read a projection's input as rows of the activation arena: every
    activation a task reads with a weight matrix starts on a whole row of that matrix's row
    length; the others only on ALIGN."""
    from megakernel.compiler.encode import ALIGN

    c = compiled(17)
    bufs, act = c.tasks.ops.buffers, c.encoded.memory.act
    seen = set()
    for task in c.tasks.tasks:
        ks = {bufs[r.buffer].shape[-1] for r in task.reads
              if bufs[r.buffer].space == "weight" and len(bufs[r.buffer].shape) == 2}
        for r in task.reads:
            if bufs[r.buffer].space == "act" and ks:
                seen.add(task.kind)
                assert all(act[r.buffer] % k == 0 for k in ks), (task.kind, r.buffer, ks)
    assert {"linear_part", "gate_up", "qkv_rope"} <= seen
    assert all(off % ALIGN == 0 for off in act.values())


@pytest.mark.parametrize("batch,split,balance", [(3, 1, False), (17, 4, True)])
def test_cuda_form_keeps_k_slices_and_balance_with_tensor_cores(batch, split, balance):
    from megakernel.runtime.effective import cuda_form
    from megakernel.runtime.variant import parse_variant

    form = cuda_form(parse_variant("64x256x4x16xs3xkv16xsk4xab"), 16, batch)
    assert form.split_k == split
    assert form.attn_balance == balance
    assert form.block_n == (64 if batch < MMA_FROM else 32)


@pytest.mark.parametrize("batch,context,label,block", [
    (17, 1024, "64x256x4x16xs3xkv1024", 128), (3, 1024, "64x256x4x16xs3xkv1024", 16),
    (17, 1000, "64x256x4x16xs3xkv1024", 16), (17, 1024, "64x256x4x16xs3xkv64", 16),
    (17, 1024, "64x256x4x16xs3xkv1024xkb256", 256)])
def test_cuda_form_takes_whole_cache_blocks_for_tensor_core_attention(batch, context, label,
                                                                     block):
    """From MMA_FROM rows on: 128-token blocks where they divide the context and a task's
    keys; never smaller blocks than asked."""
    from megakernel.runtime.effective import cuda_form
    from megakernel.runtime.variant import parse_variant

    assert cuda_form(parse_variant(label), 16, batch, context).kv_block == block


@nvcc
@pytest.mark.parametrize("batch", [5, 17, 64])
def test_tensor_core_kernel_builds_without_spills(batch, tmp_path, monkeypatch):
    """K slices whose width is no multiple of a 64-column chunk included (tiny-llama's 48 and
    112: the k-steps past the slice skipped)."""
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    c = compiled(batch)
    assert {cx["KS"] % 64 for _, kind, cx, _ in c.encoded.variants if kind == "linear_part"} \
        - {0}
    src = generate_cuda(c.encoded, "tiny", batch, len(c.tasks.tasks))
    log = build_cubin(src.source).with_suffix(".log").read_text()
    assert no_spills(log), log


@nvcc
@pytest.mark.parametrize("batch,rows,flight,log", [(17, 64, 64, 0), (64, 128, 0, 0),
                                                   (17, 128, 64, 256)])
def test_backend_benchmark_form_builds_without_spills(batch, rows, flight, log, tmp_path,
                                                      monkeypatch):
    """The backend form builds without spills, also with wait logs (``log`` entries a stream)."""
    from megakernel.bench.mma_backend import backend_source
    from megakernel.compiler.cuda_codegen import SMEM_LIMIT
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    source, smem = backend_source(batch, 2048, rows, 1, flight, chunk_log=log)
    assert f"#define MK_CHUNK_LOG {log}\n" in source
    assert smem <= SMEM_LIMIT
    log = build_cubin(source).with_suffix(".log").read_text()
    assert no_spills(log), log


@pytest.mark.parametrize("rows,cluster", [(12, 1), (256, 1), (64, 2)])
def test_backend_benchmark_form_refuses_other_shapes(rows, cluster):
    from megakernel.bench.mma_backend import backend_source

    with pytest.raises(SystemExit, match="backend form"):
        backend_source(16, 2048, rows, cluster)


def test_tensor_core_flight_is_two_pages_unless_asked():
    c = compiled(17)
    auto = generate_cuda(c.encoded, "tiny", 17, len(c.tasks.tasks))
    pages = generate_cuda(c.encoded, "tiny", 17, len(c.tasks.tasks), flight=3)
    assert "(2 copies in flight at most)" in auto.source
    assert "(3 copies in flight at most)" in pages.source


@pytest.mark.parametrize("knobs,match", [({"mma_chunks": 3}, "mma_chunks=3"),
                                         ({"mma_page_kib": 0}, "mma_page_kib=0"),
                                         ({"kv_ahead": -1}, "kv_ahead=-1"),
                                         ({"x_depth": 2}, "x_depth=2"),
                                         ({"chunk_log": -1}, "chunk_log=-1")])
def test_tensor_core_knobs_out_of_range_are_refused(knobs, match):
    c = compiled(17)
    with pytest.raises(ValueError, match=match):
        generate_cuda(c.encoded, "tiny", 17, len(c.tasks.tasks), **knobs)


@nvcc
@pytest.mark.parametrize("knobs,line", [({"mma_chunks": 1}, "#define MK_CHUNKS 1"),
                                        ({"kv_ahead": 2}, "#define MK_KV_AHEAD 2"),
                                        ({"probe": 1}, "#define MK_PROBE 1"),
                                        ({"probe": 5}, "#define MK_PROBE 5"),
                                        ({"x_depth": 16}, "XS = 16,"),
                                        ({"chunk_log": 64}, "#define MK_CHUNK_LOG 64")])
def test_tensor_core_knob_kernels_build(knobs, line, tmp_path, monkeypatch):
    """One 64-column chunk a page (a narrow task's pages part-filled), attention's L2
    prefetches held two tasks ahead of the consumers, traces' end stamps once a projection's
    first page and x chunk landed (1) and after its chunk loop without the products (5, timing
    only), 16 stages of x and the wait logs build without spills."""
    from megakernel.runtime.cuda_step import build_cubin

    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    c = compiled(17)
    src = generate_cuda(c.encoded, "tiny", 17, len(c.tasks.tasks), **knobs)
    assert line in src.source
    log = build_cubin(src.source).with_suffix(".log").read_text()
    assert no_spills(log), log
