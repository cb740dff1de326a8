"""Static KV cache: one tensor [layers, 2, B, kv_heads, S, head_dim] (index 0 keys, 1 values)."""
from __future__ import annotations

import torch

from megakernel.models.config import ModelConfig


def cache_shape(cfg: ModelConfig, batch_size: int, max_seq_len: int) -> tuple[int, ...]:
    return (cfg.num_layers, 2, batch_size, cfg.num_kv_heads, max_seq_len, cfg.head_dim)


def allocate_kv_cache(cfg: ModelConfig, batch_size: int, max_seq_len: int, *,
                      dtype: torch.dtype, device: torch.device | str,
                      fill: float = 0.0) -> torch.Tensor:
    """A zero-filled cache by default: the eager engine masks unread slots with a softmax weight of
    0, and 0 * NaN would still poison the output, so only kernels that never touch unread slots may
    be tested with ``fill=float('nan')``."""
    if batch_size < 1 or max_seq_len < 1:
        raise ValueError(f"batch_size={batch_size} and max_seq_len={max_seq_len} must be >= 1")
    return torch.full(cache_shape(cfg, batch_size, max_seq_len), fill, dtype=dtype, device=device)


def cache_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, itemsize: int) -> int:
    return cfg.num_layers * 2 * batch_size * cfg.num_kv_heads * seq_len * cfg.head_dim * itemsize
