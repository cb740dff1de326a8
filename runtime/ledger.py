"""The autotuner's ledger, ``autotune.json``: every measurement as a row under a key (model hash,
batch size, device, code version, variant), so that a rerun times only what is missing, each
batch size's shortlist (``plans``), so that a rerun need not rate the candidates again, and each
batch size's final round (``finals``: label -> ms of the finalists timed again side by side)."""
from __future__ import annotations

import json
from pathlib import Path

from .variant import Variant, parse_variant


class Ledger:
    """autotune.json: every measurement, keyed so that a rerun resumes, each batch size's
    shortlist (``plans``), so that a rerun need not rate the candidates again, and its final
    round (``finals``)."""

    def __init__(self, path: Path):
        self.path = path
        data = json.loads(path.read_text()) if path.is_file() else {}
        self.rows, self.plans = data.get("runs", []), data.get("plans", {})
        self.finals = data.get("finals", {})

    def key(self, **fields) -> str:
        return json.dumps(fields, sort_keys=True)

    def get(self, key: str):
        return next((r for r in self.rows if r["key"] == key), None)

    def add(self, key: str, **row) -> dict:
        self.rows.append({"key": key, **row})
        self.save()
        return self.rows[-1]

    def add_plan(self, key: str, picks: list[tuple[Variant, float]]) -> None:
        self.plans[key] = [[v.label, predicted] for v, predicted in picks]
        self.save()

    def plan(self, key: str) -> list[tuple[Variant, float]] | None:
        picks = self.plans.get(key)
        return None if picks is None else [(parse_variant(label), p) for label, p in picks]

    def add_final(self, key: str, times: dict[str, float]) -> dict[str, float]:
        self.finals[key] = times
        self.save()
        return times

    def final(self, key: str) -> dict[str, float] | None:
        return self.finals.get(key)

    def winners(self, batch: int, **fields) -> list[str]:
        """The winner (fastest label) of each final round of batch size ``batch`` whose key
        holds ``fields`` (e.g. the model hash and context), each once, in the order kept."""
        out = []
        for key, times in self.finals.items():
            k = json.loads(key)
            if times and k.get("batch") == batch and all(k.get(f) == v
                                                         for f, v in fields.items()):
                out.append(min(times, key=times.get))
        return list(dict.fromkeys(out))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(
            {"runs": self.rows, "plans": self.plans, "finals": self.finals}, indent=1))
