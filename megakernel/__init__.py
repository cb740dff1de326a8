"""megakernel: compile a PyTorch language model into one persistent GPU kernel per batch size.

Subpackages: ``megakernel.models`` (configs, weights, tokenizers), ``megakernel.runtime`` (KV cache,
sampling, engine), ``megakernel.compiler`` (FX graph to kernel), ``megakernel.bench``.
"""
__version__ = "0.1.0"
