"""Statements that deny for all time what another states, for the `rules` supersede decision.

A fragment says ``never``, ``haven't ever``, ``not yet`` of something another fragment states
(sharing at least `min_shared` of the `window` words after the negation, past verbs included:
``never submitted my cover letter`` / ``submitted my cover letter``; not negated there, a negation
within `NEG_WORDS` words before them, while ``I'm not sure how`` elsewhere does not count). Which
one came first decides what that is (rules-supersede-v10, from a review of what context showed):

* the **newer denies** what the older states: a **contradiction** (both stay current, context
  flags them), unless the denial is scoped to a time the statement does not share (``never ran the
  marathon in 2023`` after ``ran it in April 2018``: two facts);
* the **older denied** what the newer states: an **update** when the denial was ``not yet`` or the
  newer says it happened lately (``finally``, ``just``, ``recently``, ``yesterday``, ``for the first
  time``: ``has not yet submitted`` → ``submitted it yesterday`` is progress, and the stale ``not
  yet`` ranked first); else a contradiction (``never been to Japan`` → ``went to Japan in 2015``);
  neither when the newer only plans it (``never deployed to AWS`` → ``now planning to deploy on AWS``).
"""
from __future__ import annotations

import re
from typing import Any

from memory.lexicon import clause_end
from memory.text import is_content

__all__ = ["NEG_WORDS", "says_never", "negation"]

#: words before a shared word in which a negation makes the statement negated too
NEG_WORDS = 2
_NEVER_RE = re.compile(r"\b(?:never|not\s+yet|haven't\s+(?:ever|yet)|has\s+not\s+ever|hasn't\s+(?:ever|yet)|"
                       r"not\s+ever|no\s+experience)\b", re.IGNORECASE)
_YET_RE = re.compile(r"\byet\b", re.IGNORECASE)
_NEG_ANY_RE = re.compile(r"\b(?:never|not|no|n't|haven't|hasn't|didn't|don't|doesn't)\b", re.IGNORECASE)
#: words saying a stated thing happened lately: it fulfils an older denial instead of contradicting it
_LATELY_RE = re.compile(r"(?<![\w-])(?:finally|just|recently|lately|yesterday|today|tonight|this\s+(?:morning|"
                        r"afternoon|evening|week|weekend|month)|last\s+(?:night|week|weekend)|for\s+the\s+first\s+"
                        r"time|at\s+last|now)(?![\w-])", re.IGNORECASE)
#: words of a plan or a wish: what the newer statement means to do fulfils no denial, nor contradicts it
_PLAN_RE = re.compile(r"(?<![\w-])(?:plan(?:s|ning)?\s+to|going\s+to|will|want(?:s|ing)?\s+to|would\s+like|"
                      r"hop(?:e|es|ing)\s+to|intend(?:s|ing)?\s+to|thinking\s+(?:of|about)|consider(?:s|ing)?)(?![\w-])",
                      re.IGNORECASE)
#: a time a denial is scoped to: a year, or a period named relative to now
_SCOPE_RE = re.compile(r"\b(?:1[89]\d\d|20\d\d)\b|(?<![\w-])(?:this|last|next)\s+(?:week|weekend|month|year|"
                       r"summer|winter|spring|autumn|fall|semester|season)(?![\w-])", re.IGNORECASE)
_CLAUSE_END_RE = clause_end(("but", "because", "since", "although", "though"), stops=".;!?", dash=False)


def says_never(f: dict[str, Any]) -> bool:
    """The fragment negates something for all time (``never``, ``not yet``...)."""
    return bool(_NEVER_RE.search(str(f.get("content") or "")))


def negation(newer: dict[str, Any], older: dict[str, Any], *, window: int, min_shared: int,
             exclude: set[str]) -> str | None:
    """"contradiction", "update" or None for two fragments of which exactly one denies what the
    other states (see the module doc); `exclude`: words that say nothing (the subject's names)."""
    a, b = str(newer.get("content") or ""), str(older.get("content") or "")
    m_a, m_b = _NEVER_RE.search(a), _NEVER_RE.search(b)
    if bool(m_a) == bool(m_b):
        return None
    negated, stated, m = (a, b, m_a) if m_a else (b, a, m_b)
    assert m is not None
    exclude = exclude | {"never", "ever", "yet", "actually", "project"}
    clause = {w for w, _ in _clause_words(negated[m.end():], exclude)[:window]}
    said = _clause_words(stated, exclude, keep_negations=True)
    shared = set()
    for i, (w, _) in enumerate(said):
        if w in clause and not any(neg for _, neg in said[max(0, i - NEG_WORDS):i]):
            shared.add(w)
    if len(shared) < min_shared:
        return None
    if m_a:
        scope = {s.lower() for s in _SCOPE_RE.findall(_CLAUSE_END_RE.split(negated[m.end():])[0])}
        return None if scope and not scope <= {s.lower() for s in _SCOPE_RE.findall(stated)} else "contradiction"
    if _PLAN_RE.search(stated):
        return None                                      # "never deployed" / "now planning to deploy"
    return "update" if _YET_RE.search(m.group(0)) or _LATELY_RE.search(stated) else "contradiction"


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
