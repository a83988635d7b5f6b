"""Named values for the `rules` supersede decision (`memory.llm.rules.supersede`): a newer statement
that says one named thing took another's place ("now uses PostgreSQL" after "uses SQLite", "switched
from Flask to FastAPI" after "built it with Flask").

Names fail differently from quantities, so they have their own rule. rules-supersede-v9 tightened it
after an audit of v8's decisions (2 of 71 named-value closings were right): "now experiencing issues
with JavaScript" had closed "issues with MongoDB connection" (same key), "recently upgraded to Flask
2.3.3" closed "using OpenCV 4.7.0", the "Extended" of "Flask-JWT-Extended" was read as a cue, and "May"
as a new name. Now:

* the two statements must be close in meaning (cosine >= `NAMED_SIM`) whatever their keys: a key is
  the first content words ("experiencing issues", "working project"), shared by unrelated statements;
* only a replacement cue says a value was replaced (`_SWITCH_RE`: now, switched, moved, migrated,
  replaced, instead, no longer, changed); progress words (new, recently, updated, upgraded, improved,
  reached) say that something happened, not that one value took another's place;
* a cue is a word of its own, in lower case or opening a sentence: "Flask-JWT-Extended" is a name;
* months, weekdays and AM/PM are no names (dates and times are quantities);
* a name the newer statement says it left ("switched from Flask to FastAPI", "instead of Flask",
  "no longer uses Flask") counts as dropped, though the newer statement names it;
* v12: a "now" that opens a next step ("now user needs to handle 401 Unauthorized errors", `next_step`)
  is no replacement cue, and a name the older statement denies in its clause ("has never deployed
  it or used Gunicorn", `denied_names`) is no value it held, so none replaces it.
"""
from __future__ import annotations

import re
from typing import Any

from memory.lexicon import clause_end

__all__ = ["NAMED_SIM", "NAME_WORDS", "denied_names", "named_change", "names", "next_step", "subject_names"]

#: text cosine two statements need for a named value of one to replace the other's
NAMED_SIM = 0.6
#: words after a replacement cue that the new name must fall within
NAME_WORDS = 8

