"""RMM prospective reflection prompts (Tan et al., Appendix D.1): D.1.1 topic extraction per
participant and session, D.1.2 merging a new topic into the user's similar history topics.
"""
from __future__ import annotations

import json
import re
from typing import Any

from memory.errors import InvalidAnswerError
from memory.llm.base import LLMRequest
from memory.prompts.common import chat

__all__ = ["TOPIC_EXTRACT_VERSION", "TOPIC_MERGE_VERSION", "TOPIC_EXTRACT_SYSTEM", "TOPIC_MERGE_SYSTEM",
           "topic_extract_schema", "topic_merge_schema", "topic_extract_request", "parse_topic_extraction",
           "topic_merge_request", "parse_topic_merge"]

TOPIC_EXTRACT_VERSION = "rmm-d11-v1"
TOPIC_MERGE_VERSION = "rmm-d12-v1"

TOPIC_EXTRACT_SYSTEM = """Task Description: Given a session of dialogue between {participants}, extract the personal summaries of {subject}, with references to the corresponding turn IDs. Ensure the output adheres to the following rules:

* Output results in JSON format. The top-level key is "extracted_memories". The value should be a list of dictionaries, where each dictionary has the keys "summary" and "reference":
  - summary: A concise personal summary, which captures relevant information about {subject}'s experiences, preferences, and background, across multiple turns. Name {subject} in it.
  - reference: A list of references, each a turn ID (an integer) indicating where the information appears.
* If no personal summary can be extracted, return {{"extracted_memories": []}}.

Example:
INPUT:
* Turn 0: Ann: Did you check out that new gym in town?
* Turn 1: Ben: Yeah, I did. I'm not sure I like the vibe there, though. It was a little too trendy for me.
* Turn 2: Ann: Maybe you could get that treadmill you were talking about before?
* Turn 3: Ben: I'm leaning towards the treadmill. It will work better for my lifestyle.
* Turn 4: Ann: I usually just lift weights there, to be honest. I've heard good things about the NordicTrack.
* Turn 5: Ben: I'm from Alaska, so I'm pretty weather-tough.

OUTPUT (for Ben):
{{"extracted_memories": [{{"summary": "Ben visited the new gym in town but found it too trendy and is leaning towards buying a treadmill.", "reference": [1, 3]}}, {{"summary": "Ben is from Alaska and is used to rough weather.", "reference": [5]}}]}}

Task: Follow the JSON format demonstrated in the example above and extract the personal summaries for {subject} from the following dialogue session."""

TOPIC_MERGE_SYSTEM = """Task Description: Given a list of history personal summaries for a specific user and a new and similar personal summary from the same user, update the personal history summaries following the instructions below:

* Input format: Both the history personal summaries and the new personal summary are provided in JSON format, with the top-level keys of "history_summaries" and "new_summary".
* Possible update actions:
  - Add: If the new personal summary is not relevant to any history personal summary, add it.
    Format: Add()
  - Merge: If the new personal summary is relevant to a history personal summary, merge them as an updated summary.
    Format: Merge(index, merged_summary)
    Note: index is the position of the relevant history summary in the list. merged_summary is the merged summary of the new summary and the relevant history summary. Two summaries are considered relevant if they discuss the same aspect of the user's personal information or experiences.
* Output one JSON object {"action": "<the action function>"} with exactly one action, and nothing else.

Example:
INPUT:
* History Personal Summaries:
  - {"history_summaries": ["Ben works out although he doesn't particularly enjoy it."]}
* New Personal Summary:
  - {"new_summary": "Ben exercises every Monday and Thursday."}

OUTPUT ACTION:
{"action": "Merge(0, Ben exercises every Monday and Thursday, although he doesn't particularly enjoy it.)"}"""

_ADD_RE = r"Add\(\)"
_MERGE_RE = re.compile(r"^Merge\((\d+),\s*(.+)\)$", re.DOTALL)


