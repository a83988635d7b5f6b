"""Runs one stage's batch of LLM requests: cache, one backend call, validation, one re-ask, quarantine.

    answers, bad = LLMRunner(backend, ResponseCache(store)).run(requests)

- Live backends (openai, vllm): every cache key is looked up in one read; only misses go to the
  backend, as ONE batch (identical requests are sent once). Answers are written back in one upsert,
  keyed by their request, so a re-run or a retried Prefect task never pays twice. Invalid answers
  are recorded too (and the re-ask's), so `replay` and a deterministic live backend (temperature 0)
  repeat a quarantine from the record instead of paying for the same bad answer again; a valid re-ask
  answer is recorded under the original request.
- `replay`: the cache is the only source; the backend raises ReplayMissError for any miss.
- Non-live backends (`rules`, test fakes): no cache.
- An answer that is not JSON, violates `request.schema` or fails the `validate` callback (called with
  the answer and its request, so it may check what that request showed; it raises a ValueError, e.g.
  `memory.errors.InvalidAnswerError`) is asked again once (same request
  plus a user message quoting the error); still bad -> `Quarantined`.
- Backends report per-request failures as `LLMResponse.error` with its `error_kind`:
  `transient` (default) -> LLMTransientError, `fatal` -> LLMError, `rejected` -> quarantined. Errors
  are raised only after the batch's valid answers were cached. The runner never re-sends a failed
  request: retrying a call is the backend's job (see `memory.llm.openai_backend`).
"""
from __future__ import annotations

import copy
import json
import logging
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Callable

import jsonschema
from jsonschema.exceptions import best_match

from memory.errors import LLMError, LLMTransientError
from memory.ids import make_id
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse
from memory.llm.cache import ResponseCache
from memory.llm.structured import without_null_optionals

log = logging.getLogger(__name__)

#: a semantic check of one parsed answer given its request: raises a ValueError when invalid
Validator = Callable[[dict[str, Any], LLMRequest], None]

_RAW_LOG = 200
_ERR_QUOTE = 300


