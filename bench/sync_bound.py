"""How much of a decode step the megakernel's handoffs cost, bounded from above: one compiled
kernel timed as built and with its synchronisation weakened, side by side in one process.

    python -m megakernel.bench.sync_bound --winners autotune.json --batch-sizes 24,64 \\
        --forms release,relaxed,relaxed-polls --rounds 3

Forms (``kernel_loop`` with text substitutions, imported in the kernel's module in its place):
``release`` as built; ``relaxed`` each task's signal a relaxed atomic (no fence waiting for the
task's stores before the counter moves); ``relaxed-polls`` the waits' polls relaxed too (no
acquire); ``no-barrier`` the relaxed signal without the CTA barrier before it. Every form but
``release`` is wrong by design (a consumer may read its inputs before they land): its logits'
distance from eager's is printed beside, and only its time means anything, as the most a
handoff without that fence or barrier could save. Rounds alternate the forms on one step's
state (tokens, positions, cache, arenas); each form's figure is its median over the rounds.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from pathlib import Path

import torch

from megakernel.compiler import kernel_loop
from megakernel.runtime.fanout import fan_out

FORMS = {       # form -> (text in kernel_loop.py, its replacement), each required to be there
    "release": (),
    "relaxed": (('sem="release"', 'sem="relaxed"'),),
    "relaxed-polls": (('sem="release"', 'sem="relaxed"'), ('sem="acquire"', 'sem="relaxed"'),
                      ("ld.acquire.gpu.global", "ld.relaxed.gpu.global")),
    "no-barrier": (('sem="release"', 'sem="relaxed"'),
                   ('    tl.debug_barrier()\n    if c >= 0:', '    if c >= 0:')),
}


def form_module(form: str, folder: Path) -> str:
    """Write ``kernel_loop`` with the form's substitutions into ``folder`` (put on sys.path) as a
    module of its own; its name."""
    if form not in FORMS:
        raise ValueError(f"form {form!r} unknown; choose from {', '.join(FORMS)}")
    text = Path(kernel_loop.__file__).read_text().replace(
        "from .cost import", "from megakernel.compiler.cost import")
    for old, new in FORMS[form]:
        if old not in text:
            raise ValueError(f"form {form!r}: {old!r} is not in kernel_loop.py any more")
        text = text.replace(old, new)
    name = "megakernel_sync_" + form.replace("-", "_")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    return name


def form_source(source: str, form: str, folder: Path) -> str:
    """The generated kernel module with the form's ``kernel_loop`` bound in place of the built
    one (the source itself for ``release``)."""
    if form == "release":
        return source
    head = "from megakernel.compiler import "
    line = next((s for s in source.splitlines() if s.startswith(head)), None)
    if line is None or "kernel_loop" not in line:
        raise ValueError("the generated kernel does not import kernel_loop from megakernel.compiler")
    return source.replace(line, f"{line}\nimport {form_module(form, folder)} as kernel_loop", 1)


def _build_form(job) -> str | None:
    """In a worker process: build one changed form of a kernel compiled already (into the
    artifact cache) into Triton's cache; the error, if any."""
    from megakernel.compiler.artifact import compile_cached
    from megakernel.models.weights import empty_model
    from megakernel.runtime.megakernel import build_ahead

    cfg, dtype, opts, root, form, folder = job
    try:
        compiled, _ = compile_cached(empty_model(cfg).to(dtype), opts, cfg.arch, Path(root))
        build_ahead(compiled, dtype, "cuda", form_source(compiled.kernel.source, form, folder))
        return None
    except Exception as err:  # reported, then that form fails again where it is timed
        return f"{form}: {type(err).__name__}: {err}"[:300]


def build_forms(model, labels: dict[int, str], context: int, forms: list[str], folder: Path,
                jobs: int) -> None:
    """Build every batch size's kernel and its changed forms in ``jobs`` processes: first each
    variant once as built (``sweep.build_all``: compiled into the artifact cache), then the
    other forms from it, so that no two processes compile the same variant."""
    from megakernel.bench.sweep import build_all, parse_variant
    from megakernel.compiler.pipeline import CompileOptions
    from megakernel.runtime.megakernel import cache_dir

    root, dtype = str(cache_dir() / "artifacts"), next(model.parameters()).dtype
    errs = build_all(model, {b: [label] for b, label in labels.items()}, context, jobs)
    errs += fan_out(_build_form, [(model.config, dtype, CompileOptions(
        b, context, target="h200", **parse_variant(labels[b])), root, f, folder)
        for b in labels for f in forms if f != "release"], jobs)
    for err in filter(None, errs):
        print(f"build failed: {err}", flush=True)


def time_forms(model, label: str, batch: int, context: int, forms: list[str], rounds: int,
               iters: int, folder: Path) -> list[dict]:
    """Rows of one batch size: each form's median ms over the rounds, its ratio to the first
    form's (``release`` by default), and its logits' distance from eager's."""
    from megakernel.bench.decode import decode_state
    from megakernel.bench.sweep import kernel_rounds, parse_variant, rel_err
    from megakernel.runtime.megakernel import load_kernel, megakernel_backend

    tokens, positions, cache = state = decode_state(model, batch, context)
    step = megakernel_backend(model, cache, **parse_variant(label))
    src, name = step.compiled.kernel.source, step.compiled.kernel.kernel_name
    kernels = {f: load_kernel(form_source(src, f, folder), name) for f in forms}
    with torch.inference_mode():
        expected = model(tokens, positions, cache)
        times = kernel_rounds(step, kernels, state, rounds, iters)
        errs = {}
        for f in forms:
            step.kernel = kernels[f]
            errs[f] = rel_err(step(tokens, positions, cache), expected)
            step.synchronize()
    base = statistics.median(times[forms[0]])
    return [{"batch": batch, "variant": label, "form": f, "ms": statistics.median(times[f]),
             "ms_rounds": times[f], "vs_first": statistics.median(times[f]) / base,
             "rel_err": errs[f]} for f in forms]


def main(argv: list[str] | None = None) -> int:
    from megakernel.bench.sweep import collect_rows, round_args, rounds_text, winner_variants
    from megakernel.models import load_model
    from megakernel.runtime.megakernel import cache_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    round_args(p)
    p.add_argument("--variant", default="64x256x4x132xs3", help="without --winners")
    p.add_argument("--forms", default="release,relaxed,relaxed-polls")
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    args = p.parse_args(argv)
    forms = args.forms.split(",")
    folder = cache_dir() / "sync_forms"
    for f in forms:
        form_module(f, folder)                          # an unknown form fails before any work
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    model = load_model(args.model, device=args.device, dtype=dtype, progress=False).model
    batches = [int(b) for b in args.batch_sizes.split(",")]
    labels = {b: winner_variants(args.winners, b, [])[0] if args.winners else args.variant
              for b in batches}
    if args.jobs > 1 and args.device == "cuda":
        build_forms(model, labels, args.context, forms, folder, args.jobs)
    collect_rows(batches, lambda b: time_forms(model, labels[b], b, args.context, forms,
                                               args.rounds, args.iters, folder),
                 lambda row: f"{args.model} B={row['batch']} {row['form']:<14} "
                             f"{row['ms']:7.3f} ms  x{row['vs_first']:.3f} of {forms[0]}  "
                             f"rel err {row['rel_err']:.1e}  {rounds_text(row['ms_rounds'])}",
                 args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
