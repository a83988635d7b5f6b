"""The `reason` rule (PREMem step 2): template insights over one linked cluster pair, 0-3 per pair.

Per subject present on both sides: transformation (a sentiment flip or a changed state on the same
topic), accumulation (repeated similar statements), extension (an experience matching a stated
preference) and connection (a shared named entity or rare word across different topics).
"""
from __future__ import annotations

import re
from typing import Any

from memory.llm.rules.registry import rule
from memory.text import CAPITALIZED_RE, NOT_ENTITY, cap_words, content_tokens

__all__ = ["reason_answer"]

_POSITIVE_RE = re.compile(
    r"\b(?:love[sd]?|loving|like[sd]?|enjoy(?:s|ed|ing)?|adore[sd]?|prefer(?:s|red)?|happy|excited|great"
    r"|favou?rite|passionate|fan\s+of|into|fond\s+of|amazing|wonderful|thrilled|proud|rewarding)\b",
    re.IGNORECASE)
_NEGATIVE_RE = re.compile(
    r"\b(?:hate[sd]?|dislike[sd]?|quit|quits|stopp?(?:ed|s)?|gave\s+up|give[s]?\s+up|no\s+longer|bored"
    r"|tired\s+of|sick\s+of|can't\s+stand|regret(?:s|ted)?|unhappy|frustrat\w*|disappoint\w*"
    r"|sad|angry|annoy\w*|awful|terrible|miserable)\b",
    re.IGNORECASE)
_NEGATION_RE = re.compile(r"\b(?:not|never|no\s+longer|don't|doesn't|didn't|isn't|wasn't|won't|can't)\s+"
                          r"(?:\w+\s+)?(?:love|like|enjoy|adore|prefer|happy|excited|into)\b", re.IGNORECASE)
_CHANGE_RE = re.compile(
    r"\b(?:now|no\s+longer|anymore|any\s+more|switched|changed|became|become|becoming|moved|quit|started"
    r"|stopped|new|instead|turned|decided|used\s+to|these\s+days|finally)\b", re.IGNORECASE)
_PREFERENCE_RE = re.compile(
    r"\b(?:love[sd]?|loving|like[sd]?|enjoy(?:s|ed|ing)?|adore[sd]?|prefer(?:s|red)?|favou?rite|passion(?:ate)?"
    r"|fan\s+of|into|fond\s+of|interested\s+in)\b", re.IGNORECASE)
_DATE_RE = re.compile(r"^(?:(Before|After) )?(\d{4}-\d{2}-\d{2})$")
_ACCUM_SIM = 0.3           # token Jaccard of key + content for "similar statements"
_CHANGE_SIM = 0.25         # below this, same-topic states count as different
_MAX_INSIGHTS = 3
_MAX_SHORT_WORDS = 8


def _polarity(text: str) -> int:
    if _NEGATION_RE.search(text) or _NEGATIVE_RE.search(text):
        return -1
    return 1 if _POSITIVE_RE.search(text) else 0


class _Frag:
    __slots__ = ("d", "subject", "category", "key", "content", "date", "side", "tokens", "key_tokens",
                 "entities", "pol")

    def __init__(self, d: dict[str, Any], side: int) -> None:
        self.d = d
        self.subject = str(d.get("subject") or "").strip() or "The user"
        self.category = str(d.get("category") or "")
        self.key = str(d.get("key") or "").strip()
        self.content = str(d.get("content") or "").strip()
        self.date = str(d.get("date") or "").strip()
        self.side = side
        names = {w.lower() for w in self.subject.split()}
        names |= {n + "'s" for n in names}
        self.key_tokens = content_tokens(self.key, names)
        self.tokens = content_tokens(f"{self.key} {self.content}", names)
        self.entities = [m.group(1) for m in CAPITALIZED_RE.finditer(self.content)
                         if m.group(1) not in NOT_ENTITY and m.group(1).lower() not in names
                         and m.group(1).lower().removesuffix("'s") not in names]
        self.pol = _polarity(f"{self.key} {self.content}")


def _jaccard(a: list[str], b: list[str]) -> float:
    if not a or not b:
        return 0.0
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb)


def _short(f: _Frag) -> str:
    text = f.content
    if text.lower().startswith(f.subject.lower()):
        text = re.sub(r"^(?:'s\b)?[\s,]*", "", text[len(f.subject):])
    text = re.sub(r"[.!?]+$", "", text).strip()
    words = text.split()
    return " ".join(words[:_MAX_SHORT_WORDS]) + (" ..." if len(words) > _MAX_SHORT_WORDS else "")


def _date_range(frags: list[_Frag]) -> str:
    parsed = []
    for f in frags:
        m = _DATE_RE.match(f.date)
        if m:
            parsed.append((m.group(2), f.date))
    if not parsed:
        return "unknown"
    first = min(parsed)[1]
    last = max(parsed)[1]
    return first if first == last else f"{first} to {last}"[:64]


def _by_subject(frags: list[_Frag]) -> dict[str, list[_Frag]]:
    groups: dict[str, list[_Frag]] = {}
    for f in frags:
        groups.setdefault(f.subject, []).append(f)
    return groups


def _key_overlap(a: _Frag, b: _Frag) -> bool:
    if a.key and a.key.lower() == b.key.lower():
        return True
    return _jaccard(a.key_tokens, b.key_tokens) >= 0.5


