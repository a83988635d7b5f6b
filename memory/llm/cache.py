"""The content-addressed LLM response cache over the store's `llm_cache` table.

Keys are `LLMRequest.cache_key(model)`: a hash of model, prompt version, messages and schema, not of
the backend, so answers recorded through `openai` replay through `replay` (and vLLM offline answers
too, when the model name matches). One read per batch (`get_many`), one upsert per batch (`put_many`).

Every row also carries its reverse index (`provenance`): the user the request was for, the message ids
its prompt quotes and the ids of the memories it was built from, taken from the request's structured
`context` when the row is written. `forget_rows` finds the rows a forget must delete through it,
reading only those three columns of the user's rows, never the prompts.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable

from memory.ids import make_id
from memory.store import Store

if TYPE_CHECKING:
    from memory.llm.base import LLMRequest, LLMResponse

TABLE = "llm_cache"
#: keys per `isin` filter; a batch larger than this is read in a few chunks
_READ_CHUNK = 20_000
#: context keys whose string value (or list of strings) is a message id
_MESSAGE_KEYS = ("message_id", "source_ids", "new_source_ids")
#: context keys whose string value is the id of a memory the prompt was built from
_MEMORY_KEYS = ("id", "phase_id", "link_id")
#: context keys whose text is a summary quoted by the prompt (indexed by its hash, `text_key`)
_TEXT_KEYS = ("new_summary",)


def text_key(text: str) -> str:
    """The reverse-index entry of a quoted summary (a hash, never the text)."""
    return "text:" + make_id(text)


def provenance(context: dict[str, Any]) -> tuple[str | None, list[str], list[str]]:
    """(user id, message ids, memory ids) a request's context names, for the reverse index."""
    messages: dict[str, None] = {}
    memories: dict[str, None] = {}

    def walk(value: Any, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v, key)
        elif isinstance(value, str):
            if key in _MESSAGE_KEYS:
                messages[value] = None
            elif key in _MEMORY_KEYS:
                memories[value] = None
            elif key in _TEXT_KEYS:
                memories[text_key(value)] = None

    walk(context)
    user = context.get("user_id") if isinstance(context.get("user_id"), str) else None
    return user, list(messages), list(memories)


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

    def forget_rows(self, user_id: str, message_ids: Iterable[str], memory_ids: Iterable[str], *,
                    whole_user: bool = False) -> list[str]:
        """Keys of the user's cached answers whose prompt quotes one of `message_ids` or was built from
        one of `memory_ids` (through the reverse index: three small columns, never the prompts), plus rows
        written before the index existed (`message_ids` null: they cannot be attributed, so a forget
        drops them; they only cost a call again). `whole_user`: every row of the user."""
        if not self.store.has_table(TABLE):
            return []
        msgs, mems = set(message_ids), set(memory_ids)
        t = self.store.read(TABLE, columns=["id", "user_id", "message_ids", "memory_ids"])
        out = []
        for r in t.to_pylist():
            if r["message_ids"] is None and r["user_id"] is None:
                out.append(r["id"])
            elif r["user_id"] == user_id and (whole_user or msgs.intersection(r["message_ids"] or ())
                                              or mems.intersection(r["memory_ids"] or ())):
                out.append(r["id"])
        return out

    @staticmethod
    def row(key: str, *, backend: str, model: str, request: LLMRequest, response: LLMResponse,
            max_tokens: int | None = None) -> dict[str, Any]:
        """The cache row recording `response` as the answer to `request` under `key`, with its reverse
        index (`provenance` of the request's context) and, for an answer cut at the token limit, that
        limit (`truncated_at`; 0 when the backend did not say)."""
        user, messages, memories = provenance(request.context)
        return {
            "id": key,
            "backend": backend,
            "model": model,
            "task": request.task,
            "prompt_version": request.prompt_version,
            "response": response.text,
            "tokens_in": response.tokens_in,
            "tokens_out": response.tokens_out,
            "truncated_at": (max_tokens or 0) if response.truncated else None,
            "created_at": datetime.now(timezone.utc),
            "user_id": user,
            "message_ids": messages,
            "memory_ids": memories,
        }
