"""Prompts as data: a function from context to chat messages, the JSON schema the answer must
satisfy, a version recorded on every row it produces, and a parser back to plain dicts.

Adapted from PREMem Appendix A (Figure 3: extraction, Figure 4: reasoning) to conversations with
several named participants: every fragment names its `subject`.
"""
from __future__ import annotations

import json
import re
from typing import Any

from memory.llm.base import LLMRequest

EXTRACT_VERSION = "premem-extract-v1"
REASON_VERSION = "premem-reason-v1"

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
                      messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                      schema=EXTRACT_SCHEMA, context=session)


def parse_extraction(answer: dict[str, Any], message_ids: set[str]) -> list[dict[str, Any]]:
    """Schema-valid extraction answer -> fragment dicts; items citing unknown message ids are dropped."""
    out = []
    for cat_key, category in CATEGORY_KEYS.items():
        for item in answer.get(cat_key, []):
            if item["message_id"] not in message_ids:
                continue
            out.append({
                "subject": item["subject"].strip(), "category": category, "key": item["key"].strip(),
                "content": item["value"].strip(), "date": item["date"], "source_ids": [item["message_id"]],
            })
    return out


def _fragment_line(f: dict[str, Any]) -> str:
    return f"[{f['key']}, {f['date']}]: {f['subject']} {f['content']}"


def reason_request(pair: dict[str, Any]) -> LLMRequest:
    """The reasoning request for one linked cluster pair.

    `pair`: {"user_id", "link_id", "earlier": [fragment dicts], "later": [fragment dicts]} where a
    fragment dict has id, subject, category, key, content, date, source_ids.
    """
    frags = "\n".join(_fragment_line(f) for f in pair["earlier"] + pair["later"])
    user = "Below are the memory fragments to analyze:\n" + frags
    return LLMRequest(task="reason", prompt_version=REASON_VERSION,
                      messages=[{"role": "system", "content": REASON_SYSTEM}, {"role": "user", "content": user}],
                      schema=REASON_SCHEMA, context=pair)


def parse_reasoning(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Schema-valid reasoning answer -> insight dicts with the short inference type names."""
    return [{
        "inference_type": INFERENCE_ALIASES[item["inference_type"].lower()],
        "key": item["key"].strip(), "content": item["value"].strip(), "date": item["date"].strip(),
    } for item in answer["extended_insight"]]


def _weekday(day: str) -> str:
    from datetime import date

    try:
        return date.fromisoformat(day).strftime("%A")
    except ValueError:
        return ""




# -- RMM prospective reflection (Tan et al., Appendix D.1) -------------------------------------------
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
                      messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                      schema=topic_extract_schema(len(ctx["turns"])), context=ctx)


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
                      messages=[{"role": "system", "content": TOPIC_MERGE_SYSTEM}, {"role": "user", "content": user}],
                      schema=topic_merge_schema(len(ctx["history"])), context=ctx)


def parse_topic_merge(answer: dict[str, Any], n_history: int) -> tuple[str, int | None, str | None]:
    """Schema-valid D.1.2 answer -> ("add", None, None) or ("merge", index, merged_summary)."""
    action = answer["action"].strip()
    if re.fullmatch(_ADD_RE, action):
        return "add", None, None
    m = _MERGE_RE.match(action)
    if m is None or not 0 <= int(m.group(1)) < n_history or not m.group(2).strip():
        raise ValueError(f"not an Add() or Merge(index < {n_history}, summary) action: {action[:80]!r}")
    return "merge", int(m.group(1)), " ".join(m.group(2).split())


# -- MemWeaver cognitive memory (Yu et al., Appendix C.1, Tables 4 and 5) -------------------------
SUMMARIZE_VERSION = "memweaver-local-v1"
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

    `phase`: {"user_id", "phase_id", "number", "start", "end", "items": [{"id", "date", "text"}]}
    -- also the context the `rules` backend reads.
    """
    lines = [f"{i}. [{it['date']}] {it['text']}" for i, it in enumerate(phase["items"], 1)]
    user = (f"**Cluster {phase['number']} Activities ({len(lines)} records, {phase['start']} to {phase['end']}):**\n"
            + "\n".join(lines) + "\n\n" + SUMMARIZE_TASK + "\n" + _JSON_NOTE.format(key="summary"))
    return LLMRequest(task="summarize", prompt_version=SUMMARIZE_VERSION,
                      messages=[{"role": "system", "content": SUMMARIZE_SYSTEM}, {"role": "user", "content": user}],
                      schema=SUMMARIZE_SCHEMA, context=phase)


def profile_request(ctx: dict[str, Any]) -> LLMRequest:
    """Table 5 for one user: every local summary, oldest first.

    `ctx`: {"user_id", "summaries": [{"id", "start", "end", "text"}]}.
    """
    lines = [f"Cluster {i}: {s['text']}" for i, s in enumerate(ctx["summaries"], 1)]
    user = "\n".join(lines) + "\n\n" + PROFILE_TASK + "\n" + _JSON_NOTE.format(key="profile")
    return LLMRequest(task="profile", prompt_version=PROFILE_VERSION,
                      messages=[{"role": "system", "content": PROFILE_SYSTEM}, {"role": "user", "content": user}],
                      schema=PROFILE_SCHEMA, context=ctx)


def validate_profile(answer: dict[str, Any]) -> None:
    """The runner's extra check on a Table 5 answer: at most 300 words."""
    n = len(answer["profile"].split())
    if n > PROFILE_MAX_WORDS:
        raise ValueError(f"the profile has {n} words; at most {PROFILE_MAX_WORDS} are allowed")


def parse_summary(answer: dict[str, Any]) -> str:
    return " ".join(answer["summary"].split()) if "\n" not in answer["summary"] else answer["summary"].strip()


def parse_profile(answer: dict[str, Any]) -> str:
    return answer["profile"].strip()
