"""PREMem date normalization: a fragment's `date` relative to the date of the message it came from.

PREMem (§3.1) represents time with four patterns, all as ``YYYY-MM-DD`` strings:

1. ongoing facts and current states use the message date:            ``2023-05-08``
2. past events with a specific time become that absolute date:        ``2023-05-07`` ("yesterday")
3. past events with no usable time expression:                        ``Before 2023-05-08``
4. future plans and intentions:                                       ``After 2023-05-08``

How it works, and the choices made where the paper is silent:

* ``find_time_expression`` is a fast precompiled regex that finds a *candidate* temporal expression
  ("yesterday", "last Saturday", "two days ago", "on 3 May 2023", "in 2022", "next Friday", ...).
  Only when it matches is ``dateparser`` called (with ``RELATIVE_BASE`` = the message date and English
  only, which keeps it in the sub-millisecond range) and its results are cached, so normalizing a whole
  archive costs milliseconds. The regex only finds spans; dateparser turns them into dates. A few
  spans dateparser does not read are first rewritten into phrases it does ("last weekend" ->
  "last saturday", "a couple of days ago" -> "2 days ago", "a few days ago" -> "3 days ago").
* Relative past spans ("last week", "last month", "last year", "N days ago") take the date dateparser
  computes from the message date: "last week" is the message date minus 7 days, "last month" minus one
  month, "last year" minus one year (not the first day of that period).
* A bare month or year ("in March", "in 2022") becomes the first day of that month or year; a
  plan with a month ("going to move in March") is ``After <message date>``.
* A day or month said without a year ("on July 10th", "in March") has two candidate occurrences,
  the latest on or before the message date and the first on or after it (a month's distance is to
  its nearest day, so the current month is at distance 0). The *nearer* one is taken: the tense of
  the sentence alone cannot place the date, since a past verb often names the arranging of a later
  event ("booked the flights for July 10th", "signed up for the race on May 18th", "bought tickets
  for the concert on January 5th"), and a progressive names a plan ("are moving in March"). The tense
  only breaks near-ties: a past verb counts the past occurrence, a plan (has_future_intent) the
  future one, as `_TENSE_WEIGHT` (3) times nearer, so said on 8 May "I visited Japan in September"
  is September of last year (220 days back against 116 ahead), while "I booked a room for
  June 2nd" is this June (25 days ahead against 340 back). A span that marks the past itself
  ("back in March", "since March"; "last July" is a relative past span) takes the past occurrence.
  The regex cannot tell whether a past verb governs the date ("on July 4th I went", said on 1 July,
  reads as this July 4th, three days ahead): a past event a year back is normally said with "last
  year", a booking a few days ahead with nothing more. Weekdays ("on Saturday") are not weighed:
  within a week the tense decides (a past verb: the last one; a plan: the next one).
* Future: a *specific* day ("tomorrow", "next Friday", "in 3 days", "on 3 June" in a plan) becomes that
  absolute date; a vague future ("next month", "next year", "in two weeks", "will", "going to",
  "plan to", "want to", "next summer") becomes ``After <message date>``.
* Seasons, "recently", "the other day" and similar vague spans are not candidates: they fall through to
  the tense rules (past tense -> ``Before``, intent -> ``After``, otherwise the message date).
"""
from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from typing import Any
from functools import lru_cache

from memory.lexicon import IRREGULAR_PAST

__all__ = ["find_time_expression", "time_match", "normalize_date", "has_future_intent", "has_past_tense",
           "to_date", "local_time"]

_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_MONTH = (r"(?:january|february|march|april|may|june|july|august|september|october|november|december"
          r"|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)")
_MONTH_SAFE = (r"(?:january|february|march|april|june|july|august|september|october|november|december"
               r"|jan|feb|apr|jun|jul|aug|sept|sep|oct|nov|dec)")   # no bare "may"/"mar" (verbs)
_NUM = (r"(?:\d{1,3}|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty"
        r"|thirty|a\s+couple\s+of|a\s+couple|couple\s+of|a\s+few|few|several)")
