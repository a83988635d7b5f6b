"""Retrieval strategies by name: the RF-Mem paths as published, and the variants beyond them.

| name | what it does |
| --- | --- |
| dense | one-shot top-K cosine over raw turns only (kind=message): the baseline |
| familiarity | RF-Mem Algorithm 2: one-shot top-K cosine over every searched kind |
| recollection | RF-Mem Algorithm 3 always (retrieve → KMeans → α-mix, R rounds) |
| rfmem | RF-Mem Algorithm 1: probe, familiarity signal, gate with the paper's θ_high, θ_low, τ |
| hybrid | familiarity over dense + BM25 fused scores, with kind weights |
| rfmem-hybrid | rfmem whose both paths rank by the fused scores with kind weights |
| calibrated | rfmem-hybrid with θ_high, θ_low, τ calibrated on this user's score distribution |
| walk | MemWeaver's context-aware random walk (Eq. 2) along the user's temporal graph from the familiarity top hits; the raw turns the walked nodes cite gain a bonus |
| hybrid-walk | the same walk seeded by the hybrid (dense + BM25 + kind weights) top hits |
| rfmem-walk | rfmem whose recollection route is the walk (the paper's graph-based alternative) |
| rfmem-hybrid-walk | rfmem-hybrid whose recollection route is the walk |

Every strategy searches the settings' kinds without the memories citing only an assistant's turns
(`RetrievalSettings.assistant_speakers`, `common.assistant_memories`): those turns are searched
as raw turns. Each strategy gets a `Query` (the user index, the query vector and text, k, settings) and returns
ranked row indices, their scores, the route taken and extra signals. Modules: `common` (the query
and the helpers every strategy shares), `oneshot` (dense, familiarity, hybrid), `gated` (RF-Mem
Algorithm 1 and its variants), `walk` (the MemWeaver walk strategies).
"""
from __future__ import annotations

from typing import Callable

from retrieval import rfmem
from retrieval.strategies.common import (DEDUPE_POOL, Query, Result, assistant_memories, familiarity_signal, novel,
                                         novel_order, pool_turns, profile_row, subset, thresholds, top,
                                         turn_groups)
from retrieval.strategies.gated import gated
from retrieval.strategies.oneshot import dense, familiarity, hybrid
from retrieval.strategies.walk import walk_strategy

STRATEGIES: dict[str, Callable[[Query], Result]] = {
    "dense": dense,
    "familiarity": familiarity,
    "recollection": lambda q: gated(q, route=rfmem.RECOLLECTION, fused=False),
    "rfmem": lambda q: gated(q, route=None, fused=False),
    "hybrid": hybrid,
    "rfmem-hybrid": lambda q: gated(q, route=None, fused=True),
    "calibrated": lambda q: gated(q, route=None, fused=True, calibrated=True),
    # MemWeaver's context-aware random walk, alone and as RF-Mem's recollection expansion
    "walk": lambda q: walk_strategy(q, gate=False, fused=False),
    "hybrid-walk": lambda q: walk_strategy(q, gate=False, fused=True),
    "rfmem-walk": lambda q: walk_strategy(q, gate=True, fused=False),
    "rfmem-hybrid-walk": lambda q: walk_strategy(q, gate=True, fused=True),
}

__all__ = [
    "DEDUPE_POOL",
    "STRATEGIES",
    "Query",
    "Result",
    "assistant_memories",
    "familiarity_signal",
    "novel",
    "novel_order",
    "pool_turns",
    "profile_row",
    "subset",
    "thresholds",
    "top",
    "turn_groups",
]
