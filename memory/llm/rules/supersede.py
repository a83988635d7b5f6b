"""The `supersede` rule (PREMem's *transformation* acted on): does a newer fragment replace an older
one of the same subject, contradict it, or neither? Deterministic heuristics, documented here:

* **quantities** — every number in a fragment (``150 commits``, ``65%``, ``250ms``, ``1,200 calls
  per day``) is read with its unit (``%``, ``ms``, the next word; the next number's in ``from 20 to
  12 minutes``; units through `memory.llm.rules.units`) and its context: the content words within
  `WINDOW` words around it. Two quantities are *the same quantity* when their units agree (a
  unitless number matches a unit its context names) and their contexts share at least `MIN_SHARED`
  words; a newer fragment **updates** an older one when they hold the same quantity with different
  values and neither value is also said in the other (``has now reached 165`` after ``150
  commits``). A rate's period belongs to its unit (``1,700 words/day`` is no weekly count); a date
  both state counts as one shared word (the same period). Dates and clock times are their own kinds.
  A unitless number, a date or a time updates only under a change cue (`memory.llm.rules.cues`:
  ``has increased to 7``, a change verb's ``to``), a date or a time only under a reschedule cue
  reaching it (v10: ``rescheduled to March 22``, ``the new April 25 deadline``), and a past event's
  date (``used the Hemingway Editor on July 15``) is history. A number with a unit needs no cue, but
  an uncued one changes only at a text cosine of at least `QUANTITY_SIM`, and a span's unit word
  (``seconds``) is then no shared word (v9). What a number states (`memory.llm.rules.modality`, v9):
  a target or bound (``under 300ms``, ``aiming for 85%``), a delta (``by 12MB``) and a measured or
  set value change only their own kind; a number after ``across``, or ``under`` of a counted thing,
  is a measurement's *condition*: measurements under two conditions are two facts (``120ms under 20
  concurrent requests`` / ``210ms under 300 concurrent requests``). Years, versions (``v1.0.0``,
  ``Python 3.11``), ratios (``2:1``), identifiers (v10: ``502 Bad Gateway``, ``port 5000``:
  `memory.llm.rules.nonvalues`) are no quantities, and a number of a help request or a worked example
  is an exercise's. v11 vetoes a change between numbers about two things (`_apart`): what each is
  attached to, its owner (``user's modal popup`` / ``user's portfolio site``) or the names before it
  differ and neither statement names the other's (`memory.llm.rules.measured`); two deltas; a limit
  and a measured value (``memory limit set to 512MB`` / ``using 400MB``); two changes told whole
  (``from 78% to 88%`` / ``from 70% to 90%``) at a context under twice `MIN_SHARED`, unless one starts
  where the other ended; a load (``with 50 concurrent users``) is a condition, and a bare load replaces
  only a bare load. v12 (an audit of v11's wrong closings) reads more of what a number is: owners
  whose head nouns differ (``user's Twitter API integration`` / ``user's Twitter API query``; a
  possessive inside ends the owner: ``user's Flask app's memory``) and one measure of two kinds
  (``parsing time`` / ``API response time``) are two things (`measured.owner_head`, `measured.kind`);
  an amount added (``adds 400ms``, ``a 15ms overhead``, ``an extra $150``) is a delta, a spread
  (``±15ms``) a bound, a span a measurement covers (``over a 7-day period``) a condition, a goal
  infinitive (``set a goal to finish``) a goal (`modality`); a value said as former (``initially
  800ms``, the ``85%`` of ``from 85% to 93%``: `cues.former`) replaces none and is replaced by none;
  a count reads past its adjective (``3 new subplots``), a hyphenated unit names what it measures.
* **restatements** — a newer fragment whose changed values are exactly those the older one
  replaced (the history: the fragments the older one closed, the turns it names in
  ``replaces_sources``) restates the old state and does not replace the current value (``100
  requests/minute`` again after ``100`` → ``120``), unless it says the value went back (``back to``,
  ``reverted``) or says right at the number that it is new (a change cue among the `cues.STATED_WORDS`
  words before it, or a change verb's ``to``: ``is now 100``, ``lowered the limit to 100``). The
  callers give `decide` that history (`turns.History`), which then says ``restatement``.
* **named values** — at a text cosine of at least `NAMED_SIM`, a newer fragment with a replacement
  cue (``now``, ``switched to``, ``moved to``, ``instead``, ``no longer``...) naming a capitalized
  value the older one does not name, while the older names one the newer drops (or says it left:
  ``switched from Flask to FastAPI``), **updates** it (``now uses PostgreSQL`` after ``uses
  SQLite``): `memory.llm.rules.named`. A name inside quotes is a quotation, not a value (``now getting
  a "Rate limit exceeded" error``), and a month or a weekday is no name. v12: a "now" opening a next
  step (``now I need to handle 401 errors``) is no cue, and a name the older statement denies
  (``never used Gunicorn``) no value it held.
* **contradictions** — a newer fragment that denies for all time (``never``, ``haven't ever``,
  ``not yet``) what an older one states, sharing at least `MIN_SHARED` of the words after the
  denial (``never submitted my cover letter`` / ``submitted my cover letter``), is a
  **contradiction**, not an update: both stay current and context flags them so the answering
  model can ask; not when the denial is scoped to a time the statement does not share (``never ...
  in 2023`` / ``... in 2018``). An older denial that the newer fragment fulfils (``not yet``, or it
  says it happened lately: ``finally``, ``yesterday``) is an **update** (v10; `memory.llm.rules.negation`).

Only statements are compared (`is_statement`: no code, headings or list labels), and never two
fragments of one message. Everything else is neither. The rule reads only the two fragments'
texts (and their cosine, given by the caller): no world knowledge, so paraphrased changes without a
number or a name are missed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable

from memory.llm.rules.cues import CUE_WORDS, cue, former, past_event, reverts, whole_change
from memory.llm.rules.measured import (apart, heads_apart, kin, kind, kinds_apart, measure, names_before, owner,
                                       owner_head, words)
from memory.llm.rules.modality import mode, speaks_of_limits
from memory.llm.rules.named import named_change, subject_names
from memory.llm.rules.negation import negation, says_never
from memory.llm.rules.nonvalues import identifier, in_request
from memory.llm.rules.units import MEASURES, SPANS, counted, hyphened, period, unit_of
from memory.text import content_tokens, is_content, looks_like_code

__all__ = ["SUPERSEDE_VERSION", "Quantity", "quantities", "decide", "changed", "restates", "contradiction",
           "is_statement", "says_never", "WINDOW", "CUE_WORDS", "MIN_SHARED", "QUANTITY_SIM"]

# v7: code lines; v8: quoted names; v9: quantity identity, targets, deltas; v10: reschedule cues,
# identifiers, exercises, units; v11: what a number is about (`measured`); v12: see the module doc; v13: `REACH`
SUPERSEDE_VERSION = "rules-supersede-v13"
#: content words on each side of a number that make up its context
WINDOW = 6
#: context words two quantities (or a negation and a statement) must share to be about the same thing
MIN_SHARED = 2
#: text cosine under which a number with no change cue before it changes no other statement's
QUANTITY_SIM = 0.5
#: words a fragment needs to be a statement (shorter ones are labels and headings)
MIN_WORDS = 6
#: characters a quantity's cues read on each side of it (all are clause-local): keeps parsing linear
#: in a text's length (a 13 KB paragraph of 1,200 numbers took 28 s when each read its whole prefix)
REACH = 1200

_NUM_RE = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s?(%|percent\b|ms\b|s\b|k\b|x\b|"
                     r"[A-Za-z][A-Za-z\-]*)?")
_VERSION_RE = re.compile(r"\bv?\d+\.\d+\.\d+\b|\bv\d+(?:\.\d+)?\b")
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
_STEM_RE = re.compile(r"(?:ing|ed|es|s)$")
#: a span of time's unit words, stemmed or not: shared by every two spans, they say nothing of what is timed
_SPAN_WORDS = {w: {w, w + "s", _STEM_RE.sub("", w + "s")} for w in SPANS}
_NUMBER_WORDS = frozenset("""user users the a an and or of to in on at by for with from is are was were has have
been be it its this that which who as than then about around approximately roughly over under up down
only just also now recently already after before since until during per into onto across through
when while because but so if than more less most least times time so far yet""".split())


def _stem(word: str) -> str:
    return _STEM_RE.sub("", word) if len(word) > 4 else word


@dataclass(frozen=True)
class Quantity:
    """A number with its unit (``date``, ``time`` for those kinds), its context and what it states."""

    value: float
    unit: str
    context: frozenset[str]
    cued: bool = False
    #: the period of a rate ("1,700 words/day", "a weekly word count of 1,200": day, week), or ""
    per: str = ""
    #: a measurement's condition ("under 20 concurrent requests"), a target or bound ("under 300ms"),
    #: a change by an amount ("by 12MB"): `modality`
    condition: bool = False
    bound: bool = False
    delta: bool = False
    #: the statement says right at the number that it is a new value ("is now 100", "lowered it to 100")
    stated: bool = False
    #: a date or time of a past event ("used the Hemingway Editor on July 15": `cues.past_event`, v10)
    past: bool = False
    #: the number is in a help request or a worked example (`nonvalues.in_request`, v10)
    example: bool = False
    #: the number is set as a cap ("a memory limit set to 512MB": `modality`, v11)
    limit: bool = False
    #: the number is one end of a change told whole ("from 78% to 88%": `cues.whole_change`, v11)
    whole: bool = False
    #: what the number is attached to, its owner and the names before it (`measured`, v11)
    measure: frozenset[str] = frozenset()
    owner: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()
    #: the head noun of its owner, the word naming its measure's kind ("parsing time"; `measured`, v12)
    head: str = ""
    kind: str = ""
    #: a value that held before ("initially 800ms", the "85%" of "from 85% to 93%": `cues.former`, v12)
    former: bool = False

    @property
    def needs_cue(self) -> bool:
        """Unitless numbers, dates and times change only when the statement says so."""
        return self.unit in ("", "date", "time")


def quantities(text: str, exclude: set[str] | None = None) -> list[Quantity]:
    """Every quantity of `text` (see the module doc); years 1900-2100, versions and ratios skipped."""
    return list(_quantities(text, frozenset(exclude or ())))


def _blank(m: re.Match[str]) -> str:
    return " " * len(m.group(0))


def _quantity(text: str, start: int, end: int, value: float, unit: str, exclude: set[str],
              spelled: str = "") -> Quantity:
    """The quantity at text[start:end] with its context and cue (see `Quantity`); `spelled`: its unit
    as written (a span of time's unit word is a context word when written as a word: ``60 seconds``,
    not ``60s``)."""
    lo = max(0, start - REACH)
    lo = (text.find(" ", lo, start) + 1 or lo) if lo else 0      # from a word's start
    text, start, end = text[lo:end + REACH], start - lo, end - lo
    before = [_stem(w) for w in content_tokens(text[:start], exclude)][-WINDOW:]
    after = [_stem(w) for w in content_tokens(text[end:], exclude)][:WINDOW // 2]
    word = unit in SPANS and len(spelled) > 2
    named = [unit] if unit and (word or unit not in MEASURES) and unit not in ("date", "time", "$") else []
    prefix = text[:start]
    words = prefix.split()
    dated = unit in ("date", "time")
    said = cue(prefix, dated)
    how = mode(prefix, text[end:], unit)
    per = period(text, end, words[-WINDOW:])
    return Quantity(value=value, unit=unit, context=frozenset(before + after + named), cued=said.cued, per=per,
                    condition=how.condition, bound=how.bound, delta=how.delta, stated=said.stated,
                    past=dated and past_event(prefix, text[end:]), example=in_request(prefix), limit=how.limit,
                    whole=not dated and whole_change(prefix, text[start:]),
                    measure=frozenset() if dated else measure(prefix, text[end:]),
                    owner=owner(prefix, exclude, WINDOW), names=names_before(prefix),
                    head=owner_head(prefix, exclude, WINDOW), kind="" if dated else kind(prefix),
                    former=not dated and former(prefix, text[start:]))


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
        near = clean[max(0, m.start() - REACH):m.start()]
        if "." in raw and re.search(r"[A-Z][\w\-]*\s*$", near):
            continue                                   # "Python 3.11": a version, not a quantity
        hyphen = None if m.group(2) else hyphened(clean, m.end(1))     # v12: "a 5,000-word draft"
        unit_word = hyphen.group(1).lower() if hyphen else counted((m.group(2) or "").lower(), clean[m.end():m.end() + REACH])
        ranged = _RANGE_RE.match(clean, m.end(1)) if not unit_word or unit_word in _NUMBER_WORDS else None
        if ranged:                                     # "from 20 to 12 minutes": both in minutes
            unit_word = ranged.group(1).lower()
        named = (ranged.group(1) if ranged else m.group(2) or "")[:1].isupper() and not unit_of(unit_word)
        dollars = clean[max(0, m.start() - 1):m.start()] == "$"
        if not (set(raw) & {".", ","} or dollars) and 1900 <= value <= 2100 and (
                not unit_word or unit_word in _NUMBER_WORDS or named):
            continue                                   # a year ("1990-2020 Montserrat cinema"), not a quantity
        unit = unit_of(unit_word)
        if not unit and unit_word and unit_word not in _NUMBER_WORDS and is_content(unit_word):
            unit = _stem(unit_word)
        if dollars:
            unit = "$"
        if unit != "$" and identifier(near, raw, clean[m.end(1):m.end(1) + REACH], unit in MEASURES):
            continue                                   # "port 5000", "502 Bad Gateway", "PostgreSQL 14": names
        end = hyphen.end() if hyphen else m.end()
        out.append(_quantity(clean, m.start(), end, value, unit, set(exclude), unit_word))
    return tuple(out)


def _text(f: dict[str, Any]) -> str:
    return f"{f.get('key') or ''}: {f.get('content') or ''}"


def changed(newer: dict[str, Any], older: dict[str, Any]) -> list[Quantity]:
    """The quantities of `newer` that give a quantity of `older` another value. None when the
    condition changes (a `Quantity.condition` in both, same unit and context, different
    values) and both state a measurement too, changed or not, of any unit (v9; v8: of the same
    quantity): "210ms under 300 concurrent requests" after "120ms under 20 concurrent requests", or
    "220MB under 200 concurrent users" after "95ms under 50 concurrent users", is another fact."""
    exclude = subject_names(str(newer.get("subject") or ""))
    new_q, old_q = quantities(_text(newer), exclude), quantities(_text(older), exclude)
    if not new_q or not old_q:
        return []
    new_values = {(_kind(q), q.value) for q in new_q if not q.former}     # v12: "up from 1,500" replaces it
    old_values = {(_kind(q), q.value) for q in old_q}
    same_period = any(kind == "date" and (kind, v) in old_values for kind, v in new_values)
    texts = (_text(newer), _text(older))
    said = (words(texts[0]), words(texts[1]))
    limits = (speaks_of_limits(texts[0]), speaks_of_limits(texts[1]))
    chained = any(not _kind(q) and ("", q.value) in old_values for q in new_q)   # "65 to 72" / "72 to 78"
    out: list[Quantity] = []
    conditions: list[Quantity] = []
    for nq in (q for q in new_q if not q.former):              # v12: a value that held before replaces none
        scope = 1 if same_period and _kind(nq) != "date" else 0     # a date both state: one shared word
        for oq in old_q:
            if not _same_unit(nq, oq) or _shared(nq, oq) + scope < MIN_SHARED or _modes_differ(nq, oq):
                continue
            if _apart(nq, oq, said, limits, chained):
                continue                               # v11: numbers of two different things
            if oq.former:
                continue                               # v12: nor is it replaced
            if (_kind(nq), nq.value) in old_values or (_kind(oq), oq.value) in new_values:
                continue
            if nq.needs_cue and not nq.cued:
                continue
            if nq.example or oq.example or (oq.past and _kind(oq)):
                continue                               # v10: an exercise's number, a past event's date
            found = conditions if nq.condition and oq.condition else out
            if nq not in found:
                found.append(nq)
    if conditions and _measures(new_q) and _measures(old_q):
        return []
    if _measures(new_q) or _measures(old_q):
        return out                                     # v11: a bare load replaces no measurement's load
    return out or conditions


def restates(newer: dict[str, Any], older: dict[str, Any], earlier: Iterable[dict[str, Any]]) -> bool:
    """`newer` gives back, unchanged, the values that `older` replaced in `earlier` (the statements
    `older` superseded): it restates the old state ("12 problems, 70% to 90%" again after "15
    problems") and does not replace `older`, unless it says the value went back (`cues.reverts`) or
    that it is new right at the number (`Quantity.stated`: "is now 100", "lowered it to 100")."""
    return _gives_back(newer, changed(newer, older), earlier)


def _gives_back(newer: dict[str, Any], drivers: list[Quantity], earlier: Iterable[dict[str, Any]]) -> bool:
    """`restates` once the changed quantities (`drivers`) are known."""
    if not drivers or reverts(str(newer.get("content") or "")) or any(d.stated for d in drivers):
        return False
    exclude = subject_names(str(newer.get("subject") or ""))
    past = [q for e in earlier for q in quantities(_text(e), exclude)]
    return all(any(_same_unit(d, p) and d.value == p.value and len(d.context & p.context) >= MIN_SHARED
                   for p in past) for d in drivers)


def _shared(a: Quantity, b: Quantity) -> int:
    """Context words two quantities share, a span of time's unit word not counted (v9) unless the
    newer value `a` says it changed ("extended my study sessions to 4 hours")."""
    common = a.context & b.context
    for unit in ({a.unit, b.unit} & _SPAN_WORDS.keys()) if not a.cued else ():
        common -= _SPAN_WORDS[unit]
    return len(common)


def _apart(a: Quantity, b: Quantity, said: tuple[frozenset[str], frozenset[str]],
           limits: tuple[bool, bool], chained: bool = False) -> bool:
    """Are the newer quantity `a` and the older `b` about two things though their contexts agree?
    (v11, see the module doc; `said`: each statement's words, `limits`: whether each speaks of a
    limit, `chained`: they share a number, one change's end the next one's start.)"""
    if a.delta and b.delta:
        return True
    if a.limit != b.limit and not limits[1 if a.limit else 0]:
        return True
    if a.whole and b.whole and _shared(a, b) < 2 * MIN_SHARED and not chained:
        return True
    if apart(a.measure, b.measure, said[0], said[1]) and not kin(a.measure, b.measure):
        return True
    return apart(a.owner, b.owner, said[0], said[1]) or apart(a.names, b.names, said[0], said[1]) \
        or heads_apart(a.head, b.head, *said) or kinds_apart(a.measure, b.measure, a.kind, b.kind, *said)


def _modes_differ(a: Quantity, b: Quantity) -> bool:
    """A target or bound and a value, a delta and a level, a condition and a count: two facts,
    never one changed (v9)."""
    return (a.condition, a.bound, a.delta) != (b.condition, b.bound, b.delta) and _kind(a) == ""


def _measures(found: Iterable[Quantity]) -> bool:
    """Some quantity is no condition, date or time: a measurement the conditions qualify."""
    return any(not q.condition and _kind(q) == "" for q in found)


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


def contradiction(newer: dict[str, Any], older: dict[str, Any]) -> bool:
    """`newer` denies for all time what `older` states, or `older` denied what `newer` states and
    nothing says it has happened since (`memory.llm.rules.negation`)."""
    return _negation(newer, older) == "contradiction"


def _negation(newer: dict[str, Any], older: dict[str, Any]) -> str | None:
    return negation(newer, older, window=WINDOW, min_shared=MIN_SHARED,
                    exclude=subject_names(str(newer.get("subject") or "")))


def is_statement(f: dict[str, Any]) -> bool:
    """A sentence about someone, not a line of code, a heading or a list label: at least
    `MIN_WORDS` words and no sign of code or markup (`memory.text.looks_like_code`)."""
    text = str(f.get("content") or "")
    return len(text.split()) >= MIN_WORDS and not looks_like_code(text)


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
    if verdict := _negation(newer, older):
        return verdict                               # a denial and what it denies (`negation`)
    drivers = [d for d in changed(newer, older) if d.cued or similarity >= QUANTITY_SIM]
    if drivers and earlier is not None and _gives_back(newer, drivers, earlier()):
        return "restatement"
    if drivers or named_change(newer, older, similarity):
        return "update"
    return None
