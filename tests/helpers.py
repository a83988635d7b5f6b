"""Helpers shared by the tests: the sample archive (whole, consolidated, cut in two), store copies and
snapshots, a simulated kill, and a tiny hand-written two-user memory for the retrieval tests."""
from __future__ import annotations

import json
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import pytest

from memory.ingest import ingest
from memory.read import stats
from memory.runs import RunReport, consolidate, open_store
from memory.settings import Settings
from memory.store import Store

if TYPE_CHECKING:
    from memory.embed import Embedder

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "sample.jsonl"
LOCOMO = REPO.parent / "shared/data/locomo/locomo_dev5.json"


# -- stores built from the sample ----------------------------------------------------------------
def add_part(store: Store, part: Path, settings: Settings | None = None) -> RunReport:
    """Ingest one archive part into `store` and consolidate it."""
    ingest(store, part, "jsonl")
    return consolidate(store, settings or Settings(store=store.uri))


def build_consolidated(root: Path) -> tuple[Path, RunReport]:
    """The sample archive ingested into a new store at `root` and consolidated once."""
    return root, add_part(open_store(Settings(store=str(root))), SAMPLE)


def copy_store(src: Path | str, dst: Path) -> Store:
    """A copy of the store directory `src` at `dst` (a few ms), opened."""
    shutil.copytree(src, dst)
    return open_store(Settings(store=str(dst)))


@dataclass(frozen=True)
class SampleSplit:
    """The sample cut in two by `split_sample`: the batch files, the store after consolidating batch 1
    only, and the store after ingesting and consolidating batch 2 on top (default Settings)."""

    a: Path
    b: Path
    first: Path
    two: Path


def build_split(tmp: Path) -> SampleSplit:
    a, b = split_sample(tmp)
    store = ingest_and_consolidate(tmp / "two", a)
    shutil.copytree(tmp / "two", tmp / "first")
    add_part(store, b)
    return SampleSplit(a, b, tmp / "first", tmp / "two")


def ingest_and_consolidate(root: Path, *parts: Path, **settings: Any) -> Store:
    """A new store at `root`: each archive part ingested, then consolidated, in turn."""
    s = Settings(store=str(root), **settings)
    store = open_store(s)
    for part in parts:
        add_part(store, part, s)
    return store


def crash_before_watermarks(monkeypatch: pytest.MonkeyPatch, store: Store, batch: Path,
                           **settings: Any) -> Store:
    """On a consolidated store: ingest `batch`, a consolidation killed the moment it writes the
    watermarks (everything else of it written), then the re-run that heals it."""
    chosen = Settings(store=store.uri, **settings)
    ingest(store, batch, "jsonl")
    with killed_before(monkeypatch, "watermarks"):
        consolidate(store, chosen)
    consolidate(store, chosen)
    return store


def unique_ids(store: Store) -> dict[str, list[str]]:
    """The ids of every table of the store, asserting that none repeats within a table."""
    out = {}
    for name in store.table_names():
        ids = out[name] = store.read(name, columns=["id"]).column("id").to_pylist()
        assert len(ids) == len(set(ids)), f"duplicate ids in {name}: {len(ids)} rows, {len(set(ids))} ids"
    return out


#: the tables whose ids a consolidation's result is compared by
ID_TABLES = ("messages", "sessions", "fragments", "insights", "clusters", "links", "watermarks")


def memory_snapshot(store: Store) -> dict[str, Any]:
    """Ids per table, the content of memory rows (run ids, timestamps, provenance excluded) and stats:
    what two ways of consolidating the same archive must agree on."""
    return snapshot(store, ID_TABLES, content_columns=["id", "user_id", "text", "date", "source_ids"],
                    with_stats=True)


def snapshot(store: Store, tables: Iterable[str], *, content_columns: Iterable[str] = (),
             with_stats: bool = False) -> dict[str, Any]:
    """The ids of each of `tables` (None for a table the store lacks), asserting that every table of
    the store has unique ids; with `content_columns`, the content of the fragments and insights rows
    in those columns (run ids and timestamps left out); with `with_stats`, `mnemo stats`."""
    tables = tuple(tables)
    snap: dict[str, Any] = {name: set(ids) for name, ids in unique_ids(store).items() if name in tables}
    for name in tables:
        snap.setdefault(name, None)  # a missing table is told apart from an empty one
    columns = list(content_columns)
    if columns:
        for name in ("fragments", "insights"):
            rows = store.read(name, columns=columns).to_pylist()
            snap[name + ":content"] = {json.dumps(r, sort_keys=True) for r in rows}
    if with_stats:
        snap["stats"] = stats(store)
    return snap


