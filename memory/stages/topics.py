"""The topics stage, RMM prospective reflection (Tan et al. §5): topic memories per session, added to
or merged into each user's topic bank.

    extract (D.1.1)  one request per (session, named participant): topic summaries + referenced turns
    embed            every new summary, one batch
    update (D.1.2)   for each new topic, the top-K most similar topics of the same user and subject in
                     the bank as it stood before its session, and an Add() or Merge(index, summary)

The bank evolves session by session, so the update runs in rounds: round r holds the r-th pending
session of every user of the shard (one LLM batch per round). A merge rewrites the topic in place
(same id), keeps the union of source ids and appends the replaced version to `history_json` (its
text, date and the source ids the merge added, so the history grows with the merges, not their
square); the bank as of a watermark W is rebuilt by ignoring topics created after W and undoing later merges,
so a re-run after a crash, or two batches instead of one, converge to the same rows.

Two decisions of one session that merge into the same topic: the first (in topic order) merges,
the later ones are added as new topics. A merge answer that stays invalid after the re-ask is
quarantined and its topic added (nothing is lost). Participants with no fragment in the session
(extraction found nothing personal about them, or was quarantined) get no topic request: the
prompt's NO_TRAIT case, without paying for a call.

A reopened session (messages appended after its consolidation, see `memory.stages.load`) asks
only about its new messages; a quarantined request stays pending and is asked again, for its subject
over the messages of its first attempt, by a later run. A merge by a late session (dated before
topics already in the bank) keeps the target's newest `session_ts` and widens its date range.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from memory import prompts
from memory.embed import Embedder
from memory.ids import make_id
from memory.llm.runner import LLMRunner
from memory.stages.shard import (SessionWork, ShardState, StageContext, add_rows, has_stored,
                                 quarantine_work, timed)
from memory.store import Store
from memory.text import key_phrase

log = logging.getLogger(__name__)

#: similar existing topics shown to the update prompt (the paper's Top-K for memory update)
TOP_K = 5


@dataclass
class Topic:
    """One topic of the bank, as it stands after the sessions processed so far."""

    id: str
    user_id: str
    subject: str
    session_id: str
    created_ts: datetime
    session_ts: datetime
    text: str
    key: str
    date: str
    source_ids: list[str]
    vector: np.ndarray | None
    history: list[dict[str, Any]] = field(default_factory=list)
    merges: int = 0
    run_id: str = ""
    backend: str = ""
    model: str = ""
    prompt_version: str = prompts.TOPIC_EXTRACT_VERSION
    touched: bool = False

    def row(self) -> dict[str, Any]:
        return {
            "id": self.id, "user_id": self.user_id, "session_id": self.session_id,
            "created_ts": self.created_ts, "session_ts": self.session_ts, "subject": self.subject,
            "key": self.key, "date": self.date, "text": self.text,
            "history_json": json.dumps(self.history, ensure_ascii=False, sort_keys=True),
            "merges": self.merges, "vector": self.vector, "source_ids": list(self.source_ids),
            "run_id": self.run_id, "backend": self.backend, "model": self.model,
            "prompt_version": self.prompt_version,
        }


def topic_id(user_id: str, session_id: str, subject: str, summary: str, source_ids: list[str]) -> str:
    return make_id("topic", user_id, session_id, subject, summary, *source_ids, prompts.TOPIC_EXTRACT_VERSION)


def _day(ts: datetime) -> str:
    return ts.date().isoformat()


def _date_range(a: str, b: str) -> str:
    """The range covering two dates or ranges (ISO days; a late session's may be the earlier one)."""
    first = min(a.split(" to ")[0], b.split(" to ")[0])
    last = max(a.split(" to ")[-1], b.split(" to ")[-1])
    return first if first == last else f"{first} to {last}"


# -- the bank as of a watermark ---------------------------------------------------------------------
def load_bank(store: Store, user_id: str, watermark: datetime) -> tuple[list[Topic], list[Topic]]:
    """The user's topics as they stood at `watermark`, and those of them that had to be rolled back
    (a crashed or repeated run had merged into them; their vectors need re-embedding)."""
    bank, rolled = [], []
    for r in store.read("topics", user_id).to_pylist():
        if r["created_ts"] is None or r["created_ts"] > watermark:
            continue
        t = Topic(id=r["id"], user_id=user_id, subject=r["subject"] or "", session_id=r["session_id"] or "",
                  created_ts=r["created_ts"], session_ts=r["session_ts"], text=r["text"] or "",
                  key=r["key"] or "", date=r["date"] or "", source_ids=list(r["source_ids"] or []),
                  vector=np.asarray(r["vector"], dtype=np.float32) if r["vector"] is not None else None,
                  history=json.loads(r["history_json"] or "[]"), merges=int(r["merges"] or 0),
                  run_id=r["run_id"] or "", backend=r["backend"] or "", model=r["model"] or "",
                  prompt_version=r["prompt_version"] or prompts.TOPIC_EXTRACT_VERSION)
        undone = False
        while t.session_ts > watermark and t.history:
            prev = t.history.pop()
            t.text, t.key, t.date = prev["text"], prev["key"], prev["date"]
            if "source_ids" in prev:   # written before 2026-11: the whole list as it stood
                t.source_ids = list(prev["source_ids"])
            else:
                added = set(prev["added_ids"])
                t.source_ids = [x for x in t.source_ids if x not in added]
            t.session_ts = datetime.fromisoformat(prev["session_ts"])
            t.run_id, t.backend, t.model = prev.get("run_id", ""), prev.get("backend", ""), prev.get("model", "")
            t.prompt_version = prev.get("prompt_version", prompts.TOPIC_EXTRACT_VERSION)
            t.merges = max(0, t.merges - 1)
            undone = True
        if undone or t.vector is None:
            t.vector, t.touched = None, True
            rolled.append(t)
        bank.append(t)
    bank.sort(key=lambda t: (t.created_ts, t.id))
    return bank, rolled


# -- requests ---------------------------------------------------------------------------------------
def extraction_contexts(sessions: list[SessionWork], vectors: dict[tuple[str, str], np.ndarray],
                        subjects: dict[tuple[str, str], set[str]]) -> list[dict[str, Any]]:
    """One D.1.1 context per (session, participant with fragments in it)."""
    out = []
    for s in sessions:
        have = subjects.get((s.user_id, s.session_id), set())
        if not s.messages or not have:
            continue
        turns = [{"turn": i, "message_id": m["message_id"], "speaker": m["speaker"], "text": m["text"] or "",
                  "ts": m["ts"].isoformat()} for i, m in enumerate(s.messages)]
        vecs = [vectors.get((s.user_id, m["message_id"])) for m in s.messages]
        sims = [float(np.dot(a, b)) if a is not None and b is not None else 0.0 for a, b in zip(vecs, vecs[1:])]
        for subject in s.participants:
            if subject in have:
                out.append({"user_id": s.user_id, "session_id": s.session_id, "subject": subject,
                            "participants": s.participants, "turns": turns,
                            "adjacent_sims": [round(x, 6) for x in sims]})
    return out


# -- the stage --------------------------------------------------------------------------------------
def topics(state: ShardState, ctx: StageContext) -> ShardState:
    """RMM prospective reflection over every pending session of the shard (see the module doc)."""
    if not state.sessions:
        return state
    with timed(state, "topics"):
        with ctx.llm(state) as runner:
            embedder = ctx.embedder
            vectors = {(m["user_id"], m["message_id"]): np.asarray(m["vector"], dtype=np.float32)
                       for m in state.message_rows if m.get("vector") is not None}
            subjects: dict[tuple[str, str], set[str]] = {}
            for f in state.fragments:
                subjects.setdefault((f["user_id"], f["session_id"]), set()).add(f["subject"])
            for s in state.sessions:  # reopened sessions: messages embedded earlier, topic retries
                for m in s.messages:
                    if m.get("vector") is not None:
                        vectors.setdefault((s.user_id, m["message_id"]), m["vector"])
                if not s.extracts:
                    subjects[(s.user_id, s.session_id)] = set(s.topic_subjects)

            # 1. D.1.1: one batch for the shard
            contexts = extraction_contexts(state.sessions, vectors, subjects)
            answers, bad = runner.run([prompts.topic_extract_request(c) for c in contexts])
            for q in bad:
                c = q.request.context
                quarantine_work(state, q.row(c["user_id"], state.run_id, f"{c['session_id']}/{c['subject']}"),
                                c["user_id"], c["session_id"], f"topics:{c['subject']}")
            new: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for tc, answer in zip(contexts, answers):
                if answer is None:
                    continue
                items = new.setdefault((tc["user_id"], tc["session_id"]), [])
                seen = {it["id"] for it in items}
                for it in prompts.parse_topic_extraction(answer, tc["turns"]):
                    tid = topic_id(tc["user_id"], tc["session_id"], tc["subject"], it["summary"], it["source_ids"])
                    if tid not in seen:
                        seen.add(tid)
                        items.append({**it, "id": tid, "subject": tc["subject"]})

            # 2. embed every new summary (and rolled-back bank topics) in one batch
            banks: dict[str, list[Topic]] = {}
            stale: list[Topic] = []
            for user in sorted({s.user_id for s in state.sessions}):
                banks[user], rolled = (load_bank(ctx.store, user, state.watermarks[user][0]) if has_stored(state, user)
                                       else ([], []))
                stale.extend(rolled)
            flat = [it for items in new.values() for it in items]
            vecs = embedder.embed([it["summary"] for it in flat] + [t.text for t in stale])
            for it, v in zip(flat, vecs[:len(flat)]):
                it["vector"] = v
            for t, v in zip(stale, vecs[len(flat):]):
                t.vector = v

            # 3. D.1.2 in rounds: the r-th pending session of every user
            by_user: dict[str, list[SessionWork]] = {}
            for s in state.sessions:
                by_user.setdefault(s.user_id, []).append(s)
            for user in by_user:
                by_user[user].sort(key=lambda s: (s.ts, s.session_id))
            rounds = max(len(v) for v in by_user.values())
            for r in range(rounds):
                todo = [(s, it) for user in sorted(by_user) if r < len(by_user[user])
                        for s in [by_user[user][r]] for it in new.get((user, s.session_id), [])]
                _update_round(state, runner, embedder, banks, todo, ctx.settings.topic_merge_threshold)

        rows = [t.row() for bank in banks.values() for t in bank if t.touched]
        if rows:
            add_rows(state, "topics", rows)
    return state


def _candidates(bank: list[Topic], subject: str, vec: np.ndarray) -> list[tuple[Topic, float]]:
    same = [t for t in bank if t.subject == subject and t.vector is not None]
    if not same:
        return []
    sims = np.stack([t.vector for t in same if t.vector is not None]) @ vec
    order = sorted(range(len(same)), key=lambda i: (-float(sims[i]), same[i].id))[:TOP_K]
    return [(same[i], float(sims[i])) for i in order]


def _update_round(state: ShardState, runner: LLMRunner, embedder: Embedder, banks: dict[str, list[Topic]],
                  todo: list[tuple[SessionWork, dict[str, Any]]], threshold: float) -> None:
    backend = runner.backend
    asks: list[tuple[SessionWork, dict[str, Any], list[tuple[Topic, float]]]] = []
    decisions: list[tuple[SessionWork, dict[str, Any], list[tuple[Topic, float]], tuple[str, int | None, str | None]]] = []
    for s, it in todo:
        cands = _candidates(banks[s.user_id], it["subject"], it["vector"])
        if cands:
            asks.append((s, it, cands))
        else:
            decisions.append((s, it, [], ("add", None, None)))
    requests = [prompts.topic_merge_request({
        "user_id": s.user_id, "subject": it["subject"], "new_summary": it["summary"],
        "history": [{"id": t.id, "summary": t.text, "similarity": round(sim, 6)} for t, sim in cands],
        "threshold": threshold}) for s, it, cands in asks]
    answers, bad = runner.run(requests)
    for q in bad:
        c = q.request.context
        state.quarantine.append(q.row(c["user_id"], state.run_id, f"topic-merge/{c['new_summary'][:60]}"))
    for (s, it, cands), answer in zip(asks, answers):
        decision = ("add", None, None) if answer is None else prompts.parse_topic_merge(answer, len(cands))
        decisions.append((s, it, cands, decision))
    order = {id(x[1]): i for i, x in enumerate(todo)}
    decisions.sort(key=lambda d: order[id(d[1])])

    merged_now: set[str] = set()
    to_embed: list[Topic] = []
    # topics a run that died before its commit already merged: a late session's merge leaves its target
    # dated at or before the watermark, so `load_bank` does not roll it back; it is not made again
    merged_before = {(t.user_id, h["merged_id"]) for bank in banks.values() for t in bank for h in t.history
                     if h.get("merged_id")}
    for s, it, cands, (action, index, summary) in decisions:
        bank = banks[s.user_id]
        if (s.user_id, it["id"]) in merged_before:
            continue
        target = cands[index][0] if action == "merge" and index is not None else None
        if target is not None and target.id not in merged_now and target.id != it["id"]:
            had = set(target.source_ids)
            target.history.append({   # the ids the merge adds, not the whole list: linear in the merges
                "text": target.text, "key": target.key, "date": target.date,
                "added_ids": [x for x in dict.fromkeys(it["source_ids"]) if x not in had],
                "session_ts": target.session_ts.isoformat(), "run_id": target.run_id, "backend": target.backend,
                "model": target.model, "prompt_version": target.prompt_version,
                "merged_ts": s.ts.isoformat(), "merged_session_id": s.session_id, "merged_id": it["id"],
                "new_summary": it["summary"]})
            target.text = summary or target.text
            target.source_ids = list(dict.fromkeys(target.source_ids + it["source_ids"]))
            target.date = _date_range(target.date, _day(s.ts))
            target.session_ts = max(target.session_ts, s.ts)
            target.merges += 1
            target.run_id, target.backend, target.model = state.run_id, backend.name, backend.model
            target.prompt_version = prompts.TOPIC_MERGE_VERSION
            target.touched = True
            merged_now.add(target.id)
            to_embed.append(target)
            continue
        if any(t.id == it["id"] for t in bank):
            continue  # the same topic already in the bank (re-run of a committed session)
        bank.append(Topic(id=it["id"], user_id=s.user_id, subject=it["subject"], session_id=s.session_id,
                          created_ts=s.ts, session_ts=s.ts, text=it["summary"],
                          key=key_phrase(it["summary"], it["subject"]), date=_day(s.ts),
                          source_ids=list(it["source_ids"]), vector=it["vector"], run_id=state.run_id,
                          backend=backend.name, model=backend.model, touched=True))
    if to_embed:
        for t, v in zip(to_embed, embedder.embed([t.text for t in to_embed])):
            t.vector = v
