"""What kind of value a number states, for the `rules` supersede decision (rules-supersede-v9; v10 reads
units of measure from the one table of `memory.llm.rules.units`): a
measured or set value ("the API responds in 220ms"), a target or bound ("ensure it is under 300ms",
"aiming for 85% coverage", "a $500 budget"), a change by an amount ("reduced it by 12MB"), or a
measurement's condition ("120ms under 20 concurrent requests").

A target still holds when a measurement meets or misses it, a delta is no level, and a condition
qualifies a measurement, so the quantities (`memory.llm.rules.supersede.changed`) compare a target
only with a target, a delta only with a delta, a condition only with a condition. An audit of v8's
decisions found 42 of 390 closings where a target or bound had been closed by a measurement or the
reverse ("ensure [the response] is under 300ms" by "improved it to 220ms"; "aiming for an 85%
coverage target" by "got 92%").

Read from the words just before the number (and a goal noun right after it), no world knowledge:

* **condition**: "across N", or "under N" of a counted thing (a word unit that is no time span:
  "under 20 concurrent requests"); "under 300ms" or "under 5 minutes" is a bound;
* **bound**: a bound preposition right before the number (under, below, above, within, less /
  fewer than, no more than, at most, at least, up to, sub-; not the "up to" of a raise: "brought it
  up to 96%"), a goal word among the `GOAL_WORDS` words before it in its clause (targeting, aim /
  aiming for, want / need / hope to, working on achieving, to reach / achieve / hit, ensure,
  maintain, keep; in the present, and not after "managed to" or "able to": "maintained 90%",
  "managed to keep it at 90%" are achievements), or a goal noun (target, goal, budget, SLA) that the
  number completes ("a budget of $500", "the target is 85%"; not "my budget tracker has 150") or
  that follows it ("a 300ms target", "85% coverage goal");
* **delta**: "by" right before the number ("cut it by 25%", "reduced by about 12MB").

v11 (an audit of v10's closings):

* a count of a **load** ("with 50 concurrent users", "simulate 1,000 simultaneous chats") is a
  condition whatever the word before it: v10 compared the 99.9% uptime "with 50 concurrent users"
  and a response time "with 30 concurrent users" as one count;
* a **limit** is a number set as a cap (`Mode.limit`: "a memory limit set to 512MB", "max display
  time of 2 seconds", "a 2GB cap"): a limit and a measured value are two facts ("using around
  400MB" / "a memory limit set to 512MB"), unless the statement of the value speaks of a limit too
  (`speaks_of_limits`: "rate limiting ... set it to 100 requests/minute" / "the new rate limit of 120");
* a **delta** changes no delta: each says how much one change moved a value, so another amount is
  another change ("reduce passive voice by 25%" in an essay, "by 35%" in a conference paper).

v12 (an audit of v11's wrong closings):

* an amount **added** on top of a value is a delta (`added`: "the embedding step adds around 400ms",
  "a 15ms overhead", "an extra $150"): v11 read it as a level a total replaced;
* a **spread** ("±15ms", `spread`) bounds values around a mean: it is no mean;
* a span of time a measurement covers is its **window**, a condition (`window`: "over a 7-day
  monitoring period", "in the first 24 hours");
* a goal said as an infinitive ("set a goal to complete a 5,000-word draft") is a goal.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from memory.llm.rules.units import MEASURES, SPANS

__all__ = ["GOAL_WORDS", "Mode", "added", "mode", "speaks_of_limits", "spread", "window"]

#: words before a number (in its clause) that a goal word must fall within (a quantity's context window)
GOAL_WORDS = 6

_APPROX = r"(?:(?:about|around|roughly|approximately|nearly|almost|just|only|~)\s*)?"
_PREPOSITION_RE = re.compile(r"(?:\b(?:under|below|above|within|(?:less|fewer)\s+than|no\s+more\s+than|"
                             rf"at\s+(?:most|least)|up\s+to)\s+{_APPROX}|\bsub-\s*|<\s*|[≤≥]\s*)$", re.IGNORECASE)
_GOAL_RE = re.compile(r"(?<!managed\sto\s)(?<!able\sto\s)\b(?:targets|targeting|aim(?:s|ing)?|achieving|"
                      r"(?:wants?|needs?|hop(?:e|es|ing))\s+to|goals?\s+(?:is\s+|was\s+)?to|"
                      r"ensur(?:e|es|ing)|maintain(?:s|ing)?|keep(?:s|ing)?)\b"
                      r"|(?<!managed\s)(?<!able\s)\bto\s+(?:reach|achieve|hit)\b", re.IGNORECASE)
#: a goal noun that the number completes ("a budget of $500", "the target is 85%"; not "budget tracker")
_GOAL_NOUN_RE = re.compile(r"\b(?:targets?|goals?|budget|sla):?(?:\s+(?:is|was|of|at|to|now|set|around|about|"
                           r"roughly|approximately|currently))*\s*$", re.IGNORECASE)
#: a goal noun after the number, up to three words on ("a 300ms API response target"; not "... is a goal")
_GOAL_AFTER_RE = re.compile(r"^\s*(?:(?!(?:is|was|are|and|but|or|with|for|to|of|the|a|an|which|that|than|in|on|"
                            r"at|by|as)\b)[A-Za-z][\w\-]*\s+){0,3}(?:target|goal|budget|sla)\b", re.IGNORECASE)
#: "up to" after a verb that raises ("brought my coverage up to 96%") is a new level, not a bound
_RAISED_RE = re.compile(r"\b(?:br(?:ing|ings|ought)|g(?:o|oes|one|ot|et|ets)|went|gr(?:ew|own)|r(?:ose|isen)|"
                        r"climb(?:s|ed)?|bump(?:s|ed)?|push(?:es|ed)?|mov(?:e|es|ed)|rais(?:e|es|ed)|"
                        r"increas(?:e|es|ed))\b(?:\s+\S+){0,5}\s+up\s+to\s+$", re.IGNORECASE)
_DELTA_RE = re.compile(rf"\bby\s+{_APPROX}$", re.IGNORECASE)
#: an amount added on top of a value (v12): "adds around 400ms", "an extra $150", "a 15ms overhead"
_ADDED_BEFORE_RE = re.compile(rf"(?<![\w-])(?:add(?:s|ed|ing)?|an?\s+(?:extra|additional))\s+{_APPROX}$", re.IGNORECASE)
_ADDED_AFTER_RE = re.compile(r"^\s*(?:(?:of\s+)?(?:extra|overhead)\b|more\s+than\b(?!\s+\d))", re.IGNORECASE)
#: the words before a span of time that make it a measurement's window (v12)
_WINDOW_RE = re.compile(r"(?<![\w-])(?:(?:over|during|throughout)\s+(?:(?:the|a|an)\s+)?(?:(?:first|last|past|next|"
                        r"whole|entire)\s+)?|(?:in|for)\s+the\s+(?:first|last|past|next)\s+)$", re.IGNORECASE)
#: a spread around a value, no value (v12): "a variance of ±50ms", "+/- 15ms"
_SPREAD_RE = re.compile(r"(?:±|\+/-|\+-)\s*$")
#: a currency sign or a tilde right before the number ("under $300", "by ~12MB")
_SIGN_RE = re.compile(r"[$€£~]\s*$")
_CLAUSE_RE = re.compile(r"[.;:!?]\s|,(?!\d)")
#: a count of simultaneous things: a load a measurement runs under (v11)
_LOAD_RE = re.compile(r"^(?:concurrent|simultaneou|parallel)", re.IGNORECASE)
#: a limit word the number completes, up to three words on ("a memory limit set to 512MB", "max display
#: time of 2 seconds"), or right before it ("limit: 100") (v11)
_LIMIT_BEFORE_RE = re.compile(r"\b(?:limits?|max|maximum|cap|quota|ceiling)\b(?:\s+(?!(?:and|but|or|which|while|"
                              r"with)\b)[\w\-]+){0,3}?\s+(?:of|to|at|is|set\s+to)\s*$|"
                              r"\b(?:limits?|max|maximum|cap|quota)\s*:?\s*$", re.IGNORECASE)
#: a limit noun right after the number or one word on ("a 512MB limit", "a 2GB memory cap") (v11)
_LIMIT_AFTER_RE = re.compile(r"^\s*(?:(?!(?:with|and|but|or|which|while|for|to|of|in|on|at|by|as|is|was)\b)"
                             r"[\w\-]+\s+)?(?:limits?|cap|quota|ceiling)\b", re.IGNORECASE)
#: any word of a limit in a statement (v11)
_LIMIT_WORD_RE = re.compile(r"\b(?:limit\w*|max|maximum|cap|caps|capped|quota|ceiling|throttl\w*)\b", re.IGNORECASE)


class Mode(NamedTuple):
    """What kind of value a number states (see the module doc)."""

    condition: bool = False
    bound: bool = False
    delta: bool = False
    #: a number set as a cap ("a memory limit set to 512MB"; v11)
    limit: bool = False


def mode(prefix: str, rest: str, unit: str) -> Mode:
    """The modality of the number between `prefix` (the text before it) and `rest` (the text after
    its unit), of unit `unit` (a word unit is its stemmed word; dates and times have none)."""
    if unit in ("date", "time"):
        return Mode()
    prefix = _SIGN_RE.sub("", prefix)
    words = prefix.split()
    last = words[-1].lower() if words else ""
    condition = last == "across" or (last == "under" and unit.isalpha() and unit not in MEASURES) or bool(
        _LOAD_RE.match(unit)) or window(prefix, unit)
    before = prefix.rstrip() + " "
    clause = _CLAUSE_RE.split(prefix)[-1]
    preposition = _PREPOSITION_RE.search(before) and not _RAISED_RE.search(clause.rstrip() + " ")
    bound = not condition and bool(preposition or _GOAL_NOUN_RE.search(before)
                                   or _GOAL_AFTER_RE.match(rest)
                                   or _GOAL_RE.search(" ".join(clause.split()[-GOAL_WORDS:])))
    limit = bool(_LIMIT_BEFORE_RE.search(prefix) or _LIMIT_AFTER_RE.match(rest))
    delta = bool(_DELTA_RE.search(before)) or added(prefix, rest)
    return Mode(condition=condition, bound=bound or spread(prefix), delta=delta, limit=limit)


def window(prefix: str, unit: str) -> bool:
    """The span of time is the window a measurement covers, a condition of it (v12): "99.9% uptime
    over a 7-day monitoring period", "during a 1-hour run", "in the first 24 hours"."""
    return unit in SPANS and bool(_WINDOW_RE.search(prefix))


def added(prefix: str, rest: str) -> bool:
    """The number is an amount added on top of another value (a delta, v12): "the embedding step adds
    around 400ms", "an extra $150", "the 15ms overhead it adds", "20% more than"."""
    return bool(_ADDED_BEFORE_RE.search(prefix.rstrip() + " ") or _ADDED_AFTER_RE.match(rest))


def spread(prefix: str) -> bool:
    """The number is a spread around a value ("±50ms"): a bound on it, never the value (v12)."""
    return bool(_SPREAD_RE.search(prefix))


def speaks_of_limits(text: str) -> bool:
    """Some word of `text` speaks of a limit ("rate limiting", "max", "capped", "throttling"; v11)."""
    return bool(_LIMIT_WORD_RE.search(text))
