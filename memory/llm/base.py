"""The one interface every LLM backend speaks, and the registry that finds them by name.

A stage builds all of its requests for a shard and hands the whole batch to `complete`:
vLLM schedules it, the HTTP backend sends it with bounded concurrency, `rules` answers it with
deterministic heuristics. Each request carries the rendered chat `messages` (for real models),
the JSON `schema` the answer must satisfy, and the structured `context` the prompt was rendered
from (for the `rules` stand-in, which does not read prose).
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from memory.errors import UnknownBackendError
from memory.ids import make_id


@dataclass(frozen=True)
class LLMRequest:
    """One structured-output chat request."""

    task: str                          # "extract", "reason", ...
    prompt_version: str                # recorded on every row the answer produces
    messages: list[dict[str, str]]     # OpenAI-style chat messages
    schema: dict[str, Any]             # JSON schema of the answer
    context: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def cache_key(self, model: str) -> str:
        """Content address of this request for one model (backend-independent, so `replay` works)."""
        return make_id(model, self.prompt_version,
                       json.dumps(self.messages, sort_keys=True, ensure_ascii=False),
                       json.dumps(self.schema, sort_keys=True))


@dataclass
class LLMResponse:
    """What came back for one request: raw `text`, or `error` when no answer could be had."""

    text: str | None
    tokens_in: int = 0
    tokens_out: int = 0
    cached: bool = False
    error: str | None = None


class LLMBackend(ABC):
    """Answers a batch of requests, in order, one response each."""

    name: str = "base"
    #: live backends pay per call, so their answers go into the content-addressed cache
    live: bool = True

    def __init__(self, model: str = "") -> None:
        self.model = model or self.default_model

    default_model: str = ""

    @abstractmethod
    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        """One response per request, same order. Transient failures come back as `error`."""

    def close(self) -> None:
        """Release clients or GPU memory; the default holds nothing."""


_REGISTRY: dict[str, Callable[..., LLMBackend]] = {}


def register_backend(name: str) -> Callable[[Callable[..., LLMBackend]], Callable[..., LLMBackend]]:
    def deco(factory: Callable[..., LLMBackend]) -> Callable[..., LLMBackend]:
        _REGISTRY[name] = factory
        return factory
    return deco


def _load_builtin() -> None:
    # imported here so optional SDKs load only when their backend is chosen
    import memory.llm.rules  # noqa: F401
    import memory.llm.openai_backend  # noqa: F401
    import memory.llm.vllm_backend  # noqa: F401
    import memory.llm.replay  # noqa: F401


def get_backend(name: str, **kwargs: Any) -> LLMBackend:
    """Build a backend by name, e.g. get_backend("openai", model=..., base_url=...)."""
    _load_builtin()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownBackendError("llm", name, list(_REGISTRY)) from None
    return factory(**kwargs)


def known_backends() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)
