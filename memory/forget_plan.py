"""Planning a forget (read-only): which messages go, which derived rows cite them (provenance, never
text), how far the user's derived state rolls back, and the shard state that re-derives it.

A row is *tainted* when its provenance reaches a forgotten message: fragments and observations by
`source_ids`; insights by `source_ids` or `parent_ids` (tainted fragments); clusters by `member_ids`;
links by their clusters; topics by `source_ids` or the sources of a replaced version in
`history_json`; phase summaries by `source_ids` or `member_ids`, the profile by its phases; graph
nodes by the memory they stand for. The rollback point W is the newest session strictly before the
earliest consolidated session holding a forgotten message or a tainted fragment, insight or cluster
(a late session's insight can be older than the session it quotes). Everything of the user derived
from sessions after W is rolled back to the state "as of W" the stages already know how to read
(the pool by `consumed_ts`, the topic bank by `history_json`, graph and phases by `session_ts`), and
the surviving sessions after W (up to the old watermark) are consolidated again as one batch.
W is never after the watermark: derived rows dated after it were written by a run that died before
its watermarks (`memory.stages.commit.leftovers`) and go with the roll-back. A user with no
watermark (its first run died before writing it) has committed nothing: when a row cites a forgotten
message, every derived row of the user goes (W is the start of its history) and nothing is re-derived:
the next consolidation consolidates its surviving sessions as a user's first run does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.expr import col

from memory.embed import Embedder
from memory.errors import ConfigError
from memory.ids import validate_user_id
from memory.ingest.common import OBSERVATIONS_SCHEMA, has_surrogate
from memory.ingest.validate import sessions_frame
from memory.pointers import clear_pointers
from memory.stages.load import EPOCH, add_sessions, read_progress
from memory.stages.shard import Cluster, ShardState, active, frame
from memory.store import Store


@dataclass(frozen=True)
class Scope:
    """What one forget names: sessions, messages (`message_id` or row id), messages before a time;
    nothing named means the whole user."""

    user_id: str
    sessions: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()
    before: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "user_id", validate_user_id(self.user_id))
        if bad := [i for i in self.sessions + self.messages if "\x00" in i or has_surrogate(i)]:
            raise ConfigError(f"no stored id holds a NUL or an unpaired surrogate, as {ascii(bad[0])} does")
        if self.before is not None and self.before.tzinfo is None:
            raise ConfigError(f"--before {self.before.isoformat()} needs a time zone (e.g. 2024-03-01T00:00:00Z)")

    @property
    def whole_user(self) -> bool:
        return not (self.sessions or self.messages or self.before is not None)

    def describe(self) -> dict[str, Any]:
        """The scope for the `runs` row: ids and a date, never text."""
        return {"user": self.user_id, "whole_user": self.whole_user, "sessions": list(self.sessions),
                "messages": list(self.messages), "before": self.before.isoformat() if self.before else None}


@dataclass
class Plan:
    """Everything a forget of one user writes, computed before any write."""

    user_id: str
    message_ids: list[str]                      # forgotten `message_id` values
    row_ids: list[str]                          # their `messages` row ids
    gone_sessions: list[str]                    # sessions left without a message
    cut_sessions: dict[str, dict[str, Any]]     # sessions that keep messages: their updated row
    remaining: int                              # the user's surviving messages
    tainted: dict[str, set[str]] = field(default_factory=dict)
    rollback: datetime | None = None            # W; None: nothing derived to redo
    watermark: tuple[datetime, int] | None = None
    rerun: list[dict[str, Any]] = field(default_factory=list)   # session rows consolidated again
    done_at_rollback: int = 0
    gone_session_rows: list[str] = field(default_factory=list)  # their `sessions` row ids
    # the user's rows the plan read, per table (`taint`'s; the ids of messages, sessions and watermarks
    # when nothing survives): `forget.rollback_ids` and `forget.deletions` reuse them, never read again
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # what the scope named, found or not: a named message may live only in the quarantine
    named_messages: list[str] = field(default_factory=list)
    named_sessions: list[str] = field(default_factory=list)
    before: datetime | None = None
    whole_user: bool = False
    seen: set[str] = field(default_factory=set)   # row ids of the user's messages when planned

    @property
    def nothing_survives(self) -> bool:
        """Whether every row of the user goes: the whole user, or every message it has (if any)."""
        return self.whole_user or (self.remaining == 0 and bool(self.message_ids))

    @property
    def empty(self) -> bool:
        return not self.message_ids and self.rollback is None


def _ids(t: pl.DataFrame, column: str = "id") -> set[str]:
    return set(t[column].to_list()) if t.height else set()


def _hits(values: list[Any] | None, wanted: set[str]) -> bool:
    return bool(values) and not wanted.isdisjoint(values or ())


MESSAGE_COLUMNS = ["id", "session_id", "message_id", "ts", "seq", "speaker"]


def forgotten_messages(msgs: pl.DataFrame, scope: Scope, extra: list[str] | None = None) -> pl.DataFrame:
    """Of the user's message rows `msgs` (`MESSAGE_COLUMNS`), those the scope names (plus the
    `message_id`s of an unfinished forget)."""
    if msgs.height == 0 or scope.whole_user:
        return msgs
    named = list(scope.messages) + list(extra or [])
    mask = pl.col("session_id").is_in(list(scope.sessions)) | pl.col("message_id").is_in(named) \
        | pl.col("id").is_in(named)
    if scope.before is not None:
        mask = mask | (pl.col("ts") < scope.before)
    return msgs.filter(mask)


def taint(store: Store, user: str, gone: set[str],
          keep: dict[str, list[dict[str, Any]]] | None = None) -> tuple[dict[str, set[str]], list[datetime]]:
    """Ids of the user's rows whose provenance reaches a forgotten message id, per table, and the
    session times of the tainted fragments, insights and clusters; the rows it reads (with the
    columns `forget.rollback_ids` needs too) are put in `keep` when given."""
    out: dict[str, set[str]] = {}
    times: list[datetime] = []
    kept = keep if keep is not None else {}

    def rows(name: str, cols: list[str]) -> list[dict[str, Any]]:
        kept[name] = store.read(name, user, columns=cols).to_pylist() if store.has_table(name) else []
        return kept[name]

    frags = [r for r in rows("fragments", ["id", "session_ts", "source_ids"]) if _hits(r["source_ids"], gone)]
    out["fragments"] = {r["id"] for r in frags}
    ins = [r for r in rows("insights", ["id", "session_ts", "source_ids", "parent_ids"])
           if _hits(r["source_ids"], gone) or _hits(r["parent_ids"], out["fragments"])]
    out["insights"] = {r["id"] for r in ins}
    cls = [r for r in rows("clusters", ["id", "session_ts", "member_ids"]) if _hits(r["member_ids"], out["fragments"])]
    out["clusters"] = {r["id"] for r in cls}
    times += [r["session_ts"] for r in frags + ins + cls if r["session_ts"] is not None]
    out["links"] = {r["id"] for r in rows("links", ["id", "pool_cluster_id", "new_cluster_id"])
                    if {r["pool_cluster_id"], r["new_cluster_id"]} & out["clusters"]}
    topics = set()
    for r in rows("topics", ["id", "created_ts", "source_ids", "history_json", "text"]):
        history = json.loads(r["history_json"] or "[]")
        if _hits(r["source_ids"], gone) or any(_hits(h.get("source_ids"), gone) for h in history):
            topics.add(r["id"])
    out["topics"] = topics
    summaries = rows("summaries", ["id", "level", "session_ts", "source_ids", "member_ids"])
    phases = {r["id"] for r in summaries if r["level"] != "profile"
              and (_hits(r["source_ids"], gone) or _hits(r["member_ids"], out["fragments"]))}
    out["summaries"] = phases | {r["id"] for r in summaries if r["level"] == "profile"
                                 and (_hits(r["member_ids"], phases) or _hits(r["source_ids"], gone))}
    memories = out["fragments"] | out["insights"]
    out["graph_nodes"] = {r["id"] for r in rows("graph_nodes", ["id", "session_ts", "node_id"]) if r["node_id"] in memories}
    out["observations"] = {r["id"] for r in rows("observations", ["id", "source_ids"]) if _hits(r["source_ids"], gone)}
    return out, times


def plan(store: Store, scope: Scope, *, recorded: dict[str, Any] | None = None) -> Plan:
    """The plan of one forget; `recorded`: the intent of an unfinished forget of the same user (its
    message ids, rollback point and old watermark win where they reach further)."""
    user = scope.user_id
    rec = recorded or {}
    msgs = frame(store.read("messages", user, columns=MESSAGE_COLUMNS))
    chosen = forgotten_messages(msgs, scope, list(rec.get("message_ids", [])))
    f_ids = set(chosen["message_id"].to_list()) if chosen.height else set()
    f_ids |= set(rec.get("message_ids", []))
    keep = msgs.filter(~pl.col("message_id").is_in(list(f_ids))) if msgs.height else msgs
    sessions = frame(store.read("sessions", user))
    affected = set(chosen["session_id"].to_list()) if chosen.height else set()
    affected |= set(rec.get("sessions", []))
    p = Plan(user_id=user, message_ids=sorted(f_ids), row_ids=sorted(_ids(chosen)), gone_sessions=[],
             cut_sessions={}, remaining=keep.height, named_messages=list(scope.messages),
             named_sessions=list(scope.sessions), before=scope.before, whole_user=scope.whole_user,
             seen=_ids(msgs))
    emptied, p.cut_sessions = session_changes(list(sessions.iter_rows(named=True)), keep, affected)
    p.gone_sessions, p.gone_session_rows = [sid for sid, _ in emptied], [rid for _, rid in emptied]
    wm = store.read("watermarks", user)
    if p.remaining == 0:   # every row of the user goes (`forget.deletions`): keep the ids read here
        p.rows.update(messages=msgs.select("id").to_dicts(), sessions=sessions.select("id").to_dicts(),
                      watermarks=wm.select(["id"]).to_pylist())
    if wm.num_rows:
        p.watermark = (wm.column("last_session_ts")[0].as_py(), int(wm.column("sessions_done")[0].as_py() or 0))
    if rec.get("old_watermark") and p.watermark is not None:
        old = datetime.fromisoformat(rec["old_watermark"])
        p.watermark = (max(old, p.watermark[0]), p.watermark[1])
    p.tainted, times = taint(store, user, f_ids, p.rows)
    if p.watermark is None:   # nothing of the user was committed: its derived rows are a dead run's leftovers
        if any(p.tainted.values()) or rec.get("rollback_to"):   # back to the start; nothing re-derived
            p.rollback = EPOCH
        return p
    last = p.watermark[0]
    times += [s["ts"] for s in sessions.iter_rows(named=True) if s["session_id"] in affected and s["ts"] <= last]
    points = []
    if times:
        t0 = min(times)
        before = [s["ts"] for s in sessions.iter_rows(named=True) if s["ts"] < t0]
        points.append(max(before) if before else EPOCH)
    if rec.get("rollback_to"):
        points.append(datetime.fromisoformat(rec["rollback_to"]))
    if not points:
        return p
    p.rollback = min(points + [last])   # rows after the watermark only a dead run wrote: they go too
    gone = set(p.gone_sessions)
    p.rerun = sorted((p.cut_sessions.get(s["session_id"], s) for s in sessions.iter_rows(named=True)
                      if p.rollback < s["ts"] <= last and s["session_id"] not in gone),
                     key=lambda s: (s["ts"], s["session_id"]))
    p.done_at_rollback = sum(1 for s in sessions.iter_rows(named=True)
                             if s["ts"] <= p.rollback and s["session_id"] not in gone)
    return p


def session_changes(sessions: list[dict[str, Any]], keep: pl.DataFrame,
                    affected: set[str]) -> tuple[list[tuple[str, str]], dict[str, dict[str, Any]]]:
    """Of the `affected` sessions' rows: (session id, row id) of those left without a message, and the
    others' rows remade from the messages they keep (`keep`, `MESSAGE_COLUMNS`): their count, speakers
    and time, the earliest kept message's, as an ingest of them alone gives (a forgotten first
    message's time must not stay): `sessions_frame`, which ingest makes session rows with."""
    made = sessions_frame(keep.with_columns(user_id=pl.lit(""), archive=pl.lit(None, pl.String)),
                          pl.DataFrame(schema=OBSERVATIONS_SCHEMA), "") if keep.height else None
    left = {r["session_id"]: r for r in made.iter_rows(named=True)} if made is not None else {}
    gone, cut = [], {}
    for s in sessions:
        sid = s["session_id"]
        if sid in affected and sid not in left:
            gone.append((sid, s["id"]))
        elif sid in affected:
            cut[sid] = {**s, **{k: left[sid][k] for k in ("n_messages", "speakers", "ts")}}
    return gone, cut


