"""The words that say a value changed, for the `rules` supersede decision (`memory.llm.rules.supersede`).

* **change cues** of an amount (v4-v9): a cue word (`_CHANGE_RE`: now, increased, reduced, updated...)
  among the `CUE_WORDS` words before the number, or a change verb whose object runs up to a ``to``
  right before it, however long (``adjust the deadline for my Instagram automation prototype to
  April 5``; not the ``to`` of a range or a bound: ``from 7 to 9 PM``, ``up to 40``). A cue is a word
  of its own: the ``Extended`` of ``Flask-JWT-Extended`` is none (v10).
* **reschedule cues** of a date or a clock time (v10): only words that move a date say that one
  changed (rescheduled, moved, postponed, pushed back, delayed, shifted, extended, ``now due`` /
  ``now targets``, a ``new`` deadline or date, a date verb's ``to``: ``adjust the deadline ... to
  April 5``). Progress words (recently, reached, updated, revised, switched, new articles) say that
  something happened on a date, not that a date moved: v9 closed ``switched to Scrivener on May 5``
  with ``final draft reached 4,700 words by May 13``. A cue reaches the first value after it: in
  ``meeting rescheduled from 3 PM to 5 PM on June 2`` the time moved, not the date.
* **whole changes** (v11): a number that is one end of a change told whole in its statement
  (``improved from 78% to 88%``: `whole_change`) is that statement's own account of a change;
  `memory.llm.rules.supersede` compares it with another such end only at a stronger context, or
  when one change starts where the other ended.
* **former values** (v12): a number said as one that held before (``initially 800ms``, ``the
  previous 350ms``, ``an initial target of 15,000``, ``up from 1,500``) or that starts a change told
  whole (the ``85%`` of ``from 85% to 93%``) is history in its statement (`former`): it neither
  replaces nor is replaced, and a newer statement saying it does not keep it from being replaced.
* **past events** (v10): a date whose clause tells what was done (``used the Hemingway Editor on
  July 15``, ``found on May 6``: a past verb, and no deadline, due date or plan in the clause) is
  history; no later date replaces it.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from memory.lexicon import CLAUSE_OPENERS, clause_end

__all__ = ["CUE_WORDS", "STATED_WORDS", "Cue", "cue", "former", "past_event", "reverts", "whole_change"]

#: words before a changed value that a change cue must fall within (a name's: `named.NAME_WORDS`)
CUE_WORDS = 8
#: words right before a number that say it is a new value: "is now 100", "lowered it to 100"
STATED_WORDS = 3

_CHANGE_RE = re.compile(r"(?<![\w-])(?:now|no\s+longer|anymore|switched|switching|changed|moved|instead|"
                        r"replaced|updated?|new|recently|increased|decreased|extended|reduced|reached|"
                        r"improved|grown|grew|dropped|raised|lowered|rescheduled|postponed|pushed\s+back|"
                        r"adjusted|revised|shifted|expanded|upgraded|these\s+days|"
                        # the verbs of a change under way: "trying to adjust the deadline to April 5"
                        r"adjust(?:ing)?|chang(?:e|ing)|mov(?:e|ing)|reschedul(?:e|ing)|postpon(?:e|ing)|"
                        r"extend(?:ing)?|switch(?:ing)?|updating|shift(?:ing)?)(?![\w-])", re.IGNORECASE)
_CHANGE_VERBS = (r"adjust(?:s|ed|ing)?|chang(?:e|es|ed|ing)|mov(?:e|es|ed|ing)|reschedul(?:e|es|ed|ing)|"
                 r"postpon(?:e|es|ed|ing)|extend(?:s|ed|ing)?|switch(?:es|ed|ing)?|shift(?:s|ed|ing)?|"
                 r"updat(?:e|es|ed|ing)|increas(?:e|es|ed|ing)|decreas(?:e|es|ed|ing)|rais(?:e|es|ed|ing)|"
                 r"lower(?:s|ed|ing)?|reduc(?:e|es|ed|ing)|push(?:es|ed|ing)?|bump(?:s|ed|ing)?")
_DATE_VERBS = (r"adjust(?:s|ed|ing)?|chang(?:e|es|ed|ing)|mov(?:e|es|ed|ing)|reschedul(?:e|es|ed|ing)|"
               r"postpon(?:e|es|ed|ing)|extend(?:s|ed|ing)?|shift(?:s|ed|ing)?|push(?:es|ed|ing)?|"
               r"delay(?:s|ed|ing)?|bump(?:s|ed|ing)?")
#: a change verb whose object runs up to "to" right before the value, however far back in its clause
_CHANGE_TO_RE = re.compile(rf"(?<![\w-])(?:{_CHANGE_VERBS})(?![\w-])[^.,;:!?]{{0,80}}\bto\s*$", re.IGNORECASE)
_DATE_TO_RE = re.compile(rf"(?<![\w-])(?:{_DATE_VERBS})(?![\w-])[^.,;:!?]{{0,80}}\bto\s*$", re.IGNORECASE)
#: a "to" that closes a range or a bound, not a change: "from 7 to 9 PM", "from May 2 to May 6", "up to 40"
_RANGE_TO_RE = re.compile(r"(?:\bfrom\s+\S+(?:\s+\S+)?|\bup)\s+to\s*$", re.IGNORECASE)
#: the words that move a date or a time (v10)
_RESCHEDULE_RE = re.compile(r"(?<![\w-])(?:reschedul(?:ed|ing)|postpon(?:ed|ing)|pushed\s+(?:back|out)|"
                            r"delayed|shifted|moved|extended|"
                            r"now\s+(?:due|targets?|targeting|set|scheduled|planned|falls?)|now\s*$|"
                            r"new\s+(?:\S+\s+){0,2}?(?:deadlines?|dates?|due|schedule|start)|new\s*$)(?![\w-])",
                            re.IGNORECASE)
#: the "from ... to" of a range a reschedule cue moves ("moved from November 15 to November 22")
_FROM_TO_RE = re.compile(r"\bfrom\s+[^.,;:!?]{1,30}?\s+to\b", re.IGNORECASE)
#: the start and the end of a change told whole: "from 78% to 88%", "from $1,200 to 1,500"
_FROM_START_RE = re.compile(r"\bfrom\s+[$~]?$", re.IGNORECASE)
_FROM_REST_RE = re.compile(r"^[$~]?\d[\d.,]*\s?(?:%|[\w\-]+)?\s+to\s+[$~]?\d", re.IGNORECASE)
_FROM_END_RE = re.compile(r"\bfrom\s+[$~]?\d[\d.,]*\s?(?:%|[\w\-]+)?\s+to\s+[$~]?$", re.IGNORECASE)
#: words right before a number that say it held before and no longer does (v12): "initially 800ms",
#: "the previous 350ms", "user's initial target of 15,000"
_FORMER_RE = re.compile(r"(?<![\w-])(?:initial(?:ly)?|original(?:ly)?|previous(?:ly)?|former(?:ly)?|earlier|"
                        r"at\s+first|used\s+to\s+be)(?![\w-])(?:\s+[\w\-]+){0,2}?\s+(?:(?:of|was|is|at|been|"
                        r"about|around|roughly|approximately|~)\s+)*[$~]?$"
                        r"|(?<![\w-])(?:up|down)\s+from\s+(?:(?:the|my|our|user's)\s+)?[$~]?$", re.IGNORECASE)
#: words saying a value goes back to an earlier one: a restatement of it is then a real change
_REVERT_RE = re.compile(r"\b(?:back\s+(?:to|down|up)|revert(?:s|ed|ing)?|returned\s+to|restored?)\b", re.IGNORECASE)
#: a clause's end: a sentence stop, or a comma, dash or "and" opening another clause
_CLAUSE_END_RE = clause_end((*CLAUSE_OPENERS, "with"), and_subject=True)
_PAST_RE = re.compile(r"(?<![\w-])(?:[a-z]+[^e\W]ed|[a-z]+ied|met|found|had|did|made|went|took|gave|began|"
                      r"ran|saw|sent|wrote|left|won|spent|bought|held|led|lost|told|felt|kept|came|became|"
                      r"chose|brought|caught|taught|paid|sold|(?<!ha[sv]e\s)(?<!'ve\s)got)(?![\w-])", re.IGNORECASE)
#: words of a clause that make its date a plan, not a past event ("scheduled for", "the deadline")
_PLAN_RE = re.compile(r"(?<![\w-])(?:deadlines?|due|until|schedul(?:e|ed|es)|reschedul\w*|planned|plans?|"
                      r"booked|postponed|moved|extended|delayed|shifted|pushed|adjusted|changed|set|"
                      r"upcoming|next|will|going\s+to)(?![\w-])", re.IGNORECASE)
#: past participles that are adjectives of a feeling or a state ("worried", "excited"), no event
_NOT_PAST = frozenset("""worried interested excited concerned stressed motivated tired scared overwhelmed supposed
expected required related based limited detailed advanced focused dedicated committed determined
confused frustrated pleased surprised prepared hundred""".split())


class Cue(NamedTuple):
    """Whether the statement says the value changed (`cued`), and says so right at it (`stated`)."""

    cued: bool = False
    stated: bool = False


def cue(prefix: str, dated: bool = False) -> Cue:
    """The change cue of the value that follows `prefix` (the text before it); a date's or a
    time's (`dated`) is a reschedule cue that reaches it (see the module doc)."""
    words = prefix.split()
    if dated:
        near = " ".join(words[-CUE_WORDS:])
        to_cued = bool(_DATE_TO_RE.search(prefix)) and not _RANGE_TO_RE.search(prefix)
        found = list(_RESCHEDULE_RE.finditer(near))
        reach = bool(found) and not re.search(r"\d", _FROM_TO_RE.sub(" ", near[found[-1].end():]))
        if to_cued:
            verb = _DATE_TO_RE.search(prefix)
            to_cued = verb is not None and not re.search(r"\d", prefix[verb.start():])
        stated = to_cued or bool(_RESCHEDULE_RE.search(" ".join(words[-STATED_WORDS:])))
        return Cue(cued=reach or to_cued, stated=stated)
    to_cued = bool(_CHANGE_TO_RE.search(prefix)) and not _RANGE_TO_RE.search(prefix)
    return Cue(cued=bool(_CHANGE_RE.search(" ".join(words[-CUE_WORDS:]))) or to_cued,
               stated=to_cued or bool(_CHANGE_RE.search(" ".join(words[-STATED_WORDS:]))))


