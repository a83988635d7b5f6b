"""MemWeaver cognitive memory prompts (Yu et al., Appendix C.1): Table 4, a local summary of one
phase of a user's history; Table 5, the global profile from every local summary.

Table 4 prefaces a phase's numbered activities with "**Cluster X Activities (Y records):**"; X, the
cluster's number, is only a label, and a phase's position in the user's history would change the
prompt of every later phase when one phase is added or split before them (a late session), so no
LLM cache could answer them: the preface here names no number and adds the phase's dates.
"""
from __future__ import annotations

from typing import Any

from memory.errors import InvalidAnswerError
from memory.llm.base import LLMRequest
from memory.prompts.common import chat

__all__ = ["SUMMARIZE_VERSION", "PROFILE_VERSION", "PROFILE_MAX_WORDS", "SUMMARIZE_SYSTEM", "SUMMARIZE_TASK",
           "PROFILE_SYSTEM", "PROFILE_TASK", "SUMMARIZE_SCHEMA", "PROFILE_SCHEMA", "summarize_request",
           "profile_request", "validate_summary", "validate_profile", "parse_summary", "parse_profile"]

SUMMARIZE_VERSION = "memweaver-local-v2"
PROFILE_VERSION = "memweaver-global-v1"
PROFILE_MAX_WORDS = 300

SUMMARIZE_SYSTEM = "You are an expert at analyzing user behavior patterns."
SUMMARIZE_TASK = ("Provide a concise summary of the user's preferences and behavior patterns in this cluster. "
                  "Focus on key themes, preferences, and patterns. Use clear, structured language.")
PROFILE_SYSTEM = "You are an expert at creating concise user preference summaries."
PROFILE_TASK = ("Create a concise global summary (max 300 words) that captures the user's key preferences and "
                "behavior patterns. Focus on the most important themes and avoid redundancy. Use bullet points "
                "or short paragraphs for clarity. Be brief but comprehensive.")

SUMMARIZE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"summary": {"type": "string", "minLength": 1, "maxLength": 4000}},
    "required": ["summary"],
    "additionalProperties": False,
}
PROFILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"profile": {"type": "string", "minLength": 1, "maxLength": 4000}},
    "required": ["profile"],
    "additionalProperties": False,
}
_JSON_NOTE = 'Answer with one JSON object: {{"{key}": "<your summary>"}}.'


def summarize_request(phase: dict[str, Any]) -> LLMRequest:
    """Table 4 for one phase of a user's history (the paper's "cluster" is our phase).

    `phase`: {"user_id", "phase_id", "start", "end", "items": [{"id", "date", "text"}]}
    -- also the context the `rules` backend reads.
    """
    lines = [f"{i}. [{it['date']}] {it['text']}" for i, it in enumerate(phase["items"], 1)]
    user = (f"**Cluster Activities ({len(lines)} records, {phase['start']} to {phase['end']}):**\n"
            + "\n".join(lines) + "\n\n" + SUMMARIZE_TASK + "\n" + _JSON_NOTE.format(key="summary"))
    return LLMRequest(task="summarize", prompt_version=SUMMARIZE_VERSION,
                      messages=chat(SUMMARIZE_SYSTEM, user), schema=SUMMARIZE_SCHEMA, context=phase)


def profile_request(ctx: dict[str, Any]) -> LLMRequest:
    """Table 5 for one user: every local summary, oldest first.

    `ctx`: {"user_id", "summaries": [{"id", "start", "end", "text"}]}.
    """
    lines = [f"Cluster {i}: {s['text']}" for i, s in enumerate(ctx["summaries"], 1)]
    user = "\n".join(lines) + "\n\n" + PROFILE_TASK + "\n" + _JSON_NOTE.format(key="profile")
    return LLMRequest(task="profile", prompt_version=PROFILE_VERSION,
                      messages=chat(PROFILE_SYSTEM, user), schema=PROFILE_SCHEMA, context=ctx)


def validate_summary(answer: dict[str, Any]) -> None:
    """The runner's extra check on a Table 4 answer: some text, not only whitespace (which the schema's
    minLength lets by; else InvalidAnswerError: asked again, then quarantined)."""
    if not answer["summary"].strip():
        raise InvalidAnswerError("the summary is empty")


def validate_profile(answer: dict[str, Any]) -> None:
    """The runner's extra check on a Table 5 answer: some text, at most 300 words (else InvalidAnswerError)."""
    n = len(answer["profile"].split())
    if not n:
        raise InvalidAnswerError("the profile is empty")
    if n > PROFILE_MAX_WORDS:
        raise InvalidAnswerError(f"the profile has {n} words; at most {PROFILE_MAX_WORDS} are allowed",
                                 words=n, max_words=PROFILE_MAX_WORDS)


def parse_summary(answer: dict[str, Any]) -> str:
    """A Table 4 answer's summary: whitespace collapsed unless it spans several lines (then stripped)."""
    return " ".join(answer["summary"].split()) if "\n" not in answer["summary"] else answer["summary"].strip()


def parse_profile(answer: dict[str, Any]) -> str:
    """A Table 5 answer's profile, stripped."""
    return answer["profile"].strip()
