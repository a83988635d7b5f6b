"""The supersede stage (PREMem's *transformation*, acted on): a new fragment that gives a new value to
an older fragment of the same user and subject closes it (`valid_until` = the new one's time,
`superseded_by` = its id); one that contradicts an older one without replacing it records the older
id in `contradicts`. Nothing is deleted.

Candidates, never all pairs: for each new fragment, the `NEIGHBOURS` nearest stored or new fragments
of the user by vector (cosine >= `MIN_SIM`), the fragments with the same subject and key, and those
holding the same quantity (`memory.llm.rules.turns.QuantityIndex`: an inverted index from a quantity's
unit and context words, shared with the turns), at most `MAX_CANDIDATES`. With the `rules` backend the rule decides
here; LLM backends decide in the reason stage (a transformation insight names the fragments it
supersedes), so this stage then only stamps `valid_from`. A late fragment older than a stored one it
changes is itself closed by the stored one.

Turns (`memory.llm.rules.turns`: `Turns`, `plan_turns`): statements extraction missed are compared
turn against turn, the user's turns only (not `RetrievalSettings.assistant_speakers`'), and the
fragments citing only an assistant's turns are never compared (its advice is no fact of the user's:
"CET to AEST involves adding 9 hours" had closed "New York is 6 hours behind CET"); a newer
turn with no fragment keeps its link on the older turn's fragment (closed with `superseded_by` = the
newer turn's message row, or given the newer turn in `contradicts_sources`). When neither turn has a fragment holding the
statement (both said it inside a question: "can you remind me it's moved to 4:30 PM?", "I've never
met Bryan, can you help me say so?"), the stage makes a *change fragment* of the newer turn's sentence
(`change_fragments`) that carries the link in `replaces_sources` or `contradicts_sources`: without a
row, nothing could say the older turn is out of date or denied. The change fragments a run makes
are then decided like the others (`decide_made`): a newer statement replaces one as it would any
fragment, so a fresh consolidation closes what a re-decide of its store closes.

`supersede_user` runs the same decisions on an already consolidated store for one user (fragments
never examined, `supersede_version` null, or decided by an older rules version), writing the
changed rows: idempotent. Given an embedder it also makes the change fragments of what it decides
(the stage leaves a stored session's turn without one), from the stored messages and sessions.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory import prompts
from memory.dates import local_time
from memory.embed import Embedder
from memory.llm.rules.statements import sentence_item
from memory.llm.rules.supersede import SUPERSEDE_VERSION, Quantity, decide, is_statement, quantities
from memory.llm.rules.turns import History, QuantityIndex, Turns, Unheld, plan_turns
from memory.settings import RetrievalSettings
from memory.stages.shard import (SessionWork, ShardState, StageContext, add_rows, fragment_row, has_stored,
                                 timed)
from memory.store import Store

__all__ = ["supersede", "supersede_user", "plan", "change_fragments", "decide_made", "NEIGHBOURS", "MIN_SIM", "MAX_CANDIDATES"]

#: how the rules' versions start (`SUPERSEDE_VERSION`); LLM prompt versions are never re-decided here
RULES_PREFIX = "rules-supersede-"
#: vector neighbours examined per new fragment
NEIGHBOURS = 8
#: cosine under which a vector neighbour is not a candidate
MIN_SIM = 0.5
#: candidates examined per new fragment (vector, key and quantity candidates together)
MAX_CANDIDATES = 32
#: the `run_id` of the change fragments `supersede_user` makes (no consolidation run made them)
BACKFILL_RUN = "supersede-backfill"


def when(row: dict[str, Any], message_ts: dict[str, datetime]) -> str:
    """A fragment's time (ISO 8601): `valid_from` if set, else its newest source message's time,
    else its session's."""
    if row.get("valid_from"):
        return str(row["valid_from"])
    times = [message_ts[s] for s in row.get("source_ids") or [] if s in message_ts]
    ts = max(times) if times else row.get("session_ts")
    return ts.isoformat() if isinstance(ts, datetime) else str(ts or "")


def _candidates(i: int, z: np.ndarray, keys: dict[tuple[str, str], list[int]],
                qindex: QuantityIndex, frags: list[dict[str, Any]],
                qs: list[list[Quantity]]) -> dict[int, float]:
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
    for j in qindex.ranked(qs[i]):
        if j != i:
            out.setdefault(j, float(sims[j]))
    best = sorted(out.items(), key=lambda kv: -kv[1])[:MAX_CANDIDATES]
    return dict(best)


