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
    from retrieval.citations import citation_prompt, parse_citations
    from retrieval.context import build_context
    from retrieval.retriever import RetrievalResult, RetrievedItem, Retriever, UnknownStrategyError
    from retrieval.settings import RetrievalSettings
    from retrieval.strategies import STRATEGIES

#: exported name -> submodule; loaded on first access (PEP 562) so that `import retrieval.cli` (every
#: `mnemo` command) does not load LanceDB and scikit-learn before a command needs them
_EXPORTS = {
    "RetrievalResult": "retriever", "RetrievedItem": "retriever", "Retriever": "retriever",
    "UnknownStrategyError": "retriever", "RetrievalSettings": "settings", "STRATEGIES": "strategies",
    "build_context": "context", "citation_prompt": "citations", "parse_citations": "citations",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"retrieval.{module}"), name)
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
