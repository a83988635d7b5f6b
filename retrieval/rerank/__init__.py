"""RMM retrospective reflection (Tan et al. §6, Appendix A.1): a reranker trained from citations.

`model` is the online side (the adapters, their stored versions, the cache the retriever reads),
`examples` turns logged feedback into training examples, `train` is the offline REINFORCE trainer.
"""
from __future__ import annotations

from retrieval.rerank.examples import BaseRetriever, Example, candidates, examples_from_feedback
from retrieval.rerank.model import GLOBAL, Reranker, RerankerCache, load_latest, save_version, scope_key
from retrieval.rerank.train import (TrainConfig, TrainReport, cited_in_top, loss_grad, pl_grad, resolve_baseline,
                                    train, train_reranker, train_step)

__all__ = [
    "GLOBAL",
    "BaseRetriever",
    "Example",
    "Reranker",
    "RerankerCache",
    "TrainConfig",
    "TrainReport",
    "candidates",
    "cited_in_top",
    "examples_from_feedback",
    "load_latest",
    "loss_grad",
    "pl_grad",
    "resolve_baseline",
    "save_version",
    "scope_key",
    "train",
    "train_reranker",
    "train_step",
]
