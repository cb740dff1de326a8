"""Dependencies from region overlap: a task depends on every earlier task that wrote a box its
reads overlap (read-after-write), in task order. Never wired by hand.

``derive_deps(tasks) -> ((dep ids, ...) per task)``; the cache's writers are indexed by layer so
that lookups stay short.
"""
from __future__ import annotations

import functools
from collections import defaultdict

import numpy as np

from .ir import Region


def _region_key(r: Region):
    """Writers are indexed by buffer and, for the cache, by layer: lookups stay short."""
    return (r.buffer, r.box[0] if r.buffer == "kv_cache" else None)


class _Writers:
    """The boxes written so far into one buffer (one cache layer), tested against a read box all
    at once."""

    def __init__(self):
        self.ids, self.boxes, self.arrays = [], [], None

    def add(self, task: int, box) -> None:
        self.ids.append(task)
        self.boxes.append(box)
        self.arrays = None

    def overlapping(self, box) -> list[int]:
        if not self.ids:
            return []
        if self.arrays is None:                     # rebuilt once per run of reads
            b = np.asarray(self.boxes)              # [writers, dims, 2]
            self.arrays = (np.asarray(self.ids), b[:, :, 0], b[:, :, 1])
        ids, lo, hi = self.arrays
        q = np.asarray(box)                         # [dims, 2]
        return ids[np.all((lo < q[:, 1]) & (q[:, 0] < hi), axis=1)].tolist()


def derive_deps(tasks) -> tuple[tuple[int, ...], ...]:
    return _derived(tuple(tasks))


# the last tasks' kept: the tiling and the validation of one compile ask for the same
@functools.lru_cache(maxsize=1)
def _derived(tasks: tuple) -> tuple[tuple[int, ...], ...]:
    writers: dict = defaultdict(_Writers)
    deps = []
    for task in tasks:
        found = set()
        for r in task.reads:
            keys = [_region_key(r)] if r.buffer != "kv_cache" else [
                ("kv_cache", (layer, layer + 1)) for layer in range(*r.box[0])]
            for k in keys:
                found.update(writers[k].overlapping(r.box))
        deps.append(tuple(sorted(found)))
        for w in task.writes:
            writers[_region_key(w)].add(task.id, w.box)
    return tuple(deps)
