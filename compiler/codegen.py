"""Generate: Encoded tables -> KernelSource, by rendering templates/megakernel.py.jinja.

The template only stitches the signature, the persistent loop and one dispatch branch per opcode;
each branch's argument list is built here from the registry, so the words the encoder wrote are
the words the kernel reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from .encode import ALIGN, Encoded
from .ir import KernelSource
from .registry import HEADER, HEADER_WORDS, NUM_WORDS, REGISTRY

KERNEL_NAME = "megakernel_step"


def _template_dir() -> Path:
    import megakernel.templates as pkg

    return Path(pkg.__file__).parent


def field_expr(field, word: int, unit: int = 1, words: str = "w") -> str:
    w = f"{words}{HEADER_WORDS + word}"    # the instruction's words, loaded once per task
    # buffer words count ALIGN elements and int words their unit, so the product says what
    # divides the offset (16-byte loads). Never ``tl.multiple_of(w, ...)``: that marks the
    # word's one load, and the same word is a field of other opcodes, whose masks then look
    # constant over ALIGN lanes (an attn_combine of 3 slots in 4 lanes read the 4th).
    return {"act": f"act_ptr + {w} * {ALIGN}",
            "f32": f"f32_ptr + {w} * {ALIGN}",
            "weight": f"weights_ptr + {w}.to(tl.int64) * {ALIGN}",
            "int": f"{w} * {unit}" if unit > 1 else w, "ticket": w}[field.space]


def call_args(kind: str, constexprs: dict, units: dict, words: str = "w") -> str:
    """The op body's arguments from the instruction's words (``words``: their variables'
    prefix, ``w`` this task's, ``n`` the next one's)."""
    spec, word, args = REGISTRY[kind], 0, []
    for f in spec.fields:
        if f.space == "kernel":
            args.append(f.name)
        else:
            args.append(field_expr(f, word, units.get(f.name, 1), words))
            word += 1
    args += [f"{k}={v!r}" for k, v in constexprs.items()]
    return ", ".join(args)


@dataclass(frozen=True)
class Variant:
    opcode: int
    kind: str
    body: str
    args: str
    prefetch: str      # the kind's prefetch body, or ""
    stage: str         # the kind's staging body, or ""
    next_args: str     # ``args`` from the next instruction's words (its prefetch ahead)


def body_modules() -> list[str]:
    """The modules under megakernel.compiler that the kernel imports: the loop's and every op
    body's (the registry's)."""
    bodies = [b for spec in REGISTRY.values() for b in (spec.body, spec.prefetch, spec.stage)
              if b]
    return sorted({"kernel_loop", "staging"} | {b.split(".")[0] for b in bodies})


def most_waits(enc: Encoded) -> int:
    """The most waits a task of the kernel has, up to a power of two (``wait_counters``'s
    WAITS: above 1, a task with several polls them at once)."""
    most = int(enc.instructions[:, HEADER.index("num_waits")].max(initial=1))
    return 1 << (most - 1).bit_length()


def call_name(body: str) -> str:
    """The generated module's name for an op body built as a function of its own."""
    return "call_" + body.replace(".", "_")


def generate(enc: Encoded, model: str, batch: int, num_tasks: int,
             noinline: bool = False) -> KernelSource:
    """``noinline``: each op body a function of its own (a call), so that ptxas gives each the
    registers it needs instead of one allocation for the whole dispatch (GPU builds only)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_template_dir()),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    bodies = {kind: REGISTRY[kind].body for _, kind, _, _ in enc.variants}
    calls = sorted(set(bodies.values())) if noinline else []
    variants = [Variant(op, kind, call_name(bodies[kind]) if noinline else bodies[kind],
                        call_args(kind, cx, units), REGISTRY[kind].prefetch, REGISTRY[kind].stage,
                        call_args(kind, cx, units, "n"))
                for op, kind, cx, units in enc.variants]
    source = env.get_template("megakernel.py.jinja").render(
        kernel_name=KERNEL_NAME, model=model, batch=batch, num_tasks=num_tasks,
        num_workers=len(enc.queues), variants=variants,
        calls=[(call_name(b), b) for b in calls], num_words=NUM_WORDS, align=ALIGN,
        modules=body_modules(), waits=most_waits(enc),
        h={name: f"w{i}" for i, name in enumerate(HEADER)}, next_op=f"n{HEADER.index('op')}")
    return KernelSource(source, KERNEL_NAME, len(enc.queues), enc)
