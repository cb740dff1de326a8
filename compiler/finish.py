"""Finishers: TaskGraph -> TaskGraph with ``attached`` set: small tasks that merge what many
producers wrote (an attention combine, a split-K reduce) run by whichever producer finishes last,
so the merge starts as soon as its inputs exist instead of when a polling worker notices.

A finisher is in no queue. Each of its producers, once done, adds 1 to the finisher's ticket
counter (acquire-release); the one that brings it to epoch * producers runs the finisher on its own
worker and signals the finisher's counter for its consumers. Since a ticket acquires every
producer's release, and each producer waited for what it needed, the finisher sees everything it
depends on. Invariants: a finisher's producers are its essential dependencies, each producer
feeds at most one finisher, and no finisher is another's producer.
"""
from __future__ import annotations

from dataclasses import replace

from .ir import TaskGraph
from .sync import essential_deps

FINISHER_KINDS = ("attn_combine", "linear_reduce")


def attach_finishers(graph: TaskGraph, kinds: tuple[str, ...] = FINISHER_KINDS) -> TaskGraph:
    """The graph with each task of ``kinds`` whose producers feed no other finisher attached to
    them."""
    deps = essential_deps(graph.deps)
    attached, feeds = {}, set()
    for t, task in enumerate(graph.tasks):
        producers = deps[t]
        if task.kind not in kinds or not producers or feeds & set(producers) \
                or any(p in attached for p in producers):
            continue
        attached[t] = tuple(producers)
        feeds |= set(producers)
    return replace(graph, attached=attached)
