"""The reference VM against the generated kernel (interpreter), buffer by buffer, and the VM
under multi-worker schedules against eager PyTorch."""
from dataclasses import replace

import pytest
import torch

from megakernel.compiler.pipeline import CompileOptions, compile_model
from megakernel.compiler.tile import TileConfig, Tiler
from megakernel.models import PRESETS, load_model, random_model
from megakernel.runtime import allocate_kv_cache
from megakernel.runtime.megakernel import MegakernelStep
from megakernel.compiler.vm import run_vm

B, S = 3, 64


def load(name):
    """A tiny preset with its norm weights drawn too (presets init them to 1, which would let a
    norm weight applied wrongly, or not at all, pass); ``tiny-llama-kv4``: tiny-llama with 4 kv
    heads of 2 query heads each (groups of 4 kv heads per attention task)."""
    if name == "tiny-llama-kv4":
        cfg = replace(PRESETS["tiny-llama"], num_heads=8, num_kv_heads=4)
        model = random_model(cfg, "cpu", torch.float32, std=0.02)
    else:
        model = load_model(name, progress=False).model
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if "norm" in pname:
                param.copy_(torch.rand(param.shape, generator=gen) + 0.5)
    return model


def inputs(model):
    cache = allocate_kv_cache(model.config, B, S, dtype=torch.float32, device="cpu")
    cache.normal_(generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([[7], [200], [31]])
    positions = torch.tensor([[4], [0], [40]])
    return tokens, positions, cache


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("tiles", [TileConfig(),
                                   TileConfig(gemv=True, block_n=16, rms_unroll=0,
                                              split_head_norm=False, attn_rows=16),
                                   TileConfig(block_k=32, stages=2, swap_ab=True, balance=True,
                                              norm_first=True, split_k=2, reduce_norm=True,
                                              stage_kib=16),
                                   TileConfig(split_k=2, block_k=32, qkv_cross=True),
                                   TileConfig(split_k=2, block_n=8, block_k=32, norm_first=True,
                                              norm_sums=True),
                                   TileConfig(qkv_parts=3, stages=1, fold=2, kv_split=16,
                                              attn_tasks_per_worker=0, split_head_norm=True),
                                   TileConfig(attn_stream=True, kv_step=256, attn_rows=8),
                                   TileConfig(kv_block=32, kv_split=32, kv_step=256),
                                   TileConfig(kv_block=32, kv_split=32,
                                              attn_tasks_per_worker=0),
                                   TileConfig(attn_stream=True, kv_step=256, kv_block=32),
                                   TileConfig(attn_pairs=True, kv_split=64),
                                   TileConfig(attn_pairs=True, kv_split=64, kv_block=64,
                                              attn_keys_m=True),
                                   TileConfig(attn_pairs=True, kv_split=64, kv_step=256,
                                              attn_rotate=True),
                                   # projections' K loops each from a step of its own
                                   TileConfig(block_k=16, proj_rotate=True),
                                   TileConfig(split_k=2, block_k=16, qkv_cross=True,
                                              fuse_reduce=True, proj_rotate=True),
                                   TileConfig(attn_pairs=True, attn_pair_ranges=True, kv_split=16,
                                              kv_step=256, attn_tasks_per_worker=0),
                                   TileConfig(attn_pairs=True, attn_pair_ranges=True, kv_split=32,
                                              kv_block=32, attn_tasks_per_worker=0)])
def test_kernel_equals_vm_buffer_by_buffer(name, tiles):
    check_kernel_against_vm(name, tiles)


@pytest.mark.parametrize("tiles", [TileConfig(attn_pairs=True, attn_group=4, kv_split=64),
                                   TileConfig(attn_pairs=True, attn_group=4, kv_split=64,
                                              kv_block=32, kv_step=512),
                                   TileConfig(attn_pairs=True, attn_group=4, kv_split=64,
                                              attn_keys_m=True),
                                   TileConfig(attn_pairs=True, attn_group=4, kv_split=64,
                                              kv_block=32, kv_step=512, attn_rotate=True)])
def test_kernel_equals_vm_with_groups_of_kv_heads(tiles):
    """Attention tasks over groups of 4 kv heads (a batched dot per step; the keys as its M
    too; each group's loop from its own step on)."""
    kinds = check_kernel_against_vm("tiny-llama-kv4", tiles)
    assert kinds.count("attn_group") == 3 * B and "attn_pair" not in kinds


@pytest.mark.parametrize("name,tiles", [
    ("tiny-llama", TileConfig(attn_stream=True, attn_pairs=True, kv_step=256)),
    ("tiny-llama", TileConfig(attn_stream=True, attn_pairs=True, attn_stack=True, kv_step=256)),
    ("tiny-llama", TileConfig(attn_stream=True, attn_pairs=True, attn_stack=True, kv_step=1024,
                              kv_block=64, attn_keys_m=True)),
    ("tiny-llama", TileConfig(attn_stream=True, attn_pairs=True, kv_step=1024, kv_block=32,
                              attn_keys_m=True)),
    ("tiny-llama", TileConfig(attn_stream=True, attn_pairs=True, kv_step=1024, kv_block=64,
                              attn_keys_m=True)),
    ("tiny-qwen3", TileConfig(attn_stream=True, attn_pairs=True, kv_step=512, kv_block=32)),
    ("tiny-llama-kv4", TileConfig(attn_stream=True, attn_pairs=True, attn_group=4,
                                  kv_step=512)),
    ("tiny-llama-kv4", TileConfig(attn_stream=True, attn_pairs=True, attn_group=4,
                                  kv_step=1024, kv_block=32, attn_keys_m=True))])
def test_kernel_equals_vm_with_grouped_streams(name, tiles):
    """Streams over units of a row's pairs (or groups of 4) of kv heads, the heads' steps as
    batched dots (the interpreter's one worker takes each layer's keys in one stream: units cut
    between streams are the next test's); pairs and groups also as a loop per unit's piece;
    pairs and groups with the keys as the dots' M, steps of 64 keys in 32-key blocks or in one
    each (a group's of 32 keys); pairs with their units' queries stacked as the dots' rows (or
    as N, with the keys as M)."""
    kinds = check_kernel_against_vm(name, tiles)
    assert ("attn_group_stream" if tiles.attn_group > 2 else "attn_pair_stream") in kinds
    assert not {"attn_stream", "attn_pair", "attn_group"} & set(kinds)


@pytest.mark.parametrize("name,group,workers,fused", [
    ("tiny-llama", 2, 5, False), ("tiny-qwen3", 2, 32, False), ("tiny-llama-kv4", 4, 7, False),
    ("tiny-llama-kv4", 2, 13, False), ("tiny-llama", 2, 5, True), ("tiny-llama-kv4", 4, 7, True),
    ("tiny-llama-kv4", 2, 13, True)])
def test_vm_of_grouped_streams_on_many_workers_matches_eager(name, group, workers, fused):
    """Streams over units of ``group`` kv heads of a row, in equal shares of whole steps over
    the workers (the interpreter's one worker cuts no unit): units cut between streams, each
    cut unit's heads merged by its group combine, or (``fused``) by the last of its pieces to
    take its ticket (no combine task)."""
    model = load(name)
    opts = CompileOptions(B, S, target="h200", num_workers=workers,
                          tile=TileConfig(attn_stream=True, attn_pairs=True, attn_group=group,
                                          kv_step=256, fuse_combine=fused))
    compiled = compile_model(model, opts, name)
    kinds = [t.kind for t in compiled.tasks.tasks]
    d = compiled.ops.dims
    kind = "attn_group_stream" if group > 2 else "attn_pair_stream"
    assert kinds.count(kind) > d.layers and all(
        t.args["heads"] == group for t in compiled.tasks.tasks if t.kind == kind)
    assert (kinds.count("attn_group_combine") == 0) == fused
    assert (compiled.sync.num_tickets > 0) == fused
    assert_vm_matches_eager(compiled, model)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_kernel_equals_vm_with_fused_combines(name):
    """Attention pieces that merge their unit themselves (the last to take its ticket): no
    attn_combine task."""
    tiles = TileConfig(kv_block=16, kv_split=16, attn_tasks_per_worker=0, fuse_combine=True)
    kinds = check_kernel_against_vm(name, tiles)
    assert "attn_combine" not in kinds and "attn_partial" in kinds


def test_kernel_equals_vm_with_fused_combines_of_pairs_over_key_ranges():
    """Pairs of kv heads over key ranges whose last part merges both units (its ticket)."""
    tiles = TileConfig(kv_block=16, kv_split=16, attn_tasks_per_worker=0, attn_pairs=True,
                       attn_pair_ranges=True, fuse_combine=True)
    kinds = check_kernel_against_vm("tiny-llama", tiles)
    assert "attn_combine" not in kinds and "attn_pair_part" in kinds


@pytest.mark.parametrize("name,norm", [("tiny-llama", {}), ("tiny-qwen3", dict(norm_sums=True))])
def test_kernel_equals_vm_with_fused_reduces(name, norm):
    """K slices that reduce their column group themselves (the last to take its ticket): no
    linear_reduce task; with ``norm_sums`` the last also writes the sums the next norm takes."""
    tiles = TileConfig(split_k=2, block_k=32, norm_first=bool(norm) or None, fuse_reduce=True,
                       **norm)
    kinds = check_kernel_against_vm(name, tiles)
    assert "linear_part_reduce" in kinds
    assert not {"linear_reduce", "linear_part", "reduce_norm", "rms_norm"} & set(kinds)


@pytest.mark.parametrize("name,slices,tiles", [
    ("tiny-llama", 2, dict(qkv_parts=2)), ("tiny-llama", 3, dict(norm_sums=True)),
    ("tiny-qwen3", 5, dict(norm_sums=True, split_head_norm=False))])
def test_kernel_equals_vm_with_qkv_in_k_slices(name, slices, tiles):
    """q/k/v pieces in K slices, each piece finished by the last slice to take its ticket (no
    qkv_rope task): x normalised by rms_norm tasks, or the row RMS from sums of squares applied
    to the summed slices; tiny-qwen3's q and k heads whole, their head norm in the finish."""
    tiles = TileConfig(qkv_slices=slices, norm_first=True, **tiles)
    kinds = check_kernel_against_vm(name, tiles)
    assert "qkv_part_rope" in kinds and "qkv_rope" not in kinds
    model = load(name)
    compiled = compile_model(model, CompileOptions(B, S, target="cpu", tile=tiles), name)
    assert {t.args["slices"] for t in compiled.tasks.tasks if t.kind == "qkv_part_rope"} == \
        {slices}
    assert_vm_matches_eager(compiled, model)


def test_kernel_equals_vm_with_op_bodies_as_calls():
    """Op bodies built as functions of their own (``noinline``) compute the same step."""
    check_kernel_against_vm("tiny-qwen3", TileConfig(split_k=2, norm_first=True), noinline=True)


@pytest.mark.parametrize("split, norm", [(3, dict(reduce_norm=True)), (1, dict(norm_sums=True))])
def test_kernel_equals_vm_with_the_long_projections_in_slices_of_their_own(split, norm):
    """tiny-llama's down (K 224) in 2 K slices, o (K 96) in 3 or whole."""
    tiles = TileConfig(split_k=split, long_slices=2, block_k=32, norm_first=True, **norm)
    check_kernel_against_vm("tiny-llama", tiles)
    compiled = compile_model(load("tiny-llama"), CompileOptions(B, S, target="cpu", tile=tiles),
                             "tiny-llama")
    ops = compiled.ops
    k = {op.name: ops.buffers[op.params["weight"]].shape[1] for op in ops.ops
         if op.kind == "linear"}
    slices = {(k[t.op], t.args["slices"]) for t in compiled.tasks.tasks
              if t.kind in ("linear_reduce", "reduce_norm")}
    assert slices == {(224, 2)} | ({(96, 3)} if split > 1 else set())


@pytest.mark.parametrize("norm", [dict(reduce_norm=True), dict(norm_sums=True)])
def test_kernel_equals_vm_with_slices_of_the_long_projections_only(norm):
    """K slices only for projections with more reduction columns than the hidden size (96):
    tiny-llama's down (224) sliced, o (96) whole; the norm after down with the reduce (by rows,
    or the reduces' sums of squares), the one after o by rows or (``norm_sums``) from the sums
    of squares o's tasks write."""
    tiles = TileConfig(split_k=2, block_k=32, norm_first=True, split_long=True, **norm)
    check_kernel_against_vm("tiny-llama", tiles)
    model = load("tiny-llama")
    tasks = compile_model(model, CompileOptions(B, S, target="cpu", tile=tiles),
                          "tiny-llama").tasks.tasks
    sliced = {t.op for t in tasks if t.kind == "linear_part"}
    whole = {t.op for t in tasks if t.kind == "linear"}
    layers = model.config.num_layers
    assert len(sliced) == layers and len(whole) == layers + 1          # down; o and lm_head
    normed = [t for t in tasks if t.kind in ("rms_norm", "reduce_norm")]
    if "reduce_norm" in norm:
        assert {t.op for t in normed if t.kind == "reduce_norm"} == sliced
        assert any(t.kind == "rms_norm" and t.op.startswith("gate_up") for t in normed)
    else:       # no norm phase: the embedding, the reduces and o's tasks write sums
        assert normed == []
        writers = {t.op for t in tasks if t.kind == "linear" and t.args["osums"] is not None}
        assert len(writers) == layers and writers < whole                # o's, not lm_head's


def assert_vm_matches_eager(compiled, model) -> None:
    """The VM's step of ``compiled`` against the eager model's: logits and the cache."""
    tokens, positions, cache = inputs(model)
    cache_ref = cache.clone()
    vm = run_vm(compiled, model, tokens, positions, cache)
    ref = model(tokens, positions, cache_ref)
    torch.testing.assert_close(vm[compiled.ops.output].view_as(ref), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache, cache_ref, atol=1e-5, rtol=1e-5)


def check_kernel_against_vm(name, tiles, noinline: bool = False) -> list[str]:
    """The kernel's step against the VM's, every buffer; the kinds of its tasks."""
    model = load(name)
    opts = CompileOptions(B, S, target="cpu", tile=tiles, noinline=noinline)
    compiled = compile_model(model, opts, name)
    tokens, positions, cache = inputs(model)
    cache_vm = cache.clone()
    step = MegakernelStep(compiled, model, cache)
    step(tokens, positions, cache)
    vm = run_vm(compiled, model, tokens, positions, cache_vm)
    mem = compiled.encoded.memory
    for name_, off in mem.act.items():
        ref = vm[name_]
        got = step.act[off: off + ref.numel()].view(ref.shape)
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5, msg=lambda m: f"{name_}: {m}")
    for name_, off in mem.f32.items():
        if name_.endswith(".acc") or name_.endswith(".ml"):
            ref = vm[name_]
            got = step.f32[off: off + ref.numel()].view(ref.shape)
            torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5, msg=lambda m: f"{name_}: {m}")
    torch.testing.assert_close(cache, cache_vm, atol=2e-5, rtol=2e-5)
    return [t.kind for t in compiled.tasks.tasks]


