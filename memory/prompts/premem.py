"""PREMem prompts (Appendix A; Figure 3: extraction, Figure 4: reasoning), adapted to conversations
with several named participants: every fragment names its `subject`.
"""
from __future__ import annotations

from datetime import date
from typing import Any

from memory.errors import InvalidAnswerError
from memory.llm.base import LLMRequest
from memory.prompts.common import chat

__all__ = ["EXTRACT_VERSION", "REASON_VERSION", "DATE_PATTERN", "CATEGORY_KEYS", "INFERENCE_ALIASES",
           "EXTRACT_SCHEMA", "REASON_SCHEMA", "EXTRACT_SYSTEM", "REASON_SYSTEM", "extract_request",
           "parse_extraction", "validate_extraction", "reason_request", "parse_reasoning"]

EXTRACT_VERSION = "premem-extract-v1"
#: v2: fragments are numbered [F1]... and a transformation may name the fragment it supersedes (issue 12)
REASON_VERSION = "premem-reason-v2"

DATE_PATTERN = r"^(Before |After )?\d{4}-\d{2}-\d{2}$"
CATEGORY_KEYS = {
    "Factual_Information": "factual",
    "Experiential_Information": "experiential",
    "Subjective_Information": "subjective",
}
INFERENCE_ALIASES = {
    "extension": "extension", "generalization": "extension", "extension/generalization": "extension",
    "accumulation": "accumulation",
    "specification": "specification", "refinement": "specification",
    "specification/refinement": "specification",
    "transformation": "transformation",
    "connection": "connection", "implication": "connection", "connection/implication": "connection",
}

_FRAGMENT_ITEM = {
    "type": "object",
    "properties": {
        "subject": {"type": "string", "minLength": 1},
        "key": {"type": "string", "minLength": 1},
        "value": {"type": "string", "minLength": 1},
        "message_id": {"type": "string", "minLength": 1},
        "date": {"type": "string", "pattern": DATE_PATTERN},
    },
    "required": ["subject", "key", "value", "message_id", "date"],
    "additionalProperties": False,
}

EXTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {name: {"type": "array", "items": _FRAGMENT_ITEM} for name in CATEGORY_KEYS},
    "required": list(CATEGORY_KEYS),
    "additionalProperties": False,
}

REASON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "extended_insight": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "inference_type": {"type": "string", "enum": sorted(INFERENCE_ALIASES)},
                    "key": {"type": "string", "minLength": 1},
                    "date": {"type": "string", "minLength": 1, "maxLength": 64},
                    "value": {"type": "string", "minLength": 1},
                    "supersedes": {"type": "string", "pattern": "^F\\d+$"},
                    "superseded_by": {"type": "string", "pattern": "^F\\d+$"},
                },
                "required": ["inference_type", "key", "date", "value"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["extended_insight"],
    "additionalProperties": False,
}

