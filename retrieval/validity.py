"""What is current (issue 12): the ordering the retriever applies after any strategy, and the
history and contradictions `context()` shows.

A returned memory that holds a replaced statement keeps its place in the ranking but a newer version
is put right above it, pulled in from lower down or from outside the result. A memory holds a
replaced statement when it is a fragment closed by a newer one (`superseded_by`, written by the
supersede stage; the newer one may be a turn's message row), or it cites a message that such a
fragment cites, or one that a newer fragment names in `replaces_sources`. The version put above it
is the one of its newer versions (the `superseded_by` chain up to the current one; for a turn, also
the turns they cite; of the searched kinds only) the query matches best: a rule can link a wrong
successor, and the query decides which newer version it asks about. A version put above that is
itself replaced gets its own replacement above it in turn when the query matches that one at least
`CURRENT_SHARE` as well (`newer_chain`): an intermediate version does not stand in
for the current value, and an unrelated end of a wrongly linked chain stays out. For a turn or a memory citing one it
moves only when the query matches it about as well (cosine within `RELEVANCE_MARGIN`) or at least as
well as the result's least similar memory (a turn says many things; only the changed one should move), a
version not in the result is pulled in only for a replaced memory in the top `PULL_DEPTH` of the k,
and a version whose turns a memory above already cites is not moved at all (the replaced memory
already ranks below them; a copy would only push an answer out of the k). A query that asks what held
before a change (`asks_history`: "at the start", "originally", "what did I first say") moves no newer
version: the replaced memory is its answer (issue 12: the history stays retrievable).

A fragment that contradicts another (`contradicts`, either side; for a message, the fragment of it
the query matches best; `contradicts_sources`: the fragment and its turns against the other turn)
gets its counterpart right below it: of several, one already in the result, else the one the query
matches best if it matches at least as well as the result's least similar memory. Both then reach
the answering model and context flags them: a memory shows up to `MAX_SHOWN_CONTRADICTIONS`
counterparts, its fragment-to-fragment one or one citing its own turns first (a turn that denies what
it states), then those in the result. The result keeps `k` items: what is pulled in pushes the tail
out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory.lexicon import SAYING, alternation
from retrieval.index import FRAGMENT_VALIDITY, VALIDITY_READ, UserIndex

__all__ = ["Validity", "validity_of", "order_current", "annotate", "asks_history", "MAX_CHAIN", "RELEVANCE_MARGIN", "PULL_DEPTH",
           "MAX_SHOWN_CONTRADICTIONS", "newer_chain", "CURRENT_SHARE"]

#: superseded_by links followed to find the current version (a guard against cycles)
MAX_CHAIN = 16
#: a current version is pulled above a memory when cos(query, it) >= cos(query, memory) - this
RELEVANCE_MARGIN = 0.0
#: a version put above a replaced memory, itself replaced, gets its own replacement above it when the
#: query matches that one at least this share as well (cosine ratio): the current value of the chain;
#: below it the link is taken for a wrong one (a rule linked an unrelated memory: cosine ratio 0.03 in
#: the tests, a right one 0.88)
CURRENT_SHARE = 1 / 3
#: float32 noise between two products giving one cosine (a row against itself must pass its own floor)
SIM_TOLERANCE = 1e-5
#: a newer version is pulled in from outside the result only for a replaced memory in this top share
#: of the k (what is pulled in pushes the tail out; a replaced memory at the tail is marginal)
PULL_DEPTH = 0.5
#: counterparts one memory shows in context (`contradiction`, then `also_contradicts`)
MAX_SHOWN_CONTRADICTIONS = 3
#: a query about what was said before a change ("what did I say at the start?", "originally", "used to")
_HISTORY_RE = re.compile(
    r"\b(?:at\s+the\s+(?:start|beginning|outset)(?!\s+of\s+(?:each|every|the\s+(?:day|week|month|year)))|"
    r"at\s+first(?!\s+(?:light|sight|glance))|initially|original(?:ly)?|used\s+to|"
    r"before\s+I\s+(?:changed|updated|switched|moved|raised|lowered|adjusted|revised)|"
    r"first\s+(?:" + alternation([f for v in ("say", "mention", "tell", "state") for f in (v, SAYING[v][1])]
                                  + ["plan", "planned", "set"]) + r"))\b", re.IGNORECASE)
#: "used to" as "employed for" ("which library have I used to parse ..."), not "formerly"
_USED_FOR_RE = re.compile(r"\b(?:have|has|had|was|were|is|are|be|been|being)\s+(?:\w+\s+)?used\s+to\s*$",
                          re.IGNORECASE)


def asks_history(text: str | None) -> bool:
    """Does the query ask what held before a change ("... at the start?", "originally", "used to")?
    Then the replaced memory is the answer: no newer version is put above it (`order_current`)."""
    text = text or ""
    for m in _HISTORY_RE.finditer(text):
        if not (m.group(0).lower().startswith("used") and _USED_FOR_RE.search(text[:m.end()])):
            return True
    return False


@dataclass
class Validity:
    """One user's validity facts at an index's snapshot (fragments with an event only)."""

    superseded_by: dict[str, str] = field(default_factory=dict)
    replaces: dict[str, list[str]] = field(default_factory=dict)     # newer id -> older ids
    contradicts: dict[str, str] = field(default_factory=dict)        # both directions
    valid_from: dict[str, str] = field(default_factory=dict)
    valid_until: dict[str, str] = field(default_factory=dict)
    #: message id -> index rows of the fragments citing it (messages an eventful fragment cites or
    #: names in `replaces_sources`)
    by_message: dict[str, list[int]] = field(default_factory=dict)
    #: message id -> fragments whose statement replaced one of it (superseded fragments' sources and
    #: `replaces_sources`)
    replaced_in: dict[str, list[str]] = field(default_factory=dict)
    #: memory id (a fragment, or a message's row) -> the memory ids it contradicts, either side, for
    #: contradictions with a turn (`contradicts_sources`: the fragment and the turns it cites against
    #: that turn)
    against: dict[str, list[str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.superseded_by and not self.contradicts and not self.replaced_in and not self.against

    def newer(self, memory_id: str) -> list[str]:
        """The `superseded_by` chain after `memory_id`: its replacement, that one's, ... the current."""
        out: list[str] = []
        cur = memory_id
        for _ in range(MAX_CHAIN):
            cur = self.superseded_by.get(cur, "")
            if not cur or cur == memory_id or cur in out:
                break
            out.append(cur)
        return out

    def history(self, memory_id: str) -> list[str]:
        """The ids `memory_id` replaced, newest first, transitively."""
        out: list[str] = []
        todo = list(self.replaces.get(memory_id, []))
        while todo and len(out) < MAX_CHAIN:
            old = todo.pop(0)
            if old not in out and old != memory_id:
                out.append(old)
                todo += self.replaces.get(old, [])
        return out


