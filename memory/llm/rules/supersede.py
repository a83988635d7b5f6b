"""The `supersede` rule (PREMem's *transformation* acted on): does a newer fragment replace an older
one of the same subject, contradict it, or neither? Deterministic heuristics, documented here:

* **quantities** — every number in a fragment (``150 commits``, ``65%``, ``250ms``, ``1,200 calls
  per day``) is read with its unit (``%``, ``ms``, the next word...) and its context: the content
  words within `WINDOW` words around it. Two quantities are *the same quantity* when their units
  agree and their contexts share at least `MIN_SHARED` words (``commits merged main branch``). A
  newer fragment **updates** an older one when they hold the same quantity with different values
  and neither value is also said in the other fragment (``has now reached 165`` after
  ``150 commits``); a unitless number matches a unit its context names. Years and version
  numbers (``v1.0.0``, ``2.3.1``, ``Python 3.11``) are not quantities.
* **named values** — under the same key (or a text cosine of at least `NAMED_SIM`), a newer fragment
  with a change cue (``now``, ``switched to``, ``moved to``, ``instead``, ``no longer``...) naming a
  capitalized value the older one does not name, while the older names one the newer drops,
  **updates** it (``now uses PostgreSQL`` after ``uses SQLite``).
* **contradictions** — a newer fragment that negates an experience or state for all time
  (``never``, ``haven't ever``, ``not yet``) of which an older fragment states the opposite
  (sharing at least `MIN_SHARED` content words of its key and value, no negation there) is a
  **contradiction**, not an update: both stay current and context flags them so the answering model
  can ask.

Only statements are compared (`is_statement`: no code, headings or list labels), and never two
fragments of one message. Everything else is neither. The rule reads only the two fragments'
texts (and their cosine, given by
the caller): no world knowledge, so paraphrased changes without a number or a name are missed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from memory.text import content_tokens, is_content

__all__ = ["SUPERSEDE_VERSION", "Quantity", "quantities", "decide", "same_key", "is_statement",
           "has_change_cue", "says_never", "WINDOW",
           "MIN_SHARED"]

SUPERSEDE_VERSION = "rules-supersede-v1"
#: content words on each side of a number that make up its context
WINDOW = 6
#: context words two quantities (or a negation and a statement) must share to be about the same thing
MIN_SHARED = 2
#: text cosine under which a named value change needs the same key
NAMED_SIM = 0.6
#: words a fragment needs to be a statement (shorter ones are labels and headings)
MIN_WORDS = 6

_CODE_RE = re.compile(r"[=(){}\[\]#*`<>|]|^\s*[-\d]+[.)]\s|\w+\.\w+\(")

_NUM_RE = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s?(%|percent\b|ms\b|s\b|k\b|x\b|"
                     r"[A-Za-z][A-Za-z\-]*)?")
_VERSION_RE = re.compile(r"\bv?\d+\.\d+\.\d+\b|\bv\d+(?:\.\d+)?\b")
_CHANGE_RE = re.compile(r"\b(?:now|no\s+longer|anymore|switched|switching|changed|moved|instead|"
                        r"replaced|updated?|new|recently|increased|decreased|extended|reduced|reached|"
                        r"improved|grown|dropped|raised|lowered|has\s+(?:now\s+)?(?:reached|grown|dropped|"
                        r"improved|increased|decreased)|these\s+days)\b", re.IGNORECASE)
_NEVER_RE = re.compile(r"\b(?:never|not\s+yet|haven't\s+(?:ever|yet)|has\s+not\s+ever|hasn't\s+(?:ever|yet)|"
                       r"not\s+ever|no\s+experience)\b", re.IGNORECASE)
_NEG_ANY_RE = re.compile(r"\b(?:never|not|no|n't|haven't|hasn't|didn't|don't|doesn't)\b", re.IGNORECASE)
_CAP_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][A-Za-z0-9+#.\-]*[A-Za-z0-9+#])")
_STEM_RE = re.compile(r"(?:ing|ed|es|s)$")
_UNIT_ALIASES = {"percent": "%", "%": "%", "ms": "ms", "s": "s", "k": "k", "x": "x"}
_NUMBER_WORDS = frozenset("""user users the a an and or of to in on at by for with from is are was were has have
been be it its this that which who as than then about around approximately roughly over under up down
only just also now recently already after before since until during per into onto across through
when while because but so if than more less most least times time so far yet""".split())


def _stem(word: str) -> str:
    return _STEM_RE.sub("", word) if len(word) > 4 else word


@dataclass(frozen=True)
class Quantity:
    """A number with its unit and the (stemmed) content words around it."""

    value: float
    unit: str
    context: frozenset[str]


def quantities(text: str, exclude: set[str] | None = None) -> list[Quantity]:
    """Every quantity of `text` (see the module doc); years 1900-2100 and version numbers skipped."""
    return list(_quantities(text, frozenset(exclude or ())))


@lru_cache(maxsize=65536)
def _quantities(text: str, exclude: frozenset[str]) -> tuple[Quantity, ...]:
    clean = _VERSION_RE.sub(" ", text.replace("\u2019", "'"))
    out = []
    for m in _NUM_RE.finditer(clean):
        raw = m.group(1).replace(",", "")
        try:
            value = float(raw)
        except ValueError:
            continue
        if "." in raw and re.search(r"[A-Z][\w\-]*\s*$", clean[:m.start()]):
            continue                                   # "Python 3.11": a version, not a quantity
        unit_word = (m.group(2) or "").lower()
        if "." not in raw and 1900 <= value <= 2100 and (not unit_word or unit_word in _NUMBER_WORDS):
            continue                                   # a year, not a quantity
        unit = _UNIT_ALIASES.get(unit_word, "")
        if not unit and unit_word and unit_word not in _NUMBER_WORDS and is_content(unit_word):
            unit = _stem(unit_word)
        before = [_stem(w) for w in content_tokens(clean[:m.start()], set(exclude))][-WINDOW:]
        after = [_stem(w) for w in content_tokens(clean[m.end():], set(exclude))][:WINDOW // 2]
        context = frozenset(before + after + ([unit] if unit and unit not in _UNIT_ALIASES.values() else []))
        out.append(Quantity(value=value, unit=unit, context=context))
    return tuple(out)


def same_key(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same subject and the same key once normalized (case, spaces)."""
    def norm(x: Any) -> str:
        return " ".join(str(x or "").lower().split())
    return norm(a.get("subject")) == norm(b.get("subject")) and bool(norm(a.get("key"))) \
        and norm(a.get("key")) == norm(b.get("key"))


