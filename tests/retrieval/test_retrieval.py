"""The retriever over a real LanceDB store in a temp dir with the real embedder: public API,
every strategy, tenant isolation, unknown and malformed users, refused queries, cache refresh (only
the users a write touched, one snapshot per index), context, citations."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lancedb.expr import col
from pydantic import ValidationError

import retrieval
from memory.embed import Embedder
from memory.errors import ConfigError, InvalidUserIdError
from memory.settings import PAPER, Settings, load_settings
from memory.store import Store
from retrieval import RetrievalSettings, Retriever, UnknownStrategyError, citation_prompt, parse_citations
from retrieval.context import approx_tokens, build_context
from retrieval.index import TRACKED, UserIndex
from retrieval.retriever import InvalidQueryError
from tests.helpers import ALICE, BOB, ts, write_user


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Store:
    st = Store(str(tmp_path_factory.mktemp("retrieval") / "store"), dim=embedder.dim)
    write_user(st, embedder, "alice", ALICE)
    write_user(st, embedder, "bob", BOB)
    return st


@pytest.fixture(scope="module")
def retriever(store: Store, embedder: Embedder) -> Retriever:
    return Retriever(store, RetrievalSettings(refresh_ms=0), embedder=embedder)


def test_public_api_is_pinned() -> None:
    assert retrieval.__all__ == [
        "RetrievalResult", "RetrievalSettings", "RetrievedItem", "Retriever", "STRATEGIES",
        "UnknownStrategyError", "build_context", "citation_prompt", "parse_citations",
    ]
    assert set(retrieval.STRATEGIES) >= {"dense", "familiarity", "recollection", "rfmem", "hybrid",
                                         "rfmem-hybrid", "calibrated"}


def test_open_by_path_and_embed(store: Store, embedder: Embedder) -> None:
    r = Retriever.open(store.uri, embedder=embedder)
    vecs = r.embed(["hello", "world"])
    assert vecs.shape == (2, embedder.dim) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert r.retrieve("alice", "dog", k=2).items


def test_settings_object_or_retrieval_section(store: Store, embedder: Embedder) -> None:
    """`Retriever` takes the whole Settings (its `retrieval` section) or the section alone."""
    whole = Retriever(store, Settings(store=store.uri, retrieval=RetrievalSettings(k=3)), embedder=embedder)
    section = Retriever(store, RetrievalSettings(k=4), embedder=embedder)
    assert whole.settings.k == 3 and section.settings.k == 4 and Retriever(store).settings == RetrievalSettings()
    assert len(whole.retrieve("alice", "dog").items) == 3 and len(section.retrieve("alice", "dog").items) == 4


@pytest.mark.parametrize("strategy", list(retrieval.STRATEGIES) + [None])
def test_every_strategy_ranks_alice_only(retriever: Retriever, strategy: str | None) -> None:
    res = retriever.retrieve("alice", "What is the name of my dog?", k=5, strategy=strategy)
    assert 0 < len(res.items) <= 5
    assert res.route in ("familiarity", "recollection")
    assert all(it.id.startswith("alice-") for it in res.items)
    assert all(s.startswith("alice:") for it in res.items for s in it.source_ids)
    assert any("Rex" in it.text for it in res.items[:3])
    assert res.signals["timings"]["retrieve_ms"] > 0 and res.signals["timings"]["embed_ms"] > 0
    if strategy == "dense":
        assert {it.kind for it in res.items} == {"message"}


def test_tenants_never_mix(retriever: Retriever, embedder: Embedder) -> None:
    vec = embedder.embed(["my dog chewed my shoes at the chess club"])[0]
    for strategy in retrieval.STRATEGIES:
        res = retriever.retrieve("alice", vec, k=50, strategy=strategy, text="dog chess shoes")
        assert res.items and not any("bob" in it.id or "Bruno" in it.text for it in res.items)


def test_unknown_and_malformed_users(retriever: Retriever) -> None:
    assert retriever.retrieve("carol", "dog").items == []
    for bad in ("alice' OR '1'='1", "", "a b", "x" * 200, "../etc", "alice\n"):
        with pytest.raises(InvalidUserIdError):
            retriever.retrieve(bad, "dog")
    with pytest.raises(UnknownStrategyError):
        retriever.retrieve("alice", "dog", strategy="magic")


@pytest.mark.parametrize("query,kw,error,match", [
    ("   \t\n", {}, InvalidQueryError, "blank"),
    ("", {}, InvalidQueryError, "blank"),
    ("dog", {"strategy": ""}, UnknownStrategyError, "known: "),
    ("dog", {"kinds": ["fragments"]}, InvalidQueryError, "known: message, fragment, insight, topic, summary"),
    ("dog", {"kinds": []}, InvalidQueryError, "kinds is empty"),
    ("guitar \ud800", {}, InvalidQueryError, "lone surrogate"),
    ("dog", {"k": 0}, ConfigError, "k must be between 1 and"),
    ("dog", {"k": 2.7}, ConfigError, "k must be a whole number, got 2.7"),     # not truncated to 2
    ("dog", {"k": 2.0}, ConfigError, "k must be a whole number"),
    ("dog", {"k": True}, ConfigError, "k must be a whole number, got True"),   # not taken as 1
])
def test_meaningless_queries_are_refused(retriever: Retriever, query: str, kw: dict[str, Any],
                                         error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        retriever.retrieve("alice", query, **kw)
    with pytest.raises(error, match=match):            # unknown users too: the query is checked first
        retriever.retrieve("carol", query, **kw)


@pytest.mark.parametrize("vector,what", [
    (np.full(384, np.nan, np.float32), "NaN or infinite"), (np.r_[np.inf, np.zeros(383)], "NaN or infinite"),
    (np.zeros(384, np.float32), "zero length"), (np.zeros(0, np.float32), "zero length"),
])
def test_a_query_vector_without_direction_is_refused(retriever: Retriever, vector: np.ndarray, what: str) -> None:
    """A zero or non-finite vector ranks nothing (every score NaN, JSON not valid): refused, for known
    and unknown users alike; a numpy integer k is a whole number."""
    for user in ("alice", "carol"):
        with pytest.raises(InvalidQueryError, match=f"the query vector (holds|has) {what}.*pass the query's embedding"):
            retriever.retrieve(user, vector, k=3, text="dog")
    assert len(retriever.retrieve("alice", "dog", k=np.int64(2)).items) == 2


def test_dense_searches_turns_only_when_they_are_searched(retriever: Retriever) -> None:
    """dense ranks raw turns: with kinds leaving turns out it finds nothing (as any strategy finds
    nothing of a kind not searched), never turns anyway."""
    assert retriever.retrieve("alice", "my dog", k=5, strategy="dense", kinds=["fragment"]).items == []
    both = retriever.retrieve("alice", "my dog", k=5, strategy="dense", kinds=["message", "fragment"])
    assert both.items and {it.kind for it in both.items} == {"message"}


def test_kinds_and_default_strategy(retriever: Retriever) -> None:
    default = retriever.retrieve("alice", "my dog", k=5)
    assert default.strategy == retriever.settings.default_strategy
    assert retriever.retrieve("alice", "my dog", k=5, strategy=None).ids == default.ids
    assert {it.kind for it in retriever.retrieve("alice", "my dog", k=5, kinds=["fragment"]).items} == {"fragment"}
    assert {it.kind for it in retriever.retrieve("alice", "my dog", k=5, kinds="insight").items} == {"insight"}


def test_signals_and_forced_routes(retriever: Retriever) -> None:
    res = retriever.retrieve("alice", "what did I do with my sister?", k=4, strategy="recollection")
    assert res.route == "recollection" and len(res.items) == 4
    assert {"probe_mean", "entropy", "rounds"} <= set(res.signals)
    assert 0.0 <= res.signals["entropy"] <= 1.0
    fam = retriever.retrieve("alice", "what did I do with my sister?", k=4, strategy="familiarity")
    assert fam.route == "familiarity"
    assert [it.score for it in fam.items] == sorted((it.score for it in fam.items), reverse=True)


def test_new_consolidation_results_are_seen(tmp_path: Path, embedder: Embedder) -> None:
    st = Store(str(tmp_path / "s"), dim=embedder.dim)
    write_user(st, embedder, "dana", BOB)
    r = Retriever.open(st.uri, Settings(store=st.uri, retrieval=RetrievalSettings(refresh_ms=0)), embedder=embedder)
    before = r.retrieve("dana", "kayak trip", k=20)
    row = {"id": "dana-new", "user_id": "dana", "key": "kayak", "content": "went kayaking", "date": "2023-06-01",
           "text": "kayak: Dana went on a kayak trip in Norway", "source_ids": ["dana:D9:1"],
           "session_ts": ts(30), "vector": embedder.embed(["kayak: Dana went on a kayak trip in Norway"])[0]}
    Store(st.uri, dim=embedder.dim).upsert("fragments", [row])  # another writer
    after = r.retrieve("dana", "kayak trip", k=20)
    assert "dana-new" not in before.ids and after.ids[0] == "dana-new"


def _fragment(embedder: Embedder, user: str, fid: str, text: str) -> dict[str, Any]:
    return {"id": fid, "user_id": user, "key": "new", "content": text, "date": "2023-06-01", "text": text,
            "source_ids": [f"{user}:D9:1"], "session_ts": ts(30), "vector": embedder.embed([text])[0]}


def test_a_write_renews_only_the_users_it_touched(tmp_path: Path, embedder: Embedder) -> None:
    st = Store(str(tmp_path / "s"), dim=embedder.dim)
    write_user(st, embedder, "alice", ALICE)
    write_user(st, embedder, "bob", BOB)
    r = Retriever.open(st.uri, Settings(store=st.uri, retrieval=RetrievalSettings(refresh_ms=0)), embedder=embedder)
    alice_before = r.retrieve("alice", "my dog", k=5, strategy="rfmem")
    alice, bob = r.user_index("alice"), r.user_index("bob")
    writer = Store(st.uri, dim=embedder.dim)                      # another process's writer

    writer.upsert("fragments", [_fragment(embedder, "bob", "bob-kayak", "kayak: Bob went kayaking")])
    assert r.user_index("alice") is alice                          # untouched: the same object, memos kept
    bob2 = r.user_index("bob")
    assert bob2 is not bob and "bob-kayak" in bob2.row_of_id() and "bob-kayak" not in bob.row_of_id()
    assert alice.versions == bob2.versions == r.cache.versions()   # alice moved on to the new snapshot
    assert r.retrieve("alice", "my dog", k=5, strategy="rfmem").ids == alice_before.ids

    writer.delete("fragments", col("id") == "bob-kayak")         # a delete touches its user only
    bob3 = r.user_index("bob")
    assert r.user_index("alice") is alice and bob3 is not bob2 and "bob-kayak" not in bob3.row_of_id()

    row = _fragment(embedder, "alice", "alice-f1", "dog: Alice's dog is called Max now")
    writer.upsert("fragments", [row])                             # an update of a row in place
    alice2 = r.user_index("alice")
    assert r.user_index("bob") is bob3 and alice2 is not alice
    assert alice2.rows(np.asarray([alice2.row_of_id()["alice-f1"]]))[0]["text"] == row["text"]


def test_an_index_is_one_snapshot(tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consolidation writes a user's new turns, then their fragments. A request that loads the
    user in between never gets the new turns with the old fragments, nor the old with the new."""
    st = Store(str(tmp_path / "s"), dim=embedder.dim)
    write_user(st, embedder, "bob", BOB)
    writer = Store(st.uri, dim=embedder.dim)
    turn = {"id": "bob-m9", "user_id": "bob", "session_id": "bob-s9", "message_id": "bob:D9:0", "seq": 0,
            "speaker": "Bob", "text": "I bought a kayak", "ts": ts(30),
            "vector": embedder.embed(["Bob: I bought a kayak"])[0]}

    def commit() -> None:   # what a consolidation commit does, in its order
        writer.upsert("messages", [turn])
        writer.upsert("fragments", [_fragment(embedder, "bob", "bob-f9", "kayak: Bob bought a kayak")])

    r = Retriever(st, RetrievalSettings(refresh_ms=0), embedder=embedder)
    read = st.read
    fired = threading.Event()

    def read_then_commit(name: str, *args: Any, **kw: Any) -> Any:
        out = read(name, *args, **kw)
        if name == "messages" and "text" in (kw.get("columns") or []) and not fired.is_set():
            fired.set()
            commit()           # lands between the index's read of the turns and of the fragments
        return out

    monkeypatch.setattr(st, "read", read_then_commit)
    first = r.user_index("bob")
    assert fired.is_set()
    ids = set(first.row_of_id())
    assert ("bob-m9" in ids) == ("bob-f9" in ids), f"a half-written commit was served: {sorted(ids)}"
    assert len(first.versions) == len(TRACKED) and first.versions != r.cache.versions()
    second = r.user_index("bob")
    assert {"bob-m9", "bob-f9"} <= set(second.row_of_id()) and second.versions == r.cache.versions()