_UNIT = r"(?:days?|weeks?|weekends?|months?|years?)"
_ORD = r"\d{1,2}(?:st|nd|rd|th)?"
_YEAR = r"(?:19|20)\d{2}"
#: "last" after an article or a possessive ("her" may be an object) is "final" ("my last night shift", "the last week of May")
_FINAL = r"(?<!\bmy\s)(?<!\bour\s)(?<!\bthe\s)(?<!\bhis\s)(?<!\byour\s)(?<!\btheir\s)"

# Alternatives in priority order; named groups say what kind of span matched.
_TIME_RE = re.compile(
    r"\b(?:"
    # explicit dates, day-level
    rf"(?P<iso>\d{{4}}-\d{{2}}-\d{{2}})"
    rf"|(?P<dmy>(?:the\s+)?{_ORD}\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR})?)"
    rf"|(?P<mdy>{_MONTH}\s+{_ORD}(?:,?\s+{_YEAR})?)(?![\d:])"
    # relative past
    rf"|(?P<past>the\s+day\s+before\s+yesterday|yesterday|{_FINAL}last\s+night"
    rf"|(?:this\s+)?past\s+(?:weekend|{_WEEKDAY})"
    rf"|{_FINAL}last\s+(?:weekend|week|month|year|{_WEEKDAY}(?:\s+(?:night|morning|afternoon|evening))?|{_MONTH})"
    rf"|{_NUM}\s+{_UNIT}\s+ago)"
    # today
    r"|(?P<today>today|tonight|this\s+(?:morning|afternoon|evening))"
    # relative future, day-level
    rf"|(?P<future>the\s+day\s+after\s+tomorrow|tomorrow|next\s+(?:weekend|{_WEEKDAY})"
    r"|in\s+(?:\d{1,2}|a|one|two|three|four|five|six|seven|a\s+couple\s+of|a\s+few)\s+days?)"
    # relative future, vague
    rf"|(?P<vague_future>next\s+(?:week|month|year|{_MONTH})"
    rf"|in\s+{_NUM}\s+(?:weeks?|months?|years?))"
    # weekday whose direction depends on tense
    rf"|(?P<weekday>(?:on|this)\s+{_WEEKDAY}|this\s+weekend)"
    # coarse: a month (with optional year) or a year
    rf"|(?P<month>(?:(?:back\s+)?in|since|during|until|by|early|late|mid|around|of)\s+(?:{_MONTH}|{_MONTH}\s+{_YEAR})"
    rf"|{_MONTH_SAFE}\s+{_YEAR})"
    rf"|(?P<year>(?:(?:back\s+)?in|since|during|until|by|around)\s+{_YEAR})"
    r")\b",
    re.IGNORECASE,
)

_FUTURE_RE = re.compile(
    r"\b(?:will|won't|shall|gonna|going\s+to|plan(?:s|ning)?\s+(?:to|on)|want(?:s)?\s+to|hope(?:s)?\s+to"
    r"|hoping\s+to|intend(?:s|ing)?\s+to|thinking\s+(?:about|of)|looking\s+forward|can't\s+wait"
    r"|cannot\s+wait|about\s+to|aim(?:ing)?\s+to|would\s+like\s+to|tomorrow|upcoming|soon|someday"
    r"|next\s+\w+|one\s+day|in\s+the\s+future|(?:my|his|her|their)\s+goal|dream\s+(?:is|of)\s+to"
    r"|would\s+love\s+to|excited\s+to)\b|'ll\b|'d\s+(?:like|love)\s+to\b",
)   # run on lower-cased text

_PAST_RE = re.compile(   # run on lower-cased text
    r"\b(?:" + "|".join(IRREGULAR_PAST) + r"|used\s+to|have\s+been|has\s+been|'ve\s+been|ago)\b(?!'t)"
    r"|\b(?:didn|wasn|weren|hadn)'t\b"
    r"|'ve\s+(?:\w+ly\s+|just\s+|also\s+|finally\s+|never\s+|ever\s+)?\w{2,}(?:ed|en|ne)\b",
)
# a regular past verb right after a subject (pronoun, name) and an optional adverb: needs the case
_PAST_CASED_RE = re.compile(
    r"\b(?:[Ii]|[Ww]e|[Hh]e|[Ss]he|[Tt]hey|[A-Z][a-z]+)\s+(?:\w+ly\s+|just\s+|also\s+|finally\s+|even\s+)?"
    r"(?!need|feed|speed|seed|bleed|breed|proceed|succeed|exceed|indeed)\w{2,}ed\b"
)

