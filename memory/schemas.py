"""The one place that defines every table's Arrow schema.

Every row has a deterministic `id` (see `memory.ids.make_id`) and a `user_id`; memory rows carry
provenance: `source_ids` (message ids), `run_id`, `backend`, `model`, `prompt_version`.
Vector columns are fixed-size float32 lists whose width is the embedder's dimension.
"""
from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
STR_LIST = pa.list_(pa.string())

#: memory kinds the retriever can search, with the table each lives in
MEMORY_TABLES = {"message": "messages", "fragment": "fragments", "insight": "insights", "topic": "topics",
                 "summary": "summaries"}

CATEGORIES = ("factual", "experiential", "subjective")
INFERENCE_TYPES = ("extension", "accumulation", "specification", "transformation", "connection")


#: each searchable row's BM25 terms (`memory.terms`, set on every write); suffix: the tokenizer's version
TERMS = "terms_v1"


def vector_type(dim: int) -> pa.DataType:
    return pa.list_(pa.float32(), dim)


def _id_user() -> list[pa.Field]:
    return [pa.field("id", pa.string(), nullable=False), pa.field("user_id", pa.string(), nullable=False)]


def _provenance() -> list[pa.Field]:
    return [
        pa.field("source_ids", STR_LIST),
        pa.field("run_id", pa.string()),
        pa.field("backend", pa.string()),
        pa.field("model", pa.string()),
        pa.field("prompt_version", pa.string()),
    ]


def _terms() -> list[pa.Field]:   # null: written before terms were stored (tokenized on load)
    return [pa.field(TERMS, STR_LIST, nullable=True)]


def _validity() -> list[pa.Field]:
    """Validity of a fragment or insight (issue 12): `valid_from` its time (ISO 8601), `valid_until`
    the time of the memory that replaced it and `superseded_by` that memory's id (both null while
    current), `contradicts` the id of an older memory it contradicts without replacing it (same date
    scope, opposite statement), `replaces_sources` the older messages whose statement it replaces
    when no fragment of theirs holds that statement (extraction missed it), `contradicts_sources`
    likewise the older messages it contradicts, `supersede_version` the rule set or prompt version that decided it
    (null: not examined yet). Nothing is deleted: a closed memory stays retrievable as history."""
    return [
        pa.field("valid_from", pa.string(), nullable=True),
        pa.field("valid_until", pa.string(), nullable=True),
        pa.field("superseded_by", pa.string(), nullable=True),
        pa.field("contradicts", pa.string(), nullable=True),
        pa.field("replaces_sources", STR_LIST, nullable=True),
        pa.field("contradicts_sources", STR_LIST, nullable=True),
        pa.field("supersede_version", pa.string(), nullable=True),
    ]


def messages(dim: int) -> pa.Schema:
    """One conversation turn as written; `vector` is filled by the embed stage."""
    return pa.schema(_id_user() + [
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("seq", pa.int32()),
        pa.field("speaker", pa.string()),
        pa.field("text", pa.string()),
        pa.field("ts", TS), pa.field("utc_offset_min", pa.int32()),   # the timestamp's offset: `dates.local_time`
        pa.field("archive", pa.string()),
        pa.field("vector", vector_type(dim), nullable=True),
        pa.field("embed_model", pa.string()),
    ] + _terms())


def sessions(dim: int) -> pa.Schema:
    """One session per user; `observed` sessions got imported fragments and skip extraction."""
    return pa.schema(_id_user() + [
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("ts", TS),
        pa.field("n_messages", pa.int32()),
        pa.field("speakers", STR_LIST),
        pa.field("archive", pa.string()),
        pa.field("observed", pa.bool_()),
    ])


def fragments(dim: int) -> pa.Schema:
    """PREMem step 1: one categorized piece of personal information."""
    return pa.schema(_id_user() + [
        pa.field("session_id", pa.string()),
        pa.field("session_ts", TS),
        pa.field("subject", pa.string()),
        pa.field("category", pa.string()),
        pa.field("key", pa.string()),
        pa.field("content", pa.string()),
        pa.field("date", pa.string()),
        pa.field("text", pa.string()),
        pa.field("cluster_id", pa.string()),
        pa.field("vector", vector_type(dim)),
    ] + _provenance() + _validity() + _terms())


