"""bench.model_rank: the cost model's ranking of timed schedule classes against a ledger."""
import json
import math

import pytest

from megakernel.bench.model_rank import (class_times, ledger_labels, rank_report, ranks,
                                         spearman, target_with)


def test_ranks_share_ties_and_spearman_follows_order_only():
    assert ranks([3.0, 1.0, 3.0, 2.0]) == [2.5, 0.0, 2.5, 1.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [9, 1, 0, -5]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert rank_report([(5.0, 1.0), (1.0, 3.0), (2.0, 2.0)]) == (pytest.approx(-1.0), 3)


def test_classes_are_rated_once_and_measured_by_their_fastest_variant(tmp_path):
    """Two labels of one schedule class (warps differ) make one class, measured by the faster;
    another block size makes another; the ledger's context and right rows are read."""
    from megakernel.compiler.pipeline import model_ops
    from megakernel.models import load_model

    rows = [dict(key=json.dumps({"batch": 2, "seq": 64, "variant": v}), batch=2, variant=v,
                 ms=ms, error=err) for v, ms, err in [
        ("32x64x4x132xs2", 2.0, None), ("32x64x8x132xs2", 1.5, None),
        ("16x64x4x132xs2", 3.0, None), ("16x64x8x132xs2", None, "wrong logits")]]
    path = tmp_path / "autotune.json"
    path.write_text(json.dumps({"runs": rows}))
    context, by = ledger_labels(path)
    assert context == 64 and len(by[2]) == 3
    ops = model_ops(load_model("tiny-llama", progress=False).model, 2, context)
    pairs = class_times(ops, by[2], target_with([]))
    assert sorted(m for _, m in pairs) == [1500.0, 3000.0] and all(r > 0 for r, _ in pairs)
    assert target_with(["sync_us=0.5"]).sync_us == 0.5
    with pytest.raises(ValueError, match="not a figure"):
        target_with(["warp_speed=9"])
