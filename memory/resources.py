"""Per-process resources of consolidation: the LLM backend (a vLLM model loads once per process or
Dask worker) and the runner that sends a stage's requests through it. The embedder is
`memory.embed.embedder_for`."""
from __future__ import annotations

from typing import Any

from memory.llm.base import LLMBackend, get_backend
from memory.llm.cache import ResponseCache
from memory.llm.runner import LLMRunner
from memory.settings import Settings
from memory.store import Store

_BACKENDS: dict[str, LLMBackend] = {}


def backend_for(settings: Settings) -> LLMBackend:
    """The process-wide LLM backend for these settings (a vLLM model loads once per worker)."""
    kwargs: dict[str, Any] = {"model": settings.llm_model}
    if settings.llm == "openai":
        kwargs.update(base_url=settings.llm_base_url, concurrency=settings.llm_concurrency,
                      timeout_s=settings.llm_timeout_s, max_retries=settings.llm_max_retries,
                      max_tokens=settings.llm_max_tokens, temperature=settings.llm_temperature,
                      api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None)
    elif settings.llm == "vllm":
        kwargs.update(max_tokens=settings.llm_max_tokens, temperature=settings.llm_temperature)
    key = f"{settings.llm}|{sorted((k, str(v)) for k, v in kwargs.items())}"
    if key not in _BACKENDS:
        _BACKENDS[key] = get_backend(settings.llm, **kwargs)
    return _BACKENDS[key]


def runner_for(store: Store, settings: Settings) -> LLMRunner:
    """A new runner over the process-wide backend, with the store's response cache in front of it when
    the backend reads one. New per call, so its `stats` count one stage's requests only."""
    backend = backend_for(settings)
    return LLMRunner(backend, ResponseCache(store) if backend.reads_cache else None)