def _names(subject: str) -> set[str]:
    names = {w.lower() for w in subject.split()}
    return names | {n + "'s" for n in names}


def _text(f: dict[str, Any]) -> str:
    return f"{f.get('key') or ''}: {f.get('content') or ''}"


def quantity_change(newer: dict[str, Any], older: dict[str, Any]) -> bool:
    """The newer fragment gives another value to a quantity of the older one (see the module doc)."""
    exclude = _names(str(newer.get("subject") or ""))
    new_q, old_q = quantities(_text(newer), exclude), quantities(_text(older), exclude)
    if not new_q or not old_q:
        return False
    new_values, old_values = {q.value for q in new_q}, {q.value for q in old_q}
    for nq in new_q:
        for oq in old_q:
            if not _same_unit(nq, oq) or len(nq.context & oq.context) < MIN_SHARED:
                continue
            if nq.value not in old_values and oq.value not in new_values:
                return True
    return False


def _same_unit(a: Quantity, b: Quantity) -> bool:
    """Equal units, or one unitless number whose context holds the other's unit word."""
    if a.unit == b.unit:
        return True
    if not a.unit:
        return b.unit in a.context
    if not b.unit:
        return a.unit in b.context
    return False


def _caps(text: str) -> set[str]:
    return {m.group(1) for m in _CAP_RE.finditer(text) if len(m.group(1)) > 1}


def named_change(newer: dict[str, Any], older: dict[str, Any], similarity: float) -> bool:
    """A change cue in the newer fragment with a named value the older lacks, and vice versa."""
    if not (same_key(newer, older) or similarity >= NAMED_SIM):
        return False
    text_new, text_old = str(newer.get("content") or ""), str(older.get("content") or "")
    if not _CHANGE_RE.search(text_new):
        return False
    subject = _names(str(newer.get("subject") or ""))
    cap_new = {c for c in _caps(text_new) if c.lower() not in subject}
    cap_old = {c for c in _caps(text_old) if c.lower() not in subject}
    return bool(cap_new - cap_old) and bool(cap_old - cap_new)


def contradiction(newer: dict[str, Any], older: dict[str, Any]) -> bool:
    """One of the two negates for all time what the other states (see the module doc): at least
    `MIN_SHARED` of the `WINDOW` content words after the negation are in the other, unnegated one."""
    a, b = str(newer.get("content") or ""), str(older.get("content") or "")
    m_a, m_b = _NEVER_RE.search(a), _NEVER_RE.search(b)
    if bool(m_a) == bool(m_b):
        return False
    negated, stated, m = (a, b, m_a) if m_a else (b, a, m_b)
    assert m is not None
    if _NEG_ANY_RE.search(stated):
        return False
    exclude = _names(str(newer.get("subject") or "")) | {"never", "ever", "yet", "actually", "project"}
    clause = {_stem(w) for w in content_tokens(negated[m.end():], exclude)[:WINDOW]}
    shared = clause & {_stem(w) for w in content_tokens(stated, exclude)}
    return len(shared) >= MIN_SHARED


def is_statement(f: dict[str, Any]) -> bool:
    """A sentence about someone, not a line of code, a heading or a list label: at least
    `MIN_WORDS` words and none of the characters code and markup use."""
    text = str(f.get("content") or "")
    return len(text.split()) >= MIN_WORDS and not _CODE_RE.search(text)


def says_never(f: dict[str, Any]) -> bool:
    """The fragment negates something for all time (``never``, ``not yet``...)."""
    return bool(_NEVER_RE.search(str(f.get("content") or "")))


def has_change_cue(f: dict[str, Any]) -> bool:
    """The fragment says something changed (``now``, ``recently``, ``new``, ``has reached``...)."""
    return bool(_CHANGE_RE.search(str(f.get("content") or "")))


def decide(newer: dict[str, Any], older: dict[str, Any], similarity: float) -> str | None:
    """"update" when `newer` replaces `older`, "contradiction" when it contradicts it without
    replacing it, None otherwise. Both are fragment dicts (subject, key, content, date)."""
    if str(newer.get("subject") or "").lower() != str(older.get("subject") or "").lower():
        return None
    if not (is_statement(newer) and is_statement(older)):
        return None
    if set(newer.get("source_ids") or []) & set(older.get("source_ids") or []):
        return None                                  # one message does not update itself
    if _text(newer).lower() == _text(older).lower():
        return None
    if contradiction(newer, older):
        return "contradiction"
    if quantity_change(newer, older) or named_change(newer, older, similarity):
        return "update"
    return None
