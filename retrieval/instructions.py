"""Standing instructions: turns in which the user tells an assistant how to answer from now on
("Always use APA 7th edition citation style when I ask about formatting references.", "Never ...",
"From now on ..."). They are not evidence of a fact but rules for every later answer on their topic,
and a query rarely shares their words: "How should I list the sources in my paper?" matches the
Zotero turns above the APA one. So the retriever keeps a place for them: the user's best-matching
standing instruction (cosine at least `instruction_min_score`) that no item cites yet takes the place
`instruction_rank` and the list's last item drops out (`instruction_slots` of them, never all k
places). The validity ordering that follows keeps it.

An instruction is a turn by a speaker who is not an assistant (`assistant_speakers`), in a history
where an assistant speaks, that opens with a standing cue (`is_instruction`, English heuristics).
Conversations between people (LoCoMo) have none: "never give up" said to a friend instructs no one.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory.settings import RetrievalSettings
from retrieval.index import UserIndex

__all__ = ["CUE", "is_instruction", "instruction_rows", "pin_instruction"]

#: how a standing instruction opens: "(Remember to) always / never / don't ever <verb>", or "From now
#: on", "Going forward", "In (the) future", "Whenever ...,", "Every time ...," followed by what to do;
#: "Make sure to/you"; each optionally after "please"
CUE = re.compile(r"^\W*(?:please\s*,?\s+)?(?:(?:remember\s+to\s+)?(?:always|never|do\s+not\s+ever|don't\s+ever)"
                 r"\s+(?P<verb>[a-z']+)|make\s+sure\s+(?:to|you)\b"
                 r"|(?:from\s+now\s+on|going\s+forward|in\s+(?:the\s+)?future)\s*,?\s+(?P<then>[a-z']+)"
                 r"|(?:whenever|every\s+time)\b[^,.;!?]*,\s*(?P<then2>[a-z']+))", re.IGNORECASE)
#: words after "always"/"never" that make a statement about oneself, not an order ("Never been to
#: Japan", "Always wanted to ...", "Never mind"): irregular simple pasts and participles (regular ones
#: end in -ed); its own list, since retrieval reads the store and imports no extraction module
_SAID_OF_ONESELF = frozenset((
    "went did saw met got took made ran bought brought caught taught thought felt found gave had was were "
    "won began sang swam drove rode wrote spoke broke chose fell flew grew knew left lost paid said sent "
    "spent sold told understood built heard kept led lent meant sat slept stood struck swore threw wore "
    "woke ate drank came became forgot held hung fought bit hid shot shook tore been seen done gone known "
    "given taken gotten mind").split())
#: words that open a clause about someone rather than an order ("From now on I'm ...", "every time I
#: deploy, the build ...")
_SUBJECTS = frozenset("i i'm i've i'll i'd me my we we're our you you're your he she it it's they they're "
                      "their this that these those there the a an".split())


def is_instruction(text: str) -> bool:
    """Does a turn open with a standing instruction (`CUE`) rather than a question or a statement
    about its speaker? English heuristics: its first sentence is no question, the verb after
    "always"/"never" is no past form, and what follows "from now on" or a "whenever ...," clause is
    no subject: no pronoun or article, no capitalized name (an order has none)."""
    m = CUE.match(text)
    if m is None:
        return False
    first = re.match(r"[^.!?]*[.!?]?", text.strip())
    if first is not None and first.group(0).endswith("?"):
        return False
    verb = (m.group("verb") or "").lower()
    if verb and (verb in _SAID_OF_ONESELF or (verb.endswith("ed") and not verb.endswith("eed")
                                              and verb not in ("embed", "shed"))):
        return False
    then = m.group("then") or m.group("then2") or ""
    return not then or (then[0].islower() and then not in _SUBJECTS)   # "..., Heroku times out": a subject


def instruction_rows(index: UserIndex, assistants: tuple[str, ...]) -> np.ndarray:
    """Index rows of the user's standing-instruction turns (cached with the index); none when no
    assistant speaks in the user's history."""
    def build() -> np.ndarray:
        t = index.messages
        if not assistants or t.num_rows == 0 or "speaker" not in t.column_names:
            return np.zeros(0, dtype=np.int64)
        voice = pc.fill_null(pc.is_in(pc.utf8_lower(t.column("speaker")),
                                      value_set=pa.array([a.lower() for a in assistants])), False)
        if not pc.any(voice).as_py():
            return np.zeros(0, dtype=np.int64)
        rows = index.turn_rows()
        found = [rows[m] for m, said, text in zip(t.column("message_id").to_pylist(), voice.to_pylist(),
                                                  t.column("text").to_pylist())
                 if not said and text and m in rows and is_instruction(text)]
        return np.asarray(sorted(found), dtype=np.int64)
    return index.memo("instructions:" + ",".join(sorted(assistants)), build)


def pin_instruction(index: UserIndex, rows: np.ndarray, scores: np.ndarray, vec: np.ndarray, k: int,
                    settings: RetrievalSettings, kinds: tuple[str, ...],
                    signals: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """`rows` with the user's best-matching standing instructions (up to `instruction_slots`, never
    all k places: the best memory stays) at `instruction_rank` when each matches well enough and no
    item already cites its turn; the list stays at most k long. Also returns the pinned rows (the
    validity ordering keeps them). A pinned row's score is its cosine, so scores are not monotone
    there."""
    slots = min(settings.instruction_slots, k - 1)
    if slots < 1 or "message" not in kinds:
        return rows, scores, []
    found = instruction_rows(index, tuple(settings.assistant_speakers))
    if found.size == 0:
        return rows, scores, []
    cos = index.z[found] @ vec
    cited = {m for r in rows.tolist() for m in index.source_ids(r)}
    pinned = [int(found[i]) for i in np.argsort(-cos, kind="stable")
              if cos[i] >= settings.instruction_min_score and not set(index.source_ids(int(found[i]))) <= cited][:slots]
    if not pinned:
        return rows, scores, []
    at = min(settings.instruction_rank, rows.size, k - len(pinned))
    new_rows = np.concatenate([rows[:at], np.asarray(pinned, dtype=np.int64), rows[at:]])[:k]
    new_scores = np.concatenate([scores[:at], (index.z[pinned] @ vec).astype(np.float32), scores[at:]])[:k]
    signals["instructions"] = [index.source_ids(r)[0] for r in pinned]
    return new_rows, new_scores.astype(np.float32), pinned
