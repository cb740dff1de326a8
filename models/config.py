"""Model configuration read from a Hugging Face ``config.json``.

Input: the parsed JSON of a ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` checkpoint (legacy
``rope_theta``/``rope_scaling`` keys or the newer ``rope_parameters`` dict).
Output: a frozen :class:`ModelConfig`. Invariant: every field the decode model needs is present and
checked; anything the model would silently get wrong (another architecture, an unknown rope type,
biases, sliding windows, a non-SiLU activation) raises :class:`UnsupportedModelError` naming it.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}


class UnsupportedModelError(ValueError):
    """The checkpoint asks for something the megakernel models do not implement."""


@dataclass(frozen=True)
class Llama3RopeScaling:
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "llama" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: Llama3RopeScaling | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES.values():
            raise UnsupportedModelError(f"unknown arch {self.arch!r}")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalises each query and key head before RoPE."""
        return self.arch == "qwen3"

    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies [head_dim // 2], fp32, llama3 scaling applied."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** exponents)
        s = self.rope_scaling
        if s is None:
            return inv_freq
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
        smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        return _parse_hf(hf)

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: a Hugging Face model folder needs config.json")
        return cls.from_hf(json.loads(path.read_text()))


def _require(hf: dict, key: str):
    if key not in hf or hf[key] is None:
        raise UnsupportedModelError(f"config.json lacks {key!r}")
    return hf[key]


def _arch(hf: dict) -> str:
    archs = hf.get("architectures") or []
    known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
    if not known:
        model_type = hf.get("model_type")
        if not archs and model_type in ARCHITECTURES.values():
            return model_type
        raise UnsupportedModelError(
            f"architecture {archs or model_type!r} is not supported; supported: "
            f"{', '.join(ARCHITECTURES)}")
    return known[0]


def _rope(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    """Both layouts: legacy rope_theta + rope_scaling, and transformers 5 rope_parameters."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported (default, llama3)")
    return float(theta), Llama3RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]))


def _refuse_unsupported(hf: dict) -> None:
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if hf.get(key):
            raise UnsupportedModelError(f"config.json sets {key}=true, which is not supported")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (silu)")
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor != 1 is not supported")


def _eos(hf: dict) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _parse_hf(hf: dict) -> ModelConfig:
    arch = _arch(hf)
    _refuse_unsupported(hf)
    hidden = int(_require(hf, "hidden_size"))
    heads = int(_require(hf, "num_attention_heads"))
    theta, scaling = _rope(hf)
    return ModelConfig(
        arch=arch,
        vocab_size=int(_require(hf, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_require(hf, "intermediate_size")),
        num_layers=int(_require(hf, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hidden // heads),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_eos(hf),
        torch_dtype=str(hf.get("dtype") or hf.get("torch_dtype") or "float32"))