def past_event(prefix: str, rest: str) -> bool:
    """The date between `prefix` and `rest` is in a clause that tells a past event: a past verb
    before it in the clause, and no deadline, due date or plan word in the clause."""
    before = _CLAUSE_END_RE.split(prefix)[-1]
    after = _CLAUSE_END_RE.split(rest)[0]
    past = [m for m in _PAST_RE.finditer(before) if m.group(0).lower() not in _NOT_PAST]
    return bool(past) and not _PLAN_RE.search(before[past[0].start():] + " " + after)


def reverts(text: str) -> bool:
    """The text says a value went back to an earlier one ("back to", "reverted")."""
    return bool(_REVERT_RE.search(text))


def former(prefix: str, number: str) -> bool:
    """The number that opens `number` (the text from it on), after `prefix`, is a value that held
    before: said as former ("initially 800ms", "the previous 350ms", "an initial target of 15,000",
    "up from the 1,500 words")
    or the start of a change told whole ("from 85% to 93%": 85% held before). The statement tells
    it as history: no later value replaces it, and it replaces none (v12)."""
    return bool(_FORMER_RE.search(prefix)) or _starts_change(prefix, number)


def _starts_change(prefix: str, number: str) -> bool:
    """The number that opens `number` starts a change told whole ("from 78% to 88%": the 78%)."""
    return bool(_FROM_START_RE.search(prefix) and _FROM_REST_RE.match(number))


def whole_change(prefix: str, number: str) -> bool:
    """The number that opens `number` (the text from it on), after `prefix`, is one end of a change
    told whole in one statement: "from 78% to 88%", "from 20 to 12 minutes" (v11)."""
    return _starts_change(prefix, number) or bool(_FROM_END_RE.search(prefix))
