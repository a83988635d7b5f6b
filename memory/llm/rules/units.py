"""The one table of unit spellings for the `rules` supersede decision (rules-supersede-v10): every
way a chat writes a unit maps to one canonical unit, so ``300 milliseconds``, ``300 msec`` and
``300ms`` are the same quantity in `memory.llm.rules.supersede` and the same unit of measure in
`memory.llm.rules.modality` (v9 kept two tables, and ``milliseconds`` was a word unit of its own).

``ms``, ``s``, ``k``, ``x`` and the sizes are listed because the content-word filter drops words
under three letters. Two choices were measured on the BEAM development stores (re-decided whole):

* ``60s`` stays apart from ``60 seconds``: merging them let three more timeouts of different
  things close one another (a socket timeout, a Gunicorn worker timeout, a health check grace
  period) and made no right closing;
* two-letter units of length, weight and volume (``cm``, ``kg``, ``ml``) stay unitless numbers:
  as units they need no change cue, and triangle side lengths of two geometry exercises (``sides 7
  cm, 24 cm, 25 cm``) then replaced each other.

v12 reads two more spellings of a count's unit: past an adjective to the counted noun (``3 new
subplots`` counts subplots; v11 read a unitless 3, matched by any unit its context named: ``7 beta
readers``), and joined to the number by a hyphen (``a 5,000-word draft``, ``a 7-day period``: words,
days; the noun after them is what they measure).
"""
from __future__ import annotations

import re

__all__ = ["UNITS", "SPANS", "MEASURES", "counted", "hyphened", "period", "unit_of"]

#: the canonical units of a span of time, whose words are context words when written out (``60 seconds``)
SPANS = frozenset({"second", "minute", "hour", "day", "week", "month", "year"})

_SPELLINGS: dict[str, tuple[str, ...]] = {
    "%": ("%", "percent", "pct"),
    "ms": ("ms", "msec", "msecs", "millisecond", "milliseconds"),
    "s": ("s",),
    "second": ("sec", "secs", "second", "seconds"),
    "minute": ("min", "mins", "minute", "minutes"),
    "hour": ("h", "hr", "hrs", "hour", "hours"),
    "day": ("day", "days"),
    "week": ("wk", "wks", "week", "weeks"),
    "month": ("mo", "month", "months"),
    "year": ("yr", "yrs", "year", "years"),
    "k": ("k",),
    "x": ("x",),
    **{size: (size,) for size in ("kb", "mb", "gb", "tb")},
}
#: a unit's spelling (lower case) -> its canonical unit
UNITS: dict[str, str] = {spelling: unit for unit, spellings in _SPELLINGS.items() for spelling in spellings}
#: canonical units of measure ("under 300ms" is a bound); any other word unit is a counted thing
MEASURES = frozenset(UNITS.values())


def unit_of(word: str) -> str:
    """The canonical unit of a unit's spelling (``milliseconds`` -> ``ms``), or "" when it is none."""
    return UNITS.get(word.lower(), "")


#: adjectives between a count and what it counts ("3 new subplots", "2 more workers"; v12)
COUNT_ADJECTIVES = frozenset("new more additional extra other".split())
_NEXT_RE = re.compile(r"\s+([A-Za-z][A-Za-z\-]*)")
_HYPHEN_RE = re.compile(r"-([A-Za-z]+)\b")


def counted(word: str, rest: str) -> str:
    """The unit word of a count (`word`, the word after the number; `rest`, the text after it): past
    an adjective to the counted noun ("3 new subplots": subplots; v12)."""
    after = _NEXT_RE.match(rest) if word in COUNT_ADJECTIVES else None
    return after.group(1).lower() if after else word


def hyphened(text: str, at: int) -> re.Match[str] | None:
    """A unit joined by a hyphen to the number ending at `at` ("5,000-word", "7-day"; v12)."""
    return _HYPHEN_RE.match(text, at)


#: a rate's period right after its unit ("words/day", "hours per week", "calls a day")
_PER_RE = re.compile(r"\s*(?:/|per\s+|an?\s+|each\s+|every\s+)(day|week|month|year|hour|minute|session)s?\b",
                     re.IGNORECASE)
#: a rate's period said as an adjective near it ("my weekly word count ... 1,500 words")
_PERIODS = {"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year", "annual": "year",
            "annually": "year", "hourly": "hour", "nightly": "day"}


def period(text: str, end: int, before: list[str]) -> str:
    """The period of the rate whose unit ends at `end` in `text`: right after it ("1,700 words/day"),
    or an adjective among the words `before` it or the two after it ("a weekly word count of
    1,200"); "" when none."""
    rate = _PER_RE.match(text, end)
    if rate:
        return rate.group(1).lower()
    near = [w.lower() for w in before] + text[end:].lower().split()[:2]
    return next((_PERIODS[w] for w in near if w in _PERIODS), "")