def settle_appends(store: Store, p: Plan, dels: dict[str, set[str]]) -> int:
    """Under the write lease, before a forget writes: turns appended since its plan (an append needs
    only the write lease, which planning and re-deriving do not hold) that the scope names go too, and
    the rows of the sessions they reached are remade from the messages stored now (a session the plan
    emptied is kept when an append refilled it; a larger count makes the next run consolidate the new
    turns). Returns how many more messages go."""
    if p.whole_user:        # `forget.write` reads the appended tables again and deletes all
        return 0
    ids = store.read("messages", p.user_id, columns=["id"]).column("id").to_pylist()
    if p.seen.issuperset(ids):          # the usual case: nothing appended, only the ids read
        return 0
    now = frame(store.read("messages", p.user_id, columns=MESSAGE_COLUMNS))
    new = now.filter(~pl.col("id").is_in(sorted(p.seen)))
    scope = Scope(p.user_id, tuple(p.named_sessions), tuple(p.named_messages), p.before)
    late = _ids(forgotten_messages(new, scope, p.message_ids))
    keep = now.filter(~pl.col("id").is_in(sorted(set(p.row_ids) | late)))
    affected = set(new["session_id"].to_list())
    rows = store.read("sessions", p.user_id, where=col("session_id").isin(sorted(affected))).to_pylist()
    gone, cut = session_changes(rows, keep, affected)
    dels.setdefault("messages", set()).update(late)
    dels["sessions"] = (dels.get("sessions", set()) - {r["id"] for r in cut.values()}) | {rid for _, rid in gone}
    p.cut_sessions.update(cut)
    kept = [i for i, sid in enumerate(p.gone_sessions) if sid not in cut]     # an append refilled the others
    p.gone_sessions, p.gone_session_rows = [p.gone_sessions[i] for i in kept], [p.gone_session_rows[i] for i in kept]
    p.remaining = keep.height
    return len(late)