@pytest.mark.parametrize("name,workers,parts,slices,balance", [
    ("tiny-qwen3", 2, 1, 1, False), ("tiny-qwen3", 7, 1, 1, False), ("tiny-qwen3", 32, 1, 1, False),
    ("tiny-llama", 32, 3, 1, False), ("tiny-qwen3", 32, 4, 1, False),
    ("tiny-llama", 32, 2, 2, False), ("tiny-llama", 8, 1, 1, True), ("tiny-qwen3", 5, 1, 1, True),
    ("tiny-llama", 5, 1, 1, "stream"), ("tiny-qwen3", 32, 1, 1, "stream"),
    ("tiny-llama", 5, 1, 1, "cross"), ("tiny-llama", 13, 1, 1, "cross"),
    ("tiny-llama", 64, 1, 1, "cross"), ("tiny-qwen3", 5, 1, 1, "pairs"),
    ("tiny-llama-kv4", 7, 1, 1, "groups"), ("tiny-llama-kv4", 64, 1, 1, "pair parts"),
    ("tiny-qwen3", 7, 1, 1, "cross"), ("tiny-llama", 5, 1, 1, "spill"),
    ("tiny-qwen3", 32, 1, 2, "sums"), ("tiny-llama", 7, 1, 2, "long sums"),
    ("tiny-llama", 7, 1, 1, "fused"), ("tiny-qwen3", 32, 1, 1, "fused")])
