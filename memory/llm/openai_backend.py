"""The `openai` backend: chat completions with a JSON-schema response format against any
OpenAI-compatible server (`vllm serve`, hosted APIs).

The whole batch is sent concurrently, at most `concurrency` requests in flight. Retries happen in
one place, the SDK client (`max_retries`, exponential backoff with jitter, `Retry-After` honoured)
on timeouts, connection errors, 408/409/429 and 5xx; 400/401/403/404/422 are never retried.
A request that still fails comes back as `LLMResponse.failure(kind, message)` (see
`memory.llm.base.ErrorKind`): the runner raises LLMTransientError / LLMError or quarantines.

`complete` is synchronous and safe to call from worker threads: each call runs its own event loop
and client (inside a running event loop it runs on a helper thread).
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from memory.errors import ConfigError
from memory.llm.base import ErrorKind, LLMBackend, LLMRequest, LLMResponse, register_backend

log = logging.getLogger(__name__)

_ERR_CHARS = 300


def classify(exc: BaseException) -> ErrorKind:
    """Is this failure worth retrying later (`transient`), hopeless for this request (`rejected`),
    or hopeless for every request (`fatal`: credentials, wrong model or URL)?"""
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return "transient"
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        if code in (408, 409, 429) or code >= 500:
            return "transient"
        if code in (401, 403, 404):
            return "fatal"
        return "rejected"
    return "transient"


def failure(exc: BaseException) -> LLMResponse:
    """The response for a request that failed with `exc`: its kind and a short message."""
    code = getattr(exc, "status_code", None)
    head = type(exc).__name__ + (f" {code}" if code is not None else "")
    return LLMResponse.failure(classify(exc), f"{head}: {exc}"[:_ERR_CHARS])


@register_backend("openai")
class OpenAIBackend(LLMBackend):
    """Structured-output chat completions over HTTP with bounded concurrency."""

    name = "openai"
    live = True
    default_model = ""

    def __init__(
        self,
        model: str = "",
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        max_tokens: int = 2048,
        temperature: float = 0.0,
    ) -> None:
        super().__init__(model)
        if not self.model:
            raise ConfigError("the openai backend needs a model name: set MNEMO_LLM_MODEL (the name the "
                              "server serves, e.g. the model given to `vllm serve`)", backend="openai")
        if concurrency < 1 or max_retries < 0 or timeout_s <= 0 or max_tokens < 1:
            raise ConfigError(f"openai backend: concurrency ({concurrency}) and max_tokens ({max_tokens}) must "
                              f"be >= 1, max_retries ({max_retries}) >= 0 and timeout_s ({timeout_s}) > 0",
                              backend="openai")
        self.base_url = base_url
        self._api_key = api_key or "EMPTY"  # local servers accept anything; never logged
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.temperature = temperature

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r}, concurrency={self.concurrency})"

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        if not requests:
            return []
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._complete_all(requests))
        with ThreadPoolExecutor(max_workers=1) as pool:  # called from async code: own loop, own thread
            return pool.submit(lambda: asyncio.run(self._complete_all(requests))).result()

    async def _complete_all(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        limit = asyncio.Semaphore(self.concurrency)
        async with openai.AsyncOpenAI(api_key=self._api_key, base_url=self.base_url, timeout=self.timeout_s,
                                      max_retries=self.max_retries) as client:
            responses = await asyncio.gather(*(self._one(client, limit, r) for r in requests))
        failed = sum(r.error is not None for r in responses)
        if failed:
            log.warning("openai: %d of %d requests failed after retries (model %s)", failed, len(requests),
                        self.model)
        return list(responses)

    async def _one(self, client: openai.AsyncOpenAI, limit: asyncio.Semaphore, request: LLMRequest) -> LLMResponse:
        async with limit:
            try:
                completion = await client.chat.completions.create(
                    model=self.model,
                    messages=request.messages,  # type: ignore[arg-type]
                    response_format=self.response_format(request),  # type: ignore[arg-type]
                    max_completion_tokens=self.max_tokens,
                    temperature=self.temperature,
                )
            except openai.OpenAIError as exc:
                return failure(exc)
        usage = completion.usage
        tokens_in, tokens_out = (usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else (0, 0)
        if not completion.choices:
            return LLMResponse(text=None, tokens_in=tokens_in, tokens_out=tokens_out)
        choice = completion.choices[0]
        if choice.finish_reason == "length":
            log.warning("openai: %s answer cut at max_tokens=%d", request.task, self.max_tokens)
        return LLMResponse(text=choice.message.content, tokens_in=tokens_in, tokens_out=tokens_out)

    @staticmethod
    def response_format(request: LLMRequest) -> dict[str, Any]:
        return {"type": "json_schema",
                "json_schema": {"name": request.task, "schema": request.schema, "strict": True}}
