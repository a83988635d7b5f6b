"""The supersede stage (PREMem's *transformation*, acted on): a new fragment that gives a new value to
an older fragment of the same user and subject closes it (`valid_until` = the new one's time,
`superseded_by` = its id); one that contradicts an older one without replacing it records the older
id in `contradicts`. Nothing is deleted.

Candidates, never all pairs: for each new fragment, the `NEIGHBOURS` nearest stored or new fragments
of the user by vector (cosine >= `MIN_SIM`), the fragments with the same subject and key, and those
holding the same quantity (an inverted index from a quantity's unit and context words, see
`memory.llm.rules.supersede`), at most `MAX_CANDIDATES`. With the `rules` backend the rule decides
here; LLM backends decide in the reason stage (a transformation insight names the fragments it
supersedes), so this stage then only stamps `valid_from`. A late fragment older than a stored one it
changes is itself closed by the stored one.

Turns (`Turns`, `plan_turns`): statements extraction missed are compared turn against turn, the
user's turns only (not `RetrievalSettings.assistant_speakers`'); a newer turn with no fragment
keeps its link on the older turn's fragment (closed with `superseded_by` = the newer turn's message
row, or given the newer turn in `contradicts_sources`). When neither turn has a fragment holding the
statement (both said it inside a question: "can you remind me it's moved to 4:30 PM?", "I've never
met Bryan, can you help me say so?"), the stage makes a *change fragment* of the newer turn's sentence
(`change_fragments`) that carries the link in `replaces_sources` or `contradicts_sources`: without a
row, nothing could say the older turn is out of date or denied.

`supersede_user` runs the same decisions on an already consolidated store for one user (fragments
never examined, `supersede_version` null, or decided by an older rules version), writing the
changed rows: idempotent.
"""
from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory.llm.rules.supersede import (SUPERSEDE_VERSION, Quantity, decide, is_statement,
                                         quantities, says_never)
from memory.settings import RetrievalSettings
from memory.dates import normalize_date, to_date
from memory.stages.extract import fragment_row
from memory.stages.shard import SessionWork, ShardState, StageContext, add_rows, has_stored, timed
from memory.store import Store
from memory.text import categorize, key_phrase, split_sentences, third_person

__all__ = ["supersede", "supersede_user", "plan", "plan_turns", "change_fragments", "Unheld", "NEIGHBOURS",
           "MIN_SIM", "MAX_CANDIDATES"]

#: how the rules' versions start (`SUPERSEDE_VERSION`); LLM prompt versions are never re-decided here
RULES_PREFIX = "rules-supersede-"
#: vector neighbours examined per new fragment
NEIGHBOURS = 8
#: cosine under which a vector neighbour is not a candidate
MIN_SIM = 0.5
#: candidates examined per new fragment (vector, key and quantity candidates together)
MAX_CANDIDATES = 32
#: older turns of the fragment's subject searched for a statement extraction missed (by cosine)
MESSAGE_NEIGHBOURS = 8
MESSAGE_MIN_SIM = 0.4
#: older turns one "never ..." statement is recorded against (the nearest by vector)
MAX_CONTRADICTED = 3
#: sentences of one turn read for a contradiction (its opening: where a turn states its situation)
MAX_SENTENCES = 4


def when(row: dict[str, Any], message_ts: dict[str, datetime]) -> str:
    """A fragment's time (ISO 8601): `valid_from` if set, else its newest source message's time,
    else its session's."""
    if row.get("valid_from"):
        return str(row["valid_from"])
    times = [message_ts[s] for s in row.get("source_ids") or [] if s in message_ts]
    ts = max(times) if times else row.get("session_ts")
    return ts.isoformat() if isinstance(ts, datetime) else str(ts or "")


def _candidates(i: int, z: np.ndarray, keys: dict[tuple[str, str], list[int]],
                qindex: dict[tuple[str, str], list[int]], frags: list[dict[str, Any]],
                qs: list[list[Any]]) -> dict[int, float]:
    """Candidate positions for fragment i with their cosine (see the module doc)."""
    sims = z @ z[i]
    out: dict[int, float] = {}
    n = min(NEIGHBOURS + 1, sims.size)
    top = np.argpartition(-sims, n - 1)[:n]
    for j in top.tolist():
        if j != i and sims[j] >= MIN_SIM:
            out[j] = float(sims[j])
    f = frags[i]
    for j in keys.get((str(f.get("subject") or "").lower(), str(f.get("key") or "").lower()), []):
        if j != i:
            out.setdefault(j, float(sims[j]))
    hits: dict[int, int] = defaultdict(int)
    for q in qs[i]:
        for word in q.context:
            for j in qindex.get((q.unit, word), []):
                hits[j] += 1
    for j, n in sorted(hits.items(), key=lambda kv: -kv[1]):
        if j != i and n >= 2:
            out.setdefault(j, float(sims[j]))
    best = sorted(out.items(), key=lambda kv: -kv[1])[:MAX_CANDIDATES]
    return dict(best)


