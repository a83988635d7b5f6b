"""`RulesBackend`: answers each request with the rule registered for its task (see `registry.TASKS`)."""
from __future__ import annotations

import json

from memory.llm.base import LLMBackend, LLMRequest, LLMResponse, register_backend
from memory.llm.rules.registry import TASKS

__all__ = ["RulesBackend"]


@register_backend("rules")
class RulesBackend(LLMBackend):
    """Deterministic heuristics for every LLM step (see `memory.llm.rules` for what they miss)."""

    name = "rules"
    live = False
    default_model = "rules-v1"

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        out: list[LLMResponse] = []
        for req in requests:
            fn = TASKS.get(req.task)
            if fn is None:
                out.append(LLMResponse.failure("fatal", f"rules backend has no rule for task {req.task}"))
                continue
            try:
                answer = fn(req.context)
            except Exception as exc:  # a bad context is this request's error, not the batch's; the rules
                # are deterministic, so asking again gives the same failure: quarantine, do not retry
                out.append(LLMResponse.failure("rejected", f"rules backend failed on task {req.task}: {exc!r}"))
                continue
            out.append(LLMResponse(text=json.dumps(answer, ensure_ascii=False)))
        return out
