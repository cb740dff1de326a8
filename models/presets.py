"""Built-in models: real shapes of public checkpoints (random weights, for benchmarks) and tiny
models for the CPU. Shapes are copied from the public config.json files of those checkpoints."""
from __future__ import annotations

from .config import Llama3RopeScaling, ModelConfig


def _llama(vocab, hidden, inter, layers, heads, kv, head_dim, tie, factor) -> ModelConfig:
    return ModelConfig(
        arch="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
        tie_word_embeddings=tie, torch_dtype="bfloat16",
        rope_scaling=Llama3RopeScaling(factor, 1.0, 4.0, 8192),
        bos_token_id=128000, eos_token_ids=(128001, 128008, 128009))


def _qwen3(hidden, inter, layers, heads, tie) -> ModelConfig:
    return ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=hidden, intermediate_size=inter,
        num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6,
        rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=tie,
        torch_dtype="bfloat16", eos_token_ids=(151645,))


def _tiny(arch, hidden, inter, layers, heads, kv, head_dim) -> ModelConfig:
    return ModelConfig(
        arch=arch, vocab_size=259, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
        num_heads=heads, num_kv_heads=kv, head_dim=head_dim, rms_norm_eps=1e-5,
        rope_theta=10000.0, max_position_embeddings=2048, tie_word_embeddings=False,
        bos_token_id=256, eos_token_ids=(257,))


PRESETS: dict[str, ModelConfig] = {
    "llama-3.2-1b": _llama(128256, 2048, 8192, 16, 32, 8, 64, tie=True, factor=32.0),
    "llama-3.2-3b": _llama(128256, 3072, 8192, 28, 24, 8, 128, tie=True, factor=32.0),
    "llama-3.1-8b": _llama(128256, 4096, 14336, 32, 32, 8, 128, tie=False, factor=8.0),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, tie=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, tie=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, tie=False),
    "tiny-llama": _tiny("llama", hidden=96, inter=224, layers=3, heads=6, kv=2, head_dim=16),
    "tiny-qwen3": _tiny("qwen3", hidden=80, inter=144, layers=2, heads=4, kv=2, head_dim=24),
}
