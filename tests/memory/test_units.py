"""Multi-table units (`Store.unit`, `memory.units`) on a real LanceDB store: a reader pinning
`Store.snapshot` sees a unit whole or not at all, while it is open, while a real consolidation
commits shard after shard in another process, and after its holder was killed with `kill -9`; plain
writes stay visible at once; the marker is read once per version of it, not once per write or
snapshot."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from memory import units
from memory.doctor import check
from memory.ingest import ingest
from memory.store import Store
from retrieval.index import TRACKED, IndexCache
from tests.helpers import REPO, SAMPLE

#: what the reader checks, read at one snapshot
CHECKED = ("fragments", "watermarks", "progress", "messages")


def _run_python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE)


def half_units(store: Store, versions: dict[str, int]) -> list[str]:
    """What a reader at `versions` sees of a commit that is not whole: fragments of a session with no
    progress row, or newer than their user's watermark; consolidated (embedded) turns of a user with
    no watermark."""
    at = {name: store.read(name, version=versions[name]) for name in CHECKED}
    marks = {r["user_id"]: r["last_session_ts"] for r in at["watermarks"].to_pylist()}
    done = {(r["user_id"], r["session_id"]) for r in at["progress"].to_pylist()}
    bad = []
    for f in at["fragments"].select(["user_id", "session_id", "session_ts"]).to_pylist():
        if (f["user_id"], f["session_id"]) not in done:
            bad.append(f"fragment of {f['user_id']}/{f['session_id']} without its progress row")
        elif f["user_id"] not in marks or f["session_ts"] > marks[f["user_id"]]:
            bad.append(f"fragment of {f['user_id']}/{f['session_id']} past its user's watermark")
    embedded: defaultdict[str, int] = defaultdict(int)
    for m in at["messages"].select(["user_id", "vector"]).to_pylist():
        embedded[m["user_id"]] += m["vector"] is not None
    bad += [f"{n} embedded turns of {u} without a watermark" for u, n in embedded.items() if n and u not in marks]
    return bad


def many_users(tmp: Path, copies: int) -> Path:
    """The sample archive with its users copied `copies` times under new ids (more shards to commit)."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    out = tmp / "many.jsonl"
    with out.open("w") as fh:
        for c in range(copies):
            for r in rows:
                fh.write(json.dumps({**r, "user_id": f"{r['user_id']}{c}",
                                     "message_id": f"{r['message_id']}-{c}"}) + "\n")
    return out


def test_a_reader_never_sees_half_of_a_unit(tmp_path: Path) -> None:
    writer, reader = Store(str(tmp_path), dim=384), Store(str(tmp_path), dim=384)
    writer.upsert("feedback", [{"id": "fb0", "user_id": "alice"}])
    before = reader.snapshot(["fragments", "watermarks", "feedback"])
    with writer.unit(["alice"], "test"):
        writer.upsert("fragments", [{"id": "f1", "user_id": "alice", "session_id": "s1", "text": "x"}])
        writer.upsert("watermarks", [{"id": "w1", "user_id": "alice", "sessions_done": 1}])
        inside = reader.snapshot(["fragments", "watermarks", "feedback"])
        assert inside == before                                  # the open unit is invisible
        pinned = reader.snapshot(TRACKED)                        # what the retrieval index pins
        assert IndexCache(reader).versions() == tuple(pinned[t] for t in TRACKED)
        assert pinned["fragments"] == before["fragments"]
    after = reader.snapshot(["fragments", "watermarks", "feedback"])
    assert after["fragments"] > before["fragments"] and after["watermarks"] > before["watermarks"]
    writer.upsert("feedback", [{"id": "fb1", "user_id": "alice"}])   # a plain write: visible at once
    assert reader.snapshot(["feedback"])["feedback"] > after["feedback"]
    assert reader.read("feedback", version=reader.snapshot(["feedback"])["feedback"]).num_rows == 2


def test_a_killed_units_half_is_hidden_until_the_next_write(tmp_path: Path) -> None:
    """A holder killed inside its unit leaves the marker open: readers keep the store as it was before
    the unit, and the next write (any write) marks the unit aborted and makes everything visible."""
    uri = str(tmp_path)
    reader = Store(uri, dim=384)
    reader.upsert("feedback", [{"id": "fb0", "user_id": "alice"}])
    before = reader.snapshot(["fragments", "feedback"])
    code = ("import sys, time; from memory.store import Store; s = Store(sys.argv[1], dim=384)\n"
            "with s.unit(['alice'], 'doomed'):\n"
            "    s.upsert('fragments', [{'id': 'f1', 'user_id': 'alice', 'text': 'half'}])\n"
            "    print('written', flush=True); time.sleep(120)\n")
    proc = _run_python(code, uri)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert reader.snapshot(["fragments", "feedback"]) == before
    start = time.perf_counter()
    reader.upsert("feedback", [{"id": "fb1", "user_id": "alice"}])
    print(f"\nfirst write after a killed unit: {(time.perf_counter() - start) * 1000:.1f} ms (marks it aborted)")
    now = reader.snapshot(["fragments", "feedback"])
    assert now["fragments"] > before["fragments"] and now["feedback"] > before["feedback"]
    marker = reader.read("units").to_pylist()[0]
    assert marker["state"] == "aborted" and "doomed" in marker["label"]


