"""Numbers that state no value of the user's, for the `rules` supersede decision (rules-supersede-v10).

An audit of v8's decisions found closings between numbers that are no quantities at all:

* **identifiers** name a thing, they do not measure it: an HTTP status code (``502 Bad Gateway``,
  ``500 errors``), a number after ``port``, ``HTTP``, ``status`` or ``code`` (``port 5000``), and an
  integer right after a capitalized name (``PostgreSQL 14``, ``Node.js 18``, ``RTX 2060``) unless it
  has a unit of measure (``GPU 3GB``). v9 closed ``502 Bad Gateway errors`` with ``500 errors`` and
  ``port 0`` with ``port 5000``.
* **help requests and worked examples**: a number in the clause of a request to work something out
  (``help me solve a problem involving a triangle with sides 8, 15 and 17``, ``trying to calculate
  the area of a triangle with a base of 10 inches``, ``what's the probability of``) or of an example
  (``let's say``, ``for example``, ``suppose``) is an exercise's, not a fact. Only that clause
  counts: a request earlier in the statement leaves a fact after it a fact (``I'm trying to solve a
  puzzle and I need help, I have recently shortened my average solving time to 10 minutes``); a
  bare ``can you`` is no exercise (``can you remind me that the meeting is rescheduled to 4:30 PM``),
  nor is a topic (``my problem-solving time``, ``area calculation problems``).
"""
from __future__ import annotations

import re

from memory.lexicon import clause_end

__all__ = ["identifier", "in_request"]

#: a word right before a number that makes it a name: "port 5000", "HTTP 404", "status code 401"
_ID_BEFORE_RE = re.compile(r"(?<![\w-])(?:ports?|https?|status(?:\s+codes?)?|codes?|errno|pid)\s*:?\s*#?$",
                           re.IGNORECASE)
#: the words after an HTTP status code: "502 Bad Gateway", "404 Not Found", "500 errors"
_STATUS_AFTER_RE = re.compile(r"^\s*(?:(?:errors?|responses?|status|codes?|pages?)\b|(?:Bad|Unauthorized|Forbidden|Not|"
                              r"Internal|Request|Service|Gateway|Too|Payload|Method|Conflict|Unprocessable|"
                              r"Precondition|Unsupported|Moved|Found|OK|Created|Accepted|No\s+Content)\b)")
#: a capitalized name ending right before the number ("PostgreSQL 14"), not opening a sentence
_NAME_BEFORE_RE = re.compile(r"(?<![.!?:]\s)(?<!^)(?<![\w.\-])([A-Z][A-Za-z0-9+#.\-]*[A-Za-z0-9+#])\s$")
#: capitalized words before a number that are no names: dates, times, the first person
_NOT_NAMES = frozenset("""I January February March April May June July August September October November December
Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec Monday Tuesday Wednesday Thursday Friday Saturday Sunday
AM PM""".split())
#: words that open a help request or a worked example in a clause
_REQUEST_RE = re.compile(r"(?<![\w-])(?:help\s+(?:me|user|us)\s+"
                         r"(?:with|solve|calculate|compute|work|figure)|let'?s\s+say|for\s+(?:example|instance)|"
                         r"e\.g\.|suppose|supposing|imagine|hypothetical(?:ly)?|problems?\s+(?:involving|where)|"
                         r"what(?:'s|\s+is|\s+are|\s+would\s+be)\s+the\s+(?:probability|chance|odds|area|"
                         r"volume|perimeter|answer|result|value)|"
                         r"(?:to|me|user|us|you|please)\s+(?:solve|calculate|compute|work\s+out))(?![\w-])",
                         re.IGNORECASE)
#: where a clause ends: a sentence stop, a dash, or a comma opening another clause
_CLAUSE_END_RE = clause_end()


def identifier(prefix: str, number: str, rest: str, measured: bool) -> bool:
    """The `number` between `prefix` and `rest` names a thing (see the module doc); `measured`:
    it has a unit of measure."""
    if _ID_BEFORE_RE.search(prefix):
        return True
    if not number.isdigit():
        return False
    if len(number) == 3 and 100 <= int(number) <= 599 and _STATUS_AFTER_RE.match(rest):
        return int(number) >= 400 or not re.match(r"^\s*(?:errors?|responses?|pages?)\b", rest, re.IGNORECASE)
    name = _NAME_BEFORE_RE.search(prefix)
    return name is not None and not measured and name.group(1) not in _NOT_NAMES


def in_request(prefix: str) -> bool:
    """The number after `prefix` is in the clause of a help request or a worked example."""
    return bool(_REQUEST_RE.search(_CLAUSE_END_RE.split(prefix)[-1]))
