"""Online retrieval over the consolidated memory: RF-Mem and the variants beyond it.

    from retrieval import Retriever
    r = Retriever.open("./memstore")
    res = r.retrieve("alice", "where did I go hiking?", k=10)
    print(res.route, res.signals["timings"], res.context(max_tokens=800))
"""
from retrieval.citations import citation_prompt, parse_citations
from retrieval.context import build_context
from retrieval.retriever import RetrievalResult, RetrievedItem, Retriever, UnknownStrategyError
from retrieval.settings import RetrievalSettings
from retrieval.strategies import STRATEGIES

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