def topic_extract_schema(n_turns: int) -> dict[str, Any]:
    """D.1.1 answer schema; references must be turn ids of the session."""
    return {
        "type": "object",
        "properties": {"extracted_memories": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "summary": {"type": "string", "minLength": 1, "maxLength": 2000},
                "reference": {"type": "array", "minItems": 1,
                              "items": {"type": "integer", "minimum": 0, "maximum": max(0, n_turns - 1)}},
            },
            "required": ["summary", "reference"],
            "additionalProperties": False,
        }}},
        "required": ["extracted_memories"],
        "additionalProperties": False,
    }


def topic_merge_schema(n_history: int) -> dict[str, Any]:
    """D.1.2 answer schema: `Add()` or `Merge(index, merged_summary)` with index < n_history."""
    top = max(0, min(n_history, 10) - 1)
    return {
        "type": "object",
        "properties": {"action": {"type": "string", "maxLength": 4000,
                                  "pattern": rf"^(?:{_ADD_RE}|Merge\([0-{top}],\s*\S[\s\S]*\))$"}},
        "required": ["action"],
        "additionalProperties": False,
    }


def topic_extract_request(ctx: dict[str, Any]) -> LLMRequest:
    """D.1.1 for one participant of one session.

    `ctx`: {"user_id", "session_id", "subject", "participants": [names], "turns": [{"turn",
    "message_id", "speaker", "text", "ts"}], "adjacent_sims": [cosine of turn i and i+1]} -- the
    similarities are for the `rules` stand-in, which segments at embedding breakpoints.
    """
    lines = [f"* Turn {t['turn']}: {t['speaker']}: {' '.join(str(t['text']).split())}" for t in ctx["turns"]]
    system = TOPIC_EXTRACT_SYSTEM.format(participants=" and ".join(ctx.get("participants") or []) or "the speakers",
                                         subject=ctx["subject"])
    user = "INPUT:\n" + "\n".join(lines) + f"\n\nOUTPUT (for {ctx['subject']}):"
    return LLMRequest(task="topics", prompt_version=TOPIC_EXTRACT_VERSION,
                      messages=chat(system, user), schema=topic_extract_schema(len(ctx["turns"])),
                      context=ctx)


def parse_topic_extraction(answer: dict[str, Any], turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Schema-valid D.1.1 answer -> [{"summary", "source_ids"}] (turn ids mapped to message ids)."""
    out = []
    for item in answer["extracted_memories"]:
        refs = sorted({int(r) for r in item["reference"] if 0 <= int(r) < len(turns)})
        summary = " ".join(item["summary"].split())
        if refs and summary:
            out.append({"summary": summary, "source_ids": [turns[r]["message_id"] for r in refs]})
    return out


def topic_merge_request(ctx: dict[str, Any]) -> LLMRequest:
    """D.1.2 for one new topic against the top-K similar topics of the same user.

    `ctx`: {"user_id", "subject", "new_summary", "history": [{"id", "summary", "similarity"}],
    "threshold"} -- similarities and threshold are for the `rules` stand-in.
    """
    hist = json.dumps({"history_summaries": [h["summary"] for h in ctx["history"]]}, ensure_ascii=False)
    new = json.dumps({"new_summary": ctx["new_summary"]}, ensure_ascii=False)
    user = (f"INPUT:\n* History Personal Summaries:\n  - {hist}\n* New Personal Summary:\n  - {new}\n\n"
            "OUTPUT ACTION:")
    return LLMRequest(task="topic-merge", prompt_version=TOPIC_MERGE_VERSION,
                      messages=chat(TOPIC_MERGE_SYSTEM, user),
                      schema=topic_merge_schema(len(ctx["history"])), context=ctx)


def parse_topic_merge(answer: dict[str, Any], n_history: int) -> tuple[str, int | None, str | None]:
    """Schema-valid D.1.2 answer -> ("add", None, None) or ("merge", index, merged_summary).

    Raises InvalidAnswerError for any other action (or an index out of range)."""
    action = answer["action"].strip()
    if re.fullmatch(_ADD_RE, action):
        return "add", None, None
    m = _MERGE_RE.match(action)
    if m is None or not 0 <= int(m.group(1)) < n_history or not m.group(2).strip():
        raise InvalidAnswerError(f"not an Add() or Merge(index < {n_history}, summary) action: {action[:80]!r}",
                                 action=action[:80], n_history=n_history)
    return "merge", int(m.group(1)), " ".join(m.group(2).split())
