"""Standing instructions: turns in which the user tells an assistant how to answer from now on
("Always use APA 7th edition citation style when I ask about formatting references.", "Never ...",
"From now on ..."). They are not evidence of a fact but rules for every later answer on their topic,
and a query rarely shares their words: "How should I list the sources in my paper?" matches the
Zotero turns above the APA one. So the retriever keeps a place for them: the user's best-matching
standing instruction (cosine at least `instruction_min_score`) that no item cites yet takes the place
`instruction_rank` and, in a full list, the last item drops out (`instruction_slots` of them,
never all k places; an instruction the ranking returned fills one). It is placed after the
validity ordering, which cuts the list to k first. An instruction a newer one replaced (the supersede
stage closed it: "From now on, use MLA ... instead of APA") is not pinned (with `validity` on).

An instruction is a turn by a speaker who is not an assistant (`assistant_speakers`), in a history
where an assistant speaks, that opens with a standing cue (`is_instruction`, English heuristics).
Conversations between people (LoCoMo) have none: "never give up" said to a friend instructs no one.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow.compute as pc

from memory.lexicon import IRREGULAR_PAST
from memory.settings import RetrievalSettings
from retrieval.index import UserIndex
from retrieval.validity import validity_of

__all__ = ["CUE", "is_instruction", "instruction_rows", "pin_instruction", "replaced_instructions"]

#: how much of a turn the cue reads, its whitespace collapsed first (no regex backtracks over a
#: long run of spaces, and the cue is in the first words)
_HEAD_CHARS = 300
#: what may come before the cue: filler words ("Also, ...", "Thanks! Oh and ...") and "please"
_OPENER = (r"^\W*(?:(?:also|and|btw|oh|ok|okay|hi|hey|so|but|thanks|thank\s+you|great|perfect|cool|alright"
           r"|one\s+more\s+thing)\b[ ,!.:;-]*){0,3}(?:(?:please|pls)[ ,]+)?")
#: how "from now on" and a "whenever ...," clause may lead into the order ("From now on, I want you to")
_LEAD = r"(?:(?:i\s+want\s+you\s+to|i(?:'d|\s+would)\s+like(?:\s+you\s+to)?|you\s+(?:should|must)|please|pls)\s+)?"
#: how a standing instruction opens: "(Remember to / I'd like you to / I want you to) always / never
#: (, ever) / don't ever <verb>", "From now on", "Going forward", "In (the) future", "Whenever ...,",
#: "Every time ...,", "When/If I (you) ask (mention, paste, give ...) ...," followed by what to do;
#: "Make sure to/you/your"
CUE = re.compile(
    _OPENER + r"(?:(?:(?:remember\s+to|i(?:'d|\s+would)\s+like\s+you\s+to|i\s+want\s+you\s+to)\s+)?"
    r"(?:always|never(?: ?, ?ever)?|do\s+not\s+ever|don't\s+ever)[ *_,]+"
    r"(?:(?:really|just|ever|even|actually|truly|still|also|only|totally|definitely|honestly)\s+)?"
    r"(?P<verb>[a-z']+)(?:\s+(?P<verb_next>[a-z']+))?"
    r"|make\s+sure\s+(?:to|you|your)\b"
    r"|(?:from\s+now\s+on|going\s+forward|in\s+(?:the\s+)?future) ?,? " + _LEAD +
    r"(?P<then>[a-z']+)(?:\s+(?P<then_next>[a-z']+))?"
    r"|(?:whenever|every\s+time|(?:when|if)\s+(?:i|you)\s+(?:ever\s+)?(?:ask|mention|talk|request|bring|need"
    r"|want|share|send|paste|give|show|write|suggest|recommend|answer|reply|respond))\b"
    r"(?:[^,.;!?]|\.(?=\w))*, ?" + _LEAD + r"(?P<then2>[a-z']+)(?:\s+(?P<then2_next>[a-z']+))?)", re.IGNORECASE)
#: words after "always"/"never" that make a statement about oneself, not an order ("Never been to
#: Japan", "Always wanted to ...", "Never mind", "Always so busy", "Never know what to cook", "Never
#: can remember", "Always hungry"): irregular simple pasts and participles (regular ones end in -ed),
#: words that are no verb, modals, adjectives of mood, and verbs of feeling and knowing
_SAID_OF_ONESELF = (frozenset(IRREGULAR_PAST) - {"read", "put", "set"}) | frozenset((
    "been seen done gone known given taken gotten mind so enough too very such quite again the a an my "
    "our there in on at with for am is are can could will would should must might may know struggle "
    "wonder seem wish hate love enjoy like want need hungry sure happy sad tired busy late early glad "
    "ready afraid scared worried excited nervous good bad fine").split())
#: words that open a clause about someone or something rather than an order ("From now on I'm ...",
#: "every time I deploy, the build ...", "In the future, maybe I'll ...")
_SUBJECTS = frozenset("i i'm i've i'll i'd me my we we're our you you're your he she it it's they they're "
                      "their this that these those there the a an everyone someone nobody people things "
                      "maybe perhaps probably hopefully once someday".split())
#: a second word that makes the first a subject ("Whenever it rains, traffic is bad", "git says ...")
_VERBS_AFTER_SUBJECT = frozenset("is are was were has have had gets keeps seems will would can could does did "
                                 "doesn't won't can't isn't wasn't says goes fails crashes breaks hangs dies "
                                 "freezes stops happens flies takes makes looks feels works runs".split())
#: adverbs in -ly that stand before the verb ("Never fully understood ..."), and verbs that end so
_LY_VERBS = frozenset("apply reply supply rely fly ally multiply comply imply".split())
#: imperatives that end like a participle or a third person
_IMPERATIVES = frozenset("bring spring string swing sing ring embed shed shred bias alias let's lets pls "
                         "always".split())


def _inflected(word: str) -> bool:
    """Does `word` end like a participle, a past or a third person ("breaks", "crashes", "running")?"""
    if word in _IMPERATIVES:
        return False
    if word.endswith("ing"):
        return len(word) >= 6
    if word.endswith("ed"):
        return not word.endswith("eed")
    return word.endswith("s") and not word.endswith(("ss", "us"))


def _orders(verb: str, after: str) -> bool:
    """Can "always/never <verb> <after>" give an order, rather than say something of the speaker?"""
    if verb.endswith("ly") and verb not in _LY_VERBS and after:
        return not (after in _SAID_OF_ONESELF or _inflected(after))       # "Never fully understood ..."
    if verb == "feel":
        return after == "free"                                              # "Always feel free to ask"
    if verb == "forget":
        return after == "to"                                                # not "Always forget my keys"
    if verb == "get" and after.endswith("ed"):
        return False                                                        # "Always get confused"
    if verb in ("have", "has") and (after in ("i", "we", "you", "they", "been") or after.endswith("ed")):
        return False                                                        # "Never have I seen"
    return not (verb in _SAID_OF_ONESELF or _inflected(verb))


def is_instruction(text: str) -> bool:
    """Does a turn open with a standing instruction (`CUE`) rather than a question or a statement
    about its speaker? English heuristics, read on the turn's first words: its first sentence is no
    question, the word after "always"/"never" gives an order (no past form, participle, modal, mood
    or verb of feeling and knowing), and what follows "from now on" or a "whenever ...," clause is
    no subject (no pronoun, article, capitalized name or inflected word, nor one before a verb)."""
    head = " ".join(text[:_HEAD_CHARS].replace("\u2019", "'").split())
    m = CUE.match(head)
    if m is None:
        return False
    first = re.match(r"[^.!?]*[.!?]?", head)
    if first is not None and first.group(0).endswith("?"):
        return False
    verb = (m.group("verb") or "").lower()
    if verb:
        return _orders(verb, (m.group("verb_next") or "").lower())
    then = m.group("then") or m.group("then2") or ""
    after = (m.group("then_next") or m.group("then2_next") or "").lower()
    return not then or (then[0].islower() and then not in _SUBJECTS and not _inflected(then)
                        and after not in _VERBS_AFTER_SUBJECT)


def instruction_rows(index: UserIndex, assistants: tuple[str, ...]) -> np.ndarray:
    """Index rows of the user's standing-instruction turns (cached with the index); none when no
    assistant speaks in the user's history."""
    return _instructions(index, assistants)[0]