def test_one_build_per_touched_user(tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent requests for a user a write touched wait for one build and all get its result."""
    import retrieval.index as index_module

    st = Store(str(tmp_path / "s"), dim=embedder.dim)
    write_user(st, embedder, "bob", BOB)
    r = Retriever(st, RetrievalSettings(refresh_ms=0), embedder=embedder)
    r.user_index("bob")
    Store(st.uri, dim=embedder.dim).upsert("fragments", [_fragment(embedder, "bob", "bob-f9", "kayak: a kayak")])
    builds: list[str] = []
    load = index_module.load_user

    def counted(*args: Any, **kw: Any) -> UserIndex:
        builds.append(args[1])
        return load(*args, **kw)

    monkeypatch.setattr(index_module, "load_user", counted)
    start = threading.Barrier(8)
    got: list[UserIndex] = []

    def request() -> None:
        start.wait()
        got.append(r.user_index("bob"))

    threads = [threading.Thread(target=request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == ["bob"] and len({id(i) for i in got}) == 1 and "bob-f9" in got[0].row_of_id()


def test_context_is_chronological_and_budgeted(retriever: Retriever) -> None:
    res = retriever.retrieve("alice", "pets and hobbies", k=8, strategy="familiarity")
    text = res.context(max_tokens=2000)
    lines = text.splitlines()[1:]
    dates = [line.split("]")[0].strip("- [")[:10] for line in lines]
    assert dates == sorted(dates) and all(f"({it.kind})" in text for it in res.items)
    small = res.context(max_tokens=40)
    assert approx_tokens(small) <= 40 and len(small.splitlines()) < len(lines) + 1
    assert build_context([], 100) == ""


def test_the_budget_counts_unspaced_scripts_and_long_words() -> None:
    """English keeps words × 1.3; a Chinese sentence (no spaces) or a long URL counts by its length,
    so a context of such text keeps within its budget."""
    assert approx_tokens("I bought a red guitar yesterday") == 8
    zh = "我昨天在音乐店买了一把红色的吉他"          # 16 characters, one 'word'
    assert approx_tokens(zh) == 16
    assert approx_tokens("https://example.com/" + "a" * 400) >= 100
    assert approx_tokens("東京 trip") == 2 + 2

    class Item:
        def __init__(self, i: int) -> None:
            self.id, self.kind, self.key, self.date, self.ts = f"m{i}", "message", None, f"2024-01-{i + 1:02d}", None
            self.text = zh * 10
    text = build_context([Item(i) for i in range(5)], 400)
    assert 0 < approx_tokens(text) <= 400 and text.count(zh * 10) == 2


def test_citation_prompt_and_parser(retriever: Retriever) -> None:
    res = retriever.retrieve("alice", "What is my dog called?", k=3, strategy="hybrid")
    turns = retriever.turns("alice", [s for it in res.items for s in it.source_ids])
    prompt = citation_prompt("What is my dog called?", res.items, turns)
    assert "[NO_CITE]" in prompt and "Memory [2]" in prompt and "User Query: What is my dog called?" in prompt
    assert parse_citations("Your dog is Rex. [0, 2]", res.items) == [res.items[0].id, res.items[2].id]
    assert parse_citations("Rex [1] and [1,9]", res.items) == [res.items[1].id]
    assert parse_citations("I don't know. [NO_CITE]", res.items) == []
    assert parse_citations("no citation", res.items) is None


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMO_RETRIEVAL_K", "7")
    monkeypatch.setenv("MNEMO_RETRIEVAL_TAU", "0.5")
    monkeypatch.setenv("MNEMO_API_KEY", "s3cret")
    s = load_settings().retrieval
    assert s.k == 7 and s.tau == 0.5 and s.api_key is not None and s.api_key.get_secret_value() == "s3cret"
    assert (s.lam, s.beam, s.fanout, s.theta_low, s.alpha) == (20.0, 3, 2, 0.3, 0.5)
    paper = RetrievalSettings(**PAPER)
    assert (paper.theta_high, paper.tau, paper.entropy_normalized) == (0.6, 0.25, False)


def test_a_nested_override_updates_its_section_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment's `{"retrieval": {...}}` keeps the section's other fields from the environment."""
    monkeypatch.setenv("MNEMO_RETRIEVAL_K", "5")
    monkeypatch.setenv("MNEMO_API_KEY", "s3cret")
    s = load_settings().with_overrides(retrieval={"rerank_scope": "user"}, theta=0.7)
    assert (s.retrieval.k, s.retrieval.rerank_scope, s.theta) == (5, "user", 0.7)
    assert s.retrieval.api_key is not None and s.retrieval.api_key.get_secret_value() == "s3cret"


@pytest.mark.parametrize("env", [{"MNEMO_API_KEY": ""}, {"MNEMO_API_KEY": "  "},
                                 {"MNEMO_API_KEY": "s3cret", "MNEMO_RETRIEVAL_API_KEY": ""}])
def test_blank_api_key_is_refused(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """A blank key (`MNEMO_API_KEY=${UNSET}`) is an error, not "no key": it would open every route."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match="API key is set but blank"):
        load_settings()
    with pytest.raises(ValidationError, match="API key is set but blank"):
        RetrievalSettings(api_key="")


def test_cli_retrieve_json(store: Store, embedder: Embedder) -> None:
    import json

    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, ["--store", store.uri, "retrieve", "alice", "my dog", "--k", "3", "--json"])
    assert out.exit_code == 0, out.output
    data: dict[str, Any] = json.loads(out.stdout[out.stdout.index("{"):])
    assert len(data["items"]) == 3 and all(i["id"].startswith("alice-") for i in data["items"])


def test_a_purged_snapshot_is_read_again_a_few_times(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget that purges after every write can take a re-read snapshot too: the cache reads the
    snapshot again up to GONE_RETRIES times, then lets the caller see VersionGoneError."""
    import retrieval.index as index_module
    from memory.errors import VersionGoneError

    real, calls = index_module.load_user, {"n": 0, "fail": 0}

    def flaky(*args: Any, **kwargs: Any) -> UserIndex:
        calls["n"] += 1
        if calls["n"] <= calls["fail"]:
            raise VersionGoneError("version 19 no longer exists", table="summaries")
        return real(*args, **kwargs)

    monkeypatch.setattr(index_module, "load_user", flaky)
    calls["fail"] = index_module.GONE_RETRIES - 1
    assert index_module.IndexCache(store).get("alice").user_id == "alice"
    assert calls["n"] == index_module.GONE_RETRIES
    calls.update(n=0, fail=index_module.GONE_RETRIES)
    with pytest.raises(VersionGoneError):
        index_module.IndexCache(store).get("alice")
    assert calls["n"] == index_module.GONE_RETRIES


def test_context_without_a_budget_uses_the_setting(store: Store, embedder: Embedder) -> None:
    """`res.context()` (and `mnemo retrieve`) take `context_tokens` when given no budget, as the HTTP
    and MCP routes do: one query, one context, whatever the surface."""
    r = Retriever(store, RetrievalSettings(context_tokens=40), embedder)
    res = r.retrieve("alice", "pets and hobbies", k=8, strategy="familiarity")
    assert res.context() == res.context(max_tokens=40) != res.context(max_tokens=2000)
    assert approx_tokens(res.context()) <= 40
