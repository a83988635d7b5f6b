"""Queries about what the assistant itself said before ("How did you recommend structuring ...?",
"What was the plan you suggested?"). Their evidence is the assistant's own replies, yet the user's
turns and fragments on the same topic are short and lexically close and fill the top-K ahead of
the long replies (BEAM 100K information extraction). The hybrid strategies therefore add
`retrieval.recall_boost` to the assistant's raw turns for such a query (`assistant_turns`).

The cue is a past tense with "you" as its subject: "did you recommend", "you suggested", "you'd
told me". A request ("Can you suggest ...", "could you recommend") is not one: it asks for new
advice, and the user's preferences answer it. English only, like the instruction cues.

The mirror cue, a past tense of a verb of saying with "I" as its subject ("did I mention", "the
order in which I brought up", `ASKS_WHAT_I_SAID`), asks what the user said: the user's turns answer
it, and the assistant's replies that restate them take places in the top-K that no evidence fills
(BEAM 100K event ordering: 89 of its 200 places held assistant turns, while all 106 evidence turns
were the user's). The hybrid strategies then take `retrieval.own_words_penalty` from the
assistant's raw turns (`Query.prior`).
"""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory.lexicon import SAYING, alternation

from retrieval.index import UserIndex

__all__ = ["ASKS_WHAT_YOU_SAID", "ASKS_WHAT_I_SAID", "asks_what_you_said", "asks_what_i_said", "assistant_turns"]

#: verbs of advice and telling (`memory.lexicon.SAYING`): the base form after "did you", the past
#: after "you" and the participle after "have you"
_RECALL = ("recommend", "suggest", "say", "advise", "mention", "tell", "propose", "explain", "outline", "describe",
           "provide", "give", "share", "show", "offer", "point out", "walk me through", "lay out", "list",
           "come up with", "write")
_BASE = alternation(_RECALL)
_PAST = alternation(f for v in _RECALL for f in SAYING[v][1:])
_WHEN = r"(?:(?:ever|once|just|already|previously|earlier)\s+)?"
#: "did(n't) you (not) (ever/once/just) recommend", "have/had you (ever) recommended", "you
#: (had/'d/'ve/once) recommended" (not after "if", a modal or a passive's "were": "if you told your
#: boss", "would you have recommended", "were you told"), "what was your (earlier) recommendation"
ASKS_WHAT_YOU_SAID = re.compile(
    rf"\b(?:did|didn'?t)\s+you\s+(?:not\s+)?{_WHEN}(?:{_BASE})\b"
    rf"|\b(?:had|have|hadn'?t|haven'?t)\s+you\s+{_WHEN}(?:{_PAST})\b"
    rf"|(?<!\bif\s)(?<!\bwould\s)(?<!\bcould\s)(?<!\bshould\s)(?<!\bmight\s)(?<!\bwere\s)(?<!\bare\s)"
    rf"(?<!\bwhen\s)(?<!\bunless\s)\byou(?:'d|'ve|\s+had|\s+have)?\s+{_WHEN}(?:{_PAST})\b"
    r"|\b(?:what|which)\s+(?:was|were)\s+your\s+(?:\w+\s+)?(?:recommendation|suggestion|advice|tips?|idea|answer"
    r"|explanation)s?\b"
    r"|\byour\s+(?:earlier|previous|last|past|original)\s+(?:recommendation|suggestion|advice|tips?|answer"
    r"|explanation)s?\b",
    re.IGNORECASE)


#: verbs of saying for the user's own words; not "ask" ("the plan I asked you for" is the assistant's
#: reply) nor "raise" ("how much did I raise")
_OWN = ("say", "mention", "tell", "share", "describe", "explain", "outline", "state", "list", "bring up", "note")
_OWN_BASE = alternation(_OWN)
_OWN_PAST = alternation(f for v in _OWN for f in SAYING[v][1:])
#: "did I (ever/first) mention", "have I told", "I (had/'d/'ve) brought up", "in which I brought up";
#: not after "if", "when" or a modal ("should I have mentioned", "what would I have said")
ASKS_WHAT_I_SAID = re.compile(
    rf"\b(?:did|didn'?t|have|had|haven'?t|hadn'?t)\s+I\s+{_WHEN}(?:first\s+)?(?:{_OWN_BASE}|{_OWN_PAST})\b"
    rf"|(?<!\bif\s)(?<!\bwhen\s)(?<!\bshould\s)(?<!\bwould\s)(?<!\bcould\s)(?<!\bmight\s)(?<!\bmust\s)"
    rf"(?<!\bmay\s)\bI(?:'d|'ve|\s+had|\s+have)?\s+{_WHEN}(?:first\s+)?(?:{_OWN_PAST})\b",
    re.IGNORECASE)


def asks_what_i_said(text: str | None) -> bool:
    """Does the query ask what the user said before ("did I mention", "the order in which I brought up")?"""
    return _asks(ASKS_WHAT_I_SAID, text)


def asks_what_you_said(text: str | None) -> bool:
    """Does the query ask what the assistant said, suggested or recommended before?"""
    return _asks(ASKS_WHAT_YOU_SAID, text)


def _asks(cue: re.Pattern[str], text: str | None) -> bool:
    return bool(text) and cue.search((text or "").replace("\u2019", "'")) is not None


def assistant_turns(index: UserIndex, voices: tuple[str, ...]) -> np.ndarray:
    """Per index row: is it a raw turn said by one of `voices` (speaker names, case-insensitive)?"""
    def build() -> np.ndarray:
        out = np.zeros(index.size, dtype=bool)
        t = index.messages
        if not voices or t.num_rows == 0 or "speaker" not in t.column_names:
            return out
        theirs = index.said_ids(voices)
        rows = np.flatnonzero(index.kinds == "message")
        first = pc.list_element(index.meta.column("source_ids").take(pa.array(rows, pa.int64())), 0)
        out[rows] = pc.fill_null(pc.is_in(first, value_set=theirs), False).to_numpy(zero_copy_only=False)
        return out
    return index.memo("assistant-turns:" + ",".join(sorted(voices)), build)