def _instructions(index: UserIndex, assistants: tuple[str, ...]) -> tuple[np.ndarray, list[str]]:
    """(index rows, message ids) of the user's standing instructions, in row order, built once per
    index: only the first `_HEAD_CHARS` of the turns no assistant said leave Arrow (a 1M chat's long
    replies are never copied into Python on the first query)."""
    def build() -> tuple[np.ndarray, list[str]]:
        t = index.messages
        none: tuple[np.ndarray, list[str]] = (np.zeros(0, dtype=np.int64), [])
        if not assistants or t.num_rows == 0 or "speaker" not in t.column_names:
            return none
        voice = index.said_by(assistants)
        if not pc.any(voice).as_py():
            return none
        own = t.filter(pc.invert(voice))
        heads = pc.utf8_slice_codeunits(own.column("text"), 0, _HEAD_CHARS).to_pylist()
        rows = index.turn_rows()
        found = sorted((rows[m], m) for m, head in zip(own.column("message_id").to_pylist(), heads)
                       if head and m in rows and is_instruction(head))
        return np.asarray([r for r, _ in found], dtype=np.int64), [m for _, m in found]
    return index.memo("instructions:" + ",".join(sorted(assistants)), build)


def pin_instruction(index: UserIndex, rows: np.ndarray, scores: np.ndarray, vec: np.ndarray, k: int,
                    settings: RetrievalSettings, kinds: tuple[str, ...],
                    signals: dict[str, Any], history: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """`rows` with the user's best-matching standing instructions (up to `instruction_slots` less
    those the ranking returned, never all k places: the best memory stays) at `instruction_rank`
    when each matches well enough and no item already cites its turn; the list stays at most k
    long. Called after the validity ordering, so nothing moves it. A pinned row's score is its
    cosine, so scores are not monotone there. With `settings.validity` an instruction a newer one
    replaced (`replaced_instructions`) is neither pinned nor counted as filling a place, unless the
    query asks what held before (`history`)."""
    slots = min(settings.instruction_slots, k - 1)
    if slots < 1 or "message" not in kinds:
        return rows, scores
    found, ids = _instructions(index, tuple(settings.assistant_speakers))
    if found.size == 0:
        return rows, scores
    cos = index.z[found] @ vec
    cited = {m for r in rows.tolist() for m in index.source_ids(r)}
    held = np.asarray([m in cited for m in ids], dtype=bool)
    replaced = replaced_instructions(index, tuple(settings.assistant_speakers)) \
        if settings.validity and not history else frozenset()
    gone = np.asarray([m in replaced for m in ids], dtype=bool)
    slots -= int((held & ~gone).sum())      # an instruction the ranking returned fills its place
    best = [int(i) for i in np.argsort(-cos, kind="stable")
            if cos[i] >= settings.instruction_min_score and not held[i] and not gone[i]][:max(slots, 0)]
    if not best:
        return rows, scores
    pinned = [int(found[i]) for i in best]
    at = min(settings.instruction_rank, rows.size, k - len(pinned))
    new_rows = np.concatenate([rows[:at], np.asarray(pinned, dtype=np.int64), rows[at:]])[:k]
    new_scores = np.concatenate([scores[:at], cos[best].astype(np.float32), scores[at:]])[:k]
    signals["instructions"] = [ids[i] for i in best]
    return new_rows, new_scores.astype(np.float32)


def replaced_instructions(index: UserIndex, assistants: tuple[str, ...]) -> frozenset[str]:
    """The user's instruction turns (message ids) that a newer instruction replaced: the supersede
    stage closed a statement of the turn with a memory citing another instruction turn ("From now
    on, use MLA ... instead of APA" after "Always use APA ..."), and no fragment of the turn is still
    current (a turn whose other statement changed keeps its rule). Built once per index."""
    def build() -> frozenset[str]:
        rows, ids = _instructions(index, assistants)
        v = validity_of(index)
        if rows.size == 0 or not v.replaced_in:
            return frozenset()
        row_of, mine, memory_id = index.row_of_id(), set(ids), index.meta.column("id")

        def by_another(m: str) -> bool:      # closed by a memory citing another instruction turn
            return any(f in row_of and (set(index.source_ids(row_of[f])) & mine) - {m}
                       for f in v.replaced_in.get(m, []))

        def none_current(m: str) -> bool:    # every fragment citing the turn was closed
            return all(memory_id[r].as_py() in v.superseded_by for r in v.by_message.get(m, []))
        return frozenset(m for m in ids if by_another(m) and none_current(m))
    return index.memo("instructions-replaced:" + ",".join(sorted(assistants)), build)
