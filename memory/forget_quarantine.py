"""Which quarantine rows a forget deletes: those holding the forgotten messages' text, and those of the
LLM work its re-derivation redoes.

An ingest row is matched by what its raw record or its `source` names: a forgotten message id, a
forgotten session (the source of a LoCoMo, LongMemEval or BEAM turn is `archive:user/session/...`), or,
for `before`, its own timestamp. A record whose user could not be read (invalid JSON, bad encoding, an
invalid user id) is stored without a user; it is the forgotten user's when its raw text names that
user id (`"user_id": "alice"`), so a forget finds it too. Rows of other stages name the LLM work.
"""
from __future__ import annotations

import json
import re
from typing import Any

from lancedb.expr import col, lit

from memory.forget_plan import Plan
from memory.ingest.append import APPEND_ARCHIVE
from memory.ingest.common import STAGE as INGEST, parse_time
from memory.store import Store

#: LLM tasks whose quarantine rows name a session (`source` = session id, or `session/subject`)
SESSION_TASKS = ("extract", "topics")
COLUMNS = ["id", "stage", "source", "raw"]


def quarantine_ids(store: Store, p: Plan, dels: dict[str, set[str]]) -> set[str]:
    """Quarantine rows of the forgotten messages (ingest rows whose raw record or source names one, or a
    session left empty, or are dated before the scope's `before`; named in the scope, even if only the
    quarantine holds them) and of the LLM work the re-derivation redoes (or that a deleted row came from)."""
    if not store.has_table("quarantine"):
        return set()
    user = p.user_id
    rows = store.read("quarantine", user, columns=COLUMNS).to_pylist() + unowned(store, user)
    if p.nothing_survives:
        return {r["id"] for r in rows}
    gone_msgs = set(p.message_ids) | set(p.named_messages)
    gone_sessions = set(p.gone_sessions) | set(p.named_sessions)
    redone = {s["session_id"] for s in p.rerun} | gone_sessions
    out = set()
    for r in rows:
        stage, source = r["stage"] or "", r["source"] or ""
        if stage in SESSION_TASKS:
            # a topics row names `session/subject` and either may hold a "/": any redone session opening
            # it counts (a row of a session not redone may go too; its work stays pending in `progress`)
            hit = source in redone if stage == "extract" else any(source.startswith(s + "/") for s in redone)
        elif stage == "reason":
            hit = source in dels.get("links", set())
        elif stage in ("summarize", "profile", "topic-merge"):
            hit = p.rollback is not None
        else:
            rec = _record(r["raw"])
            hit = (_names_forgotten(rec, gone_msgs, gone_sessions) or _source_names(source, user, gone_sessions)
                   or (p.before is not None and _dated_before(rec, p)))
        if hit:
            out.add(r["id"])
    return out


def unowned(store: Store, user: str) -> list[dict[str, Any]]:
    """Ingest quarantine rows stored without a user whose raw text names `user` as its user id."""
    rows = store.read("quarantine", columns=COLUMNS, where=col("stage") == lit(INGEST), null="user_id")
    named = re.compile(r'"user_id"\s*:\s*"' + re.escape(user) + '"')
    return [r for r in rows.to_pylist() if named.search(r["raw"] or "")]


def _record(raw: str | None) -> dict[str, Any]:
    """A quarantined archive record as a dict ({} when it is not a JSON object)."""
    try:
        rec = json.loads(raw or "")
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def _names_forgotten(rec: dict[str, Any], messages: set[str], sessions: set[str]) -> bool:
    """Whether a quarantined archive record names a forgotten message or session."""
    ids = {str(rec.get(k)) for k in ("message_id", "dia_id", "id") if rec.get(k) is not None}
    return bool(ids & messages) or str(rec.get("session_id")) in sessions


def _dated_before(rec: dict[str, Any], p: Plan) -> bool:
    """Whether a quarantined generic record (JSONL, Parquet, an append) is dated before the scope's cut;
    a record without a readable time is not (the messages `before` forgets are those with one)."""
    when = parse_time(rec.get("timestamp"))
    return when is not None and p.before is not None and when < p.before


def _source_names(source: str, user: str, sessions: set[str]) -> bool:
    """Whether a quarantined turn's or session's `source` (`archive:user/session/...`, as the LoCoMo,
    LongMemEval and BEAM readers write them) names a forgotten session: the session id is a prefix of
    the path after the user (a session id may hold a `/` itself); a LoCoMo observation's path opens with
    `session_N_observation`, which names session `session_N`."""
    at = source.find(f":{user}/")
    if at < 0 or source.startswith(APPEND_ARCHIVE + ":"):   # an append's path is `user/index in its batch`
        return False
    parts = source[at + len(user) + 2:].split("/")
    prefixes = {"/".join(parts[:n]) for n in range(1, len(parts) + 1)}
    return bool(sessions & (prefixes | {x.removesuffix("_observation") for x in prefixes}))
