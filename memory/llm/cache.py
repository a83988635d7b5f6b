"""The content-addressed LLM response cache over the store's `llm_cache` table.

Keys are `LLMRequest.cache_key(model)`: a hash of model, prompt version, messages and schema, not of
the backend, so answers recorded through `openai` replay through `replay` (and vLLM offline answers
too, when the model name matches). One read per batch (`get_many`), one upsert per batch (`put_many`).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable

from memory.store import Store

if TYPE_CHECKING:
    from memory.llm.base import LLMRequest, LLMResponse

TABLE = "llm_cache"
#: keys per `isin` filter; a batch larger than this is read in a few chunks
_READ_CHUNK = 20_000


class ResponseCache:
    """Recorded LLM answers of one store, looked up and written a batch at a time."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get_many(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The cached rows for those keys that have one, by key."""
        wanted = sorted(set(keys))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(wanted), _READ_CHUNK):
            table = self.store.read_ids(TABLE, wanted[start:start + _READ_CHUNK])  # col("id").isin(keys)
            for row in table.to_pylist():
                found[row["id"]] = row
        return found

    def put_many(self, rows: list[dict[str, Any]]) -> int:
        """Upsert rows (see `row`) in one write (serialised per table by `Store.upsert`); returns how many
        were written."""
        if not rows:
            return 0
        return self.store.upsert(TABLE, rows)

    @staticmethod
    def row(key: str, *, backend: str, model: str, request: LLMRequest, response: LLMResponse) -> dict[str, Any]:
        """The cache row recording `response` as the answer to `request` under `key`."""
        return {
            "id": key,
            "backend": backend,
            "model": model,
            "task": request.task,
            "prompt_version": request.prompt_version,
            "response": response.text,
            "tokens_in": response.tokens_in,
            "tokens_out": response.tokens_out,
            "created_at": datetime.now(timezone.utc),
        }