def split_sample(tmp: Path) -> tuple[Path, Path]:
    """The sample archive cut in two by session start time: the earlier half of sessions first."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    firsts: dict[tuple[str, str], str] = {}
    for r in rows:
        key = (r["user_id"], r["session_id"])
        firsts[key] = min(firsts.get(key, r["timestamp"]), r["timestamp"])
    order = sorted(firsts, key=lambda k: firsts[k])
    early = set(order[: len(order) // 2])
    a, b = tmp / "a.jsonl", tmp / "b.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in rows if (r["user_id"], r["session_id"]) in early) + "\n")
    b.write_text("\n".join(json.dumps(r) for r in rows if (r["user_id"], r["session_id"]) not in early) + "\n")
    return a, b


class Killed(RuntimeError):
    """The simulated crash of a run."""


def forget_killed_before_messages(monkeypatch: pytest.MonkeyPatch, store: Store, user: str,
                                  sessions: list[str]) -> None:
    """A forget of `sessions` killed after it deleted their derived rows, before it deleted their
    messages: its run stays `started`."""
    from memory.forget import forget

    real = Store.delete

    def dies(self: Store, name: str, where: Any) -> Any:
        if name == "messages":
            raise Killed("killed before deleting the messages")
        return real(self, name, where)

    with monkeypatch.context() as m:
        m.setattr(Store, "delete", dies)
        with pytest.raises(Killed):
            forget(store, Settings(store=store.uri), user, sessions=sessions)


@contextmanager
def killed_before(monkeypatch: pytest.MonkeyPatch, table: str) -> Iterator[None]:
    """The block must die the moment it writes `table` (earlier writes land); the store heals after."""
    real = Store.upsert

    def crashing(self: Store, name: str, data: Any) -> int:
        if name == table:
            raise Killed(f"killed before writing {name}")
        return real(self, name, data)

    monkeypatch.setattr(Store, "upsert", crashing)
    try:
        with pytest.raises(Killed):
            yield
    finally:
        monkeypatch.setattr(Store, "upsert", real)


# -- a hand-written two-user memory for the retrieval tests -----------------------------------------
ALICE = [
    ("I went hiking in the Alps with my sister last summer", 1),
    ("My dog is called Rex and he loves the beach", 2),
    ("I started painting sunsets in watercolor", 3),
    ("Work has been stressful since the promotion", 4),
    ("We adopted a kitten named Luna yesterday", 5),
    ("My favourite band is Radiohead, I saw them live in Paris", 6),
]
BOB = [("I play chess every Tuesday at the club", 1), ("My dog Bruno chewed my shoes", 2)]


def ts(day: int) -> datetime:
    return datetime(2023, 5, day, 12, 0, tzinfo=timezone.utc)


def write_user(store: Store, emb: "Embedder", user: str, turns: list[tuple[str, int]]) -> None:
    """Messages, one fragment per message and one insight for `user`, embedded with `emb`."""
    msgs: list[dict[str, Any]] = [
        {"id": f"{user}-m{i}", "user_id": user, "session_id": f"{user}-s{day}", "message_id": f"{user}:D1:{i}",
         "seq": i, "speaker": user.title(), "text": text, "ts": ts(day)} for i, (text, day) in enumerate(turns)]
    frags: list[dict[str, Any]] = []
    for i, (text, day) in enumerate(turns):
        key = " ".join(text.split()[1:4]).lower()
        frags.append({"id": f"{user}-f{i}", "user_id": user, "session_id": f"{user}-s{day}", "session_ts": ts(day),
                      "subject": user.title(), "category": "factual", "key": key, "content": text,
                      "date": f"2023-05-{day:02d}", "text": f"{key}: {user.title()} said {text}",
                      "source_ids": [f"{user}:D1:{i}"]})
    store_embedded(store, emb, msgs, frags)
    ins: dict[str, Any] = {"id": f"{user}-i0", "user_id": user, "key": "pets", "content": f"{user.title()} has pets",
           "date": "2023-05-02 to 2023-05-05", "text": f"pets: {user.title()} has pets and cares for them",
           "source_ids": [m["message_id"] for m in msgs[:2]], "parent_ids": [frags[0]["id"]],
           "session_ts": ts(5)}
    ins["vector"] = emb.embed([ins["text"]])[0]
    store.upsert("insights", [ins])


def messages_store(root: Path, embedder: "Embedder", user: str, texts: list[str]) -> Store:
    """A store at `root` holding `texts` as one session of `user`'s turns, embedded: the smallest
    store a retrieval or service test can search."""
    st = Store(str(root), dim=embedder.dim)
    speaker = user.capitalize()
    rows: list[dict[str, Any]] = [
        {"id": f"{user}-m{i}", "user_id": user, "session_id": "s1", "message_id": f"D1:{i}", "seq": i,
         "speaker": speaker, "text": t, "ts": datetime(2023, 3, i + 1, tzinfo=timezone.utc)}
        for i, t in enumerate(texts)]
    for r, v in zip(rows, embedder.embed([f"{speaker}: {t}" for t in texts])):
        r["vector"] = v
    st.upsert("messages", rows)
    return st


def store_embedded(st: Store, emb: "Embedder", messages: list[dict[str, Any]],
                   fragments: list[dict[str, Any]]) -> Store:
    """Hand-written messages and fragments embedded as consolidation embeds them, then stored."""
    from memory.text import turn_text

    for m, v in zip(messages, emb.embed([turn_text(m["speaker"], m["text"]) for m in messages])):
        m["vector"] = v
    for f, v in zip(fragments, emb.embed([f["text"] for f in fragments])):
        f["vector"] = v
    st.upsert("messages", messages)
    st.upsert("fragments", fragments)
    return st


@contextmanager
def run_lease_held(uri: str) -> Iterator[None]:
    """While the block runs, another thread holds the store's run lease (a consolidation in progress)."""
    from memory.lease import run_lease

    held, release = threading.Event(), threading.Event()

    def run() -> None:
        with run_lease(uri):
            held.set()
            release.wait(10)

    t = threading.Thread(target=run)
    t.start()
    held.wait(10)
    try:
        yield
    finally:
        release.set()
        t.join()


def statement(text: str, mid: str, subject: str = "user") -> dict[str, Any]:
    """A fragment as the `rules` supersede decision reads it: its subject, text and one source turn."""
    return {"subject": subject, "key": "", "content": text, "source_ids": [mid]}