def test_vm_on_many_workers_matches_eager(name, workers, parts, slices, balance):
    """The VM on many workers against eager, for each tiling form ``balance`` names (True:
    balanced attention ranges), each form's tasks checked to be the ones it makes."""
    model = load(name)
    form = "balance" if balance is True else balance or "plain"
    opts = CompileOptions(B, S, target="h200", num_workers=workers,
                          tile=form_tile(form, parts, slices))
    compiled = compile_model(model, opts, name)
    FORM_CHECKS.get(form, lambda *a: None)(compiled, opts, name, workers)
    assert_vm_matches_eager(compiled, model)


def form_tile(form: str, parts: int, slices: int) -> TileConfig:
    """The tile knobs of a tiling form, with ``parts`` q/k/v pieces a head and ``slices`` K
    slices."""
    pairs = form in ("pairs", "groups", "pair parts")
    sums = form in ("sums", "long sums")
    whole = form == "spill" or pairs and form != "pair parts"
    return TileConfig(qkv_parts=parts, split_head_norm=parts > 1, split_k=slices,
                      attn_balance=form == "balance", kv_split=64 if whole else 16,
                      attn_stream=form == "stream", kv_step=256, qkv_cross=form == "cross",
                      attn_pairs=pairs, attn_group=4 if form == "groups" else 2,
                      attn_pair_ranges=form == "pair parts", attn_spill=form == "spill",
                      norm_first=True if sums else None, norm_sums=sums,
                      split_long=form == "long sums", fuse_combine=form == "fused")