def _load(index: UserIndex) -> Validity:
    v = Validity()
    store = index.store
    if store is None or not store.has_table("fragments"):
        return v
    t = index.memo(FRAGMENT_VALIDITY, lambda: store.read("fragments", index.user_id, columns=VALIDITY_READ,
                                                         version=index.version_of("fragments")))
    if t.num_rows == 0:
        return v
    def listed(name: str) -> Any:
        return pc.greater(pc.fill_null(pc.list_value_length(t.column(name)), 0), 0)

    mask = pc.or_(pc.or_(pc.is_valid(t.column("superseded_by")), pc.is_valid(t.column("contradicts"))),
                  pc.or_(listed("replaces_sources"), listed("contradicts_sources")))
    targets = pc.unique(t.column("superseded_by").drop_null())
    events = t.filter(mask)
    current = t.filter(pc.is_in(t.column("id"), value_set=targets.combine_chunks()
                                if isinstance(targets, pa.ChunkedArray) else targets))
    for fid, since in zip(current.column("id").to_pylist(), current.column("valid_from").to_pylist()):
        if since:
            v.valid_from[fid] = since
    cited: set[str] = set()
    for r in events.to_pylist():
        fid = r["id"]
        if r["superseded_by"]:
            v.superseded_by[fid] = r["superseded_by"]
            v.replaces.setdefault(r["superseded_by"], []).append(fid)
            v.valid_until[fid] = r["valid_until"] or ""
            for s in r["source_ids"] or []:
                v.replaced_in.setdefault(s, []).append(r["superseded_by"])
        for s in r["replaces_sources"] or []:
            v.replaced_in.setdefault(s, []).append(fid)
            cited.add(s)
        if r["contradicts_sources"]:
            turns = index.turn_rows()
            own = [str(index.meta.column("id")[turns[s]].as_py()) for s in r["source_ids"] or [] if s in turns]
            for s in r["contradicts_sources"]:
                if s in turns:
                    mid = str(index.meta.column("id")[turns[s]].as_py())
                    for a in [fid] + [o for o in own if o != mid]:   # the fragment, and its own turns
                        v.against.setdefault(a, []).append(mid)
                        v.against.setdefault(mid, []).append(a)
        if r["contradicts"]:
            v.contradicts.setdefault(fid, r["contradicts"])
            v.contradicts.setdefault(r["contradicts"], fid)
        if r["valid_from"]:
            v.valid_from[fid] = r["valid_from"]
        cited.update(r["source_ids"] or [])
    if cited:
        meta = index.meta
        frag_rows = np.flatnonzero(index.kinds == "fragment")
        sources = meta.column("source_ids").take(pa.array(frag_rows, type=pa.int64())).to_pylist()
        for row, srcs in zip(frag_rows.tolist(), sources):
            for s in srcs or []:
                if s in cited:
                    v.by_message.setdefault(s, []).append(row)
    return v