class Turns:
    """One user's turns with vectors, searched for older statements of a fragment's subject that
    no fragment holds (extraction missed them): a changed quantity there is recorded on the newer
    fragment as `replaces_sources`. Candidates are the nearest turns by vector and the turns with
    a sentence holding the same quantity (an inverted index over their sentences' quantities, like
    the fragments'): a turn that mostly holds code or another topic is still found."""

    def __init__(self, rows: list[dict[str, Any]], skip: Iterable[str] = ()) -> None:
        voices = {v.lower() for v in skip}       # assistants' turns: not the user's facts, never searched
        rows = [m for m in rows if m.get("vector") is not None and m.get("ts") is not None
                and str(m.get("speaker") or "").lower() not in voices]
        self.rows = rows
        self.z = np.stack([np.asarray(m["vector"], dtype=np.float32) for m in rows]) if rows else \
            np.zeros((0, 1), dtype=np.float32)
        self._sentences: dict[int, list[str]] = {}
        self._openings: dict[int, list[str]] = {}
        self._qindex: dict[tuple[str, str], set[int]] | None = None

    def same_quantity(self, f: dict[str, Any]) -> list[int]:
        """Turns (positions) with a sentence sharing at least two (unit, context word) keys with a
        quantity of `f`, most shared first."""
        if self._qindex is None:
            self._qindex = defaultdict(set)
            for j in range(len(self.rows)):
                for sentence in self.sentences(j):
                    for q in quantities(sentence):
                        for word in q.context:
                            self._qindex[(q.unit, word)].add(j)
        hits: dict[int, int] = defaultdict(int)
        for q in quantities(str(f.get("content") or "")):
            units = {q.unit} | ({w for w in q.context} if not q.unit else set())
            for word in q.context:
                for unit in units:
                    for j in self._qindex.get((unit, word), ()):
                        hits[j] += 1
        return [j for j, n in sorted(hits.items(), key=lambda kv: -kv[1]) if n >= 2][:MAX_CANDIDATES]

    def sentences(self, j: int) -> list[str]:
        """The statements of turn j that hold a number (cached)."""
        if j not in self._sentences:
            text = str(self.rows[j].get("text") or "")
            self._sentences[j] = [s for s in split_sentences(text) if any(c.isdigit() for c in s)
                                  and is_statement({"content": s})]
        return self._sentences[j]

    def openings(self, j: int) -> list[str]:
        """The first `MAX_SENTENCES` sentences of turn j, where a turn states its situation (cached)."""
        if j not in self._openings:
            self._openings[j] = split_sentences(str(self.rows[j].get("text") or ""))[:MAX_SENTENCES]
        return self._openings[j]

    def replaced(self, f: dict[str, Any], vec: np.ndarray, since: str) -> list[str]:
        """Message ids of older turns of `f`'s subject with a quantity `f` gives a new value; only
        for a statement that gives a quantity a new value (`decide`): no fragment backs the turn."""
        if not is_statement(f) or not quantities(str(f.get("content") or "")):
            return []                       # `decide` asks a change cue of unitless numbers and dates
        return self._older_turns(f, vec, since, "update", self.sentences)

    def contradicted(self, f: dict[str, Any], vec: np.ndarray, since: str) -> list[str]:
        """Message ids of older turns of `f`'s subject with a statement `f` contradicts (rules'
        `contradiction`: `f` says "never ..." of what the turn states)."""
        if not is_statement(f) or not says_never(f):
            return []
        return self._older_turns(f, vec, since, "contradiction", self.openings)

    def _older_turns(self, f: dict[str, Any], vec: np.ndarray, since: str, verdict: str,
                     sentences: Callable[[int], list[str]]) -> list[str]:
        """Message ids of the turns nearest `f` (same speaker as its subject, older than `since`, not
        its own sources) one of whose `sentences` rules' `decide` judges `verdict` against `f`; for an
        update only the one nearest by vector (a new value replaces one older statement of it)."""
        if not self.rows or self.z.shape[1] != vec.shape[0]:
            return []
        sims = self.z @ vec
        subject = str(f.get("subject") or "").lower()
        own = set(f.get("source_ids") or [])
        out: list[str] = []
        order = np.argsort(-sims).tolist()
        if verdict == "update":
            near = [j for j in order[:MESSAGE_NEIGHBOURS] if sims[j] >= MESSAGE_MIN_SIM]
            same = self.same_quantity(f)
        else:                                    # "never ..." sentences are rare: every older turn
            near, same = order, []
        cap = 1 if verdict == "update" else MAX_CONTRADICTED
        for j in sorted(dict.fromkeys(near + same), key=lambda j: -float(sims[j])):
            if len(out) >= cap:
                break
            m = self.rows[j]
            if m["message_id"] in own or str(m.get("speaker") or "").lower() != subject:
                continue
            if m["ts"].isoformat() >= since:
                continue
            for sentence in sentences(j):
                old = {"subject": f.get("subject"), "key": "", "content": sentence, "source_ids": [m["message_id"]]}
                if decide(f, old, float(sims[j])) == verdict:
                    out.append(m["message_id"])
                    break
        return out             # a new value replaces one statement, the nearest; a denial a few


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
    carriers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in frags:
        for sid in f.get("source_ids") or []:
            carriers[sid].append(f)
    at = {m["message_id"]: j for j, m in enumerate(turns.rows)}
    changed: dict[str, dict[str, Any]] = {}

    def add(f: dict[str, Any], field: str, ids: list[str]) -> None:
        new = [i for i in ids if i not in (f.get(field) or [])]
        if new:
            f[field] = list(f.get(field) or []) + new
            f["supersede_version"] = version
            changed[f["id"]] = f

    for mid in dict.fromkeys(todo):
        j = at.get(mid)
        if j is None:
            continue
        m, own = turns.rows[j], carriers.get(mid, [])
        since = m["ts"].isoformat()
        text = str(m.get("text") or "")
        for sentence in split_sentences(text):
            probe = {"subject": m.get("speaker"), "key": "", "content": sentence, "source_ids": [mid]}
            digits, never = any(c.isdigit() for c in sentence), says_never(probe)
            if not (digits or never) or not is_statement(probe):
                continue
            against = turns.contradicted(probe, turns.z[j], since) if never else []
            if never and own and _denies_itself(probe, text):
                against.append(mid)
            for verdict, found in (("update", turns.replaced(probe, turns.z[j], since) if digits else []),
                                   ("contradiction", against)):
                field = "replaces_sources" if verdict == "update" else "contradicts_sources"
                if own:
                    add(own[0], field, found)
                    continue
                for old in found:
                    held = [g for g in carriers.get(old, []) if is_statement(g) and decide(probe, g, 1.0) == verdict]
                    orphan = not held if verdict == "update" else not carriers.get(old)
                    if orphan and unheld is not None and (mid, sentence, old, field) not in unheld:
                        unheld.append((mid, sentence, old, field))
                    if verdict == "update" and m.get("id"):
                        for g in held:
                            if not g.get("superseded_by"):
                                g.update(superseded_by=m["id"], valid_until=since, supersede_version=version)
                                changed[g["id"]] = g
                    elif verdict == "contradiction" and (held or carriers.get(old)):
                        add((held or carriers[old])[0], field, [mid])
    return changed


