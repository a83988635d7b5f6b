"""Online retrieval over the consolidated memory: RF-Mem and the variants beyond it.

    from retrieval import Retriever
    r = Retriever.open("./memstore")
    res = r.retrieve("alice", "where did I go hiking?", k=10)
    print(res.route, res.signals["timings"], res.context(max_tokens=800))
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memory.settings import RetrievalSettings
    from retrieval.citations import citation_prompt, parse_citations
    from retrieval.context import build_context
    from retrieval.retriever import RetrievalResult, RetrievedItem, Retriever, UnknownStrategyError
    from retrieval.strategies import STRATEGIES

#: exported name -> module; loaded on first access (PEP 562) so that importing one light submodule
#: (`retrieval.rfmem`, `retrieval.citations`) does not load LanceDB and scikit-learn with the retriever
_EXPORTS = {
    "RetrievalResult": "retrieval.retriever", "RetrievedItem": "retrieval.retriever",
    "Retriever": "retrieval.retriever", "UnknownStrategyError": "retrieval.retriever",
    "RetrievalSettings": "memory.settings", "STRATEGIES": "retrieval.strategies",
    "build_context": "retrieval.context", "citation_prompt": "retrieval.citations",
    "parse_citations": "retrieval.citations",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "RetrievalResult",
    "RetrievalSettings",
    "RetrievedItem",
    "Retriever",
    "STRATEGIES",
    "UnknownStrategyError",
    "build_context",
    "citation_prompt",
    "parse_citations",
]