def validity_of(index: UserIndex) -> Validity:
    """The user's validity facts, read once per index (memoized)."""
    return index.memo("validity", lambda: _load(index))


def _eventful(v: Validity, memory_id: str) -> bool:
    return memory_id in v.superseded_by or memory_id in v.contradicts or memory_id in v.against


def effective(index: UserIndex, v: Validity, row: int, vec: np.ndarray, ids: list[str | None],
              sources: list[list[str]]) -> str | None:
    """The fragment id a ranked row stands for: itself for a fragment, for a message the fragment
    citing it that best matches the query (None when that one has no validity event)."""
    kind = str(index.kinds[row])
    if kind == "fragment":
        fid = ids[0]
        return fid if fid is not None and _eventful(v, fid) else None
    if kind != "message":
        return None
    rows = [r for s in sources[0] for r in v.by_message.get(s, [])]
    if not rows:
        return None
    sims = index.z[np.asarray(rows, dtype=np.int64)] @ vec
    best = index.meta.column("id")[rows[int(np.argmax(sims))]].as_py()
    return best if _eventful(v, best) else None


def replacement(index: UserIndex, v: Validity, row: int, vec: np.ndarray, memory_id: str | None,
                sources: list[str], row_of: dict[str, int], row_sim: float, floor: float = 1.0,
                kinds: tuple[str, ...] | None = None) -> int | None:
    """The index row of the current version to put above `row`, if any (see the module doc);
    `row_sim`: the query cosine of `row`; `floor`: that of the result's least similar memory (a
    newer version that matches the query at least that well earns its place on its own); `kinds`:
    the searched kinds (None: all), the only ones a version is chosen among."""
    closed = memory_id is not None and memory_id in v.superseded_by
    found = v.newer(memory_id) if closed and memory_id is not None else []
    for s in sources:
        for n in v.replaced_in.get(s, []):
            found += [n] + v.newer(n)
    rows = [row_of[f] for f in dict.fromkeys(found) if f != memory_id and f in row_of]
    turns = index.turn_rows()                      # the newer turns those fragments cite compete too
    cited = index.meta.column("source_ids").take(pa.array(rows, type=pa.int64())).to_pylist() \
        if rows and not closed else []           # (a closed fragment gets a fragment, with its history)
    rows += [turns[c] for cs in cited for c in cs or [] if c in turns and c not in sources]
    rows = [r for r in dict.fromkeys(rows) if r != row and (kinds is None or str(index.kinds[r]) in kinds)]
    if not rows:
        return None
    sims = index.z[np.asarray(rows, dtype=np.int64)] @ vec
    best = int(np.argmax(sims))
    if not closed and sims[best] < min(row_sim - RELEVANCE_MARGIN, floor) - SIM_TOLERANCE:
        return None
    return rows[best]


