"""Token sampling: greedy, temperature, top-k and top-p, with a seedable generator.

``sample(logits [B, V], params, generator, step) -> [B] int64``. Invariant: a row holding NaN or
Inf raises :class:`NonFiniteLogitsError` naming the step and the sequences instead of emitting a token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class NonFiniteLogitsError(RuntimeError):
    def __init__(self, step: int, rows: list[int]):
        super().__init__(f"non-finite logits (NaN or Inf) at decode step {step} "
                         f"in sequence(s) {rows}")
        self.step, self.rows = step, rows


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0            # 0 means off
    top_p: float = 1.0        # 1 means off
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, device: torch.device | str) -> torch.Generator | None:
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


def check_finite(logits: torch.Tensor, step: int) -> None:
    finite = torch.isfinite(logits).all(dim=-1)  # [B]
    if not bool(finite.all()):
        raise NonFiniteLogitsError(step, (~finite).nonzero().flatten().tolist())


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    # logits: [B, V] fp32, already divided by the temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs > top_p  # keeps the first token always
        drop = drop.scatter(-1, order, drop)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
           step: int) -> torch.Tensor:
    logits = logits.float()
    check_finite(logits, step)
    if params.greedy:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits / params.temperature, params.top_k, params.top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)
