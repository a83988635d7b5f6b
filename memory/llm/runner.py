"""Runs one stage's batch of LLM requests: cache, one backend call, validation, one re-ask, quarantine.

    answers, bad = LLMRunner(backend, ResponseCache(store)).run(requests)

- Live backends (openai, vllm): every cache key is looked up in one read; only misses go to the
  backend, as ONE batch (identical requests are sent once). Valid answers are written back in one
  upsert, keyed by the original request, so a re-run or a retried Prefect task never pays twice.
- `replay`: the cache is the only source; the backend raises ReplayMissError for any miss.
- Non-live backends (`rules`, test fakes): no cache.
- An answer that is not JSON, violates `request.schema` or fails the `validate` callback (which
  raises a ValueError, e.g. `memory.errors.InvalidAnswerError`) is asked again once (same request
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

log = logging.getLogger(__name__)

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
        validate: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[list[dict[str, Any] | None], list[Quarantined]]:
        """One parsed answer per request (None where quarantined), and the quarantined requests."""
        answers: list[dict[str, Any] | None] = [None] * len(requests)
        if not requests:
            return answers, []
        model = self.backend.model
        keys = [r.cache_key(model) for r in requests]

        # 1. cache: one read for the whole batch
        pending = list(range(len(requests)))
        if self._reads_cache:
            assert self.cache is not None
            hits = self.cache.get_many(keys)
            pending = []
            for i, key in enumerate(keys):
                row = hits.get(key)
                answer, problem = (None, "miss") if row is None else check(row["response"], requests[i].schema,
                                                                          validate)
                if answer is None:
                    if row is not None:
                        log.warning("cached %s answer %s no longer validates (%s); asking again",
                                    requests[i].task, key, problem)
                    pending.append(i)
                else:
                    answers[i] = answer
                    self.stats.cache_hits += 1

        # 2. one batch for the misses; identical live requests are sent once
        groups: dict[str, list[int]] = {}
        for i in pending:
            groups.setdefault(keys[i] if self.backend.live else str(i), []).append(i)
        heads = [members[0] for members in groups.values()]
        to_cache: list[dict[str, Any]] = []
        failed: list[tuple[int, LLMResponse]] = []
        rejected: list[tuple[int, str]] = []
        bad: list[tuple[int, str | None, str]] = []
        for i, resp in zip(heads, self._send([requests[i] for i in heads])):
            self._sort(i, resp, requests[i], validate, answers, to_cache, keys, failed, rejected, bad)
        all_rejected = len(heads) > 1 and len(rejected) == len(heads)

        # 3. one re-ask batch for invalid answers
        quarantined: list[Quarantined] = []
        if bad:
            self.stats.retries += len(bad)
            again = [_reask(requests[i], problem) for i, _, problem in bad]
            still_bad: list[tuple[int, str | None, str]] = []
            for (i, _, _), resp in zip(bad, self._send(again)):
                self._sort(i, resp, requests[i], validate, answers, to_cache, keys, failed, rejected, still_bad)
            for i, raw, problem in still_bad:
                quarantined.append(Quarantined(requests[i], raw, f"invalid answer after one re-ask: {problem}"))
                log.warning("quarantined %s answer %s: %s; raw %r", requests[i].task, keys[i], problem,
                            (raw or "")[:_RAW_LOG])
        for i, error in rejected:
            quarantined.append(Quarantined(requests[i], None, f"rejected by the backend: {error}"))
            log.warning("quarantined %s request %s: backend rejected it: %s", requests[i].task, keys[i], error)

        # 4. cacheable work first, then failures
        if to_cache and self._writes_cache:
            assert self.cache is not None
            self.cache.put_many(to_cache)
        if all_rejected:
            raise LLMError(
                f"the {self.backend.name} backend rejected all {len(heads)} {requests[0].task} requests "
                f"(first: {rejected[0][1]}); this looks like a configuration problem (model, server options), "
                "not bad prompts", backend=self.backend.name, task=requests[0].task, failed=len(heads))
        self._raise_failures(requests, failed)

        # duplicates share the answer (or the quarantine) of the request that was sent
        bad_heads = {id(q.request): q for q in quarantined}
        for members in groups.values():
            for i in members[1:]:
                answers[i] = copy.deepcopy(answers[members[0]])
                q = bad_heads.get(id(requests[members[0]]))
                if q is not None:
                    quarantined.append(replace(q, request=requests[i]))
        self.stats.quarantined += len(quarantined)
        log.info("llm %s: %d requests, %d cache hits, %d sent, %d re-asked, %d quarantined",
                 requests[0].task, len(requests), len(requests) - len(pending), len(heads), len(bad),
                 len(quarantined))
        return answers, quarantined

    # -- helpers --------------------------------------------------------------------------
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

    def _sort(self, i: int, resp: LLMResponse, request: LLMRequest,
              validate: Callable[[dict[str, Any]], None] | None, answers: list[dict[str, Any] | None],
              to_cache: list[dict[str, Any]], keys: list[str], failed: list[tuple[int, LLMResponse]],
              rejected: list[tuple[int, str]], bad: list[tuple[int, str | None, str]]) -> None:
        if resp.error is not None:
            if resp.error_kind == "rejected":
                rejected.append((i, resp.error))
            else:
                failed.append((i, resp))
            return
        answer, problem = check(resp.text, request.schema, validate)
        if answer is None:
            bad.append((i, resp.text, problem or "invalid"))
            return
        answers[i] = answer
        to_cache.append(ResponseCache.row(keys[i], backend=self.backend.name, model=self.backend.model,
                                          request=request, response=resp))

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


def check(text: str | None, schema: dict[str, Any],
          validate: Callable[[dict[str, Any]], None] | None = None) -> tuple[Any, str | None]:
    """(parsed answer, None) when `text` is JSON valid for `schema` and `validate`, else (None, why)."""
    if text is None or not text.strip():
        return None, "empty answer"
    try:
        answer = json.loads(_strip_fence(text))
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc}"
    err = best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(answer))
    if err is not None:
        return None, f"schema violation at {err.json_path}: {err.message}"[:_ERR_QUOTE]
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
    """Tolerate a ```json fence around the object (models without structured outputs add one)."""
    s = text.strip()
    if s.startswith("```") and s.endswith("```"):
        s = s[3:-3]
        s = s[4:] if s.startswith("json") else s
    return s


def _reask(request: LLMRequest, problem: str) -> LLMRequest:
    note = (f"Your previous answer was invalid: {problem[:_ERR_QUOTE]}. Answer again with only the JSON "
            "object that satisfies the required schema, and nothing else.")
    return replace(request, messages=[*request.messages, {"role": "user", "content": note}])
