"""The one interface every LLM backend speaks, and the registry that finds them by name.

A stage builds all of its requests for a shard and hands the whole batch to `complete`:
vLLM schedules it, the HTTP backend sends it with bounded concurrency, `rules` answers it with
deterministic heuristics. Each request carries the rendered chat `messages` (for real models),
the JSON `schema` the answer must satisfy, and the structured `context` the prompt was rendered
from (for the `rules` stand-in, which does not read prose).
"""
from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

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


#: what a failed request is worth: `transient` (retry the task later), `rejected` (this request is
#: hopeless: quarantine it), `fatal` (every request will fail: stop, e.g. credentials or model name)
ErrorKind = Literal["transient", "rejected", "fatal"]


@dataclass
class LLMResponse:
    """What came back for one request: raw `text`, or `error` when no answer could be had."""

    text: str | None
    tokens_in: int = 0
    tokens_out: int = 0
    cached: bool = False
    error: str | None = None
    #: the answer was cut at the token limit (finish reason "length")
    truncated: bool = False
    #: how the runner treats `error`; a backend that does not say is assumed to have hit a passing fault
    error_kind: ErrorKind = "transient"

    @classmethod
    def failure(cls, kind: ErrorKind, message: str) -> "LLMResponse":
        """A failed request of `kind` (no answer text)."""
        return cls(text=None, error=message, error_kind=kind)


class LLMBackend(ABC):
    """Answers a batch of requests, in order, one response each."""

    name: str = "base"
    #: live backends pay per call, so their answers go into the content-addressed cache
    live: bool = True

    def __init__(self, model: str = "") -> None:
        self.model = model or self.default_model

    default_model: str = ""

    @property
    def reads_cache(self) -> bool:
        """Does the runner answer from the response cache before calling this backend? Live ones do."""
        return self.live

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


#: the built-in backends and the module that registers each, imported only when asked for by name
#: so optional SDKs (openai, vllm) load only when their backend is chosen
_BUILTIN: dict[str, str] = {
    "rules": "memory.llm.rules",
    "openai": "memory.llm.openai_backend",
    "vllm": "memory.llm.vllm_backend",
    "replay": "memory.llm.replay",
}


def _load_builtin(name: str) -> None:
    module = _BUILTIN.get(name)
    if module is not None:
        importlib.import_module(module)


def backend_factory(name: str) -> Callable[..., LLMBackend]:
    """The factory registered under `name` (importing a built-in backend's module first)."""
    _load_builtin(name)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownBackendError("llm", name, known_backends()) from None


def get_backend(name: str, **kwargs: Any) -> LLMBackend:
    """Build a backend by name, e.g. get_backend("openai", model=..., base_url=...)."""
    return backend_factory(name)(**kwargs)


def known_backends() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTRY))


class RulesAnswers(LLMBackend):
    """Answers as the `rules` backend does, each answer passed through `answer` (unchanged here): for
    benchmarks and tests that need rules' answers through another path (a `live` one is cached like a
    paid model's) or some of them spoiled."""

    def __init__(self, model: str = "") -> None:
        super().__init__(model)
        self.rules = get_backend("rules")

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        return [self.answer(r, a, i) for i, (r, a) in enumerate(zip(requests, self.rules.complete(requests)))]

    def answer(self, request: LLMRequest, answer: LLMResponse, index: int) -> LLMResponse:
        """The answer given for `request` (the `index`-th of its batch), from rules' `answer`."""
        return answer