def plan(frags: list[dict[str, Any]], todo: Iterable[str], message_ts: dict[str, datetime], *,
         version: str = SUPERSEDE_VERSION, decide_rules: bool = True,
         turns: Turns | None = None) -> dict[str, dict[str, Any]]:
    """Decide for every fragment of `todo` (ids among `frags`, one user's fragments with vectors)
    against its candidates, in time order, and (with `turns`) against older turns no fragment
    covers; mutates the rows and returns the changed ones by id."""
    todo = list(todo)
    if not frags or not todo:
        return {}                 # a run's user with no new fragment: nothing to index
    z = np.stack([np.asarray(f["vector"], dtype=np.float32) for f in frags])
    z = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    times = [when(f, message_ts) for f in frags]
    pos = {f["id"]: i for i, f in enumerate(frags)}
    keys: dict[tuple[str, str], list[int]] = defaultdict(list)
    qindex = QuantityIndex()
    qs: list[list[Quantity]] = []
    # the rules compare the user's statements only: not code lines, nor an assistant's advice
    statement = [is_statement(f) and not (turns is not None and turns.skipped_only(f)) for f in frags]
    for i, f in enumerate(frags):
        if not statement[i]:
            qs.append([])
            continue
        keys[(str(f.get("subject") or "").lower(), str(f.get("key") or "").lower())].append(i)
        found = quantities(f"{f.get('key') or ''}: {f.get('content') or ''}") if decide_rules else []
        qs.append(found)
        qindex.add(i, found)
    changed: dict[str, dict[str, Any]] = {}
    history = History(frags, turns)
    would: dict[tuple[str, int], list[str]] = {}   # older turns a fragment would replace, per history state

    def replaced(i: int) -> list[str]:
        """The older turns fragment i would replace (`Turns.replaced`), searched once per history state."""
        assert turns is not None
        key = (frags[i]["id"], history.changes)
        if key not in would:
            would[key] = turns.replaced(frags[i], z[i], times[i], history)
        return would[key]

    def earlier(f: dict[str, Any]) -> list[dict[str, Any]]:
        """What `f` replaced: its history, or (not decided yet: a newer fragment is judged in the
        older one's turn) the statements of the older turns it would replace."""
        found = history.of_fragment(f)
        if found or f.get("replaces_sources") or turns is None:
            return found
        return [s for mid in replaced(pos[f["id"]]) for s in turns.statements(mid)]
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
            if (c.get("superseded_by") and times[j] <= times[i]) or not statement[j]:
                continue      # history: only current fragments change; a closed newer one still closes a late f
            newer, older = (f, c) if times[j] <= times[i] else (c, f)
            verdict = decide(newer, older, sim, lambda: earlier(older))   # "restatement": nothing changes
            if verdict == "update":
                updated = updated or newer is f
                history.close(older, newer["id"], when(newer, message_ts), version)
                changed[older["id"]] = older
            elif verdict == "contradiction" and not newer.get("contradicts"):
                newer["contradicts"] = older["id"]
                changed[newer["id"]] = newer
        if turns is not None and not updated and not f.get("superseded_by"):
            history.link(f, "replaces_sources", replaced(i))
        if turns is not None:
            history.link(f, "contradicts_sources", turns.contradicted(f, z[i], times[i]))
    return changed


def _turns(store: Store, user: str, extra: Iterable[dict[str, Any]] = (),
           skip: Iterable[str] = (), vectors: bool = True) -> tuple[dict[str, datetime], Turns]:
    """The user's message times and turns with vectors (stored, then `extra`, the shard's), but
    not the turns of the `skip` speakers (`RetrievalSettings.assistant_speakers`); with `vectors`
    False only the times are read (LLM backends decide without the turns)."""
    rows: dict[str, dict[str, Any]] = {}
    if store.has_table("messages"):
        cols = ["id", "message_id", "session_id", "speaker", "text", "ts", "vector"] if vectors else ["message_id", "ts"]
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
        # a user whose run kept no fragment still has turns to link (said inside questions: change fragments)
        for user in dict.fromkeys([*by_user, *(s.user_id for s in state.sessions)]):
            new = by_user.get(user, [])
            ids = {f["id"] for f in new}
            stored = _stored(ctx.store, user, ids) if has_stored(state, user) else []
            sessions = [s for s in state.sessions if s.user_id == user]
            msgs = [m for m in state.message_rows if m["user_id"] == user] + [m for s in sessions for m in s.messages]
            message_ts, turns = _turns(ctx.store, user, msgs, ctx.settings.retrieval.assistant_speakers,
                                       vectors=rules)
            # an LLM backend decides in the reason stage: its prompt's version, not the rules', is on the row
            changed = plan(stored + new, ids, message_ts, version=SUPERSEDE_VERSION if rules else prompts.REASON_VERSION,
                           decide_rules=rules, turns=turns if rules else None)
            if rules:
                unheld: list[Unheld] = []
                changed.update(plan_turns(stored + new, [m["message_id"] for m in msgs], turns, unheld=unheld))
                made = change_fragments(unheld, sessions, ctx.embedder, state.run_id)
                changed.update(decide_made(stored + new, made, message_ts, turns))
                ids |= {f["id"] for f in made}
                state.fragments += made
            closed = [r for fid, r in changed.items() if fid not in ids]
            if closed:
                add_rows(state, "fragments", closed)
    return state