def _transformation(subject: str, frags: list[_Frag]) -> tuple[dict[str, str], set[int]] | None:
    best: tuple[tuple[int, float, int], _Frag, _Frag] | None = None
    later = [f for f in frags if f.side == 1]
    for i, e in enumerate(f for f in frags if f.side == 0):
        for j, l in enumerate(later):
            sim = _jaccard(e.tokens, l.tokens)
            flip = e.pol * l.pol < 0 and (_key_overlap(e, l) or sim >= 0.15)
            state_change = (_key_overlap(e, l) and sim < _CHANGE_SIM and e.content.lower() != l.content.lower()
                            and _CHANGE_RE.search(l.content) is not None)
            if not (flip or state_change):
                continue
            rank = (0 if flip else 1, sim, i * 10000 + j)
            if best is None or rank < best[0]:
                best = (rank, e, l)
    if best is None:
        return None
    _, e, l = best
    topic = l.key or e.key or "state"
    value = cap_words(f"{subject} changed from {_short(e)} to {_short(l)}")
    return ({"inference_type": "transformation", "key": f"change in {topic}", "date": _date_range([e, l]),
             "value": value}, {id(e), id(l)})


def _similar(a: _Frag, b: _Frag) -> bool:
    return (bool(a.key) and a.key.lower() == b.key.lower()) or _jaccard(a.tokens, b.tokens) >= _ACCUM_SIM


def _accumulation(subject: str, frags: list[_Frag], exclude: set[int]) -> dict[str, str] | None:
    members: list[_Frag] = []
    best: tuple[float, _Frag, _Frag] | None = None
    earlier = [f for f in frags if f.side == 0]
    later = [f for f in frags if f.side == 1]
    for e in earlier:
        for l in later:
            if id(e) in exclude and id(l) in exclude:
                continue
            same_key = bool(e.key) and e.key.lower() == l.key.lower()
            sim = _jaccard(e.tokens, l.tokens)
            if not _similar(e, l):
                continue
            score = 1.0 + sim if same_key else sim
            if best is None or score > best[0]:
                best = (score, e, l)
            for f in (e, l):
                if f not in members:
                    members.append(f)
    if best is None:
        return None
    for f in frags:             # statements similar to a member, on either side, repeat it too
        if f not in members and any(_similar(f, m) for m in members):
            members.append(f)
    _, e, l = best
    if e.key and e.key.lower() == l.key.lower():
        topic = e.key
    else:
        shared = [t for t in e.tokens if t in l.tokens]
        topic = " ".join(shared[:3]) or e.key
    members.sort(key=lambda f: (f.side, frags.index(f)))
    n = len(members)
    return {"inference_type": "accumulation", "key": f"{topic} (recurring)", "date": _date_range(members),
            "value": cap_words(f"{subject} repeatedly mentions {topic} ({n} times)")}


def _extension(subject: str, frags: list[_Frag]) -> dict[str, str] | None:
    liked = [s for s in frags
             if s.category == "subjective" and _polarity(s.content) > 0 and _PREFERENCE_RE.search(s.content)]
    for e in frags:
        if e.category != "experiential":
            continue
        for s in liked:
            if s.side == e.side:
                continue
            shared = [t for t in s.key_tokens if t in e.key_tokens]
            if not shared:
                continue
            topic = " ".join(shared[:3])
            beyond = f", beyond {e.key}" if e.key and e.key.lower() != topic else ""
            return {"inference_type": "extension", "key": f"{topic} interest",
                    "date": _date_range([e, s]),
                    "value": cap_words(f"{subject} has a lasting interest in {topic}{beyond}")}
    return None


def _connection(subject: str, frags: list[_Frag], all_frags: list[_Frag]) -> dict[str, str] | None:
    counts: dict[str, int] = {}
    for f in all_frags:
        for t in f.tokens:
            counts[t] = counts.get(t, 0) + 1
    later = [f for f in frags if f.side == 1]
    for a in (f for f in frags if f.side == 0):
        for b in later:
            if any(t in b.key_tokens for t in a.key_tokens):
                continue            # same topic: accumulation's or transformation's business
            in_keys = set(a.key_tokens) | set(b.key_tokens)
            link = next((x for x in a.entities if x in b.entities and x.lower() not in in_keys), None)
            if link is None:
                link = next((t for t in a.tokens if len(t) >= 5 and counts.get(t) == 2 and t in b.tokens
                             and t not in in_keys), None)
            if link is None:
                continue
            ka, kb = a.key or _short(a), b.key or _short(b)
            if ka.lower() == kb.lower():
                continue
            return {"inference_type": "connection", "key": f"{link} connection",
                    "date": _date_range([a, b]),
                    "value": cap_words(f"{subject} links {ka} and {kb} through {link}")}
    return None


@rule("reason")
def reason_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """PREMem step 2 templates over one linked pair (see `memory.prompts.reason_request`)."""
    frags = [_Frag(d, 0) for d in ctx.get("earlier", [])] + [_Frag(d, 1) for d in ctx.get("later", [])]
    insights: list[dict[str, str]] = []
    for subject, group in _by_subject(frags).items():
        if not any(f.side == 0 for f in group) or not any(f.side == 1 for f in group):
            continue
        used: set[int] = set()
        trans = _transformation(subject, group)
        if trans is not None:
            insights.append(trans[0])
            used = trans[1]
        for found in (_accumulation(subject, group, used), _extension(subject, group),
                      _connection(subject, group, frags)):
            if found is not None:
                insights.append(found)
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for it in insights:
        if it["value"].lower() in seen:
            continue
        seen.add(it["value"].lower())
        out.append(it)
        if len(out) >= _MAX_INSIGHTS:
            break
    return {"extended_insight": out}
