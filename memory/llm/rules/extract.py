"""The `extract` rule (PREMem step 1): the personal statements of each message as fragments."""
from __future__ import annotations

from typing import Any

from memory.llm.rules.registry import rule
from memory.llm.rules.statements import personal_statements, sentence_item, vocative_forms

__all__ = ["extract_answer"]


_CATEGORY_FIELD = {"factual": "Factual_Information", "experiential": "Experiential_Information",
                   "subjective": "Subjective_Information"}


@rule("extract")
def extract_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """PREMem step 1 over one session's messages (see `memory.prompts.extract_request`)."""
    answer: dict[str, list[dict[str, str]]] = {f: [] for f in _CATEGORY_FIELD.values()}
    participants = list(ctx.get("participants") or [])
    speakers = [m.get("speaker") for m in ctx.get("messages", [])]
    vocatives = vocative_forms(participants + [s for s in speakers if s])
    seen: set[tuple[str, str]] = set()
    for m in ctx.get("messages", []):
        text = m.get("text") or ""
        speaker = str(m.get("speaker") or "").strip() or "Unknown"
        mid = str(m.get("message_id") or "")
        if not text.strip() or not mid:
            continue
        for sentence in personal_statements(text, vocatives):
            item = sentence_item(sentence, speaker, m["ts"], mid)
            if (speaker, item["content"].lower()) in seen:
                continue
            seen.add((speaker, item["content"].lower()))
            answer[_CATEGORY_FIELD[item["category"]]].append({
                "subject": speaker, "key": item["key"], "value": item["content"], "message_id": mid,
                "date": item["date"],
            })
    return answer
