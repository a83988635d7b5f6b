"""PREMem step 1: categorized episodic fragments per session, from the LLM backend or from
imported observations (LoCoMo's recorded extraction)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memory import prompts
from memory.ids import make_id

OBSERVATION_VERSION = "observation-import-v1"


@dataclass
class SessionWork:
    """One pending session of one user, with its messages in order."""

    user_id: str
    session_id: str
    ts: datetime
    messages: list[dict[str, Any]]        # message_id, speaker, text, ts
    observed: bool = False
    observations: list[dict[str, Any]] | None = None

    @property
    def participants(self) -> list[str]:
        return list(dict.fromkeys(m["speaker"] for m in self.messages))

    def context(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id, "session_id": self.session_id, "participants": self.participants,
            "messages": [{"message_id": m["message_id"], "speaker": m["speaker"], "text": m["text"],
                          "ts": m["ts"].isoformat()} for m in self.messages],
        }


def fragment_text(key: str, subject: str, content: str) -> str:
    """What gets embedded: key phrase plus content, naming the subject (PREMem §3.2.1)."""
    body = content if content.lower().startswith(subject.lower()) else f"{subject} {content}"
    return f"{key}: {body}"


def fragment_row(session: SessionWork, item: dict[str, Any], *, run_id: str, backend: str, model: str,
                 prompt_version: str) -> dict[str, Any]:
    """A fragments-table row (without vector) for one parsed extraction item."""
    fid = make_id(session.user_id, session.session_id, item["category"], item["subject"], item["key"],
                  item["content"], item["date"], *item["source_ids"], prompt_version)
    return {
        "id": fid, "user_id": session.user_id, "session_id": session.session_id,
        "session_ts": session.ts, "subject": item["subject"], "category": item["category"],
        "key": item["key"], "content": item["content"], "date": item["date"],
        "text": fragment_text(item["key"], item["subject"], item["content"]),
        "source_ids": list(item["source_ids"]), "run_id": run_id, "backend": backend, "model": model,
        "prompt_version": prompt_version,
    }


def observation_items(session: SessionWork) -> list[dict[str, Any]]:
    """Imported observations as fragment items: category, key and date from the rule heuristics."""
    from memory.dates import normalize_date
    from memory.llm.rules import categorize, key_phrase

    items = []
    for obs in session.observations or []:
        content = obs["content"].strip()
        category = categorize(content)
        items.append({
            "subject": obs["subject"], "category": category, "key": key_phrase(content, obs["subject"]),
            "content": content, "date": normalize_date(content, session.ts, category),
            "source_ids": list(obs["source_ids"]),
        })
    return items


def extraction_requests(sessions: list[SessionWork]) -> list[prompts.LLMRequest]:
    return [prompts.extract_request(s.context()) for s in sessions]


def dedupe_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop exact repeats an LLM sometimes emits (same category, subject, content, sources)."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for it in items:
        key = (it["category"], it["subject"].lower(), it["content"].lower(), tuple(it["source_ids"]))
        if key not in seen:
            seen.add(key)
            out.append(it)
    return out