def feedback_ids(store: Store, user: str, gone: set[str]) -> set[str]:
    """The user's feedback rows that showed or cited a deleted memory."""
    if not store.has_table("feedback") or not gone:
        return set()
    rows = store.read("feedback", user, columns=["id", "shown_ids", "cited_ids"]).to_pylist()
    return {r["id"] for r in rows if not gone.isdisjoint((r["shown_ids"] or []) + (r["cited_ids"] or []))}


def reranker_ids(store: Store, user: str, feedback: set[str]) -> set[str]:
    """Reranker versions trained on deleted feedback: the user's own; global versions trained on
    feedback at least as new as the oldest deleted row; and every version of another user whose first
    version started from one of those global ones (`metrics.from_version`; later versions descend from
    it). The nightly train retrains from the version before them on what survives."""
    if not feedback or not store.has_table("rerankers"):
        return set()
    rows = store.read("feedback", where=col("id").isin(sorted(feedback)), columns=["created_at"]).to_pylist()
    oldest = min((r["created_at"] for r in rows), default=None)
    versions = store.read("rerankers", columns=["id", "scope", "version", "feedback_until", "metrics_json"]).to_pylist()
    out = {r["id"] for r in versions if r["scope"] == f"user:{user}"}
    gone_global = {r["version"] for r in versions if r["scope"] == "global" and oldest is not None
                   and r["feedback_until"] is not None and r["feedback_until"] >= oldest}
    out |= {r["id"] for r in versions if r["scope"] == "global" and r["version"] in gone_global}
    lineages: dict[str, list[dict[str, Any]]] = {}
    for r in (r for r in versions if r["scope"].startswith("user:") and r["scope"] != f"user:{user}"):
        lineages.setdefault(r["scope"], []).append(r)
    for rows_of_scope in lineages.values():
        first = min(rows_of_scope, key=lambda r: r["version"])
        if json.loads(first["metrics_json"] or "{}").get("from_version") in gone_global:
            out |= {r["id"] for r in rows_of_scope}
    return out