_REWRITES = [
    (re.compile(r"\ba\s+couple(?:\s+of)?\b|\bcouple\s+of\b"), "2"),
    (re.compile(r"\b(?:a\s+few|few|several)\b"), "3"),
    (re.compile(r"\bthis\s+past\s+|\bpast\s+"), "last "),
    (re.compile(r"\b(last|next)\s+weekend\b"), r"\1 saturday"),
    (re.compile(r"\bthis\s+weekend\b"), "saturday"),
    (re.compile(r"\b(\w+)\s+weekends?\s+ago\b"), r"\1 weeks ago"),
    (re.compile(r"^(?:(?:back\s+)?in|on|since|during|until|by|early|late|mid|around|of|this|the)\s+"), ""),
    (re.compile(r"\s+(?:night|morning|afternoon|evening)$"), ""),
    (re.compile(r"\s+"), " "),
]


# substrings one of which every candidate span contains: a cheap test before the big regex
_TIME_HINTS = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "day", "tonight", "tomorrow", "last",
               "next", "past", "ago", "week", "mon", "year", "morning", "noon", "evening", "night", "jan",
               "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


@lru_cache(maxsize=8192)
def time_match(text: str) -> tuple[str, str] | None:
    """(kind, span) of the first candidate temporal expression in `text`, or None (cached).

    kind: "iso", "dmy", "mdy" (explicit day), "past" (yesterday, last Saturday, 2 days ago), "today",
    "future" (tomorrow, next Friday, in 3 days), "vague_future" (next month, in two weeks),
    "weekday" (on Saturday, this weekend), "month" (in March), "year" (in 2022).
    """
    low = text.lower()
    if not any(h in low for h in _TIME_HINTS):
        return None
    m = _TIME_RE.search(text)
    return (m.lastgroup or "", m.group(0)) if m else None


def find_time_expression(text: str) -> str | None:
    """The first candidate temporal expression in `text` (regex only, no parsing), or None."""
    m = time_match(text)
    return m[1] if m else None


def has_future_intent(text: str) -> bool:
    """Plans and intentions: will, 'll, going to, plan to, want to, hope to, next ..., tomorrow, ..."""
    return _FUTURE_RE.search(text.lower()) is not None


def has_past_tense(text: str) -> bool:
    """A past-tense or present-perfect verb (went, visited, I've tried, have been, ... ago)."""
    return _PAST_RE.search(text.lower()) is not None or _PAST_CASED_RE.search(text) is not None


def local_time(message: dict[str, Any]) -> datetime:
    """A message's time in its speaker's zone: `ts` (UTC) moved by its `utc_offset_min` when the
    archive gave one; "yesterday" said at 23:30 -08:00 on 10 February is the 9th, not the 10th."""
    ts, offset = message["ts"], message.get("utc_offset_min")
    if offset is None or not isinstance(ts, datetime):
        return ts
    return ts.astimezone(timezone(timedelta(minutes=int(offset))))


def to_date(ts: datetime | date | str) -> date:
    """A message timestamp (datetime, date or ISO 8601 string) as a calendar date."""
    if isinstance(ts, datetime):
        return ts.date()
    if isinstance(ts, date):
        return ts
    s = str(ts).strip()
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).date()
    except ValueError:
        return date.fromisoformat(s[:10])


@lru_cache(maxsize=4096)
def _parser(prefer: str, first: bool, base: date):
    """One dateparser parser per (direction, first-day preference, message day); cheap to build."""
    from dateparser.date import DateDataParser

    settings = {"PREFER_DATES_FROM": prefer, "RETURN_AS_TIMEZONE_AWARE": False,
                "RELATIVE_BASE": datetime(base.year, base.month, base.day)}
    if first:
        # bare months and years take their first day; relative spans keep the day of month
        # ("last month" = the message date minus one month)
        settings.update({"PREFER_DAY_OF_MONTH": "first", "PREFER_MONTH_OF_YEAR": "first"})
    return DateDataParser(languages=["en"], settings=settings)