def kinds_of(compiled) -> list[str]:
    return [t.kind for t in compiled.tasks.tasks]


def check_fused(compiled, opts, name, workers):
    """Every unit merged by its last piece: no combine task."""
    assert "attn_combine" not in kinds_of(compiled) and compiled.sync.num_tickets > 0


def check_cross(compiled, opts, name, workers):
    """Pieces across heads in one wave (not where heads have a head norm)."""
    qkv = [t.args for t in compiled.tasks.tasks if t.kind == "qkv_rope"]
    per_layer = len(qkv) // compiled.ops.dims.layers
    half = compiled.ops.dims.head_dim // 2
    crossing = [a for a in qkv if a.get("cross") and a["d0"] + a["part"] > half]
    least = opts.tile.min_qkv_dims                  # pairs: a tensor-core dot's 16 rows
    assert all(a["part"] >= least for a in qkv)
    if name == "tiny-llama":    # 8 pairs a head: pieces of 8 cross none (13, 64 workers)
        assert per_layer <= workers or all(a["part"] == least for a in qkv)
        assert bool(crossing) == (workers == 5)
    else:
        assert not crossing


def check_stream(compiled, opts, name, workers):
    """Shares of whole 16-key steps, units cut between them, each merged once."""
    kinds = kinds_of(compiled)
    assert kinds.count("attn_stream") > compiled.ops.dims.layers
    assert 0 < kinds.count("attn_combine") and "attn_partial" not in kinds


