"""Queues placed on SMs (``queues_by_sm``): the GH100 SM groups, the placement's permutation and
spread, the option through labels, schedules and an sm_90 build."""
from types import SimpleNamespace as NS

import pytest
import torch

from megakernel.compiler.cost import H200, gh100_sm_groups
from megakernel.compiler.ir import Schedule
from megakernel.compiler.placement import attention_bytes, place_queues
from megakernel.compiler.pipeline import CompileOptions, compile_model
from megakernel.models import load_model
from megakernel.runtime.variant import parse_variant


def test_gh100_groups_cover_every_sm_once():
    groups = gh100_sm_groups()
    assert sorted(s for g in groups for s in g) == list(range(132))
    assert sorted(len(g) for g in groups) == [2] * 10 + [4] * 28
    assert H200.sm_groups == groups


def schedule_of(busy: int, workers: int = 132):
    """Queue w holds task w: an attention task of 100 bytes for the first ``busy`` queues, a
    projection of 7 bytes for the others."""
    tasks = NS(tasks=[NS(kind="attn_pair" if w < busy else "linear", bytes=100 if w < busy
                         else 7) for w in range(workers)])
    return tasks, Schedule(workers, tuple((w,) for w in range(workers)), 12.5, "greedy")


def test_placement_spreads_attention_over_the_groups():
    """96 attention queues on 132 SMs: three in every four-SM group, one in each pair and a
    second in two pairs; every queue kept once, the rating unchanged."""
    tasks, sched = schedule_of(96)
    placed = place_queues(tasks, sched, gh100_sm_groups())
    assert sorted(placed.queues) == sorted(sched.queues)
    assert (placed.makespan_us, placed.num_workers) == (12.5, 132)
    busy = [attention_bytes(tasks, q) > 0 for q in placed.queues]
    per_group = [sum(busy[s] for s in g) for g in gh100_sm_groups()]
    assert [n for g, n in zip(gh100_sm_groups(), per_group) if len(g) == 4] == [3] * 28
    assert sorted(n for g, n in zip(gh100_sm_groups(), per_group) if len(g) == 2) == \
        [1] * 8 + [2] * 2
    assert placed.queues[0] == (0,)                   # the most bytes first, lowest SM id


def test_placement_refuses_what_it_cannot_place():
    tasks, sched = schedule_of(4, workers=8)
    with pytest.raises(ValueError, match="one worker per SM"):
        place_queues(tasks, sched, gh100_sm_groups())
    with pytest.raises(ValueError, match="no SM groups"):
        place_queues(tasks, sched, ())


def test_queues_by_sm_through_labels_and_schedules():
    """The flag ``qm`` sets the option; the compiled schedule is a permutation of the one
    without, the kernel source the same (BY_SM is a launch switch, off under the interpreter;
    its sm_90 build: ``test_artifacts``)."""
    v = parse_variant("64x256x4x132xs3xqm")
    assert "qm" in v.label.split("x") and v.options(132)["queues_by_sm"]
    model = load_model("tiny-llama", progress=False).model.to(torch.bfloat16)
    plain = compile_model(model, CompileOptions(2, 64, num_workers=132), "tiny")
    opts = CompileOptions(2, 64, num_workers=132, queues_by_sm=True)
    placed = compile_model(model, opts, "tiny")
    assert sorted(placed.schedule.queues) == sorted(plain.schedule.queues)
    assert placed.kernel.source == plain.kernel.source
    assert (opts.switches()["BY_SM"], opts.switches(cuda=False)["BY_SM"]) == (1, 0)
