"""Appends in a child process (memory/ingest/append_worker.py) on a real store: the same reports and
errors as `append` in-process, from another pid; a killed child replaced without losing the batch; a
busy store refused after the worker's short wait; and the serving process's retrieval cache keeps
another user's index without reading its rows again (`Store.inserts`: `memory.inserts.InsertLog`)."""
from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterator

import pytest

from memory.embed import Embedder
from memory.errors import AppendTooLargeError, InvalidUserIdError, StoreBusyError
from memory.ingest import REUSED_ID
from memory.ingest.append_worker import AppendWorker, BatchNotSendableError
from memory.lease import write_lease
from memory.settings import Settings
from memory.store import Store
from retrieval import Retriever
from retrieval.index import ADDR


def turns(n: int, session: str = "dana-s1", start: int = 0, text: str = "Dana note {i}: the kiln is hot.") \
        -> list[dict[str, Any]]:
    return [{"session_id": session, "message_id": f"{session}-m{i}", "speaker": "Dana", "text": text.format(i=i),
             "timestamp": f"2024-06-01T10:{i % 60:02d}:00Z"} for i in range(start, start + n)]


@pytest.fixture
def worker(store: Store) -> Iterator[AppendWorker]:
    w = AppendWorker(store, wait_s=0.5, compact_every=0, nice=5)
    yield w
    w.close()


def test_the_worker_appends_like_append_in_another_process(store: Store, worker: AppendWorker) -> None:
    assert worker.pid() != os.getpid()
    bad = turns(3) + [{"session_id": "x", "message_id": "y", "speaker": "z", "text": "t", "timestamp": "later"}]
    rep = worker.append("dana", bad, 10)
    assert (rep.received, rep.added, rep.duplicates) == (4, 3, 0)
    assert rep.quarantined == [{"index": 3, "message_id": "y", "reason": "unparsable timestamp: 'later'"}]
    again = worker.append("dana", turns(3), 10)
    assert (again.added, again.duplicates) == (0, 3)
    assert worker.append("dana", turns(1, text="other {i}"), 10).quarantined[0]["reason"] == REUSED_ID
    assert store.read("messages", "dana").num_rows == 3
    with pytest.raises(AppendTooLargeError):
        worker.submit("dana", turns(11), 10)
    with pytest.raises(InvalidUserIdError):
        worker.submit("da na", turns(1), 10)


def test_a_killed_worker_is_replaced_and_the_batch_written_once(store: Store, worker: AppendWorker,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    worker.append("dana", turns(2), 10)
    dead = worker.pid()
    os.kill(dead, signal.SIGKILL)
    time.sleep(0.5)                              # the pool notices its child is gone
    rep = worker.append("dana", turns(4), 10)    # sent again to a new child
    assert "append worker process died" in caplog.text and worker.pid() != dead
    assert (rep.added, rep.duplicates) == (2, 2)
    ids = store.read("messages", "dana", columns=["message_id"]).column("message_id").to_pylist()
    assert sorted(ids) == [f"dana-s1-m{i}" for i in range(4)]


def test_a_batch_too_deep_to_pickle_is_refused_as_the_callers_input(store: Store, worker: AppendWorker) -> None:
    child = worker.pid()
    value: list[Any] = []
    for _ in range(5000):                        # an unknown field nested deeper than pickle goes
        value = [value]
    bad = turns(1)[0] | {"x": value}
    with pytest.raises(BatchNotSendableError, match="nested too deep") as err:
        worker.append("dana", [bad], 10)
    assert err.value.reason == "RecursionError" and err.value.user_id == "dana"
    rep = worker.append("dana", turns(2), 10)    # the same child goes on with the next batch
    assert rep.added == 2 and worker.pid() == child


def test_a_busy_store_is_refused_after_the_short_wait(store: Store, worker: AppendWorker) -> None:
    worker.pid()                                 # started: its start-up is not part of the wait
    with write_lease(store.uri, wait_s=5):       # another writer (this process) holds the lease
        start = time.perf_counter()
        with pytest.raises(StoreBusyError):
            worker.append("dana", turns(1), 10)
        waited = time.perf_counter() - start
    print(f"\nrefused after {waited:.2f} s (write_wait_s 0.5)")
    assert waited < 5
    assert worker.append("dana", turns(1), 10).added == 1


def test_another_users_index_is_kept_without_a_read(sample_store: Store, embedder: Embedder,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    r = Retriever(sample_store, Settings(store=sample_store.uri), embedder=embedder)
    r.cache.refresh_s = 0.0                       # re-check the versions on every request
    before = r.user_index("alice")
    w = AppendWorker(sample_store, wait_s=1.0, compact_every=0)
    try:
        old = sample_store.version("messages")
        assert w.append("bob", turns(5, session="bob-live"), 10).added == 5
        new = sample_store.version("messages")
        assert sample_store.inserts.inserted_only("messages", old, new, "alice")
        assert not sample_store.inserts.inserted_only("messages", old, new, "bob")
        reads: list[tuple[str, Any]] = []
        real = sample_store.read

        def counted(name: str, *args: Any, **kwargs: Any) -> Any:
            reads.append((name, kwargs.get("columns")))
            return real(name, *args, **kwargs)

        monkeypatch.setattr(sample_store, "read", counted)
        after = r.user_index("alice")
        assert after is before and after.version_of("messages") == new
        assert not [c for name, c in reads if name == "messages" and c == [ADDR]]   # no address read
        assert "bob-live-m4" in r.user_index("bob").turns()    # bob's own index is renewed: his new turns
    finally:
        w.close()
