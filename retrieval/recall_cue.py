"""Queries about what the assistant itself said before ("How did you recommend structuring ...?",
"What was the plan you suggested?"). Their evidence is the assistant's own replies, yet the user's
turns and fragments on the same topic are short and lexically close and fill the top-K ahead of
the long replies (BEAM 100K information extraction). The hybrid strategies therefore add
`retrieval.recall_boost` to the assistant's raw turns for such a query (`assistant_turns`).

The cue is a past tense with "you" as its subject: "did you recommend", "you suggested", "you'd
told me". A request ("Can you suggest ...", "could you recommend") is not one: it asks for new
advice, and the user's preferences answer it. English only, like the instruction cues.
"""
from __future__ import annotations

import re

import numpy as np
import pyarrow.compute as pc

from retrieval.index import UserIndex

__all__ = ["ASKS_WHAT_YOU_SAID", "asks_what_you_said", "assistant_turns"]

#: verbs of advice and telling: base form (after "did you") -> past (after "you"); participles differ for two
_VERBS = {"recommend": "recommended", "suggest": "suggested", "say": "said", "advise": "advised",
          "mention": "mentioned", "tell": "told", "propose": "proposed", "explain": "explained",
          "outline": "outlined", "describe": "described", "provide": "provided", "give": "gave",
          "share": "shared", "show": "showed", "offer": "offered", "point out": "pointed out",
          "walk me through": "walked me through", "lay out": "laid out", "list": "listed"}
_PARTICIPLES = {**_VERBS, "give": "given", "show": "shown"}
_BASE = "|".join(re.escape(v).replace(r"\ ", r"\s+") for v in sorted(_VERBS, key=len, reverse=True))
_PAST = "|".join(re.escape(v).replace(r"\ ", r"\s+")
                 for v in sorted(set(_VERBS.values()) | set(_PARTICIPLES.values()), key=len, reverse=True))
#: "did you (ever/once/just) recommend", "have/had you (ever) recommended", "you (had/'d/'ve/once)
#: recommended"
ASKS_WHAT_YOU_SAID = re.compile(
    rf"\bdid\s+you\s+(?:(?:ever|once|just|already|previously|earlier)\s+)?(?:{_BASE})\b"
    rf"|\b(?:had|have)\s+you\s+(?:(?:ever|once|just|already|previously|earlier)\s+)?(?:{_PAST})\b"
    rf"|\byou(?:'d|'ve|\s+had|\s+have)?\s+(?:(?:once|just|already|previously|earlier)\s+)?(?:{_PAST})\b",
    re.IGNORECASE)


def asks_what_you_said(text: str | None) -> bool:
    """Does the query ask what the assistant said, suggested or recommended before?"""
    return bool(text) and ASKS_WHAT_YOU_SAID.search(text or "") is not None


def assistant_turns(index: UserIndex, voices: tuple[str, ...]) -> np.ndarray:
    """Per index row: is it a raw turn said by one of `voices` (speaker names, case-insensitive)?"""
    def build() -> np.ndarray:
        out = np.zeros(index.size, dtype=bool)
        t = index.messages
        if not voices or t.num_rows == 0 or "speaker" not in t.column_names:
            return out
        theirs = set(pc.filter(t.column("message_id"), index.said_by(voices)).to_pylist())
        for message_id, row in index.turn_rows().items():
            if message_id in theirs:
                out[row] = True
        return out
    return index.memo("assistant-turns:" + ",".join(sorted(voices)), build)
