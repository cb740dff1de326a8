"""KV cache, sampling, decode backends and the generation engine (``megakernel.runtime``)."""
from .backends import BACKENDS, get_backend
from .engine import Engine, GenerationResult
from .kv_cache import allocate_kv_cache, cache_bytes, cache_shape
from .sampling import NonFiniteLogitsError, SamplingParams, sample

__all__ = [
    "BACKENDS", "Engine", "GenerationResult", "NonFiniteLogitsError", "SamplingParams",
    "allocate_kv_cache", "cache_bytes", "cache_shape", "get_backend", "sample",
]
