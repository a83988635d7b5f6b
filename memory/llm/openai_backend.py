"""The `openai` backend: chat completions with a JSON-schema response format against any
OpenAI-compatible server (`vllm serve`, llama.cpp's `llama_cpp.server`, hosted APIs).

The whole batch is sent concurrently, at most `concurrency` requests in flight. The request shape
(the structured-output *dialect*, `memory.llm.structured`) is negotiated once per backend: the first
request is tried in each dialect in turn until the server accepts one (a rejection naming a dialect
field: `response_format`, `max_completion_tokens`...), and every later request uses that one.

Retries happen in exactly one place per HTTP call: the loop in `OpenAIBackend` around each request.
The SDK client is built with `max_retries=0`, so its own retries never stack with ours. A failed call
is tried again, up to `max_retries` more times, only when :func:`is_retryable` says so: timeouts,
connection errors, 408/409/429 and 5xx (:func:`classify` -> `transient`); 400/401/403/404/422 and any
other 4xx are never retried, nor is a 5xx whose body is a request validation error (llama.cpp answers a
body it cannot parse with HTTP 500 and pydantic's message: permanent, `rejected`). The wait (:func:`retry_delay`) honours the server's `Retry-After` /
`Retry-After-Ms` (up to 60 s), else backs off exponentially (0.5 s doubling, at most 8 s, minus up to
25 % jitter). A request that still fails comes back as `LLMResponse.failure(kind, message)` (see
`memory.llm.base.ErrorKind`): the runner never re-sends it; it raises LLMTransientError / LLMError
or quarantines, and whether a stage is run again after an LLMTransientError is the flow's decision.

`complete` is synchronous and safe to call from worker threads: each call runs its own event loop
and client (inside a running event loop it runs on a helper thread).
"""
from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from memory.errors import ConfigError
from memory.llm.base import ErrorKind, LLMBackend, LLMRequest, LLMResponse, register_backend
from memory.llm.structured import DIALECTS, Dialect, chat_body, is_validation_error, names_a_dialect_field

log = logging.getLogger(__name__)

_ERR_CHARS = 300
#: backoff between tries of one request when the server names no delay (the SDK's own values)
INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
#: the longest server-named delay (`Retry-After`) that is honoured; longer ones fall back to backoff
MAX_RETRY_AFTER_S = 60.0


#: one call's whole time, in units of `timeout_s` (which httpx applies to each connect and read)
DEADLINE_TIMEOUTS = 2


class DeadlineError(openai.OpenAIError):
    """A call that took longer than `timeout_s` in all: tried again like a timeout."""


class MalformedBodyError(openai.OpenAIError):
    """A 200 answer whose body is not a chat completion (a proxy's error page, a cut-off body): tried
    again like any transient failure."""


def classify(exc: BaseException) -> ErrorKind:
    """Is this failure worth retrying later (`transient`), hopeless for this request (`rejected`),
    or hopeless for every request (`fatal`: credentials, wrong model or URL)?"""
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return "transient"
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        if code >= 500 and is_validation_error(error_text(exc)):
            return "rejected"
        if code in (408, 409, 429) or code >= 500:
            return "transient"
        if code in (401, 403, 404):
            return "fatal"
        return "rejected"
    return "transient"


def error_text(exc: BaseException) -> str:
    """The server's error message and body as one string (what the dialect checks read)."""
    return f"{exc} {getattr(exc, 'body', '') or ''}"


def is_dialect_rejection(exc: BaseException) -> bool:
    """Did the server refuse the request's shape (a field another dialect spells differently), rather
    than its content or its own health? Such a request is worth sending once in the next dialect."""
    return (isinstance(exc, openai.APIStatusError) and classify(exc) == "rejected"
            and names_a_dialect_field(error_text(exc)))


def is_retryable(exc: BaseException) -> bool:
    """Is a failed call worth trying again right away? Only `transient` failures (see `classify`)."""
    return classify(exc) == "transient"