@dataclass
class LLMStats:
    """What a runner spent: requests sent (re-asks included), tokens, cache hits, re-asks, quarantined."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cache_hits: int = 0
    retries: int = 0
    quarantined: int = 0

    def add(self, other: LLMStats) -> LLMStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Quarantined:
    """A request whose answer stayed invalid after the re-ask (or that the backend rejected)."""

    request: LLMRequest
    raw: str | None
    reason: str

    def row(self, user_id: str | None, run_id: str, source: str) -> dict[str, Any]:
        """A `quarantine` table row; the id is stable across runs so a re-run replaces it."""
        return {
            "id": make_id("llm-quarantine", user_id, self.request.task, self.request.prompt_version, source,
                          self.request.cache_key("")),
            "user_id": user_id,
            "stage": self.request.task,
            "source": source,
            "reason": self.reason,
            "raw": self.raw,
            "run_id": run_id,
            "created_at": datetime.now(timezone.utc),
        }


class LLMRunner:
    """Sends a stage's requests through one backend, with the response cache in front of it."""

    def __init__(self, backend: LLMBackend, cache: ResponseCache | None = None) -> None:
        self.backend = backend
        self.cache = cache
        self.stats = LLMStats()

    @property
    def _reads_cache(self) -> bool:
        return self.cache is not None and self.backend.reads_cache

    @property
    def _writes_cache(self) -> bool:
        return self.cache is not None and self.backend.live

    def run(
        self,
        requests: list[LLMRequest],
        validate: Validator | None = None,
    ) -> tuple[list[dict[str, Any] | None], list[Quarantined]]:
        """One parsed answer per request (None where quarantined), and the quarantined requests."""
        answers: list[dict[str, Any] | None] = [None] * len(requests)
        if not requests:
            return answers, []
        model = self.backend.model
        keys = [r.cache_key(model) for r in requests]
        calls_before = self.stats.calls

        # 1. recorded answers first (one cache read), the misses as ONE batch
        first = self._fetch(requests, keys, validate)
        to_cache: dict[str, dict[str, Any]] = {}
        failed: list[tuple[int, LLMResponse]] = []
        rejected: list[tuple[int, str]] = []
        bad: list[tuple[int, str | None, str]] = []
        for i, resp in enumerate(first):
            answer = self._sort(i, resp, requests[i], validate, failed, rejected, bad)
            if answer is not None:
                answers[i] = answer
                self._record(to_cache, keys[i], requests[i], resp)
        sent = {keys[i] for i, r in enumerate(first) if not r.cached}
        all_rejected = len(sent) > 1 and {keys[i] for i, _ in rejected} == sent

        # 2. one re-ask batch for invalid answers (also answered from the record where there is one)
        quarantined: list[Quarantined] = []
        if bad:
            self.stats.retries += len(bad)
            again = [_reask(requests[i], problem) for i, _, problem in bad]
            again_keys = [r.cache_key(model) for r in again]
            still_bad: list[tuple[int, str | None, str]] = []
            for (i, _, _), req2, key2, resp2 in zip(bad, again, again_keys, self._fetch(again, again_keys, validate)):
                answer = self._sort(i, resp2, requests[i], validate, failed, rejected, still_bad)
                if answer is not None:
                    answers[i] = answer  # a good second answer is recorded under the original request
                    self._record(to_cache, keys[i], requests[i], resp2)
                elif resp2.error is None:  # both invalid answers go on record, so a re-run or replay repeats this
                    self._record(to_cache, keys[i], requests[i], first[i])
                    self._record(to_cache, key2, req2, resp2)
            for i, raw, problem in still_bad:
                quarantined.append(Quarantined(requests[i], raw, f"invalid answer after one re-ask: {problem}"))
                log.warning("quarantined %s answer %s: %s; raw %r", requests[i].task, keys[i], problem,
                            (raw or "")[:_RAW_LOG])
        for i, error in rejected:
            quarantined.append(Quarantined(requests[i], None, f"rejected by the backend: {error}"))
            log.warning("quarantined %s request %s: backend rejected it: %s", requests[i].task, keys[i], error)

        # 3. cacheable work first, then failures
        if to_cache and self._writes_cache:
            assert self.cache is not None
            self.cache.put_many(list(to_cache.values()))
        if all_rejected:
            raise LLMError(
                f"the {self.backend.name} backend rejected all {len(sent)} {requests[0].task} requests "
                f"(first: {rejected[0][1]}); this looks like a configuration problem (model, server options), "
                "not bad prompts", backend=self.backend.name, task=requests[0].task, failed=len(sent))
        self._raise_failures(requests, failed)
        self.stats.quarantined += len(quarantined)
        log.info("llm %s: %d requests, %d answered from the cache, %d sent (re-asks included), %d re-asked, "
                 "%d quarantined", requests[0].task, len(requests), sum(r.cached for r in first),
                 self.stats.calls - calls_before, len(bad), len(quarantined))
        return answers, quarantined

    # -- helpers --------------------------------------------------------------------------
    def _fetch(self, requests: list[LLMRequest], keys: list[str],
               validate: Validator | None) -> list[LLMResponse]:
        """One response per request: the recorded one where the cache holds a usable answer (marked
        `cached`), the rest from one backend batch in which identical live requests are sent once.
        A recorded answer that does not validate is used only by `replay` and by a deterministic live
        backend (temperature 0: it would answer the same again), unless it was cut at a lower token limit
        than the backend's now (a raised limit must get its chance); others ask again."""
        out: list[LLMResponse | None] = [None] * len(requests)
        if self._reads_cache:
            assert self.cache is not None
            hits = self.cache.get_many(keys)
            reuse_invalid = not self.backend.live or getattr(self.backend, "temperature", None) == 0
            limit = getattr(self.backend, "max_tokens", None)
            for i, key in enumerate(keys):
                row = hits.get(key)
                if row is None:
                    continue
                cut = row.get("truncated_at")
                reuse = reuse_invalid and not (self.backend.live and cut is not None and (limit or 0) > cut)
                if not reuse and check(row["response"], requests[i].schema, bound(validate, requests[i]))[0] is None:
                    log.warning("cached %s answer %s does not validate; asking again", requests[i].task, key)
                    continue
                out[i] = LLMResponse(text=row["response"], tokens_in=int(row.get("tokens_in") or 0),
                                     tokens_out=int(row.get("tokens_out") or 0), cached=True)
                self.stats.cache_hits += 1
        groups: dict[str, list[int]] = {}
        for i, resp in enumerate(out):
            if resp is None:
                groups.setdefault(keys[i] if self.backend.live else str(i), []).append(i)
        for members, resp in zip(groups.values(), self._send([requests[m[0]] for m in groups.values()])):
            for i in members:
                out[i] = resp
        return [r for r in out if r is not None]

    def _record(self, to_cache: dict[str, dict[str, Any]], key: str, request: LLMRequest,
                resp: LLMResponse) -> None:
        """Put a fresh answer (valid or not: it is the record of what the model said) in the batch's
        cache write; answers that came from the cache are not written again."""
        if not resp.cached and resp.text is not None:
            to_cache[key] = ResponseCache.row(key, backend=self.backend.name, model=self.backend.model,
                                              request=request, response=resp,
                                              max_tokens=getattr(self.backend, "max_tokens", None))

    def _send(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        if not requests:
            return []
        responses = self.backend.complete(requests)
        if len(responses) != len(requests):
            raise LLMError(f"the {self.backend.name} backend answered {len(responses)} of {len(requests)} "
                           "requests", backend=self.backend.name)
        self.stats.calls += len(requests)
        for resp in responses:
            self.stats.tokens_in += resp.tokens_in
            self.stats.tokens_out += resp.tokens_out
        return responses

    @staticmethod
    def _sort(i: int, resp: LLMResponse, request: LLMRequest, validate: Validator | None,
              failed: list[tuple[int, LLMResponse]], rejected: list[tuple[int, str]],
              bad: list[tuple[int, str | None, str]]) -> dict[str, Any] | None:
        """The parsed answer of a valid response; else file the response under failed, rejected or bad."""
        if resp.error is not None:
            if resp.error_kind == "rejected":
                rejected.append((i, resp.error))
            else:
                failed.append((i, resp))
            return None
        answer, problem = check(resp.text, request.schema, bound(validate, request))
        if answer is None:
            bad.append((i, resp.text, problem or "invalid"))
        return answer

    def _raise_failures(self, requests: list[LLMRequest], failed: list[tuple[int, LLMResponse]]) -> None:
        if not failed:
            return
        fatal = [(i, r) for i, r in failed if r.error_kind == "fatal"]
        worst = fatal or failed
        first_i, first = worst[0][0], worst[0][1].error
        ctx = dict(backend=self.backend.name, task=requests[first_i].task, failed=len(failed),
                   total=len(requests), first_error=first)
        msg = (f"{len(failed)} of {len(requests)} {requests[first_i].task} requests to the "
               f"{self.backend.name} backend failed (first: {first})")
        log.error("%s", msg)
        if fatal:
            raise LLMError(msg + "; not worth retrying", **ctx)
        raise LLMTransientError(msg, **ctx)


def bound(validate: Validator | None, request: LLMRequest) -> Callable[[dict[str, Any]], None] | None:
    """`validate` for the answers of `request` (what `check` calls)."""
    return None if validate is None else lambda answer: validate(answer, request)


def check(text: str | None, schema: dict[str, Any],
          validate: Callable[[dict[str, Any]], None] | None = None) -> tuple[Any, str | None]:
    """(parsed answer, None) when `text` is JSON valid for `schema` and `validate`, else (None, why)."""
    if text is None or not text.strip():
        return None, "empty answer"
    try:
        answer = json.loads(_strip_fence(text))
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc}"
    except RecursionError:   # "[[[[..." deeper than the parser's recursion limit
        return None, "not valid JSON: nested too deeply"
    answer = without_null_optionals(answer, schema)
    try:
        err = best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(answer))
        if err is not None:
            return None, f"schema violation at {err.json_path}: {err.message}"[:_ERR_QUOTE]
    except RecursionError:   # nested just under the parser's limit: the validator's message recurses
        return None, "schema violation: nested too deeply"
    if validate is not None:
        try:
            validate(answer)
        except ValueError as exc:  # InvalidAnswerError is one
            return None, f"rejected: {exc}"[:_ERR_QUOTE]
    return answer, None


@lru_cache(maxsize=64)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


def _strip_fence(text: str) -> str:
    """Tolerate a leading `<think>...</think>` block (reasoning models) and a ```json fence around the
    object (models without structured outputs add one)."""
    s = text.strip()
    if s.startswith("<think>") and "</think>" in s:
        s = s.split("</think>", 1)[1].strip()
    if s.startswith("```") and s.endswith("```"):
        s = s[3:-3]
        s = s[4:] if s.startswith("json") else s
    return s


def _reask(request: LLMRequest, problem: str) -> LLMRequest:
    note = (f"Your previous answer was invalid: {problem[:_ERR_QUOTE]}. Answer again with only the JSON "
            "object that satisfies the required schema, and nothing else.")
    return replace(request, messages=[*request.messages, {"role": "user", "content": note}])