def test_a_reader_polling_during_a_consolidation_never_sees_half_a_commit(tmp_path: Path) -> None:
    """A real consolidation (local engine, one user per shard: 12 shard commits) in another process;
    this process reads the store at `Store.snapshot` as fast as it can. Every snapshot is whole; the
    same reads at the latest versions (no marker) are counted for comparison."""
    uri = str(tmp_path / "store")
    store = Store(uri, dim=384)
    ingest(store, many_users(tmp_path, 6), "jsonl")
    code = ("import sys; from memory.runs import consolidate, open_store; from memory.settings import Settings; "
            "s = Settings(store=sys.argv[1], shard_size=1); print(consolidate(open_store(s), s).status, flush=True)")
    run = _run_python(code, uri)
    polls, seen, latest_bad = 0, set(), 0
    while run.poll() is None:
        versions = store.snapshot(CHECKED)
        bad = half_units(store, versions)
        assert not bad, f"at {versions}: {bad[:3]}"
        seen.add(versions["watermarks"])
        try:   # the comparison at the latest versions: a table being created is listed before it opens
            latest_bad += bool(half_units(store, {n: store.version(n) for n in CHECKED}))
        except ValueError:
            pass
        polls += 1
    assert run.wait(timeout=10) == 0 and run.stdout is not None and run.stdout.read().split() == ["completed"]
    final = store.snapshot(CHECKED)
    assert not half_units(store, final)
    marks = store.read("watermarks", version=final["watermarks"]).num_rows
    print(f"\n{polls} snapshots during 12 shard commits ({len(seen)} watermark versions seen): 0 half-seen; "
          f"reading the latest versions instead: {latest_bad} half-seen")
    assert marks == 12 and polls > 0
    assert check(store).ok


def test_the_marker_is_read_once_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write (its lease) and every snapshot asks for the marker: a store handle reads the `units`
    table again only when another unit moved it, here or in another handle."""
    writer, reader = Store(str(tmp_path), dim=384), Store(str(tmp_path), dim=384)
    with writer.unit(["alice"], "first"):
        writer.upsert("fragments", [{"id": "f1", "user_id": "alice", "text": "x"}])
    marker_reads: list[int] = []
    real = reader.read

    def counted(name: str, *args: object, **kwargs: object) -> object:
        marker_reads.extend([1] if name == units.UNITS else [])
        return real(name, *args, **kwargs)   # type: ignore[arg-type]

    monkeypatch.setattr(reader, "read", counted)
    first = units.latest_marker(reader)
    for _ in range(5):
        reader.snapshot(["fragments"])
        reader.upsert("feedback", [{"id": "fb", "user_id": "alice"}])   # a plain write: no new marker
    assert first is not None and first["state"] == "closed" and first["label"] == "first"
    assert len(marker_reads) == 1
    with writer.unit(["alice"], "second"):                              # another handle moves it
        inside = units.latest_marker(reader)
    assert inside is not None and inside["state"] == "open" and inside["label"] == "second"
    last = units.latest_marker(reader)
    assert last is not None and last["state"] == "closed" and last["seq"] == first["seq"] + 2
    assert len(marker_reads) == 3
    # the memo is the handle's own (`Store.marker_memo`): a new handle reads the marker once itself
    assert reader.marker_memo == (reader.version(units.UNITS), last)
    assert Store(str(tmp_path), dim=384).marker_memo is None


def test_a_writer_remembers_the_marker_it_publishes(tmp_path: Path, store_reads: list[str]) -> None:
    """The lease holder is the only writer of `units`: after its own publish it knows the marker at the
    version that write made and never reads it back; another handle reads the same marker."""
    writer = Store(str(tmp_path), dim=384)
    for label in ("first", "second", "third"):
        with writer.unit(["alice"], label):
            writer.upsert("fragments", [{"id": f"f-{label}", "user_id": "alice", "text": label}])
    assert units.UNITS not in store_reads
    mine = units.latest_marker(writer)
    assert units.UNITS not in store_reads
    theirs = units.latest_marker(Store(str(tmp_path), dim=384))
    assert store_reads.count(units.UNITS) == 1
    assert mine == theirs and mine is not None and mine["state"] == "closed" and mine["label"] == "third"
    assert writer.marker_memo is not None and writer.marker_memo[0] == writer.version(units.UNITS)
