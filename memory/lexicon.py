"""English word lists shared by the sentence heuristics of consolidation (`memory.dates`,
`memory.text`) and of retrieval (`retrieval.instructions`, `recall_cue`, `lexical`, `validity`):
data only, so the retriever can read them without importing a stage or a parser."""
from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["IRREGULAR_PAST", "SAYING", "CLAUSE_OPENERS", "saying_forms", "alternation", "clause_end"]

#: irregular simple-past verbs (the tense test of `memory.dates`; `rules` spots past-tense clauses
#: with them, and the retriever statements about oneself: "Never went ...")
IRREGULAR_PAST = (
    "went did saw met got took made ran bought brought caught taught thought felt found gave "
    "had was were won began sang swam drove rode wrote spoke broke chose fell flew grew knew "
    "left lost paid said sent spent sold told understood built heard kept led lent meant put "
    "read set sat slept stood struck swore threw wore woke ate drank came became forgot began "
    "held hung fought bit hid shot shook tore"
).split()

#: verbs of saying, telling and advising: base -> (third person, simple past, past participle). One
#: table so the cues that read them cannot drift apart; each takes the subset it was measured with:
#: the recall cue ("did you recommend"), the BM25 question words ("what did you say") and the
#: history cue ("what did I first say").
SAYING: dict[str, tuple[str, str, str]] = {
    "say": ("says", "said", "said"), "mention": ("mentions", "mentioned", "mentioned"),
    "tell": ("tells", "told", "told"), "recommend": ("recommends", "recommended", "recommended"),
    "suggest": ("suggests", "suggested", "suggested"), "advise": ("advises", "advised", "advised"),
    "ask": ("asks", "asked", "asked"), "share": ("shares", "shared", "shared"),
    "explain": ("explains", "explained", "explained"), "describe": ("describes", "described", "described"),
    "outline": ("outlines", "outlined", "outlined"), "propose": ("proposes", "proposed", "proposed"),
    "state": ("states", "stated", "stated"), "provide": ("provides", "provided", "provided"),
    "give": ("gives", "gave", "given"), "show": ("shows", "showed", "shown"),
    "offer": ("offers", "offered", "offered"), "list": ("lists", "listed", "listed"),
    "write": ("writes", "wrote", "written"), "point out": ("points out", "pointed out", "pointed out"),
    "walk me through": ("walks me through", "walked me through", "walked me through"),
    "lay out": ("lays out", "laid out", "laid out"), "come up with": ("comes up with", "came up with", "come up with"),
    "bring up": ("brings up", "brought up", "brought up"), "note": ("notes", "noted", "noted"),
}


#: words that open another clause after a comma ("..., but", "..., which", "..., I")
CLAUSE_OPENERS = ("and", "but", "so", "because", "since", "given", "considering", "which", "while", "although",
                  "though", "especially", "after", "as", "where", "user", "I", "my", "we")


def saying_forms(*bases: str) -> tuple[str, ...]:
    """Every form of the verbs `bases` (keys of SAYING), base first, without repeats."""
    return tuple(dict.fromkeys(f for b in bases for f in (b, *SAYING[b])))


def alternation(phrases: Iterable[str]) -> str:
    """A regex alternation of `phrases`, longest first, a space matching any run of whitespace."""
    return "|".join(re.escape(p).replace(r"\ ", r"\s+") for p in sorted(set(phrases), key=len, reverse=True))


def clause_end(openers: Iterable[str] = CLAUSE_OPENERS, *, stops: str = ".;:!?", dash: bool = True,
               and_subject: bool = False) -> re.Pattern[str]:
    """Where a clause ends, for `split`: one of `stops` ending a sentence, a dash between spaces, a
    comma before one of `openers` (case-sensitive: "I", not "i"), and with `and_subject` an "and"
    before a subject ("... and I"). One builder, so the rules' clause readers differ only in these."""
    parts = [f"[{re.escape(stops)}](?:\\s|$)"]
    if dash:
        parts.append(r"\s[-\u2013\u2014]\s")
    parts.append(rf",\s*(?=(?:{alternation(openers)})\b)")
    if and_subject:
        parts.append(r"\band\s+(?=(?:user|I|we|she|he|they)\b)")
    return re.compile("|".join(parts))