def rerun_state(store: Store, p: Plan, run_id: str, max_attempts: int) -> ShardState:
    """The shard state that consolidates the plan's sessions again on top of the user's memory as of
    the rollback point, without the forgotten messages (and the observations that cite them)."""
    assert p.rollback is not None
    user = p.user_id
    state = ShardState(run_id=run_id, users=[user], max_attempts=max_attempts)
    state.watermarks[user] = (p.rollback, p.done_at_rollback)
    if p.rerun:
        add_sessions(store, state, user, [(s, "new", 0, None, []) for s in p.rerun])
    # and without turns appended since the plan: `settle_appends` forgets or counts them, the next run
    # consolidates those that stay (re-deriving one the scope names would write it back)
    gone = set(p.message_ids) | {m["message_id"] for m in state.message_rows if m["id"] not in p.seen}
    state.message_rows = [m for m in state.message_rows if m["message_id"] not in gone]
    for s in state.sessions:
        s.messages = [m for m in s.messages if m["message_id"] not in gone]
        s.n_messages = len(s.messages)
        if s.observations is not None:
            s.observations = [o for o in s.observations if gone.isdisjoint(o["source_ids"] or [])]
    state.sessions = [s for s in state.sessions if s.messages]
    known = read_progress(store, user)
    if "" in known:
        state.progress[(user, "")] = known[""]
    # the phases and profile are rebuilt on top of those as of W (the profile cites every phase)
    if p.done_at_rollback or any(i["work"] == "summarize" for i in active(known.get("", {}).get("items", []))):
        state.summary_retry.append(user)
    clusters = frame(store.read("clusters", user))
    if clusters.height and p.done_at_rollback:
        w = p.rollback
        live = clusters.filter((pl.col("session_ts") <= w) &
                               (pl.col("consumed_ts").is_null() | (pl.col("consumed_ts") > w)))
        state.pools[user] = [Cluster(
            id=r["id"], user_id=user, session_id=r["session_id"], session_ts=r["session_ts"],
            member_ids=list(r["member_ids"]), centroid=np.asarray(r["centroid"], dtype=np.float32),
        ) for r in live.sort(["session_ts", "id"]).iter_rows(named=True)]
    return state