def newer_chain(index: UserIndex, v: Validity, row: int, vec: np.ndarray, memory_id: str | None,
                sources: list[str], row_of: dict[str, int], row_sim: float, floor: float,
                kinds: tuple[str, ...] | None) -> list[int]:
    """The versions to put above `row`, newest first: its `replacement` and, while the version put
    is itself replaced, that one's replacement in turn when the query matches it at least
    `CURRENT_SHARE` as well (a current value, not only a closer stale one; an unrelated end of a
    wrongly linked chain stays out). At most `MAX_CHAIN`."""
    chain: list[int] = []
    crow = replacement(index, v, row, vec, memory_id, sources, row_of, row_sim, floor, kinds)
    while crow is not None and crow != row and crow not in chain and len(chain) < MAX_CHAIN:
        chain.append(crow)
        cid = index.meta.column("id")[crow].as_py()
        sim = float(index.z[crow] @ vec)
        crow = replacement(index, v, crow, vec, cid, index.source_ids(crow), row_of, sim, floor, kinds)
        if crow is not None and float(index.z[crow] @ vec) < CURRENT_SHARE * sim:
            break
    return chain[::-1]


def order_current(index: UserIndex, rows: np.ndarray, scores: np.ndarray, vec: np.ndarray,
                  k: int, history: bool = False,
                  kinds: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The strategy's ranking with current versions above superseded ones and contradicting pairs
    together (see the module doc), cut to `k`; plus signals (how many were moved or pulled in).
    With `history` (the query asks what held before: `asks_history`) no newer version is moved; with
    `kinds` (those the query searched) no memory of another kind is pulled in."""
    v = validity_of(index)
    if v.empty or rows.size == 0:
        return rows, scores, {}
    kind_of = index.meta.column("kind")

    def searched(row: int) -> bool:
        return kinds is None or kind_of[row].as_py() in kinds

    row_of = index.row_of_id()
    taken = pa.array(rows, type=pa.int64())
    ids = index.meta.column("id").take(taken).to_pylist()
    sources = index.meta.column("source_ids").take(taken).to_pylist()
    out: list[tuple[int, float]] = []
    placed: set[int] = set()
    above: set[str] = set()                  # the turns the rows placed so far cite
    pulled = paired = 0
    row_sims = (index.z[rows] @ vec).tolist()
    floor = min(row_sims)
    taken_rows = set(rows.tolist())
    for i, (row, score) in enumerate(zip(rows.tolist(), scores.tolist())):
        if row in placed:
            continue
        chain = [] if history else newer_chain(index, v, row, vec, ids[i], sources[i] or [], row_of,
                                               row_sims[i], floor, kinds)
        for crow in chain:
            if crow not in placed and (crow in taken_rows or i < k * PULL_DEPTH) and searched(crow):
                cites = set(index.source_ids(crow))
                if not cites <= above:          # its turns already ranked above: nothing to add
                    out.append((crow, score))
                    placed.add(crow)
                    above.update(cites)
                    pulled += 1
        fid = effective(index, v, row, vec, ids[i:i + 1], sources[i:i + 1])
        out.append((row, score))
        placed.add(row)
        above.update(sources[i] or [])
        others = [v.contradicts[fid]] if fid is not None and fid in v.contradicts else []
        for mid in (ids[i], fid):
            others += v.against.get(mid or "", [])
        orows = [row_of[o] for o in dict.fromkeys(others)
                 if o in row_of and row_of[o] not in placed and searched(row_of[o])]
        inside = [o for o in orows if o in taken_rows]           # a counterpart already returned first
        sims = index.z[np.asarray(inside or orows, dtype=np.int64)] @ vec if orows else np.zeros(0)
        if orows and (inside or float(sims.max()) >= floor):
            best = (inside or orows)[int(np.argmax(sims))]
            out.append((best, score))
            placed.add(best)
            above.update(index.source_ids(best))
            paired += 1
    out = out[:k]
    signals = {"validity": {"current_pulled": pulled, "contradictions_paired": paired}}
    return (np.asarray([r for r, _ in out], dtype=np.int64),
            np.asarray([s for _, s in out], dtype=np.float32), signals)


def annotate(index: UserIndex, memory_id: str, texts: dict[str, tuple[str, str]],
             returned: Collection[str] = ()) -> dict[str, Any]:
    """Validity fields of one returned memory for `RetrievedItem`: valid_from/until, superseded_by,
    the versions it replaced (`history`: text and date, newest first) and the memory it
    contradicts (`contradiction`; of several, one among the `returned` ids if any) and, for a turn
    or a memory restating turns a newer memory replaced a value of, that memory's current version
    (`updated_by`). `texts` caches id -> (text, date) lookups."""
    v = validity_of(index)
    if v.empty:
        return {}
    row_of = index.row_of_id()

    def look(mid: str) -> dict[str, str] | None:
        if mid not in texts:
            r = row_of.get(mid)
            if r is None:
                return None
            row = index.rows(np.asarray([r], dtype=np.int64))[0]
            texts[mid] = (row["text"] or "", v.valid_from.get(mid) or row["date"] or "")
        text, date = texts[mid]
        return {"id": mid, "text": text, "date": date[:10]}

    out: dict[str, Any] = {}
    if memory_id in v.valid_from:
        out["valid_from"] = v.valid_from[memory_id]
    if memory_id in v.superseded_by:
        out["superseded_by"] = v.superseded_by[memory_id]
        out["valid_until"] = v.valid_until.get(memory_id)
    if memory_id not in v.superseded_by and (current := _current_of_sources(index, v, memory_id, row_of)):
        out["updated_by"] = look(current)
    history = [h for h in (look(m) for m in v.history(memory_id)) if h is not None]
    if history:
        out["history"] = history
    others = v.against.get(memory_id, [])
    first = v.contradicts.get(memory_id) or _same_turn(index, memory_id, others, row_of)
    order = ([first] if first else []) + [o for o in others if o in returned] + others
    found = (c for c in (look(o) for o in dict.fromkeys(order)) if c is not None)
    shown = list(islice(found, MAX_SHOWN_CONTRADICTIONS))   # rows read only for the counterparts shown
    if shown:
        out["contradiction"] = shown[0]
    if len(shown) > 1:
        out["also_contradicts"] = shown[1:]
    return out


def _current_of_sources(index: UserIndex, v: Validity, memory_id: str, row_of: dict[str, int]) -> str | None:
    """For a raw turn a newer memory replaced a value of (`replaced_in`), or an insight, topic or
    summary citing such a turn, the current version of that memory, the newest by `valid_from` if
    several: a replaced fragment says so, its turn and what restates it did not."""
    r = row_of.get(memory_id)
    if r is None or index.kinds[r] == "fragment":   # a fragment has its own `superseded_by`
        return None
    found = [([f] + v.newer(f))[-1] for s in index.source_ids(r) for f in v.replaced_in.get(s, [])]
    return max(found, key=lambda f: (v.valid_from.get(f) or "", f), default=None)


def _same_turn(index: UserIndex, memory_id: str, others: list[str], row_of: dict[str, int]) -> str | None:
    """Of the memories `memory_id` contradicts, one citing the same turns (a turn that denies what it
    states, "I've never done X, but I recently did X", against its own fragment): shown first, the
    plainest contradiction there is."""
    if not others or memory_id not in row_of:
        return None
    mine = set(index.source_ids(row_of[memory_id]))
    return next((o for o in others if mine and o in row_of and set(index.source_ids(row_of[o])) == mine), None)
