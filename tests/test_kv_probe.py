"""``bench/kv_probe.py`` on small shapes: the streamed sums equal the cache's, and the attention
bodies walked over every layer (tasks in the tiler's order or across rows, idle programs
polling the tasks' counters, loops rotated, tasks stamped; or as streams of units) give the
last layer's attention as SDPA does."""
import pytest
import torch

from megakernel.bench import kv_probe
from megakernel.bench.attention import sdpa

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
L, B, HQ, HKV, S, D = 2, 2, 8, 4, 32, 16


def inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(L, 2, B, HKV, S, D, generator=gen)
    q = torch.randn(B, HQ * D, generator=gen)
    pos = torch.full((B,), S - 1, dtype=torch.int32)
    table = torch.arange(B * S // 16, dtype=torch.int32).view(B, S // 16)
    return [t.to(DEVICE) for t in (cache, q, pos, table)]


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_sums_cover_the_cache(heads):
    cache, *_ = inputs(1)
    out = torch.zeros(3 * 16 * D, device=DEVICE)
    ntasks = B * HKV // heads
    kv_probe.kv_tasks[(3,)](cache, out, ntasks, L, B, HKV, S, D, heads, 16, 2, 1,
                            -(-ntasks // 3))
    torch.testing.assert_close(out.sum().cpu(), cache.sum().cpu(), atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("heads,groups,across,spin,rotate", [
    (2, 1, False, 0, False), (2, 2, True, 1, False), (4, 2, False, 1, True),
    (2, 2, False, 0, True)])
def test_bodies_match_sdpa(heads, groups, across, spin, rotate):
    cache, q, pos, table = inputs(2)
    out = torch.full_like(q, float("nan"))
    ntasks = B * HKV // heads
    stamps = torch.zeros(L * ntasks * kv_probe.FIELDS + 1, dtype=torch.int64, device=DEVICE)
    done = torch.zeros(L, dtype=torch.int32, device=DEVICE)
    programs = ntasks + 2                                  # two idle programs
    kv_probe.body_tasks[(programs,)](q, cache, pos, table, out, ntasks, L, B, HQ, HKV, S, D,
                                     HQ // HKV, 16, 16 * groups, 4, 2, heads, groups, 1, False,
                                     stamps, 1 if DEVICE == "cpu" else 2, done, spin, across,
                                     rotate)
    torch.testing.assert_close(out.cpu(), sdpa(q, cache[L - 1:], HKV).cpu(), atol=1e-5,
                               rtol=1e-5)
    marks = stamps[:-1].view(L, ntasks, kv_probe.FIELDS).cpu()
    assert (marks[..., 1] > marks[..., 0]).all()           # every task stamped, end after start
    assert (marks[..., 3] > 0).all() == (DEVICE == "cuda")  # SM clock cycles on the GPU only
    if spin:
        assert done.tolist() == [ntasks] * L


def test_stamp_summary_means_by_row_and_by_sm():
    """4 layers (the first and last left out) of 8 tasks, 4 a row (2 of 8 kv heads a task),
    task i taking 5 + i us on SM 3 + 2 * (i // 2): rows 0 and 1, and each SM, averaged alone."""
    stamps = torch.zeros(4, 8, kv_probe.FIELDS, dtype=torch.int64)
    stamps[..., 1] = torch.arange(8) * 1000 + 5000
    stamps[..., 2] = 3 + 2 * (torch.arange(8) // 2)
    span, by_row, by_sm = kv_probe.stamp_summary(stamps, 2, 8)
    assert span.startswith("  layer span 12.0 us; task mean 8.5") and "clock" not in span
    assert by_row == "  by row: 6.5 10.5"
    assert by_sm == "  by SM: 3:5.5 5:7.5 7:9.5 9:11.5"
    stamps[..., 3] = (stamps[..., 1] - stamps[..., 0]) * 3 // 2         # 1.5 cycles a ns
    assert kv_probe.stamp_summary(stamps, 2, 8)[0].endswith("; SM clock 1500 MHz")


@pytest.mark.parametrize("heads,groups,stack", [(2, 1, False), (2, 2, False), (4, 1, False),
                                               (4, 2, False), (2, 1, True), (2, 2, True)])
def test_unit_streams_match_sdpa(heads, groups, stack):
    """``stream_probe``: streams of pairs (or groups of 4) of kv heads over 3 programs, every
    layer in one launch, the keys as the dots' M where ``groups`` > 1, pairs' queries of their
    units stacked (``stack``); the last layer's attention with its cut units merged equals
    SDPA's (rows of unequal length)."""
    s = 96                                     # 3 steps of 32 keys a unit: units cut
    gen = torch.Generator().manual_seed(4)
    cache, q = torch.randn(L, 2, B, HKV, s, D, generator=gen), torch.randn(B, HQ * D, generator=gen)
    pos = torch.tensor([s - 1, s - 40], dtype=torch.int32)
    table = torch.arange(B * s // 16, dtype=torch.int32).view(B, s // 16)
    cache, q, pos, table = (t.to(DEVICE) for t in (cache, q, pos, table))
    launch, outputs = kv_probe.stream_probe(q, cache, pos, table, 3, heads, groups, 32, 2,
                                            stack=stack)
    launch()
    lengths = (pos + 1).tolist()
    ref = torch.cat([sdpa(q[r:r + 1], cache[L - 1:, :, r:r + 1, :, :lengths[r]], HKV)
                     for r in range(B)])
    torch.testing.assert_close(outputs().cpu(), ref.cpu(), atol=1e-5, rtol=1e-5)


def test_hot_rows_read_one_rows_cache_in_each_rows_order():
    """``body_inputs`` with ``hot``: each row's table points at row r % hot's blocks from its
    own block on, so a body over all rows gives SDPA over ``read_rows``' cache (one row's
    keys, in another order a row), and no other row's cache is read (made NaN here)."""
    gen = torch.Generator().manual_seed(5)
    cache = torch.randn(L, 2, 3, HKV, S, D, generator=gen).to(DEVICE)
    q, pos, table = kv_probe.body_inputs(cache, HQ, hot=1, block=16)
    assert table.tolist() == [[0, 1], [1, 0], [0, 1]]
    cache[:, :, 1:] = float("nan")
    out = torch.full_like(q, float("nan"))
    ntasks = 3 * HKV // 2
    kv_probe.body_tasks[(ntasks,)](q, cache, pos, table, out, ntasks, L, 3, HQ, HKV, S, D,
                                   HQ // HKV, 16, 16, 4, 2, 2, 1, 1)
    ref = sdpa(q, kv_probe.read_rows(cache, 1)[L - 1:], HKV)
    assert not ref.isnan().any()
    torch.testing.assert_close(out.cpu(), ref.cpu(), atol=1e-5, rtol=1e-5)
