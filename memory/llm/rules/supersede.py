"""The `supersede` rule (PREMem's *transformation* acted on): does a newer fragment replace an older
one of the same subject, contradict it, or neither? Deterministic heuristics, documented here:

* **quantities** — every number in a fragment (``150 commits``, ``65%``, ``250ms``, ``1,200 calls
  per day``) is read with its unit (``%``, ``ms``, the next word; the next number's in ``from 20
  to 12 minutes``) and its context: the content
  words within `WINDOW` words around it. Two quantities are *the same quantity* when their units
  agree and their contexts share at least `MIN_SHARED` words (``commits merged main branch``). A
  newer fragment **updates** an older one when they hold the same quantity with different values
  and neither value is also said in the other fragment (``has now reached 165`` after
  ``150 commits``); a unitless number matches a unit its context names. A rate's period (``1,700
  words/day``, ``hours per week``, ``my weekly word count``) belongs to its unit: rates of two
  periods are never the same quantity. A date both fragments
  state counts as one shared context word: the same period, another count (``secured 3 interviews
  between April 25 and May 1`` / ``secured 5 interviews`` between the same dates). Dates (``April 5, 2024``)
  and clock times (``4:30 PM``) are quantities of their own kind, compared only with their kind
  (their month names left out of the context). Numbers of different things are common, so a
  unitless number, a date or a time only updates when the newer statement says it changed: a change
  cue among the `CUE_WORDS` words before it (``rescheduled to March 22 at 4:30 PM``, ``the new April
  25 deadline``, ``has increased to 7``), or a change verb whose object runs up to a ``to`` right
  before the value, however long (``adjust the deadline for my Instagram automation prototype to
  April 5``; not the ``to`` of a range or a bound: ``from 7 to 9 PM``, ``up to 40``); a number with
  a unit (``52 sources``) needs none. A number right after ``under`` or ``across`` is a
  measurement's *condition*: when both fragments state one of the same quantity with different
  values, the measurements they condition are two facts, not an update, changed or not (``120ms
  under 20 concurrent requests`` / ``dropped to 210ms under 300 concurrent requests``; ``120ms``
  under both loads alike); a condition alone that changes is an update.
  Years, version numbers (``v1.0.0``, ``2.3.1``, ``Python 3.11``) and ratios (``8/10``, ``2:1``)
  are not quantities.
* **restatements** — a newer fragment whose changed values are exactly those the older one
  replaced (the history: the fragments the older one closed, the turns it names in
  ``replaces_sources``) restates the old state and does not replace the current value (``100
  requests/minute`` again after ``100`` → ``120``), unless it says the value went back (``back to``,
  ``reverted``) or says right at the number that it is new (a change cue among the `STATED_WORDS`
  words before it, or a change verb's ``to``: ``is now 100``, ``lowered the limit to 100``). The
  callers give `decide` that history (`turns.History`), which then says ``restatement``.
* **named values** — under the same key (or a text cosine of at least `NAMED_SIM`), a newer fragment
  with a change cue (``now``, ``switched to``, ``moved to``, ``instead``, ``no longer``...) naming a
  capitalized value the older one does not name (within `CUE_WORDS` words after the cue), while
  the older names one the newer drops, **updates** it (``now uses PostgreSQL`` after ``uses SQLite``).
  A name inside quotes is a quotation, not a value (``now getting a "Rate limit exceeded" error``).
* **contradictions** — a newer fragment that negates an experience or state for all time
  (``never``, ``haven't ever``, ``not yet``) of which an older fragment states the opposite
  (sharing at least `MIN_SHARED` of the words after the negation, past verbs included: ``never
  submitted my cover letter`` / ``submitted my cover letter``; not negated there, a negation within
  `NEG_WORDS` words before them, while ``I'm not sure how`` elsewhere does not count) is a
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
from typing import Any, Callable, Iterable

from memory.text import content_tokens, is_content, looks_like_code

__all__ = ["SUPERSEDE_VERSION", "Quantity", "quantities", "decide", "changed", "restates", "contradiction",
           "same_key", "is_statement", "says_never", "WINDOW", "CUE_WORDS", "MIN_SHARED"]

SUPERSEDE_VERSION = "rules-supersede-v8"   # v7: code lines, no assistant fragment; v8: a quoted name is no value
#: content words on each side of a number that make up its context
WINDOW = 6
#: context words two quantities (or a negation and a statement) must share to be about the same thing
MIN_SHARED = 2
#: words before a changed value (after it, for a name) that a change cue must fall within
CUE_WORDS = 8
#: text cosine under which a named value change needs the same key
NAMED_SIM = 0.6
#: words before a shared word in which a negation makes the statement negated too
NEG_WORDS = 2
#: words a fragment needs to be a statement (shorter ones are labels and headings)
MIN_WORDS = 6

_NUM_RE = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s?(%|percent\b|ms\b|s\b|k\b|x\b|"
                     r"[A-Za-z][A-Za-z\-]*)?")
_VERSION_RE = re.compile(r"\bv?\d+\.\d+\.\d+\b|\bv\d+(?:\.\d+)?\b")
_CHANGE_RE = re.compile(r"\b(?:now|no\s+longer|anymore|switched|switching|changed|moved|instead|"
                        r"replaced|updated?|new|recently|increased|decreased|extended|reduced|reached|"
                        r"improved|grown|grew|dropped|raised|lowered|rescheduled|postponed|pushed\s+back|"
                        r"adjusted|revised|shifted|expanded|upgraded|these\s+days|"
                        # the verbs of a change under way: "trying to adjust the deadline to April 5"
                        r"adjust(?:ing)?|chang(?:e|ing)|mov(?:e|ing)|reschedul(?:e|ing)|postpon(?:e|ing)|"
                        r"extend(?:ing)?|switch(?:ing)?|updating|shift(?:ing)?)\b", re.IGNORECASE)
_CHANGE_VERBS = (r"adjust(?:s|ed|ing)?|chang(?:e|es|ed|ing)|mov(?:e|es|ed|ing)|reschedul(?:e|es|ed|ing)|"
                 r"postpon(?:e|es|ed|ing)|extend(?:s|ed|ing)?|switch(?:es|ed|ing)?|shift(?:s|ed|ing)?|"
                 r"updat(?:e|es|ed|ing)|increas(?:e|es|ed|ing)|decreas(?:e|es|ed|ing)|rais(?:e|es|ed|ing)|"
                 r"lower(?:s|ed|ing)?|reduc(?:e|es|ed|ing)|push(?:es|ed|ing)?|bump(?:s|ed|ing)?")
#: a change verb whose object runs up to "to" right before the value, the cue however far back in its
#: clause: "adjust the deadline for my Instagram automation prototype to April 5"
_CHANGE_TO_RE = re.compile(rf"\b(?:{_CHANGE_VERBS})\b[^.,;:!?]{{0,80}}\bto\s*$", re.IGNORECASE)
#: a "to" that closes a range or a bound, not a change: "from 7 to 9 PM", "from May 2 to May 6", "up to 40"
_RANGE_TO_RE = re.compile(r"(?:\bfrom\s+\S+(?:\s+\S+)?|\bup)\s+to\s*$", re.IGNORECASE)
#: words saying a value goes back to an earlier one: a restatement of it is then a real change
_REVERT_RE = re.compile(r"\b(?:back\s+(?:to|down|up)|revert(?:s|ed|ing)?|returned\s+to|restored?)\b", re.IGNORECASE)
#: words right before a number (`STATED_WORDS`) that say it is a new value: "is now 100", "lowered it to 100"
STATED_WORDS = 3
#: a preposition right before a number that makes it the condition of a measurement ("180ms under
#: 20 concurrent requests"): two measurements under different conditions are two facts
_CONDITIONS = frozenset({"under", "across"})
_MONTHS = {m: i + 1 for i, ms in enumerate(("january jan", "february feb", "march mar", "april apr", "may",
                                             "june jun", "july jul", "august aug", "september sep sept",
                                             "october oct", "november nov", "december dec"))
           for m in ms.split()}
_MONTH = r"(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")"
# a day range ("May 3-4") is one date, its first day: the second day is no number of its own
_DATE_RE = re.compile(rf"\b(?:({_MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:\s*[-\u2013]\s*\d{{1,2}}(?:st|nd|rd|th)?)?"
                      rf"|(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH}))\b(?:,?\s+\d{{4}}\b)?", re.IGNORECASE)
_TIME_RE = re.compile(r"\b(\d{1,2})(?::(\d{2}))?\s*([ap])\.?m\b\.?", re.IGNORECASE)
_RANGE_RE = re.compile(r"\s*(?:to|-|\u2013)\s*(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s?(%|[A-Za-z][A-Za-z\-]*)")
_RATIO_RE = re.compile(r"\b\d+\s*[/:]\s*\d+\b")
_NEVER_RE = re.compile(r"\b(?:never|not\s+yet|haven't\s+(?:ever|yet)|has\s+not\s+ever|hasn't\s+(?:ever|yet)|"
                       r"not\s+ever|no\s+experience)\b", re.IGNORECASE)
_NEG_ANY_RE = re.compile(r"\b(?:never|not|no|n't|haven't|hasn't|didn't|don't|doesn't)\b", re.IGNORECASE)
_CAP_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][A-Za-z0-9+#.\-]*[A-Za-z0-9+#])")
_QUOTED_RE = re.compile(r"\"[^\"\n]{1,80}\"|“[^”\n]{1,80}”|‘[^’\n]{1,80}’|(?<!\w)'\S[^'\n]{0,78}\S'(?!\w)")
_STEM_RE = re.compile(r"(?:ing|ed|es|s)$")
#: a rate's period right after its unit ("words/day", "hours per week", "calls a day")
_PER_RE = re.compile(r"\s*(?:/|per\s+|an?\s+|each\s+|every\s+)(day|week|month|year|hour|minute|session)s?\b",
                     re.IGNORECASE)
#: a rate's period said as an adjective near it ("my weekly word count ... 1,500 words")
_PERIODS = {"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annual": "year",
            "annually": "year", "hourly": "hour", "nightly": "day"}
_UNIT_ALIASES = {"percent": "%", "%": "%", "ms": "ms", "s": "s", "k": "k", "x": "x",
                 **{u: u for u in ("kb", "mb", "gb", "tb")}}    # sizes: too short for a content word
#: units of time, which the content-word filter drops (``6 weeks`` is not a unitless 6)
_MEASURES = {w + s: w for w in ("second", "minute", "hour", "day", "week", "month", "year") for s in ("", "s")}
_NUMBER_WORDS = frozenset("""user users the a an and or of to in on at by for with from is are was were has have
been be it its this that which who as than then about around approximately roughly over under up down
only just also now recently already after before since until during per into onto across through
when while because but so if than more less most least times time so far yet""".split())


def _stem(word: str) -> str:
    return _STEM_RE.sub("", word) if len(word) > 4 else word


@dataclass(frozen=True)
class Quantity:
    """A number with its unit (``date`` and ``time`` for those kinds), the (stemmed) content words
    around it, and whether a change cue comes right before it."""

    value: float
    unit: str
    context: frozenset[str]
    cued: bool = False
    #: the period of a rate ("1,700 words/day", "a weekly word count of 1,200": day, week), or ""
    per: str = ""
    #: the number is a measurement's condition (`_CONDITIONS`: "under 20 concurrent requests")
    condition: bool = False
    #: the statement says right at the number that it is a new value ("is now 100", "lowered it to 100")
    stated: bool = False

    @property
    def needs_cue(self) -> bool:
        """Unitless numbers, dates and times change only when the statement says so."""
        return self.unit in ("", "date", "time")


def quantities(text: str, exclude: set[str] | None = None) -> list[Quantity]:
    """Every quantity of `text` (see the module doc); years 1900-2100, versions and ratios skipped."""
    return list(_quantities(text, frozenset(exclude or ())))


def _blank(m: re.Match[str]) -> str:
    return " " * len(m.group(0))


def _quantity(text: str, start: int, end: int, value: float, unit: str, exclude: set[str]) -> Quantity:
    """The quantity at text[start:end] with its context and cue (see `Quantity`)."""
    before = [_stem(w) for w in content_tokens(text[:start], exclude)][-WINDOW:]
    after = [_stem(w) for w in content_tokens(text[end:], exclude)][:WINDOW // 2]
    named = [unit] if unit and unit not in _UNIT_ALIASES.values() and unit not in ("date", "time", "$") else []
    prefix = text[:start]
    words = prefix.split()
    to_cued = bool(_CHANGE_TO_RE.search(prefix)) and not _RANGE_TO_RE.search(prefix)
    cued = bool(_CHANGE_RE.search(" ".join(words[-CUE_WORDS:]))) or to_cued
    stated = to_cued or bool(_CHANGE_RE.search(" ".join(words[-STATED_WORDS:])))
    condition = bool(words) and words[-1].lower() in _CONDITIONS and unit not in ("date", "time")
    rate = _PER_RE.match(text, end)
    per = rate.group(1).lower() if rate else next(
        (_PERIODS[w] for w in [x.lower() for x in words[-WINDOW:]] + text[end:].lower().split()[:2]
         if w in _PERIODS), "")
    return Quantity(value=value, unit=unit, context=frozenset(before + after + named), cued=cued, per=per,
                    condition=condition, stated=stated)


@lru_cache(maxsize=65536)
def _quantities(text: str, exclude: frozenset[str]) -> tuple[Quantity, ...]:
    clean = _VERSION_RE.sub(_blank, text.replace("\u2019", "'"))
    out = []
    words = set(exclude) | set(_MONTHS) | {"at", "pm", "am"}
    for m in _DATE_RE.finditer(clean):
        month, day = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        if 1 <= int(day) <= 31:
            stamp = float(_MONTHS[month.lower().rstrip(".")] * 100 + int(day))
            out.append(_quantity(clean, m.start(), m.end(), stamp, "date", words))
    clean = _DATE_RE.sub(_blank, clean)
    for m in _TIME_RE.finditer(clean):
        hour = int(m.group(1)) % 12 + (12 if m.group(3).lower() == "p" else 0)
        out.append(_quantity(clean, m.start(), m.end(), float(hour * 60 + int(m.group(2) or 0)), "time", words))
    clean = _RATIO_RE.sub(_blank, _TIME_RE.sub(_blank, clean))
    for m in _NUM_RE.finditer(clean):
        raw = m.group(1).replace(",", "")
        try:
            value = float(raw)
        except ValueError:
            continue
        if "." in raw and re.search(r"[A-Z][\w\-]*\s*$", clean[:m.start()]):
            continue                                   # "Python 3.11": a version, not a quantity
        unit_word = (m.group(2) or "").lower()
        ranged = _RANGE_RE.match(clean, m.end(1)) if not unit_word or unit_word in _NUMBER_WORDS else None
        if ranged:                                     # "from 20 to 12 minutes": both in minutes
            unit_word = ranged.group(1).lower()
        if "." not in raw and 1900 <= value <= 2100 and (not unit_word or unit_word in _NUMBER_WORDS):
            continue                                   # a year, not a quantity
        unit = _UNIT_ALIASES.get(unit_word, "") or _MEASURES.get(unit_word, "")
        if not unit and unit_word and unit_word not in _NUMBER_WORDS and is_content(unit_word):
            unit = _stem(unit_word)
        if clean[max(0, m.start() - 1):m.start()] == "$":
            unit = "$"
        out.append(_quantity(clean, m.start(), m.end(), value, unit, set(exclude)))
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


def changed(newer: dict[str, Any], older: dict[str, Any]) -> list[Quantity]:
    """The quantities of `newer` that give a quantity of `older` another value. None when the
    condition changes (a number right after `_CONDITIONS` in both, same unit and context, different
    values) and a measurement is stated too, changed or not: "210ms under 300 concurrent requests"
    after "120ms under 20 concurrent requests" is another fact, not an update."""
    exclude = _names(str(newer.get("subject") or ""))
    new_q, old_q = quantities(_text(newer), exclude), quantities(_text(older), exclude)
    if not new_q or not old_q:
        return []
    new_values, old_values = {(_kind(q), q.value) for q in new_q}, {(_kind(q), q.value) for q in old_q}
    same_period = any(kind == "date" and (kind, v) in old_values for kind, v in new_values)
    out: list[Quantity] = []
    conditions: list[Quantity] = []
    kept = False                                       # a measurement both state with one value
    for nq in new_q:
        scope = 1 if same_period and _kind(nq) != "date" else 0     # a date both state: one shared word
        for oq in old_q:
            if not _same_unit(nq, oq) or len(nq.context & oq.context) + scope < MIN_SHARED:
                continue
            if nq.value == oq.value and not (nq.condition or oq.condition):
                kept = True
            if (_kind(nq), nq.value) in old_values or (_kind(oq), oq.value) in new_values:
                continue
            if nq.needs_cue and not nq.cued:
                continue
            found = conditions if nq.condition and oq.condition else out
            if nq not in found:
                found.append(nq)
    if conditions and (out or kept):
        return []
    return out or conditions


def restates(newer: dict[str, Any], older: dict[str, Any], earlier: Iterable[dict[str, Any]]) -> bool:
    """`newer` gives back, unchanged, the values that `older` replaced in `earlier` (the statements
    `older` superseded): it restates the old state ("12 problems, 70% to 90%" again after "15
    problems") and does not replace `older`, unless it says the value went back (`_REVERT_RE`) or
    that it is new right at the number (`Quantity.stated`: "is now 100", "lowered it to 100")."""
    return _gives_back(newer, changed(newer, older), earlier)


def _gives_back(newer: dict[str, Any], drivers: list[Quantity], earlier: Iterable[dict[str, Any]]) -> bool:
    """`restates` once the changed quantities (`drivers`) are known."""
    if not drivers or _REVERT_RE.search(str(newer.get("content") or "")) or any(d.stated for d in drivers):
        return False
    exclude = _names(str(newer.get("subject") or ""))
    past = [q for e in earlier for q in quantities(_text(e), exclude)]
    return all(any(_same_unit(d, p) and d.value == p.value and len(d.context & p.context) >= MIN_SHARED
                   for p in past) for d in drivers)


def _kind(q: Quantity) -> str:
    return q.unit if q.unit in ("date", "time") else ""


def _same_unit(a: Quantity, b: Quantity) -> bool:
    """Equal units, or one unitless number whose context holds the other's unit word; dates and
    times only with their own kind; rates of two different periods never (words a day, a week)."""
    if a.per and b.per and a.per != b.per:
        return False
    if a.unit == b.unit:
        return True
    if "date" in (a.unit, b.unit) or "time" in (a.unit, b.unit):
        return False
    if not a.unit:
        return b.unit in a.context
    if not b.unit:
        return a.unit in b.context
    return False


def _caps(text: str) -> set[str]:
    """Capitalized names outside quoted phrases ("Rate limit exceeded"; a lone "Kong" counts, "user's" opens none)."""
    return {m.group(1) for m in _CAP_RE.finditer(_QUOTED_RE.sub(lambda q: " " if " " in q.group(0) else q.group(0),
                                                                text)) if len(m.group(1)) > 1}


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
    if not cap_old - cap_new:
        return False
    for cue in _CHANGE_RE.finditer(text_new):               # the cue governs a new name after it
        if _caps(" ".join(text_new[cue.end():].split()[:CUE_WORDS])) & (cap_new - cap_old):
            return True
    return False


def contradiction(newer: dict[str, Any], older: dict[str, Any]) -> bool:
    """One of the two negates for all time what the other states (see the module doc): at least
    `MIN_SHARED` of the `WINDOW` words after the negation (verbs in the past kept: ``enrolled``,
    ``submitted``) are in the other, not negated there (no negation in the `NEG_WORDS` words before
    them; a negation elsewhere in the sentence, ``not sure how``, does not count)."""
    a, b = str(newer.get("content") or ""), str(older.get("content") or "")
    m_a, m_b = _NEVER_RE.search(a), _NEVER_RE.search(b)
    if bool(m_a) == bool(m_b):
        return False
    negated, stated, m = (a, b, m_a) if m_a else (b, a, m_b)
    assert m is not None
    exclude = _names(str(newer.get("subject") or "")) | {"never", "ever", "yet", "actually", "project"}
    clause = {w for w, _ in _clause_words(negated[m.end():], exclude)[:WINDOW]}
    said = _clause_words(stated, exclude, keep_negations=True)
    shared = set()
    for i, (w, _) in enumerate(said):
        if w in clause and not any(neg for _, neg in said[max(0, i - NEG_WORDS):i]):
            shared.add(w)
    return len(shared) >= MIN_SHARED


def _clause_words(text: str, exclude: set[str], keep_negations: bool = False) -> list[tuple[str, bool]]:
    """(stem, is a negation) of the words of `text` that name what was done: content words and past
    verbs, stemmed alike (``enrolled``/``enroll``, ``missing``/``missed``); negations only if asked."""
    out: list[tuple[str, bool]] = []
    for tok in re.findall(r"[A-Za-z][A-Za-z'\-]*", text.replace("\u2019", "'")):
        low = tok.lower().removesuffix("'s")
        if _NEG_ANY_RE.fullmatch(low) or low.endswith("n't"):
            if keep_negations:
                out.append(("", True))
            continue
        if low in exclude or len(low) < 3:
            continue
        past = len(low) >= 5 and low.endswith("ed") and is_content(low[:-2] + "s")
        if not (is_content(low) or past):
            continue
        stem = re.sub(r"e$", "", re.sub(r"(?:ing|ed|s)$", "", low)) if len(low) > 4 else low
        if len(stem) > 3 and stem[-1] == stem[-2]:
            stem = stem[:-1]                              # submitt(ed) = submit, miss(ing) = mis(s)
        out.append((stem, False))
    return out


def is_statement(f: dict[str, Any]) -> bool:
    """A sentence about someone, not a line of code, a heading or a list label: at least
    `MIN_WORDS` words and no sign of code or markup (`memory.text.looks_like_code`)."""
    text = str(f.get("content") or "")
    return len(text.split()) >= MIN_WORDS and not looks_like_code(text)


def says_never(f: dict[str, Any]) -> bool:
    """The fragment negates something for all time (``never``, ``not yet``...)."""
    return bool(_NEVER_RE.search(str(f.get("content") or "")))


def decide(newer: dict[str, Any], older: dict[str, Any], similarity: float,
           earlier: Callable[[], Iterable[dict[str, Any]]] | None = None) -> str | None:
    """"update" when `newer` replaces `older`, "contradiction" when it contradicts it without
    replacing it, "restatement" when its changed values are those `older` replaced (`earlier`:
    the statements it replaced, asked for only then; see `restates`), None otherwise. Both are
    fragment dicts (subject, key, content, date)."""
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
    drivers = changed(newer, older)
    if drivers and earlier is not None and _gives_back(newer, drivers, earlier()):
        return "restatement"
    if drivers or named_change(newer, older, similarity):
        return "update"
    return None