EXTRACT_SYSTEM = """# GOAL
Analyze the entire <Conversation> to identify all statements revealing personal information about its participants ({participants}). Categorize each piece of information as Factual, Experiential, or Subjective, and output the results as a single structured JSON object.

# INFORMATION CATEGORY DEFINITIONS
1. Factual Information: Objective, verifiable facts about a person's state, attributes, possessions, knowledge, skills, and relationships with others (family, friends, pets, etc.). ('What I am / What I have / Who I know')
* Keywords: is, am, have, own, live in, work as, know, my name/age/job/sister/friend is, etc.
2. Experiential Information: Specific events, actions, activities, or interactions experienced over time, often situated in a context. ('What I did / What happened to me')
* Keywords: went, did, saw, met, visited, learned, attended, bought, have been, have tried, last year, yesterday, when I was..., etc.
3. Subjective Information: Internal states, including preferences, habits, opinions, beliefs, goals, plans, feelings, etc. ('What I like / think / want / feel / usually do')
* Keywords: like, love, hate, prefer, think, believe, feel, want, plan to, hope to, usually, often, my goal is, etc.

# INSTRUCTIONS
1. The <Conversation> consists of messages, each a [message_id], the message date, the speaker and the text.
2. Identify all specific pieces of information about a participant in the three categories above.
3. "subject" is the participant the information is about, by name.
4. Format each value as a phrase that starts with a verb in present tense, regardless of the original tense. Do not include pronouns in the value.
5. For the "date" field (always YYYY-MM-DD, optionally prefixed):
* For ongoing facts or current states, use the date of the message
* For past events with a specific timeframe (e.g., "yesterday", "three days ago"), calculate the actual date from the message date
* For other past events, use "Before [message-date]"
* For future plans or intentions, use "After [message-date]"
6. Output one JSON object with the keys "Factual_Information", "Experiential_Information" and "Subjective_Information"; use [] for a category with no information.
7. Use the exact [message_id] of the message the information comes from.

# Example
<Conversation>
[msg-301] (2024-05-17 Friday) Alex: I'm living in Rome now with my girlfriend, Hana. We moved here last summer.
[msg-302] (2024-05-17 Friday) Alex: I quit my job at Coupang in March. I just didn't see myself growing there anymore.
[msg-305] (2024-05-17 Friday) Alex: I ate chicken with my friends yesterday.

Answer:
{{"Factual_Information": [{{"subject": "Alex", "key": "current residence", "value": "Lives in Rome with girlfriend Hana", "message_id": "msg-301", "date": "2024-05-17"}}], "Experiential_Information": [{{"subject": "Alex", "key": "job resignation", "value": "Quits job at Coupang in March", "message_id": "msg-302", "date": "Before 2024-05-17"}}, {{"subject": "Alex", "key": "dinner with friends", "value": "Eats chicken with friends", "message_id": "msg-305", "date": "2024-05-16"}}], "Subjective_Information": [{{"subject": "Alex", "key": "career dissatisfaction", "value": "Feels no growth potential at Coupang", "message_id": "msg-302", "date": "Before 2024-05-17"}}]}}"""

REASON_SYSTEM = """You are an AI assistant analyzing memory fragments to generate insights. Your task is to identify patterns and connections from the data provided.

Analyze these fragments and generate insights based on five inference types:
- extension: expanding information from specific cases to broader categories, domains, or patterns.
- accumulation: identifying behaviors, experiences, or patterns that repeat or persist over time.
- specification: breaking general information down into more detailed and specific aspects.
- transformation: identifying changes in states, perspectives, emotions, behaviors, etc. over time.
- connection: identifying relationships, causality, or meaning between seemingly disparate pieces of information.

Output a JSON object with an "extended_insight" key holding an array of objects with "inference_type" (one of the five), "key" (brief description of the insight), "date" (relevant date or date range) and "value" (the insight, 12 words or less, naming the person it is about).

- You do NOT need to use all five inference types; select only those that clearly apply.
- You may use the same inference type several times for different insights.
- Focus on quality over quantity; avoid trivial insights.
- Each fragment starts with its reference [F1], [F2], ... When a later fragment replaces the value an earlier one stated about the same person and thing (a changed number, place, job, tool, plan), output a transformation insight with "supersedes": the earlier fragment's reference and "superseded_by": the later one's (e.g. "F2" and "F5"). Omit both fields otherwise, and never use them for two statements that can both be true.

Example fragments:
[tech purchase, 2023-03-05]: Jordan buy new drawing tablet
[software usage, 2023-03-07]: Jordan spend three hours learning Procreate app
[social media, 2023-03-22]: Jordan share first digital artwork on Instagram
Output:
{"extended_insight": [{"inference_type": "accumulation", "key": "digital art activities", "date": "2023-03-05 to 2023-03-22", "value": "Jordan engaged in 3 digital art activities within 17 days"}, {"inference_type": "transformation", "key": "identity shift", "date": "Before 2023-03-05 to 2023-03-22", "value": "Jordan evolved from art appreciator to digital artist"}]}"""


def extract_request(session: dict[str, Any]) -> LLMRequest:
    """The extraction request for one session.

    `session`: {"user_id", "session_id", "participants": [names], "messages": [{"message_id",
    "speaker", "text", "ts" (ISO 8601)}]} -- also the `context` the rules backend reads.
    """
    lines = []
    for m in session["messages"]:
        day = str(m["ts"])[:10]
        lines.append(f"[{m['message_id']}] ({day} {_weekday(day)}) {m['speaker']}: {m['text']}")
    system = EXTRACT_SYSTEM.format(participants=", ".join(session.get("participants") or []))
    user = "<Conversation>\n" + "\n".join(lines)
    return LLMRequest(task="extract", prompt_version=EXTRACT_VERSION,
                      messages=chat(system, user), schema=EXTRACT_SCHEMA, context=session)


