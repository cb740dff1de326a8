"""Batch generation: prefill the prompts eagerly, then decode one token per step with a backend.

Input: prompts as token-id lists of different lengths, a model, a backend name, sampling params.
Output: :class:`GenerationResult` (generated ids per prompt, optional per-step logits, timings).
Invariants: prompts are right-padded; each row decodes at its own position, so padding is never
attended to. A row stops after one of ``eos_ids``; generation stops when all rows have.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from megakernel.models.transformer import CausalLM

from .backends import get_backend
from .kv_cache import allocate_kv_cache
from .sampling import NonFiniteLogitsError, SamplingParams, sample


@dataclass
class GenerationResult:
    prompt_ids: list[list[int]]
    generated_ids: list[list[int]]
    step_logits: list[torch.Tensor] = field(default_factory=list)  # each [B, V] fp32
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    padded_batch: int = 0    # rows actually run (more than the prompts when a kernel was padded)

    @property
    def decode_tokens_per_s(self) -> float:
        tokens = self.decode_steps * len(self.prompt_ids)
        return tokens / self.decode_s if self.decode_s > 0 else float("nan")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_prompts(prompts: list[list[int]], vocab_size: int) -> None:
    if not prompts:
        raise ValueError("no prompts given")
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} holds token id(s) {bad[:4]} outside [0, {vocab_size})")


class Engine:
    def __init__(self, model: CausalLM, *, backend: str = "eager", max_seq_len: int | None = None,
                 kernels=None):
        """``kernels``: a ``KernelLibrary`` of precompiled megakernels; a batch then runs on the
        kernel of its size, or padded to the next compiled size."""
        self.model = model
        self.backend = get_backend(backend)
        self.kernels = kernels
        self.max_seq_len = max_seq_len or model.config.max_position_embeddings
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.step_fn = None

    def _prefill(self, prompts: list[list[int]], pad_id: int, cache: torch.Tensor):
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)   # [B]
        width = int(lengths.max())
        tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = torch.tensor(p)
        tokens = tokens.to(self.device)                                           # [B, T]
        positions = torch.arange(width, device=self.device).expand_as(tokens)     # [B, T]
        logits = self.model(tokens, positions, cache, logit_index=lengths - 1)    # [B, 1, V]
        return logits[:, -1], lengths

    def _plan(self, prompts: list[list[int]], longest: int, pad_id: int):
        """(prompts to run, padded with one-token rows if need be; the cache; the decode step)."""
        if self.kernels is None:
            cache = allocate_kv_cache(self.model.config, len(prompts), -(-longest // 64) * 64,
                                      dtype=self.dtype, device=self.device)
            self.step_fn = self.backend(self.model, cache)
            return prompts, cache, self.step_fn
        compiled = self.kernels.pick(len(prompts), longest)
        batch, seq = compiled.options.batch_size, compiled.options.max_seq_len
        cache = allocate_kv_cache(self.model.config, batch, seq, dtype=self.dtype,
                                  device=self.device)
        self.step_fn = self.kernels.step(compiled, self.model, cache)
        return prompts + [[pad_id]] * (batch - len(prompts)), cache, self.step_fn

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 sampling: SamplingParams | None = None, eos_ids: tuple[int, ...] = (),
                 pad_id: int = 0, keep_logits: bool = False,
                 poison: bool = False) -> GenerationResult:
        """``poison`` fills every cache slot that prefill did not write with NaN, so a decode
        backend that reads a slot before writing it cannot go unnoticed."""
        _check_prompts(prompts, self.model.config.vocab_size)
        sampling = sampling or SamplingParams()
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        longest = max(len(p) for p in prompts) + max_new_tokens
        if longest > self.max_seq_len:
            raise ValueError(f"prompt plus max_new_tokens needs {longest} positions, "
                             f"max_seq_len is {self.max_seq_len}")
        batch = len(prompts)
        run, cache, step_fn = self._plan(prompts, longest, pad_id)
        generator = sampling.generator(self.device)
        result = GenerationResult([list(p) for p in prompts], [[] for _ in prompts],
                                  padded_batch=len(run))
        t0 = time.perf_counter()
        logits, positions = self._prefill(run, pad_id, cache)
        if poison:
            for row, length in enumerate(positions.tolist()):
                cache[:, :, row, :, length:] = float("nan")
        _sync(self.device)
        t1 = time.perf_counter()
        done = [False] * batch
        for step in range(max_new_tokens):
            if keep_logits:
                result.step_logits.append(logits[:batch].to("cpu", torch.float32, copy=True))
            try:
                next_tokens = sample(logits, sampling, generator, step)             # [B]
            except NonFiniteLogitsError:
                # a megakernel that tripped its watchdog says so (its error word is read on
                # the host only every few steps), rather than leaving its logits to explain it
                getattr(step_fn, "synchronize", lambda: None)()
                raise
            for i, tok in enumerate(next_tokens[:batch].tolist()):
                if not done[i]:
                    result.generated_ids[i].append(tok)
                    done[i] = tok in eos_ids
            if all(done) or step == max_new_tokens - 1:
                break
            logits = step_fn(next_tokens[:, None], positions[:, None], cache)[:, -1]
            positions = positions + 1
            result.decode_steps += 1
        getattr(step_fn, "synchronize", lambda: None)()   # a megakernel reports late errors
        _sync(self.device)
        result.prefill_s, result.decode_s = t1 - t0, time.perf_counter() - t1
        return result