def _denies_itself(probe: dict[str, Any], text: str) -> bool:
    """A "never ..." sentence whose own turn states what it denies in another clause ("I've never
    done X, but I recently did X"): the turn contradicts itself."""
    clauses = [c for c in re.split(r"[.!?;]\s+|,?\s+but\s+", text) if c.strip()]
    denial = [c for c in clauses if says_never({"content": c})]
    return any(decide({**probe, "content": d}, {**probe, "content": c, "source_ids": []}, 1.0) == "contradiction"
               for d in denial for c in clauses if c is not d and not says_never({"content": c}))


def plan(frags: list[dict[str, Any]], todo: Iterable[str], message_ts: dict[str, datetime], *,
         version: str = SUPERSEDE_VERSION, decide_rules: bool = True,
         turns: Turns | None = None) -> dict[str, dict[str, Any]]:
    """Decide for every fragment of `todo` (ids among `frags`, one user's fragments with vectors)
    against its candidates, in time order, and (with `turns`) against older turns no fragment
    covers; mutates the rows and returns the changed ones by id."""
    if not frags:
        return {}
    z = np.stack([np.asarray(f["vector"], dtype=np.float32) for f in frags])
    z = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    times = [when(f, message_ts) for f in frags]
    pos = {f["id"]: i for i, f in enumerate(frags)}
    keys: dict[tuple[str, str], list[int]] = defaultdict(list)
    qindex: dict[tuple[str, str], list[int]] = defaultdict(list)
    qs: list[list[Quantity]] = []
    statement = [is_statement(f) for f in frags]   # the rules compare statements only: skip code lines
    for i, f in enumerate(frags):
        if not statement[i]:
            qs.append([])
            continue
        keys[(str(f.get("subject") or "").lower(), str(f.get("key") or "").lower())].append(i)
        found = quantities(f"{f.get('key') or ''}: {f.get('content') or ''}") if decide_rules else []
        qs.append(found)
        for q in found:
            for word in q.context:
                qindex[(q.unit, word)].append(i)
    changed: dict[str, dict[str, Any]] = {}
    order = sorted({pos[t] for t in todo if t in pos}, key=lambda i: times[i])
    for i in order:
        f = frags[i]
        if not f.get("valid_from"):
            f["valid_from"] = times[i]
        f["supersede_version"] = version
        changed[f["id"]] = f
        if not decide_rules or not statement[i]:
            continue
        updated = False
        for j, sim in _candidates(i, z, keys, qindex, frags, qs).items():
            if f.get("superseded_by"):
                break                                   # closed by a newer stored fragment
            c = frags[j]
            if c.get("superseded_by") or not statement[j]:
                continue                                # history: only current fragments change
            newer, older = (f, c) if times[j] <= times[i] else (c, f)
            verdict = decide(newer, older, sim)
            if verdict == "update":
                updated = updated or newer is f
                older["valid_until"] = when(newer, message_ts)
                older["superseded_by"] = newer["id"]
                older["supersede_version"] = version
                changed[older["id"]] = older
            elif verdict == "contradiction" and not newer.get("contradicts"):
                newer["contradicts"] = older["id"]
                changed[newer["id"]] = newer
        if turns is not None and not updated and not f.get("superseded_by"):
            turned = turns.replaced(f, z[i], times[i])
            if turned:
                f["replaces_sources"] = turned
        if turns is not None:
            against = turns.contradicted(f, z[i], times[i])
            if against:
                f["contradicts_sources"] = against
    return changed