def insights(dim: int) -> pa.Schema:
    """PREMem step 2: a fragment inferred across sessions over one linked cluster pair."""
    return pa.schema(_id_user() + [
        pa.field("session_id", pa.string()),
        pa.field("session_ts", TS),
        pa.field("link_id", pa.string()),
        pa.field("inference_type", pa.string()),
        pa.field("key", pa.string()),
        pa.field("content", pa.string()),
        pa.field("date", pa.string()),
        pa.field("text", pa.string()),
        pa.field("parent_ids", STR_LIST),
        pa.field("vector", vector_type(dim)),
    ] + _provenance() + _validity() + _terms())


def observations(dim: int) -> pa.Schema:
    """Facts recorded by an earlier LLM pass (LoCoMo `observation`), imported at ingest.

    The extract stage turns them into fragments of their session instead of calling the LLM.
    """
    return pa.schema(_id_user() + [
        pa.field("session_id", pa.string()),
        pa.field("subject", pa.string()),
        pa.field("content", pa.string()),
        pa.field("source_ids", STR_LIST),
        pa.field("archive", pa.string()),
    ])


def clusters(dim: int) -> pa.Schema:
    """Per-session fragment clusters; the persistent pool is the unconsumed ones.

    `consumed_ts` is the session time of the first later cluster it linked to, so the pool as of
    any watermark W is: session_ts <= W and (consumed_ts is null or consumed_ts > W).
    """
    return pa.schema(_id_user() + [
        pa.field("session_id", pa.string()),
        pa.field("session_ts", TS),
        pa.field("member_ids", STR_LIST),
        pa.field("size", pa.int32()),
        pa.field("centroid", vector_type(dim)),
        pa.field("consumed_ts", TS, nullable=True),
        pa.field("consumed_by", pa.string(), nullable=True),
        pa.field("run_id", pa.string()),
    ])


def links(dim: int) -> pa.Schema:
    """A connected pair (pool cluster p, new cluster c) with sim(p, c) > θ."""
    return pa.schema(_id_user() + [
        pa.field("pool_cluster_id", pa.string()),
        pa.field("new_cluster_id", pa.string()),
        pa.field("session_id", pa.string()),
        pa.field("similarity", pa.float32()),
        pa.field("run_id", pa.string()),
    ])


def watermarks(dim: int) -> pa.Schema:
    """Per user: the newest session whose every stage is committed. Written last."""
    return pa.schema(_id_user() + [
        pa.field("last_session_ts", TS),
        pa.field("sessions_done", pa.int32()),
        pa.field("run_id", pa.string()),
        pa.field("updated_at", TS),
    ])


def progress(dim: int) -> pa.Schema:
    """Per user and session: how far consolidation got, and the LLM work it still owes.

    One row per consolidated session (`n_messages` / `next_seq`: the message count and the `seq`
    after the last message consolidated, so messages appended later are found) and one per user
    (`session_id` null: its profile and phase summaries). `pending_json` lists work set aside by
    quarantine: items `{"work", "subject", "from", "to", "attempts", "quarantine_ids", "given_up"}`,
    retried by later runs until they succeed or reach `Settings.max_llm_attempts`; `status` is
    `done`, `pending` or `given_up`. Written after every other table of a commit, before the
    watermarks.
    """
    return pa.schema(_id_user() + [
        pa.field("session_id", pa.string(), nullable=True),
        pa.field("session_ts", TS, nullable=True),
        pa.field("n_messages", pa.int32()),
        pa.field("next_seq", pa.int32()),
        pa.field("status", pa.string()),
        pa.field("pending_json", pa.string()),
        pa.field("run_id", pa.string()),
        pa.field("updated_at", TS),
    ])