def parse_extraction(answer: dict[str, Any], message_ids: set[str]) -> list[dict[str, Any]]:
    """Schema-valid extraction answer -> fragment dicts. A cited id written as the prompt shows it
    ("[msg-301]", spaces around) reads as the shown id; items citing other ids, with a subject, key or
    value of whitespace only, or a date no calendar has ("2024-02-30") are dropped."""
    out = []
    for cat_key, category in CATEGORY_KEYS.items():
        for item in answer.get(cat_key, []):
            cited = _shown_id(item["message_id"], message_ids)
            if cited is None or not _real_date(item["date"]) \
                    or not all(item[k].strip() for k in ("subject", "key", "value")):
                continue
            out.append({
                "subject": item["subject"].strip(), "category": category, "key": item["key"].strip(),
                "content": item["value"].strip(), "date": item["date"], "source_ids": [cited],
            })
    return out


def validate_extraction(answer: dict[str, Any], message_ids: set[str]) -> None:
    """The runner's extra check on an extraction answer: one with items keeps at least one (else
    InvalidAnswerError: asked again, then quarantined with its raw text, the session's extraction left
    pending). An answer with no items (nothing personal said) is valid; one with some bad items keeps
    the good ones (`parse_extraction`)."""
    items = [item for k in CATEGORY_KEYS for item in answer.get(k, [])]
    if items and not parse_extraction(answer, message_ids):
        raise InvalidAnswerError(
            f"none of the {len(items)} items is usable (the first cites {items[0]['message_id']!r}, dated "
            f"{items[0]['date']!r}): each must cite the exact message_id of a message shown (without the "
            "brackets), a real date and a non-empty subject, key and value", items=len(items))


def _shown_id(cited: str, message_ids: set[str]) -> str | None:
    """The shown message id an item cites, tolerating the prompt's decoration ("[id]", spaces)."""
    if cited in message_ids:
        return cited
    bare = cited.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1].strip()
    return bare if bare in message_ids else None


def _real_date(text: str) -> bool:
    """Whether a schema-valid date ("[Before |After ]YYYY-MM-DD") names a day that exists."""
    try:
        date.fromisoformat(text.split()[-1])
    except ValueError:
        return False
    return True


def _fragment_line(f: dict[str, Any], ref: int) -> str:
    return f"[F{ref}] [{f['key']}, {f['date']}]: {f['subject']} {f['content']}"


def reason_request(pair: dict[str, Any]) -> LLMRequest:
    """The reasoning request for one linked cluster pair.

    `pair`: {"user_id", "link_id", "earlier": [fragment dicts], "later": [fragment dicts]} where a
    fragment dict has id, subject, category, key, content, date, source_ids.
    """
    frags = "\n".join(_fragment_line(f, i + 1) for i, f in enumerate(pair["earlier"] + pair["later"]))
    user = "Below are the memory fragments to analyze:\n" + frags
    return LLMRequest(task="reason", prompt_version=REASON_VERSION,
                      messages=chat(REASON_SYSTEM, user), schema=REASON_SCHEMA, context=pair)


def parse_reasoning(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Schema-valid reasoning answer -> insight dicts with the short inference type names; a
    transformation naming the fragment it supersedes keeps both 1-based positions (`supersedes`,
    `superseded_by`: indexes into the pair's earlier + later fragments); items of whitespace only are dropped."""
    out = []
    for item in answer["extended_insight"]:
        row: dict[str, Any] = {"inference_type": INFERENCE_ALIASES[item["inference_type"].lower()],
                               "key": item["key"].strip(), "content": item["value"].strip(),
                               "date": item["date"].strip()}
        if not all(row[k] for k in ("key", "content", "date")):
            continue                                  # whitespace only: the schema's minLength lets it by
        old, new = item.get("supersedes"), item.get("superseded_by")
        if row["inference_type"] == "transformation" and old and new and old != new:
            row["supersedes"], row["superseded_by"] = int(old[1:]), int(new[1:])
        out.append(row)
    return out



def _weekday(day: str) -> str:
    try:
        return date.fromisoformat(day).strftime("%A")
    except ValueError:
        return ""