def _turns(store: Store, user: str, extra: Iterable[dict[str, Any]] = (),
           skip: Iterable[str] = (), vectors: bool = True) -> tuple[dict[str, datetime], Turns]:
    """The user's message times and turns with vectors (stored, then `extra`, the shard's), but
    not the turns of the `skip` speakers (`RetrievalSettings.assistant_speakers`); with `vectors`
    False only the times are read (LLM backends decide without the turns)."""
    rows: dict[str, dict[str, Any]] = {}
    if store.has_table("messages"):
        cols = ["id", "message_id", "speaker", "text", "ts", "vector"] if vectors else ["message_id", "ts"]
        rows = {m["message_id"]: m for m in store.read("messages", user, columns=cols).to_pylist()}
    for m in extra:
        if m.get("ts") is not None:
            rows[m["message_id"]] = {**rows.get(m["message_id"], {}), **m}
    times = {k: m["ts"] for k, m in rows.items() if m.get("ts") is not None}
    return times, Turns(list(rows.values()) if vectors else [], skip)


def _stored(store: Store, user: str, exclude: set[str]) -> list[dict[str, Any]]:
    if not store.has_table("fragments"):
        return []
    t = store.read("fragments", user)
    if exclude and t.num_rows:
        t = t.filter(pc.invert(pc.is_in(t.column("id"), value_set=pa.array(sorted(exclude)))))
    return [r for r in t.to_pylist() if r.get("vector") is not None]


def supersede(state: ShardState, ctx: StageContext) -> ShardState:
    """Close the stored (or new) fragments the shard's new fragments replace; flag contradictions."""
    with timed(state, "supersede"):
        rules = ctx.settings.llm == "rules"
        by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for f in state.fragments:
            if f.get("vector") is not None:
                by_user[f["user_id"]].append(f)
        for user, new in by_user.items():
            ids = {f["id"] for f in new}
            stored = _stored(ctx.store, user, ids) if has_stored(state, user) else []
            msgs = [m for m in state.message_rows if m["user_id"] == user]
            for s in state.sessions:
                if s.user_id == user:
                    msgs += s.messages
            message_ts, turns = _turns(ctx.store, user, msgs, ctx.settings.retrieval.assistant_speakers,
                                       vectors=rules)
            changed = plan(stored + new, ids, message_ts, decide_rules=rules, turns=turns if rules else None)
            if rules:
                unheld: list[Unheld] = []
                changed.update(plan_turns(stored + new, [m["message_id"] for m in msgs], turns, unheld=unheld))
                state.fragments += change_fragments(unheld, [s for s in state.sessions if s.user_id == user],
                                                    ctx, state.run_id)
            closed = [r for fid, r in changed.items() if fid not in ids]
            if closed:
                add_rows(state, "fragments", closed)
    return state


