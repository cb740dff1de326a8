"""Tiny random Hugging Face checkpoints with odd sizes, written by ``transformers`` itself."""
from __future__ import annotations

from pathlib import Path

import torch

LLAMA = dict(vocab_size=301, hidden_size=72, intermediate_size=136, num_hidden_layers=2,
             num_attention_heads=6, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5,
             max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=True,
             rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=4.0,
                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=64))
QWEN3 = dict(vocab_size=277, hidden_size=80, intermediate_size=144, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
             max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=False,
             rope_parameters=dict(rope_type="default", rope_theta=1000000.0))


def hf_model(arch: str, seed: int = 0, **overrides):
    import transformers

    torch.manual_seed(seed)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**{**LLAMA, **overrides})
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(**{**QWEN3, **overrides})
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    return model.eval()


def write_checkpoint(arch: str, folder: Path, seed: int = 0, dtype=torch.float32,
                     max_shard_size: str | None = None, **overrides):
    """Returns the HF model (fp32) whose weights now lie in ``folder``."""
    model = hf_model(arch, seed, **overrides)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.to(dtype).save_pretrained(folder, **kwargs)
    return model.float()


@torch.no_grad()
def hf_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding by full recomputation: the plainest possible reference."""
    ids, logits_seen = list(prompt), []
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()  # [V]
        logits_seen.append(logits)
        ids.append(int(logits.argmax()))
    return ids[len(prompt):], logits_seen