def check_pairs(compiled, opts, name, workers):
    """A task per row and pair (group of 4) of kv heads, no partials."""
    kinds, d, n = kinds_of(compiled), compiled.ops.dims, opts.tile.attn_group
    kind = "attn_group" if n > 2 else "attn_pair"
    assert kinds.count(kind) == d.layers * B * d.kv_heads // n
    assert "attn_partial" not in kinds and "attn_combine" not in kinds


def check_pair_parts(compiled, opts, name, workers):
    """A task per row, pair of kv heads and key range; a combine per unit."""
    kinds, d = kinds_of(compiled), compiled.ops.dims
    assert kinds.count("attn_pair_part") == d.layers * B * d.kv_heads // 2 * (S // 16)
    assert kinds.count("attn_combine") == d.layers * B * d.kv_heads
    assert "attn_partial" not in kinds


def check_spill(compiled, opts, name, workers):
    """6 units on 5 workers: 5 whole, the last in 16-key pieces, one combine."""
    first = next(t.op for t in compiled.tasks.tasks if t.kind == "attn_partial")
    tasks = [t for t in compiled.tasks.tasks if t.op == first]
    spans = sorted((t.args["span"], t.args["kv_split"], t.args["direct"]) for t in tasks
                   if t.kind == "attn_partial")
    assert spans == [(16, 16, False)] * 4 + [(S, S, True)] * 5
    assert [t.kind for t in tasks].count("attn_combine") == 1


def check_sums(compiled, opts, name, workers):
    """No norm phase: the embedding, the K slices' reduces and the projections in whole
    columns write row sums, every norm reads them."""
    tasks = compiled.tasks.tasks
    readers = {t.op: t.args["groups"] for t in tasks
               if t.args.get("sums") and t.kind not in ("linear_reduce", "embed")}
    normed = {t.op for t in tasks if t.kind in ("rms_norm", "reduce_norm")}
    assert len(readers) == 2 * compiled.ops.dims.layers + 1 and not normed
    assert min(readers.values()) > 1


def check_balance(compiled, opts, name, workers):
    """Each row's keys cut once, at places that leave unequal ranges."""
    pieces = Tiler(compiled.ops, opts.tile, workers).kv_pieces()
    assert all(p[0][0] == 0 and p[-1][1] == S and all(a[1] == b[0] for a, b in zip(p, p[1:]))
               for p in pieces)
    assert len({hi - lo for p in pieces for lo, hi in p}) > 1


def check_parts(compiled, opts, name, workers):
    """q/k/v in as many pieces a head as asked (heads with a head norm split too)."""
    d = compiled.ops.dims
    assert kinds_of(compiled).count("qkv_rope") == \
        d.layers * (d.heads + 2 * d.kv_heads) * opts.tile.qkv_parts


FORM_CHECKS = {"fused": check_fused, "cross": check_cross, "stream": check_stream,
               "pairs": check_pairs, "groups": check_pairs, "pair parts": check_pair_parts,
               "spill": check_spill, "sums": check_sums, "long sums": check_sums,
               "balance": check_balance, "plain": check_parts}