class ReuseEmbedder(Embedder):
    """The run's embedder, answering texts it already embedded (the rolled-back rows' stored vectors)
    from memory: a re-derivation embeds only what is new."""

    name = "reuse"

    def __init__(self, base: Embedder, known: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.base = base
        self.known = known
        self.reused = 0

    @property
    def dim(self) -> int:
        return self.base.dim

    @property
    def model_name(self) -> str:
        return self.base.model_name

    def _encode(self, texts: list[str]) -> np.ndarray:
        return self.base.embed(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        missing = [i for i, t in enumerate(texts) if t not in self.known]
        for i, t in enumerate(texts):
            if t in self.known:
                out[i] = self.known[t]
        self.reused += len(texts) - len(missing)
        if missing:
            vecs = self.base.embed([texts[i] for i in missing])
            for i, v in zip(missing, vecs):
                out[i] = v
                self.known[texts[i]] = v
        return out


class RollbackView(Store):
    """The store as the re-derivation must see it: the rows the forget deletes hidden, and validity
    pointers to them cleared, so every stage reads the user's memory as of W whatever it filters by
    itself. Shares the base store's connection; stages only read (the LLM cache still writes)."""

    def __init__(self, base: Store, hidden: dict[str, set[str]]) -> None:  # noqa: D107
        self.__dict__.update(base.__dict__)
        self.hidden = hidden
        self.dead = set().union(*hidden.values()) if hidden else set()

    def read(self, name: str, user_id: str | None = None, *, columns: list[str] | None = None,
             where: Any = None, version: int | None = None, null: str | None = None,
             limit: int | None = None) -> pa.Table:
        hide = self.hidden.get(name, set())
        cols = columns if columns is None or "id" in columns or not hide else columns + ["id"]
        t = super().read(name, user_id, columns=cols, where=where, version=version, null=null,
                         limit=None if hide else limit)
        if hide and t.num_rows:
            t = t.filter(pc.invert(pc.is_in(t.column("id"), value_set=pa.array(sorted(hide)))))[:limit]
        if cols is not columns and columns is not None:
            t = t.select(columns)
        if name in ("fragments", "insights") and self.dead and t.num_rows:
            t = clear_pointers(t, self.dead)
        return t
