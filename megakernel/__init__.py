"""megakernel: compile a PyTorch language model into one persistent GPU kernel per batch size.

Subpackages: ``megakernel.models`` (configs, weights, tokenizers), ``megakernel.runtime`` (KV cache,
sampling, engine, kernel launcher), ``megakernel.compiler`` (FX graph to kernel),
``megakernel.bench``. ``megakernel.compile`` is the one-call entry point.
"""
__version__ = "0.1.0"


def compile(model, batch_sizes=(1,), max_seq_len: int = 1024, target: str | None = None,
            **options) -> dict:
    """Compile ``model`` (a ``megakernel.models.CausalLM``) into one persistent kernel per batch
    size: ``{batch_size: Compiled}``. ``target`` defaults to the GPU when CUDA is available, else
    the CPU interpreter (which is then selected before Triton is imported). Other keyword
    arguments go to ``CompileOptions`` (num_workers, scheduler, tile, num_warps, prefetch)."""
    import torch

    from megakernel.interpreter import ensure_interpreter, kernel_target

    if target is None:
        target = kernel_target("cuda" if torch.cuda.is_available() else "cpu")
    elif target == "cpu":
        ensure_interpreter()
    from megakernel.compiler.pipeline import CompileOptions, compile_model

    sizes = [batch_sizes] if isinstance(batch_sizes, int) else list(batch_sizes)
    name = getattr(model.config, "arch", "model")
    return {b: compile_model(model, CompileOptions(b, max_seq_len, target=target, **options), name)
            for b in sizes}
