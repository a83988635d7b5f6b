"""Cost that follows new work: a nightly run with nothing to do ends before Prefect or a model loads
(`memory.nightly`), compaction keeps the data files bounded over many runs, and a store refuses a
consolidation with another embedder than the one that wrote its vectors. Real LanceDB, real embedder."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memory.embed import recorded_embedder
from memory.errors import EmbedderMismatchError
from memory.forget import forget
from memory.ingest import ingest
from memory.nightly import new_feedback, pending_users
from memory.runs import consolidate
from memory.settings import Settings
from memory.store import Store
from retrieval import Retriever
from tests.helpers import REPO, SAMPLE

#: `mnemo consolidate` in a subprocess that then says which heavy modules it imported
PROBE = ("import sys; from flows.cli import app\n"
         "try:\n    app(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
         "heavy = sorted(m for m in ('prefect', 'torch', 'sentence_transformers', 'onnxruntime', 'flows.consolidate',"
         " 'memory.stages') if m in sys.modules)\n"
         "print('HEAVY', ','.join(heavy), 'EXIT', code)\n")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def _session(store: Store, user: str, session: str, when: datetime, texts: list[str]) -> None:
    rows = [{"user_id": user, "session_id": session, "message_id": f"{session}-m{i}", "speaker": "Alice",
             "text": t, "timestamp": (when + timedelta(minutes=i)).isoformat()} for i, t in enumerate(texts)]
    path = Path(store.uri).parent / f"{session}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ingest(store, path, "jsonl")


def test_nothing_pending_exits_before_prefect_or_a_model(sample_store: Store) -> None:
    assert pending_users(sample_store) == [] and not new_feedback(sample_store)
    before = sample_store.read("runs").num_rows
    res = _cli("--store", sample_store.uri, "consolidate")
    assert res.returncode == 0, res.stderr
    assert "HEAVY  EXIT 0" in res.stdout, res.stdout            # nothing heavy imported
    assert "0 users with new sessions, 0 sessions" in res.stdout
    assert "data files" in res.stdout
    assert sample_store.read("runs").num_rows == before + 1      # the run is still recorded


def test_pending_users_sees_new_late_and_appended_sessions(sample_store: Store) -> None:
    _session(sample_store, "bob", "bob-new", datetime(2030, 1, 1, tzinfo=timezone.utc), ["I adopted a cat."])
    assert pending_users(sample_store) == ["bob"]
    assert pending_users(sample_store, ["alice"]) == []
    _session(sample_store, "alice", "alice-late", datetime(2000, 1, 1, tzinfo=timezone.utc), ["I was born."])
    assert pending_users(sample_store) == ["alice", "bob"]      # a late session: before the watermark
    consolidate(sample_store, Settings(store=sample_store.uri))
    assert pending_users(sample_store) == []
    rows = sample_store.read("sessions", "alice").to_pylist()    # an append: more messages than consolidated
    rows[0]["n_messages"] += 1
    sample_store.upsert("sessions", rows[:1])
    assert pending_users(sample_store) == ["alice"]


def test_work_pending_a_retry_is_pending(sample_store: Store) -> None:
    row = sample_store.read("progress", "bob").to_pylist()[0]
    row["pending_json"] = json.dumps([{"work": "summarize", "subject": "", "from": 0, "to": 0, "attempts": 1,
                                       "quarantine_ids": []}])
    sample_store.upsert("progress", [row])
    assert pending_users(sample_store) == ["bob"]
    row["pending_json"] = json.dumps([{"work": "summarize", "attempts": 3, "given_up": True}])
    sample_store.upsert("progress", [row])
    assert pending_users(sample_store) == []


def test_compaction_keeps_data_files_bounded(tmp_path: Path) -> None:
    """Ten small runs each write a fragment per table; compaction keeps every table at or under the
    threshold plus one, instead of one more file per run."""
    store = Store(str(tmp_path / "s"))
    cfg = Settings(store=store.uri, compact_max_fragments=3, cleanup_older_than_s=0)
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    for i in range(10):
        _session(store, "carol", f"c{i}", start + timedelta(days=i), [f"I went hiking on trail {i}.",
                                                                       f"My sister visited me on day {i}."])
        report = consolidate(store, cfg)
        assert "data files" in report.compaction
    files = store.data_files()
    assert files["messages"][0] <= 4 and files["fragments"][0] <= 4 and files["runs"][0] <= 4, files
    assert files["units"][0] <= 4, files                          # the commit marker: a file per unit published
    for table in ("messages", "units"):
        on_disk = len(list((tmp_path / "s" / f"{table}.lance" / "data").iterdir()))
        assert on_disk <= 5, (table, on_disk)                     # old versions' files were cleaned up
    assert store.read("messages").num_rows == 20


def test_a_store_refuses_another_embedder(sample_store: Store) -> None:
    assert recorded_embedder(sample_store) == "all-MiniLM-L6-v2"
    _session(sample_store, "bob", "bob-new", datetime(2030, 1, 1, tzinfo=timezone.utc), ["I adopted a cat."])
    with pytest.raises(EmbedderMismatchError) as err:
        consolidate(sample_store, Settings(store=sample_store.uri, embed_backend="onnx-int8"))
    assert "'all-MiniLM-L6-v2'" in str(err.value) and "'all-MiniLM-L6-v2+onnx-int8'" in str(err.value)
    assert pending_users(sample_store) == ["bob"]                 # nothing was written
    other = Settings(store=sample_store.uri, embed_backend="onnx-int8")
    alice = sample_store.read("messages", "alice").num_rows
    with pytest.raises(EmbedderMismatchError):                    # a forget re-derives with vectors too
        forget(sample_store, other, "alice", sessions=["alice-s2"])
    assert sample_store.read("messages", "alice").num_rows == alice
    with pytest.raises(EmbedderMismatchError):                    # and queries embedded otherwise miss
        Retriever.open(sample_store.uri, other)
    res = _cli("--store", sample_store.uri, "consolidate", "--engine", "local")
    assert res.returncode == 0, res.stderr                        # the store's own embedder still works


def test_bench_nightly_clones_users_and_times_one_session(sample_store: Store) -> None:
    """`--nightly-users`: the same new session in a 1-user store and in a 4-user clone of the sample."""
    from evaluation.nightly import bench_nightly

    text = bench_nightly(sample_store, 4, Settings(store=sample_store.uri))
    assert "   1-user store" in text and "   4-user store" in text and "ratio 4-user / 1-user" in text
    assert text.count("1 users with new sessions") == 2, text   # only alice had work, in both stores
