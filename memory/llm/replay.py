"""The `replay` backend: the response cache without a live model (tests and benchmarks).

`LLMRunner` answers every request it can from the cache first, so whatever reaches this backend
is a miss, and a miss is an error, not a guess. `model` must be the model the answers were
recorded with: it is part of every cache key.
"""
from __future__ import annotations

from memory.errors import ReplayMissError
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse, register_backend


@register_backend("replay")
class ReplayBackend(LLMBackend):
    """Answers only from recorded responses (read by the runner); raises for anything else."""

    name = "replay"
    live = False
    default_model = ""

    @property
    def reads_cache(self) -> bool:
        return True             # the cache is its only source

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        if not requests:
            return []
        first = requests[0]
        raise ReplayMissError(
            f"replay has no recorded answer for {len(requests)} request(s) (first: task {first.task!r}, "
            f"prompt version {first.prompt_version!r}, model {self.model!r}); record them with a live "
            "backend and the same model name first",
            missing=len(requests), task=first.task, prompt_version=first.prompt_version, model=self.model,
        )