def runs(dim: int) -> pa.Schema:
    """One row per command run (ingest, consolidate, backfill) with its summary."""
    return pa.schema([
        pa.field("id", pa.string(), nullable=False),
        pa.field("kind", pa.string()),
        pa.field("status", pa.string()),
        pa.field("started_at", TS),
        pa.field("finished_at", TS),
        pa.field("users", STR_LIST),
        pa.field("counts_json", pa.string()),
        pa.field("llm_calls", pa.int64()),
        pa.field("tokens_in", pa.int64()),
        pa.field("tokens_out", pa.int64()),
        pa.field("cache_hits", pa.int64()),
        pa.field("quarantined", pa.int64()),
        pa.field("seconds", pa.float64()),
        pa.field("backend", pa.string()),
        pa.field("model", pa.string()),
    ])


def quarantine(dim: int) -> pa.Schema:
    """Rows and LLM answers set aside with the reason and the raw text; nothing is lost."""
    return pa.schema([
        pa.field("id", pa.string(), nullable=False),
        pa.field("user_id", pa.string(), nullable=True),
        pa.field("stage", pa.string()),
        pa.field("source", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("raw", pa.string()),
        pa.field("run_id", pa.string()),
        pa.field("created_at", TS),
    ])


def llm_cache(dim: int) -> pa.Schema:
    """LLM answers by key = hash(model, messages, schema); `truncated_at`: the token limit that cut one."""
    return pa.schema([
        pa.field("id", pa.string(), nullable=False),
        pa.field("backend", pa.string()),
        pa.field("model", pa.string()),
        pa.field("task", pa.string()),
        pa.field("prompt_version", pa.string()),
        pa.field("response", pa.string()),
        pa.field("tokens_in", pa.int64()),
        pa.field("tokens_out", pa.int64()),
        pa.field("created_at", TS),
        pa.field("truncated_at", pa.int64(), nullable=True),
        # the reverse index `memory.forget` deletes by: the request's user, the message ids its prompt quotes and
        # the memory ids (fragments, phases, topics, links, `text:<hash>` of a quoted summary) it was built from
        pa.field("user_id", pa.string(), nullable=True),
        pa.field("message_ids", STR_LIST, nullable=True),
        pa.field("memory_ids", STR_LIST, nullable=True),
    ])


def topics(dim: int) -> pa.Schema:
    """RMM prospective reflection: a topic memory of one participant with the turns it references.

    A merge updates the topic in place (same id): `source_ids` become the union, `history_json`
    records each replaced version (text, date, session_ts, the sources the merge added) and the summary merged in, so the
    bank as of any watermark W can be rebuilt (created_ts <= W, later merges undone).
    """
    return pa.schema(_id_user() + [
        pa.field("session_id", pa.string()),
        pa.field("created_ts", TS),
        pa.field("session_ts", TS),
        pa.field("subject", pa.string()),
        pa.field("key", pa.string()),
        pa.field("date", pa.string()),
        pa.field("text", pa.string()),
        pa.field("history_json", pa.string()),
        pa.field("merges", pa.int32()),
        pa.field("vector", vector_type(dim)),
    ] + _provenance() + _terms())


def feedback(dim: int) -> pa.Schema:
    """What the answering LLM was shown for one query of one user and what it cited (RMM §6.2)."""
    return pa.schema(_id_user() + [
        pa.field("query", pa.string()),
        pa.field("query_vector", vector_type(dim), nullable=True),
        pa.field("shown_ids", STR_LIST),
        pa.field("cited_ids", STR_LIST),
        pa.field("reranker_version", pa.int64(), nullable=True),
        pa.field("created_at", TS),
    ])


def rerankers(dim: int) -> pa.Schema:
    """Versioned RMM reranker weights (W_q, W_m as float32 bytes) with the metrics of their run."""
    return pa.schema([
        pa.field("id", pa.string(), nullable=False),
        pa.field("version", pa.int64()),
        pa.field("scope", pa.string()),
        pa.field("user_id", pa.string(), nullable=True),
        pa.field("created_at", TS),
        pa.field("dim", pa.int32()),
        pa.field("weights", pa.binary()),
        pa.field("sha256", pa.string()),
        pa.field("feedback_until", TS),
        pa.field("metrics_json", pa.string()),
        pa.field("run_id", pa.string()),
    ])


def graph_nodes(dim: int) -> pa.Schema:
    """MemWeaver graph: one node per fragment or insight, in time order (`seq`), with its K-means
    cluster. Semantic edges are not stored: every pair of nodes sharing `cluster_id` is one (a
    clique would be O(n²) rows); its weight is the cosine of the two memories' vectors."""
    return pa.schema(_id_user() + [
        pa.field("node_id", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("session_ts", TS),
        pa.field("cluster_id", pa.string()),
        pa.field("cluster_size", pa.int32()),
        pa.field("centroid_sim", pa.float32()),
        pa.field("batch_id", pa.string()),
        pa.field("run_id", pa.string()),
        pa.field("weave_version", pa.string()),
    ])


def graph_edges(dim: int) -> pa.Schema:
    """MemWeaver temporal edges (consecutive nodes, and a batch's first node to the last old one):
    the edges that cluster membership cannot give, with their weights."""
    return pa.schema(_id_user() + [
        pa.field("src_id", pa.string()),
        pa.field("dst_id", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("gap_days", pa.float32()),
        pa.field("similarity", pa.float32()),
        pa.field("run_id", pa.string()),
    ])


def summaries(dim: int) -> pa.Schema:
    """MemWeaver cognitive memory: a local summary per phase (`level` = phase) and one global
    profile per user (`level` = profile); `member_ids` are the fragments (or, for the profile, the
    phase summaries) it covers, `source_ids` their messages."""
    return pa.schema(_id_user() + [
        pa.field("level", pa.string()),
        pa.field("session_id", pa.string()),
        pa.field("session_ts", TS),
        pa.field("start_ts", TS),
        pa.field("end_ts", TS),
        pa.field("key", pa.string()),
        pa.field("content", pa.string()),
        pa.field("date", pa.string()),
        pa.field("text", pa.string()),
        pa.field("member_ids", STR_LIST),
        pa.field("n_items", pa.int32()),
        pa.field("vector", vector_type(dim)),
    ] + _provenance() + _terms())


def units(dim: int) -> pa.Schema:
    """The store's one commit marker (`memory.units`): the last multi-table unit a writer opened or
    closed (`state` open / closed / aborted), with every table's version at that moment, so readers
    pin their snapshot to the versions before an open unit (all of it or none of it)."""
    return pa.schema([
        pa.field("id", pa.string(), nullable=False),
        pa.field("seq", pa.int64()),
        pa.field("state", pa.string()),
        pa.field("label", pa.string()),
        pa.field("user_ids", STR_LIST),
        pa.field("versions_json", pa.string()),
        pa.field("holder", pa.string()),
        pa.field("at", TS),
    ])


def leases(dim: int) -> pa.Schema:
    """Lease rows of object-store stores (`memory.lease_row`): one per lease kind, with its holder and
    expiry. `id` is declared Lance's unenforced primary key, so of two concurrent inserts of one new
    key (or updates of one row) Lance commits one and re-plans the other against it."""
    return pa.schema([
        pa.field("id", pa.string(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"}),
        pa.field("holder", pa.string()),
        pa.field("host", pa.string()),
        pa.field("pid", pa.int64()),
        pa.field("acquired_at", TS),
        pa.field("expires_at", TS),
    ])

SCHEMAS = {
    "messages": messages,
    "sessions": sessions,
    "fragments": fragments,
    "insights": insights,
    "observations": observations,
    "clusters": clusters,
    "links": links,
    "watermarks": watermarks,
    "progress": progress,
    "runs": runs,
    "quarantine": quarantine,
    "llm_cache": llm_cache,
    "topics": topics,
    "feedback": feedback,
    "rerankers": rerankers,
    "graph_nodes": graph_nodes,
    "graph_edges": graph_edges,
    "summaries": summaries,
    "units": units,
    "leases": leases,
}

#: tables whose rows are scoped by user and get a scalar index on `user_id`
USER_TABLES = ("messages", "sessions", "observations", "fragments", "insights", "clusters", "links",
               "watermarks", "progress", "topics", "feedback", "graph_nodes", "graph_edges", "summaries")


def schema_for(name: str, dim: int) -> pa.Schema:
    try:
        return SCHEMAS[name](dim)
    except KeyError:
        raise KeyError(f"unknown table {name!r} (known: {', '.join(SCHEMAS)})") from None