def retry_after(exc: BaseException) -> float | None:
    """The delay in seconds the server asked for (`Retry-After-Ms`, `Retry-After` as seconds or an
    HTTP date), or None when it named none."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            return float(value) / divisor
        except ValueError:
            continue
    try:
        parsed = email.utils.parsedate_tz(headers.get("retry-after"))
        return None if parsed is None else float(email.utils.mktime_tz(parsed) - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def retry_delay(retries_done: int, exc: BaseException) -> float:
    """How long to wait before retry number `retries_done + 1` after `exc`: the server's delay when it
    named one (0 < delay <= MAX_RETRY_AFTER_S), else exponential backoff with up to 25 % jitter."""
    asked = retry_after(exc)
    if asked is not None and math.isfinite(asked) and 0 < asked <= MAX_RETRY_AFTER_S:
        return asked
    backoff = min(INITIAL_RETRY_DELAY_S * 2.0 ** min(retries_done, 1000), MAX_RETRY_DELAY_S)
    return max(0.0, backoff * (1 - 0.25 * random.random()))


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
        #: the dialect this server accepted (None until the first request got through)
        self.dialect: Dialect | None = None
        self._negotiating = threading.Lock()
        #: HTTP calls tried again after a transient failure, over the backend's life (`mnemo bench llm`)
        self.http_retries = 0

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
        # max_retries=0: the SDK never retries; `_call` is the one retry loop (see the module docstring)
        async with openai.AsyncOpenAI(api_key=self._api_key, base_url=self.base_url, timeout=self.timeout_s,
                                      max_retries=0) as client:
            head: list[LLMResponse] = []
            if self.dialect is None:
                with self._negotiating:  # other threads' batches wait for the first answer's dialect
                    if self.dialect is None:
                        head = [await self._negotiate(client, requests[0])]
            rest = requests[len(head):]
            responses = head + list(await asyncio.gather(*(self._one(client, limit, r) for r in rest)))
        failed = sum(r.error is not None for r in responses)
        if failed:
            log.warning("openai: %d of %d requests failed after retries (model %s)", failed, len(requests),
                        self.model)
        return list(responses)

    async def _negotiate(self, client: openai.AsyncOpenAI, request: LLMRequest) -> LLMResponse:
        """Send `request` in each dialect in turn until one is accepted; keep that one for the server."""
        for n, dialect in enumerate(DIALECTS):
            try:
                completion = await self._call(client, request, dialect)
            except openai.OpenAIError as exc:
                if n + 1 < len(DIALECTS) and is_dialect_rejection(exc):
                    log.info("openai: %s rejected the %s dialect (%s); trying %s", self.base_url, dialect.name,
                             str(exc)[:_ERR_CHARS], DIALECTS[n + 1].name)
                    continue
                return failure(exc)
            self.dialect = dialect
            log.info("openai: %s speaks the %s structured-output dialect", self.base_url, dialect.name)
            return self._response(request, completion)
        raise AssertionError("unreachable: the last dialect returns")

    async def _one(self, client: openai.AsyncOpenAI, limit: asyncio.Semaphore, request: LLMRequest) -> LLMResponse:
        async with limit:
            try:
                completion = await self._call(client, request, self.dialect or DIALECTS[0])
            except openai.OpenAIError as exc:
                return failure(exc)
        return self._response(request, completion)

    def _response(self, request: LLMRequest, completion: ChatCompletion) -> LLMResponse:
        usage = completion.usage
        tokens_in, tokens_out = (usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else (0, 0)
        if not completion.choices:
            return LLMResponse(text=None, tokens_in=tokens_in, tokens_out=tokens_out)
        choice = completion.choices[0]
        cut = choice.finish_reason == "length"
        if cut:
            log.warning("openai: %s answer cut at max_tokens=%d", request.task, self.max_tokens)
        return LLMResponse(text=choice.message.content, tokens_in=tokens_in, tokens_out=tokens_out, truncated=cut)

    async def _create(self, client: openai.AsyncOpenAI, body: dict[str, Any]) -> ChatCompletion:
        """One HTTP call, over in `DEADLINE_TIMEOUTS` x `timeout_s` at most (httpx's timeout bounds each
        read: a server trickling bytes would hold it far longer); a 200 whose body is not a chat
        completion is a (transient) failure."""
        deadline = DEADLINE_TIMEOUTS * self.timeout_s
        try:
            result = await asyncio.wait_for(client.chat.completions.create(model=self.model, **body), deadline)
        except asyncio.TimeoutError:
            raise DeadlineError(f"no whole answer within {deadline:g} s ({DEADLINE_TIMEOUTS} x timeout_s)") from None
        except ValueError as exc:   # the SDK's JSON decoding of a 200 body that is not JSON
            raise MalformedBodyError(f"the server's answer is not JSON: {exc}") from exc
        if not isinstance(result, ChatCompletion):
            raise MalformedBodyError(f"the server's answer is not a chat completion but {type(result).__name__}")
        return result

    async def _call(self, client: openai.AsyncOpenAI, request: LLMRequest, dialect: Dialect) -> ChatCompletion:
        """One chat completion in `dialect`, tried again (up to `max_retries` times) while `is_retryable`."""
        retries = 0
        body = chat_body(request, dialect, max_tokens=self.max_tokens, temperature=self.temperature)
        body["messages"] = cast(list[ChatCompletionMessageParam], body["messages"])
        while True:
            try:
                return await self._create(client, body)
            except openai.OpenAIError as exc:
                if retries >= self.max_retries or not is_retryable(exc):
                    raise
                delay = retry_delay(retries, exc)
                retries += 1
                self.http_retries += 1  # a figure for reports, never read for control
                log.info("openai: %s request failed (%s), retry %d of %d in %.2fs", request.task,
                         type(exc).__name__, retries, self.max_retries, delay)
                await asyncio.sleep(delay)
