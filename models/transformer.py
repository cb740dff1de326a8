"""Decoder-only transformer for Llama-3.x and Qwen3, written to trace with ``torch.fx``.

Inputs of :meth:`CausalLM.forward`:
    tokens     [B, T] int64    token ids (T = prompt length at prefill, 1 at decode)
    positions  [B, T] int64    absolute position of each token in its sequence
    kv_cache   [L, 2, B, Hkv, S, D]  static cache; keys and values of the new tokens are written
               in place at ``positions``, attention reads every slot ``<= position``
Output: logits [B, T, V] (or [B, 1, V] when ``logit_index`` [B] picks one position per row).

Invariants: shapes are static and there is no data-dependent Python control flow, so one
``symbolic_trace`` per (B, T) captures a whole step. Cache slots beyond a token's position are never
read, so right-padded prompts and rows of different lengths share one batch. Parameter names equal
the Hugging Face names without their ``model.`` prefix.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, T, D]; cos, sin: [B, T, D]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def kv_write_index(positions: torch.Tensor, num_layers: int, num_kv_heads: int):
    """Index tensors that place a step's keys and values [2, B, Hkv, T, D] in the cache."""
    dev = positions.device
    layers = torch.arange(num_layers, device=dev)[:, None, None, None, None]  # [L, 1, 1, 1, 1]
    kinds = torch.arange(2, device=dev)[:, None, None, None]                   # [2, 1, 1, 1]
    rows = torch.arange(positions.shape[0], device=dev)[None, :, None, None]   # [1, B, 1, 1]
    heads = torch.arange(num_kv_heads, device=dev)[None, None, :, None]        # [1, 1, Hkv, 1]
    slots = positions[None, :, None, :]                                        # [1, B, 1, T]
    return layers, (kinds, rows, heads, slots)


def write_kv(kv_cache: torch.Tensor, layer: torch.Tensor, index, kv: torch.Tensor) -> None:
    """kv_cache[layer, :, b, h, positions[b, t]] = kv[:, b, h, t]; kv: [2, B, Hkv, T, D].

    One ``index_put_`` on the whole cache (not on a view of it), so that a compiler can update
    the cache in place instead of copying it."""
    kv_cache.index_put_((layer, *index), kv)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, kv_cache, kv_index, layer: int):
        # x: [B, T, hidden]; kv_cache: [L, 2, B, Hkv, S, D]; mask: [B, 1, T, S]
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))     # [B, T, H, D]
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))  # [B, T, Hkv, D]
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))  # [B, T, Hkv, D]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)     # [B, H*, T, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        write_kv(kv_cache, kv_index[0][layer], kv_index[1], torch.stack((k, v)).to(kv_cache.dtype))
        k_cache, v_cache = kv_cache[layer, 0], kv_cache[layer, 1]             # [B, Hkv, S, D]
        out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).flatten(2))                    # [B, T, hidden]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, kv_cache, kv_index, layer: int):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv_cache, kv_index, layer)
        return h + self.mlp(self.post_attention_layernorm(h))


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", cfg.inv_freq(), persistent=False)  # [D / 2] fp32
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (after building on the meta device)."""
        self.inv_freq = self.config.inv_freq().to(self.embed_tokens.weight.device)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions[..., None].float() * self.inv_freq                  # [B, T, D / 2]
        emb = torch.cat((freqs, freqs), dim=-1)                               # [B, T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, tokens, positions, kv_cache, logit_index=None):
        x = self.embed_tokens(tokens)                                         # [B, T, hidden]
        cos, sin = self.rope(positions, x.dtype)
        slots = torch.arange(kv_cache.shape[4], device=tokens.device)         # [S]
        mask = slots[None, None, None, :] <= positions[:, None, :, None]      # [B, 1, T, S]
        kv_index = kv_write_index(positions, len(self.layers), self.config.num_kv_heads)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, kv_cache, kv_index, i)
        if logit_index is not None:
            x = x.gather(1, logit_index[:, None, None].expand(-1, 1, x.shape[2]))  # [B, 1, hidden]
        return self.lm_head(self.norm(x))                                     # [B, T, V]
