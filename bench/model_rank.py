"""How well the cost model ranks what was timed: per batch size of autotune ledgers, the
schedule classes' rated step (``runtime.search.predict``) against their fastest measured
variant, without a GPU.

    python -m megakernel.bench.model_rank bench/results/autotune-llama-3.2-1b.json \
        [--model llama-3.2-1b] [--set sync_us=0.5 --set attn_chain_gain=0.3]

Inputs: ledgers (``autotune.json``) of one model at one context; ``--set`` changes figures of
the H200 target (``compiler.cost.Target`` fields). Output per batch size: the classes timed,
the Spearman rank correlation of rated against measured, and where the fastest measured class
stood among the rated; then the means. Code-level knobs (warps, pipelines, calls) do not
change a class's rating, so a class is measured by its fastest variant.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import fields, replace
from pathlib import Path

import torch


def ranks(xs: list[float]) -> list[float]:
    """Ranks from 0, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out, i = [0.0] * len(xs), 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            out[k] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (Pearson's of the ranks; NaN where either is constant)."""
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    sa, sb = (sum((x - m) ** 2 for x in r) ** 0.5 for r, m in ((ra, ma), (rb, mb)))
    return cov / (sa * sb) if sa and sb else float("nan")


def class_times(ops, labels: dict, target) -> list[tuple[float, float]]:
    """(rated us, fastest measured us) of each schedule class among ``labels`` {variant label:
    measured ms}, each variant as built for ``ops``."""
    from megakernel.runtime import search
    from megakernel.runtime.effective import effective
    from megakernel.runtime.variant import parse_variant

    alike, memo, classes = search.alike_ops(ops), {}, {}
    for label, ms in labels.items():
        v = effective(ops, parse_variant(label))
        cls = search.schedule_class(v)
        rated, best = classes.get(cls, (None, float("inf")))
        if rated is None:
            rated = search.predict(ops, v, target, alike, memo)
        classes[cls] = (rated, min(best, ms * 1e3))
    return list(classes.values())


def rank_report(pairs: list[tuple[float, float]]) -> tuple[float, int]:
    """(Spearman of rated against measured, the fastest measured class's place among the rated,
    from 1)."""
    rated, measured = zip(*pairs)
    best = min(range(len(pairs)), key=lambda i: measured[i])
    place = sorted(range(len(pairs)), key=lambda i: rated[i]).index(best) + 1
    return spearman(list(rated), list(measured)), place


def ledger_labels(path: Path) -> tuple[int, dict]:
    """(context, {batch: {label: ms}}) of a ledger's right measurements."""
    rows = json.loads(path.read_text())["runs"]
    contexts = {json.loads(r["key"]).get("seq") for r in rows}
    if len(contexts) != 1:
        raise ValueError(f"{path}: one context per ledger, found {sorted(map(str, contexts))}")
    by: dict = {}
    for r in rows:
        if r["error"] is None and r["ms"]:
            by.setdefault(r["batch"], {})[r["variant"]] = r["ms"]
    return contexts.pop(), by


def target_with(changes: list[str]):
    from megakernel.compiler.cost import H200

    names = {f.name: f.type for f in fields(H200)}
    kw = {}
    for text in changes:
        name, _, value = text.partition("=")
        if name not in names or name in ("name", "sms"):
            raise ValueError(f"--set {text!r}: not a figure of the target "
                             f"({', '.join(n for n in names if n not in ('name', 'sms'))})")
        kw[name] = type(getattr(H200, name))(float(value))
    return replace(H200, **kw)


def main(argv: list[str] | None = None) -> None:
    from megakernel.compiler.pipeline import model_ops
    from megakernel.models import PRESETS
    from megakernel.models.weights import empty_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ledgers", nargs="+", type=Path)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    args = p.parse_args(argv)
    target, model = target_with(args.set), empty_model(PRESETS[args.model]).to(torch.bfloat16)
    for path in args.ledgers:
        context, by = ledger_labels(path)
        rows = []
        for batch in sorted(by):
            pairs = class_times(model_ops(model, batch, context), by[batch], target)
            if len(pairs) >= 3:
                rows.append(rank_report(pairs))
                print(f"{path} batch {batch:3d}: {len(pairs):3d} classes  spearman "
                      f"{rows[-1][0]:5.2f}  fastest rated #{rows[-1][1]}", flush=True)
        print(f"{path}: mean spearman {sum(r for r, _ in rows) / len(rows):.3f}, fastest rated "
              f"#{sum(p for _, p in rows) / len(rows):.2f} on average", flush=True)


if __name__ == "__main__":
    main()