def change_fragments(unheld: list[Unheld], sessions: list[SessionWork], ctx: StageContext,
                     run_id: str) -> list[dict[str, Any]]:
    """One fragment per sentence of `unheld` (worded as the rules' extraction words a statement),
    embedded, naming the older turns in `replaces_sources` (it gives them a new value) or
    `contradicts_sources` (it denies what they state). Its id is derived from its content like
    every fragment's, so a rerun makes no duplicate. Turns of a session outside `sessions` (stored
    ones) get none: their link waits for their own run."""
    where = {m["message_id"]: (s, m) for s in sessions for m in s.messages}
    by_sentence: dict[tuple[str, str], dict[str, list[str]]] = {}
    for mid, sentence, old, field in unheld:
        if mid in where:
            olds = by_sentence.setdefault((mid, sentence), {}).setdefault(field, [])
            if old not in olds:
                olds.append(old)
    rows = []
    for (mid, sentence), links in by_sentence.items():
        session, m = where[mid]
        speaker = str(m.get("speaker") or "").strip() or "Unknown"
        category = categorize(sentence)
        item = {"subject": speaker, "category": category, "key": key_phrase(sentence, speaker),
                "content": third_person(sentence, speaker), "source_ids": [mid],
                "date": normalize_date(sentence, to_date(m.get("ts") or session.ts), category)}
        row = fragment_row(session, item, run_id=run_id, backend="rules", model="rules",
                           prompt_version=SUPERSEDE_VERSION)
        when_said = m.get("ts") or session.ts
        row.update(links, supersede_version=SUPERSEDE_VERSION, valid_from=when_said.isoformat())
        rows.append(row)
    if rows:
        for row, vec in zip(rows, ctx.embedder.embed([r["text"] for r in rows])):
            row["vector"] = vec
    return rows


def supersede_user(store: Store, user_id: str, skip: Iterable[str] | None = None) -> dict[str, int]:
    """Run the rules' decisions on one user of an already consolidated store: every fragment never
    examined (`supersede_version` null, or decided by an older rules version: decided again) against
    its candidates; writes the changed rows. Returns
    counts (examined, superseded, contradictions). A second run finds nothing to examine. Every turn
    (but `skip` speakers', default the assistants') is compared turn against turn (`plan_turns`)."""
    frags = _stored(store, user_id, set())
    for f in frags:                      # an older rules version's decisions are made again
        if str(f.get("supersede_version") or "").startswith(RULES_PREFIX) and f["supersede_version"] != SUPERSEDE_VERSION:
            f.update(valid_until=None, superseded_by=None, contradicts=None, replaces_sources=None,
                     contradicts_sources=None, supersede_version=None)
    todo = [f["id"] for f in frags if not f.get("supersede_version")]
    if not todo:
        return {"examined": 0, "superseded": 0, "contradictions": 0, "replaced_turns": 0, "contradicted_turns": 0}
    before_sup = {f["id"] for f in frags if f.get("superseded_by")}
    before_con = {f["id"] for f in frags if f.get("contradicts")}
    voices = RetrievalSettings().assistant_speakers if skip is None else skip
    message_ts, turns = _turns(store, user_id, skip=voices)
    changed = plan(frags, todo, message_ts, turns=turns)
    changed.update(plan_turns(frags, [m["message_id"] for m in turns.rows], turns))
    rows = list(changed.values())
    for r in rows:
        r["vector"] = np.asarray(r["vector"], dtype=np.float32)
    store.upsert("fragments", rows)
    return {"examined": len(todo),
            "superseded": sum(1 for r in rows if r.get("superseded_by") and r["id"] not in before_sup),
            "contradictions": sum(1 for r in rows if r.get("contradicts") and r["id"] not in before_con),
            "replaced_turns": sum(len(r.get("replaces_sources") or []) for r in rows),
            "contradicted_turns": sum(len(r.get("contradicts_sources") or []) for r in rows)}