_CAP_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][A-Za-z0-9+#.\-]*[A-Za-z0-9+#])")
_QUOTED_RE = re.compile(r"\"[^\"\n]{1,80}\"|“[^”\n]{1,80}”|‘[^’\n]{1,80}’|(?<!\w)'\S[^'\n]{0,78}\S'(?!\w)")
#: the words that say a value was replaced, as words of their own (not inside "Flask-JWT-Extended")
_SWITCH_RE = re.compile(r"(?<![\w-])(?:now|no\s+longer|instead|switch(?:es|ed|ing)?|mov(?:ed|ing)|"
                        r"migrat(?:e|es|ed|ing)|replac(?:e|es|ed|ing)|chang(?:ed|ing))(?![\w-])", re.IGNORECASE)
#: a name the statement says it left: "from X" after a cue, "instead of X", "no longer ... X", "replaced X"
_LEFT_RE = re.compile(r"(?<![\w-])(?:(?:switch(?:es|ed|ing)?|mov(?:ed|ing)|migrat(?:e|es|ed|ing)|chang(?:ed|ing))"
                      r"(?:\s+\S+){0,3}?\s+from|instead\s+of|no\s+longer\s+\S+(?:\s+\S+)?|"
                      r"replac(?:e|es|ed|ing))\s+((?:\S+\s+){0,2}?[A-Z][A-Za-z0-9+#.\-]*[A-Za-z0-9+#])")
#: "now" opening a next step, not a state ("now user needs to handle 401 errors", "now I have to"; v12)
#: (not "now I can use FastAPI" nor "now I have to use Kubernetes": a state)
_NEXT_STEP_RE = re.compile(r"^\s*(?:(?:I|we|user|he|she|they)\s+)?(?:also\s+)?(?:needs?|ha(?:s|ve)\s+to|must|wants?|"
                           r"plans?|would\s+like|am\s+going|is\s+going)\b(?!(?:\s+to)?\s+(?:use|run|host|be)\b)",
                           re.IGNORECASE)
#: a denial of using or having what follows ("never deployed it or used Gunicorn", "haven't tried Redis",
#: "without Redis"; v12), not one of something else ("couldn't be happier hosting it on Vercel", "do not
#: regret choosing PostgreSQL"): a verb of use within two words, or a name right after it
_DENIAL_RE = re.compile(r"(?:(?<![\w-])(?i:never|not|without)|(?i:n't))(?![\w-])(?=\s+(?:(?:\S+\s+){0,2}?(?i:use[ds]?|"
                        r"using|tried|try|deploy(?:ed|s)?|install(?:ed|s)?|ha(?:s|ve|d)|run|ran|set\s+up|worked\s+with|"
                        r"heard\s+of)(?![\w-])|[A-Z]))")
#: where a denial's reach ends inside its clause ("haven't had outages since I moved to PostgreSQL")
_SCOPE_END_RE = re.compile(r"(?<![\w-])(?:since|because|when|after|than|so|but|although|though|while|which|that)"
                           r"(?![\w-])", re.IGNORECASE)
_CLAUSE_RE = clause_end(("and", "but", "so", "because", "since", "which", "while", "although", "though", "as",
                         "where", "user", "I", "we"))
#: capitalized words that are dates or times, not names
_NOT_NAMES = frozenset("""January February March April May June July August September October November December
Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec Monday Tuesday Wednesday Thursday Friday Saturday Sunday
Mon Tue Tues Wed Thu Thurs Fri Sat Sun AM PM A.M P.M""".split())


def subject_names(subject: str) -> set[str]:
    """The lower-cased words of a subject and their possessives: never a value of the subject's."""
    words = {w.lower() for w in subject.split()}
    return words | {n + "'s" for n in words}


def names(text: str) -> set[str]:
    """Capitalized names outside quoted phrases ("Rate limit exceeded"; a lone "Kong" counts, "user's"
    opens none), months, weekdays and AM/PM left out."""
    unquoted = _QUOTED_RE.sub(lambda q: " " if " " in q.group(0) else q.group(0), text)
    return {m.group(1) for m in _CAP_RE.finditer(unquoted) if len(m.group(1)) > 1 and m.group(1) not in _NOT_NAMES}


def _cues(text: str) -> list[re.Match[str]]:
    """The replacement cues of `text`: in lower case, or opening a sentence ("Now I use Kong"), not a
    "now" that opens a next step (`next_step`)."""
    return [m for m in _SWITCH_RE.finditer(text)
            if (m.group(0).islower() or not text[:m.start()].strip() or text[:m.start()].rstrip()[-1] in ".!?")
            and not (m.group(0).lower() == "now" and next_step(text[m.end():]))]


def next_step(rest: str) -> bool:
    """The words after a "now" (`rest`) say what is to be done next, not what holds now: "now user
    needs to handle 401 errors", "now I have to migrate" (v12: a task, no value replaced)."""
    return bool(_NEXT_STEP_RE.match(rest))


def denied_names(text: str) -> set[str]:
    """Names that `text` says are not held: after a denial in their clause ("has never deployed
    this app or used Gunicorn", "without Redis"; v12). Such a name is no value a newer statement replaces."""
    out: set[str] = set()
    for clause in _CLAUSE_RE.split(text):
        for denial in _DENIAL_RE.finditer(clause):
            rest = clause[denial.end():]
            end = _SCOPE_END_RE.search(rest)
            out |= names(" " + (rest[:end.start()] if end else rest))
    return out


def named_change(newer: dict[str, Any], older: dict[str, Any], similarity: float) -> bool:
    """A replacement cue in the newer statement followed (within `NAME_WORDS` words) by a name the
    older does not give, while the older gives one the newer drops or says it left; the two at a
    cosine of at least `NAMED_SIM`."""
    if similarity < NAMED_SIM:
        return False
    text_new, text_old = str(newer.get("content") or ""), str(older.get("content") or "")
    cues = _cues(text_new)
    if not cues:
        return False
    subject = subject_names(str(newer.get("subject") or ""))
    cap_new = {c for c in names(text_new) if c.lower() not in subject}
    cap_old = {c for c in names(text_old) if c.lower() not in subject} - denied_names(text_old)
    left = {c for m in _LEFT_RE.finditer(text_new) for c in names(" " + m.group(1))}
    if not cap_old - (cap_new - left):
        return False
    for cue in cues:                               # the cue governs a new name after it
        if names(" ".join(text_new[cue.end():].split()[:NAME_WORDS])) & (cap_new - cap_old):
            return True
    return False
