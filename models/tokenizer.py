"""Tokenizers: Hugging Face ``tokenizer.json`` through ``tokenizers``, and a byte-level one.

Both expose ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``eos_ids`` and ``pad_id``.
"""
from __future__ import annotations

from pathlib import Path


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; then BOS, EOS and PAD. Used by the built-in tiny models."""

    bos_id, eos_id, pad_id = 256, 257, 258
    vocab_size = 259

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (self.eos_id,)

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path: str | Path, eos_ids: tuple[int, ...] = ()):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.eos_ids = tuple(eos_ids)
        self.pad_id = self.eos_ids[0] if self.eos_ids else 0

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def load_tokenizer(folder: str | Path, eos_ids: tuple[int, ...] = ()) -> HFTokenizer:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass token ids or add tokenizer.json")
    return HFTokenizer(path, eos_ids)
