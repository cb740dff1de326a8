"""Results file ``{"gpu", "date", "torch", "triton", "copy_TBps", "results": [...]}``: merging
a new run into it (a row is replaced by a newer one of the same model, batch, context, backend)
and drawing ms/token against batch size.

    python -m megakernel.bench.results INTO.json RUN.json... [--plot PNG]

merges the rows of each run (in order) into INTO.json, e.g. the halves of a range of batch sizes
timed side by side on two GPUs."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROW_KEY = ("model", "batch_size", "context", "backend")


def merge_results(path: Path, report: dict) -> dict:
    old = json.loads(path.read_text()) if path.is_file() else {"results": []}
    fresh = {tuple(r[k] for k in ROW_KEY) for r in report["results"]}
    kept = [r for r in old.get("results", []) if tuple(r[k] for k in ROW_KEY) not in fresh]
    rows = sorted(kept + report["results"], key=lambda r: tuple(str(r[k]).zfill(6) for k in ROW_KEY))
    merged = {k: v for k, v in report.items() if k != "results"} | {"results": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=1) + "\n")
    return merged


def check_plot_path(path: Path) -> None:
    """A ValueError unless matplotlib writes ``path``'s format (before anything is timed)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    matplotlib.use("Agg")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise ValueError(f"plot {path}: format {path.suffix or '(none)'} is not one matplotlib "
                         f"writes ({', '.join(sorted(formats))})")


def plot_results(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    models = sorted({r["model"] for r in rows})
    backends = sorted({r["backend"] for r in rows})       # one colour per backend in every panel
    colour = {b: plt.get_cmap("tab10")(i) for i, b in enumerate(backends)}
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for backend in sorted({r["backend"] for r in rows if r["model"] == model}):
            pts = sorted((r["batch_size"], r["ms_per_token"]) for r in rows
                         if r["model"] == model and r["backend"] == backend)
            ax.plot([b for b, _ in pts], [t for _, t in pts], marker="o", label=backend,
                    color=colour[backend])
        ax.set_title(f"{model}, context {rows[0]['context']}")
        ax.set_xlabel("batch size")
        ax.set_ylabel("ms / token (log scale)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"decode latency on {report.get('gpu', '?')} ({report.get('date', '')}); "
                 f"copy {report.get('copy_TBps', 0):.2f} TB/s")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")     # the title may be wider than one panel
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="merge runs' rows into a results file")
    p.add_argument("into", type=Path)
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    for run in args.runs:
        report = merge_results(args.into, json.loads(run.read_text()))
    if args.plot:
        plot_results(report, args.plot)


if __name__ == "__main__":
    main()