def change_fragments(unheld: list[Unheld], sessions: list[SessionWork], embedder: Embedder,
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
        said: datetime = m.get("ts") or session.ts
        row = fragment_row(session, sentence_item(sentence, speaker, local_time(m) if m.get("ts") else said, mid),
                           run_id=run_id, backend="rules",
                           model="rules", prompt_version=SUPERSEDE_VERSION)
        row.update(links, supersede_version=SUPERSEDE_VERSION, valid_from=said.isoformat())
        rows.append(row)
    if rows:
        for row, vec in zip(rows, embedder.embed([r["text"] for r in rows])):
            row["vector"] = vec
    return rows


def decide_made(frags: list[dict[str, Any]], made: list[dict[str, Any]], message_ts: dict[str, datetime],
                turns: Turns) -> dict[str, dict[str, Any]]:
    """Decide the change fragments just `made` against the other fragments (`frags`) and each other,
    as `plan` decided those: one made from an older turn is replaced by a newer statement like any
    fragment (made after the decisions, it was compared with none). Returns the changed rows."""
    if not made:
        return {}
    for f in made:
        f["supersede_version"] = None
    return plan(frags + made, [f["id"] for f in made], message_ts, turns=turns)


def supersede_user(store: Store, user_id: str, skip: Iterable[str] | None = None,
                   embedder: Embedder | None = None, *, run_id: str = BACKFILL_RUN) -> dict[str, int]:
    """Run the rules' decisions on one user of a consolidated store (fragments never examined, or by
    an older rules version), turn against turn too (`skip`: default the assistants); with `embedder`,
    change fragments as the stage makes them. Writes the changed rows, returns counts; idempotent."""
    frags = _stored(store, user_id, set())
    for f in frags:                      # an older rules version's decisions are made again
        if str(f.get("supersede_version") or "").startswith(RULES_PREFIX) and f["supersede_version"] != SUPERSEDE_VERSION:
            f.update(valid_until=None, superseded_by=None, contradicts=None, replaces_sources=None,
                     contradicts_sources=None, supersede_version=None)
    todo = [f["id"] for f in frags if not f.get("supersede_version")]
    if not todo:
        return {"examined": 0, "superseded": 0, "contradictions": 0, "replaced_turns": 0, "contradicted_turns": 0,
                "change_fragments": 0}
    before_sup = {f["id"] for f in frags if f.get("superseded_by")}
    before_con = {f["id"] for f in frags if f.get("contradicts")}
    voices = RetrievalSettings().assistant_speakers if skip is None else skip
    message_ts, turns = _turns(store, user_id, skip=voices)
    changed = plan(frags, todo, message_ts, turns=turns)
    unheld: list[Unheld] = []
    changed.update(plan_turns(frags, [m["message_id"] for m in turns.rows], turns, unheld=unheld))
    made = change_fragments(unheld, _sessions_of(store, user_id, turns, {u[0] for u in unheld}), embedder, run_id) \
        if embedder is not None and unheld else []
    changed.update(decide_made(frags, made, message_ts, turns))
    rows = list({**changed, **{f["id"]: f for f in made}}.values())
    for r in rows:
        r["vector"] = np.asarray(r["vector"], dtype=np.float32)
    store.upsert("fragments", rows)
    return {"examined": len(todo),
            "superseded": sum(1 for r in rows if r.get("superseded_by") and r["id"] not in before_sup),
            "contradictions": sum(1 for r in rows if r.get("contradicts") and r["id"] not in before_con),
            "replaced_turns": sum(len(r.get("replaces_sources") or []) for r in rows),
            "contradicted_turns": sum(len(r.get("contradicts_sources") or []) for r in rows),
            "change_fragments": len(made)}


def _sessions_of(store: Store, user_id: str, turns: Turns, mids: set[str]) -> list[SessionWork]:
    """The stored sessions holding the turns `mids` (already read into `turns`), each with those
    turns (what `change_fragments` reads of a shard's sessions)."""
    if not mids or not store.has_table("sessions"):
        return []
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for mid in mids:
        if mid in turns.at:
            m = turns.rows[turns.at[mid]]
            by_session[m["session_id"]].append(m)
    sessions = store.read("sessions", user_id, columns=["session_id", "ts"]).to_pylist()
    return [SessionWork(user_id=user_id, session_id=s["session_id"], ts=s["ts"], messages=by_session[s["session_id"]])
            for s in sessions if s["session_id"] in by_session and s["ts"] is not None]
