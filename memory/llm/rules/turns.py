"""Turn against turn (the `rules` supersede decisions for what extraction missed): `Turns` finds
older turns of a statement's speaker that it updates or denies, and `plan_turns` records those links
on the fragments of either turn, or reports them as `Unheld` when no fragment of either turn can
hold them (the supersede stage then makes a change fragment: `memory.stages.supersede`).

Candidates are never all turns: the `MESSAGE_NEIGHBOURS` nearest by vector (cosine at least
`MESSAGE_MIN_SIM`) and the turns holding the same quantity (an inverted index over their sentences'
quantities), at most `MAX_TURNS`; a denial is checked against every older turn's opening
(`MAX_SENTENCES`) and recorded against the `MAX_CONTRADICTED` nearest. Assistants' turns are never
searched: they are not the user's facts.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Callable, Iterable

import numpy as np

from memory.llm.rules.supersede import (SUPERSEDE_VERSION, Quantity, contradiction, decide, is_statement,
                                         quantities, says_never)
from memory.text import cites_only, prose, said_by, split_sentences

__all__ = ["History", "QuantityIndex", "Turns", "Unheld", "plan_turns", "MESSAGE_NEIGHBOURS", "MESSAGE_MIN_SIM", "MAX_TURNS",
           "MAX_CONTRADICTED", "MAX_SENTENCES"]

#: older turns of the fragment's subject searched for a statement extraction missed (by cosine)
MESSAGE_NEIGHBOURS = 8
MESSAGE_MIN_SIM = 0.4
#: turns examined per statement (vector and quantity candidates together)
MAX_TURNS = 32
#: older turns one "never ..." statement is recorded against (the nearest by vector)
MAX_CONTRADICTED = 3
#: sentences of one turn read for a contradiction (its opening: where a turn states its situation)
MAX_SENTENCES = 4


def said(subject: Any, sentence: str, message_id: str) -> dict[str, Any]:
    """One sentence of a turn as the fragment-like dict the rules compare."""
    return {"subject": subject, "key": "", "content": sentence, "source_ids": [message_id]}


class QuantityIndex:
    """An inverted index from a quantity's (unit, context word) to the positions holding it, so that
    the items sharing a quantity with a statement are found without comparing all pairs. `distinct`:
    a position counts once per key (turns: several sentences), else once per quantity (fragments)."""

    def __init__(self, distinct: bool = False) -> None:
        self.distinct = distinct
        self._index: dict[tuple[str, str], Any] = defaultdict(set if distinct else list)

    def add(self, pos: int, found: Iterable[Quantity]) -> None:
        """Index the quantities `found` in the item at `pos`."""
        for q in found:
            for word in q.context:
                held = self._index[(q.unit, word)]
                held.add(pos) if self.distinct else held.append(pos)

    def ranked(self, found: Iterable[Quantity], unitless_as_units: bool = False) -> list[int]:
        """Positions sharing at least two keys with the quantities `found`, most shared first;
        `unitless_as_units`: a unitless number also matches its context words as units."""
        index = self._index
        hits: dict[int, int] = defaultdict(int)
        for q in found:
            units = {q.unit} | ({w for w in q.context} if unitless_as_units and not q.unit else set())
            for word in q.context:
                for unit in units:
                    for j in index.get((unit, word), ()):
                        hits[j] += 1
        return [j for j, n in sorted(hits.items(), key=lambda kv: -kv[1]) if n >= 2]


class Turns:
    """One user's turns with vectors, searched for older statements of a fragment's subject that
    no fragment holds (extraction missed them): a changed quantity there is recorded on the newer
    fragment as `replaces_sources`. Candidates are the nearest turns by vector and the turns with
    a sentence holding the same quantity (an inverted index over their sentences' quantities, like
    the fragments'): a turn that mostly holds code or another topic is still found."""

    def __init__(self, rows: list[dict[str, Any]], skip: Iterable[str] = ()) -> None:
        #: the message ids of the skipped speakers' turns (assistants': not the user's facts, never searched)
        self.skipped = said_by(rows, skip)
        rows = [m for m in rows if m.get("vector") is not None and m.get("ts") is not None
                and m["message_id"] not in self.skipped]
        self.rows = rows
        self.z = np.stack([np.asarray(m["vector"], dtype=np.float32) for m in rows]) if rows else \
            np.zeros((0, 1), dtype=np.float32)
        self.at = {m["message_id"]: j for j, m in enumerate(rows)}
        self._split: dict[int, list[str]] = {}
        self._sentences: dict[int, list[str]] = {}
        self._qindex: QuantityIndex | None = None
        #: the last vector searched, with the turns' cosines and their order (`replaced` and
        #: `contradicted` search with the same vector in turn)
        self._near: tuple[bytes, np.ndarray, list[int]] | None = None

    def skipped_only(self, f: dict[str, Any]) -> bool:
        """Does fragment `f` cite only turns of the skipped speakers (an assistant's advice)?"""
        return cites_only(f.get("source_ids"), self.skipped)

    def same_quantity(self, f: dict[str, Any]) -> list[int]:
        """Turns (positions) with a sentence sharing at least two (unit, context word) keys with a
        quantity of `f`, most shared first."""
        if self._qindex is None:
            self._qindex = QuantityIndex(distinct=True)
            for j in range(len(self.rows)):
                for sentence in self.sentences(j):
                    self._qindex.add(j, quantities(sentence))
        return self._qindex.ranked(quantities(str(f.get("content") or "")), unitless_as_units=True)[:MAX_TURNS]

    def split(self, j: int) -> list[str]:
        """Every sentence of turn j outside its code blocks (cached: each turn is split once)."""
        if j not in self._split:
            self._split[j] = split_sentences(prose(str(self.rows[j].get("text") or "")))
        return self._split[j]

    def sentences(self, j: int) -> list[str]:
        """The statements of turn j that hold a number (cached)."""
        if j not in self._sentences:
            self._sentences[j] = [s for s in self.split(j) if any(c.isdigit() for c in s)
                                  and is_statement({"content": s})]
        return self._sentences[j]

    def statements(self, mid: str) -> list[dict[str, Any]]:
        """The numbered statements of turn `mid` as fragment-like dicts (none for an unknown turn)."""
        j = self.at.get(mid)
        if j is None:
            return []
        return [said(self.rows[j].get("speaker"), s, mid) for s in self.sentences(j)]

    def openings(self, j: int) -> list[str]:
        """The first `MAX_SENTENCES` sentences of turn j, where a turn states its situation."""
        return self.split(j)[:MAX_SENTENCES]

    def replaced(self, f: dict[str, Any], vec: np.ndarray, since: str, history: History | None = None) -> list[str]:
        """Message ids of older turns of `f`'s subject with a quantity `f` gives a new value; only
        for a statement that gives a quantity a new value (`decide`): no fragment backs the turn.
        With `history`, a turn whose replaced value `f` gives back stops the search (`restates`)."""
        if not is_statement(f) or not quantities(str(f.get("content") or "")):
            return []                       # `decide` asks a change cue of unitless numbers and dates
        return self._older_turns(f, vec, since, "update", self.sentences, history)

    def contradicted(self, f: dict[str, Any], vec: np.ndarray, since: str) -> list[str]:
        """Message ids of older turns of `f`'s subject with a statement `f` contradicts (rules'
        `contradiction`: `f` says "never ..." of what the turn states)."""
        if not is_statement(f) or not says_never(f):
            return []
        return self._older_turns(f, vec, since, "contradiction", self.openings)

    def _older_turns(self, f: dict[str, Any], vec: np.ndarray, since: str, verdict: str,
                     sentences: Callable[[int], list[str]], history: History | None = None) -> list[str]:
        """Message ids of the turns nearest `f` (same speaker as its subject, older than `since`, not
        its own sources) one of whose `sentences` rules' `decide` judges `verdict` against `f`; for an
        update only the one nearest by vector (a new value replaces one older statement of it)."""
        if not self.rows or self.z.shape[1] != vec.shape[0]:
            return []
        sims, order = self._nearest(vec)
        subject = str(f.get("subject") or "").lower()
        own = set(f.get("source_ids") or [])
        out: list[str] = []
        if verdict == "update":
            near = [j for j in order[:MESSAGE_NEIGHBOURS] if sims[j] >= MESSAGE_MIN_SIM]
            same = self.same_quantity(f)
        else:                                    # "never ..." sentences are rare: every older turn
            near, same = order, []
        cap = 1 if verdict == "update" else MAX_CONTRADICTED
        spent = 0                                # turns counted toward `cap`
        for j in sorted(dict.fromkeys(near + same), key=lambda j: -float(sims[j])):
            if spent >= cap:
                break
            m = self.rows[j]
            if m["message_id"] in own or str(m.get("speaker") or "").lower() != subject:
                continue
            if m["ts"].isoformat() >= since:
                continue
            back = (lambda m=m: history.of_turn(m)) if history is not None else None   # `replaced` only
            for sentence in sentences(j):
                found = decide(f, said(f.get("subject"), sentence, m["message_id"]), float(sims[j]), back)
                if found == "restatement":
                    return []        # the nearest holder of the value is restated: nothing farther replaced
                if found == verdict:
                    out.append(m["message_id"])
                    held = history.citing.get(m["message_id"], []) if history is not None else []
                    # an update's nearest turn whose values were all replaced already: the current
                    # value is in another older turn, which the update reaches too
                    spent += not (verdict == "update" and held and all(g.get("superseded_by") for g in held))
                    break
        return out             # a new value replaces one statement, the nearest; a denial a few

    def _nearest(self, vec: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Every turn's cosine to `vec` and the turns nearest first; kept for the last vector, which
        the next search often repeats (`replaced`, then `contradicted`, of one statement)."""
        key = vec.dtype.str.encode() + vec.tobytes()
        if self._near is None or self._near[0] != key:
            sims = self.z @ vec
            self._near = (key, sims, np.argsort(-sims).tolist())
        return self._near[1], self._near[2]


class History:
    """What each fragment and turn replaced, kept current while the planners link them: an update
    that gives back a value its older statement replaced is a restatement (rules' `restates`).
    Every link goes through it, closing a fragment through `close`, naming older turns through
    `link`, so `changes` counts them."""

    def __init__(self, frags: list[dict[str, Any]], turns: Turns | None = None) -> None:
        self.turns = turns
        #: links made so far (`close`, `link`): what a turn replaced can change with each, so a cached
        #: answer keys on it
        self.changes = 0
        self.closed_by: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.citing: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for f in frags:
            if f.get("superseded_by"):
                self.closed_by[str(f["superseded_by"])].append(f)
            for sid in f.get("source_ids") or []:
                self.citing[sid].append(f)

    def close(self, older: dict[str, Any], newer_id: str, since: str, version: str) -> None:
        """Close `older` (superseded by the fragment or message row `newer_id` from `since`)."""
        older.update(superseded_by=newer_id, valid_until=since, supersede_version=version)
        self.closed_by[newer_id].append(older)
        self.changes += 1

    def link(self, f: dict[str, Any], field: str, mids: list[str]) -> bool:
        """Add the turns `mids` that `f` does not name yet to its `field` (`replaces_sources`: the
        older turns it replaces, `contradicts_sources`: those it contradicts); True when any was new."""
        new = [m for m in mids if m not in (f.get(field) or [])]
        if not new:
            return False
        f[field] = list(f.get(field) or []) + new
        self.changes += 1
        return True

    def of_fragment(self, f: dict[str, Any]) -> list[dict[str, Any]]:
        """The statements `f` replaced: the fragments it closed and the turns it names."""
        out = list(self.closed_by.get(str(f.get("id")), []))
        if self.turns is not None:
            for mid in f.get("replaces_sources") or []:
                out += self.turns.statements(mid)
        return out

    def of_turn(self, m: dict[str, Any]) -> list[dict[str, Any]]:
        """The statements turn `m` (a message row) replaced, through its fragments or itself."""
        out = list(self.closed_by.get(str(m.get("id")), []))
        for f in self.citing.get(m["message_id"], []):
            out += self.of_fragment(f)
        return out


#: (newer message id, its sentence, the older message id, the field naming it: `replaces_sources` or
#: `contradicts_sources`): an update or a denial between two turns no fragment of which holds the
#: statement (`plan_turns`)
Unheld = tuple[str, str, str, str]


def plan_turns(frags: list[dict[str, Any]], todo: Iterable[str], turns: Turns,
               version: str = SUPERSEDE_VERSION, unheld: list[Unheld] | None = None) -> dict[str, dict[str, Any]]:
    """Turn against turn, for the statements extraction missed: each sentence of a `todo` turn
    (message ids) that gives a quantity a new value is compared with the older turns of its speaker
    (`Turns.replaced`), each "never ..." sentence likewise (`Turns.contradicted`). The link is kept
    on a fragment citing the newer turn (`replaces_sources` / `contradicts_sources`: the older
    turns); when the newer turn has none, on the older turn's fragments: one holding the replaced
    value is closed with `superseded_by` = the newer turn's message row (a memory too), one stating
    what the newer turn denies gets the newer turn in `contradicts_sources`; an update or a denial
    no fragment of either turn holds is appended to `unheld` (for `change_fragments`). Returns the
    changed fragments by id."""
    history = History(frags, turns)          # fresh: sees every link made so far on these fragments
    carriers = history.citing
    changed: dict[str, dict[str, Any]] = {}

    def add(f: dict[str, Any], field: str, ids: list[str]) -> None:
        if history.link(f, field, ids):
            f["supersede_version"] = version
            changed[f["id"]] = f

    for mid in dict.fromkeys(todo):
        j = turns.at.get(mid)
        if j is None:
            continue
        m, own = turns.rows[j], carriers.get(mid, [])
        since = m["ts"].isoformat()
        text = str(m.get("text") or "")
        for sentence in turns.split(j):
            probe = said(m.get("speaker"), sentence, mid)
            digits, never = any(c.isdigit() for c in sentence), says_never(probe)
            if not (digits or never) or not is_statement(probe):
                continue
            against = turns.contradicted(probe, turns.z[j], since) if never else []
            if never and own and _denies_itself(probe, text):
                against.append(mid)
            for verdict, found in (("update", turns.replaced(probe, turns.z[j], since, history) if digits else []),
                                   ("contradiction", against)):
                field = "replaces_sources" if verdict == "update" else "contradicts_sources"
                if own:
                    add(own[0], field, found)
                    continue
                for old in found:
                    # the two turns' cosine, as `Turns.replaced` judged them (v9; v8 passed 1.0, so no
                    # cosine gate applied to what the older turn's fragments hold)
                    sim = float(turns.z[turns.at[old]] @ turns.z[j]) if old in turns.at else 0.0
                    held = [g for g in carriers.get(old, []) if is_statement(g) and decide(probe, g, sim) == verdict]
                    orphan = not held if verdict == "update" else not carriers.get(old)
                    if orphan and unheld is not None:
                        unheld.append((mid, sentence, old, field))
                    if verdict == "update" and m.get("id"):
                        for g in held:
                            if not g.get("superseded_by"):
                                history.close(g, m["id"], since, version)
                                changed[g["id"]] = g
                    elif verdict == "contradiction" and (held or carriers.get(old)):
                        add((held or carriers[old])[0], field, [mid])
    return changed


def _denies_itself(probe: dict[str, Any], text: str) -> bool:
    """A "never ..." sentence whose own turn states what it denies in another clause ("I've never
    done X, but I recently did X"): the turn contradicts itself."""
    clauses = [(c, says_never({"content": c})) for c in re.split(r"[.!?;]\s+|,?\s+but\s+", text) if c.strip()]
    denial = [c for c, never in clauses if never]
    stated = [c for c, never in clauses if not never and is_statement({"content": c})]
    return any(contradiction({**probe, "content": d}, {**probe, "content": c})
               for d in denial if is_statement({"content": d}) for c in stated)
