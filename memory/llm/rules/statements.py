"""Which sentences of a message are personal statements about its speaker (the `rules` extraction filter).

Code blocks are not read (`memory.text.prose`). A sentence is kept when it is not a question, has
four words or more once interjections, leading conjunctions and vocatives are stripped, is no filler
("thanks", "sounds great", "I agree"), and says something about its speaker (first person) or a named
thing, rather than about the other participant.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date, datetime
from typing import Any

from memory.dates import normalize_date
from memory.text import (CAPITALIZED_RE, NOT_ENTITY, TOKEN_RE, categorize, is_content, key_phrase, prose,
                         split_sentences, third_person)

__all__ = ["vocative_forms", "personal_statements", "sentence_item"]

_FIRST_PERSON_COUNT_RE = re.compile(r"\b(?:i|i'm|i've|i'll|i'd|me|my|mine|myself)\b")     # lower-cased text
_INTERJECTION_RE = re.compile(
    r"^(?:(?:wow+|whoa+|hey+|hi+|hello|oh+|ah+|aw+|yeah+|yes|yep|yup|no|nope|ok(?:ay)?|ha(?:ha)+|lol|omg"
    r"|thanks?(?:\s+so\s+much|\s+a\s+lot)?|thank\s+you(?:\s+so\s+much)?|well|hmm+|um+|uh+|sure|right"
    r"|cool|great|awesome|nice|totally|absolutely|definitely|indeed|true|congrats|congratulations"
    r"|exactly|agreed|haha|aww+|yay+|woah|gosh|man|dude|honestly|seriously|anyway|anyways)"
    r"(?:\s+[A-Z][a-z]+)?\s*[,!.:;\u2013\u2014-]+\s*)+",
    re.IGNORECASE,
)
_LEAD_CONJ_RE = re.compile(r"^(?:so|and|but|plus|anyway|also|well|oh|yeah)\s+(?=(?:i|i'm|i've|i'll|i'd|my|we|we're)\b)",
                           re.IGNORECASE)
_FILLER_START_RE = re.compile(
    r"^(?:thanks|thank\s+you|bye|see\s+you|take\s+care|good\s+luck|congrats|congratulations|talk\s+(?:to\s+you\s+)?soon"
    r"|have\s+(?:a|fun)|hope\s+you|glad\s+you|nice\s+to|good\s+to\s+see|same\s+here|me\s+too|you\s+too"
    r"|sounds\s+(?:great|good|awesome|amazing|fun)|that's\s+(?:great|awesome|amazing|so|really|cool)"
    r"|i\s+(?:\w+ly\s+)?(?:agree|hear\s+you|feel\s+you|see\s+what|get\s+(?:it|that|you)"
    r"|(?:know|understand)(?:\s*,|\s+(?:what|how|why|right|that\s+feeling|the\s+feeling|it)\b))"
    r"|i'm\s+(?:so\s+|really\s+|very\s+)?(?:happy|glad|proud|sorry)\s+(?:for|of|to\s+hear))\b",
    re.IGNORECASE,
)
_FIRST_PERSON_RE = re.compile(r"\b(?:i|i'm|i've|i'll|i'd|me|my|mine|myself|we|we're|we've|we'll|we'd|our|ours|us)\b")
_SECOND_PERSON_RE = re.compile(r"\b(?:you|you're|you've|you'll|you'd|your|yours|yourself|ya)\b")


def _clean(sentence: str) -> str:
    s = sentence.replace("\u2019", "'").replace("\u2018", "'").strip()
    prev = None
    while prev != s:
        prev = s
        s = _INTERJECTION_RE.sub("", s, count=1)
        s = _LEAD_CONJ_RE.sub("", s, count=1)
    s = s.strip(" \t-\u2013\u2014,;:")
    s = re.sub(r"[.!]+$", "", s).strip()
    if s and s[0].islower() and not s.startswith(("i ", "i'")):
        s = s[0].upper() + s[1:]
    return s


def vocative_forms(participants: list[str]) -> set[str]:
    """Lower-cased names of the participants and their prefixes (3+ letters): how they are addressed."""
    out: set[str] = set()
    for p in participants:
        for part in str(p).split():
            low = part.lower()
            out.add(low)
            out.update(low[:n] for n in range(3, len(low)))
    return out


_VOC_END_RE = re.compile(r",\s*([A-Z][a-z]+)\s*$")
_VOC_START_RE = re.compile(r"^([A-Z][a-z]+)\s*,\s*")
# "Researching adoption agencies - it's been a dream": a clause with the speaker left implicit; only a
# whole sentence, or a first clause closed by a dash, with no verb that would make the gerund a subject
_GERUND_START_RE = re.compile(
    r"^(?!(?:Exciting|Amazing|Interesting|Inspiring|Relaxing|Boring|Refreshing|Rewarding|Surprising|Touching"
    r"|Heartwarming|Annoying|Frustrating|Satisfying|Fascinating|Stunning|Charming|Outstanding|Thing|King"
    r"|Spring|Morning|Evening|Nothing|Something|Everything|Anything|Being|Seeing|Hearing|Knowing)\b)"
    r"[A-Z][a-z]{2,}ing\b(?![^\u2013\u2014]*?\b(?:is|are|was|were|can|could|will|would|must|should"
    r"|might|may|helps?|makes?|gives?|has|have|keeps?|means?|seems?|feels?|sounds?|looks?|takes?|brings?"
    r"|reminds?|plays?|sure|definitely)\b[^\u2013\u2014]*?(?:[\u2013\u2014]|\s-\s|$))"
    r"[^,;:\u2013\u2014]*?(?:[\u2013\u2014]|\s-\s|$)")


def _strip_vocative(s: str, vocatives: set[str]) -> str:
    m = _VOC_END_RE.search(s)
    if m and m.group(1).lower() in vocatives:
        s = s[:m.start()].rstrip()
    m = _VOC_START_RE.match(s)
    if m and m.group(1).lower() in vocatives:
        s = s[m.end():]
        s = s[:1].upper() + s[1:]
    return s


def _personal(s: str, vocatives: set[str]) -> bool:
    """Does the statement say something about its speaker (or a named thing)?"""
    low = s.lower()
    first = _FIRST_PERSON_RE.search(low) is not None
    n_second = len(_SECOND_PERSON_RE.findall(low))
    second = n_second > 0
    if second and n_second >= len(_FIRST_PERSON_COUNT_RE.findall(low)):
        return False            # about the other participant ("I'm so proud of you")
    if not first:
        if second:
            return False
        if not any(m.group(1) not in NOT_ENTITY and m.group(1).lower() not in vocatives
                   for m in CAPITALIZED_RE.finditer(s)):
            return False
    n_content = sum(1 for t in TOKEN_RE.findall(s) if is_content(t) and t.lower() not in vocatives)
    singular = _FIRST_PERSON_COUNT_RE.search(low) is not None
    return n_content >= (1 if singular and not second else 2)


def personal_statements(text: str, vocatives: set[str]) -> Iterator[str]:
    """Each personal statement in one message, cleaned (first person, as said); code blocks are
    not read (`memory.text.prose`)."""
    for raw in split_sentences(prose(text)):
        if raw.rstrip("\"')").endswith("?"):
            continue
        s = _strip_vocative(_clean(raw), vocatives)
        if _GERUND_START_RE.match(s):
            s = "I'm " + s[0].lower() + s[1:]          # "Researching agencies" said of oneself
        if len(s.split()) < 4 or _FILLER_START_RE.match(s) or not _personal(s, vocatives):
            continue
        yield s


def sentence_item(sentence: str, speaker: str, said: datetime | date | str, message_id: str) -> dict[str, Any]:
    """The fragment item (subject, category, key, content, source_ids, date) one sentence of `speaker`
    makes, worded by the rules: extraction's statements and the supersede stage's change fragments."""
    category = categorize(sentence)
    return {"subject": speaker, "category": category, "key": key_phrase(sentence, speaker),
            "content": third_person(sentence, speaker), "source_ids": [message_id],
            "date": normalize_date(sentence, said, category)}