@lru_cache(maxsize=65536)
def _parse(expr: str, base: date, prefer: str, first: bool) -> date | None:
    phrase = expr.lower()
    for pat, rep in _REWRITES:
        phrase = pat.sub(rep, phrase)
    phrase = phrase.strip()
    if not phrase:
        return None
    try:
        data = _parser(prefer, first, base).get_date_data(phrase)
    except Exception:  # pragma: no cover - a span dateparser cannot read is "no date"
        return None
    return data.date_obj.date() if data and data.date_obj else None


def _nearest(base: date, a: date | None, b: date | None) -> date | None:
    if a is None or b is None:
        return a or b
    return a if abs((base - a).days) <= abs((b - base).days) else b


#: how many times nearer a tense cue counts the occurrence on its side (past verb: the past one,
#: plan: the future one) when a yearless date has one on each side of the message date
_TENSE_WEIGHT = 3
#: spans that place their month in the past whatever the tense ("back in March", "since June")
_PAST_SPAN_RE = re.compile(r"(?:back\s+in|since)\s", re.IGNORECASE)


def _month_end(d: date) -> date:
    nxt = date(d.year + (d.month == 12), d.month % 12 + 1, 1)
    return nxt - timedelta(days=1)


def _occurrence(expr: str, base: date, lean: str, month: bool) -> date | None:
    """The occurrence of a possibly yearless date `expr` the module doc's rule picks: the nearer of
    the latest one on or before `base` and the first one on or after it, the side `lean` ("past",
    "future" or "") names counted `_TENSE_WEIGHT` times nearer; a past-marking span takes the past
    one. `month`: `expr` names a month (its first day is returned, its distance is to its nearest day)."""
    before, after = _parse(expr, base, "past", True), _parse(expr, base, "future", True)
    if before is None or after is None or before == after:   # a year was given, or no date
        return before or after
    if _PAST_SPAN_RE.match(expr):
        return before
    back = max((base - (_month_end(before) if month else before)).days, 0) / (_TENSE_WEIGHT if lean == "past" else 1)
    ahead = max((after - base).days, 0) / (_TENSE_WEIGHT if lean == "future" else 1)
    return before if back <= ahead else after


def normalize_date(text: str, message_ts: datetime | date | str, category: str | None = None) -> str:
    """PREMem date of one statement: ``YYYY-MM-DD``, ``Before YYYY-MM-DD`` or ``After YYYY-MM-DD``.

    `category` ("factual", "experiential", "subjective") sets the default when the text has no
    usable time expression and states no plan: experiential -> Before, factual and subjective -> the
    message date. Without a category a past-tense verb means Before, else the message date. A plan or
    intention ("will", "going to", "want to", ...) is After in every category.
    """
    base = to_date(message_ts)
    day = base.isoformat()
    future = has_future_intent(text)
    m = time_match(text)
    if m:
        kind, expr = m
        if kind == "vague_future":
            return f"After {day}"
        if kind == "today":
            return day
        lean = "future" if future else "past" if has_past_tense(text) else ""
        if kind == "weekday":   # within a week the tense decides; no cue: the nearest day
            got = (_parse(expr, base, lean, False) if lean else
                   _nearest(base, _parse(expr, base, "past", False), _parse(expr, base, "future", False)))
        elif kind in ("iso", "dmy", "mdy"):
            got = _occurrence(expr, base, lean, month=False)
        elif kind == "past":
            got = _parse(expr, base, "past", False)
        elif kind == "future":
            got = _parse(expr, base, "future", False)
        else:  # month / year: first day of it; a vague period when it is a plan
            if future:
                return f"After {day}"
            got = _occurrence(expr, base, lean, month=kind == "month")
        if got is not None:
            return got.isoformat()
    if category == "experiential" and has_past_tense(text):
        return f"Before {day}"  # a past event, even when a plan is mentioned alongside it
    if future:
        return f"After {day}"
    if category == "experiential":
        return f"Before {day}"
    if category in ("factual", "subjective"):
        return day          # current states and states of mind
    if has_past_tense(text):
        return f"Before {day}"
    return day
