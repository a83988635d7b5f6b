"""`mnemo bench appends`' pieces that need no service: the reader is an archive user, never a writer
an earlier run left in a reused store, and with no reader the retrieval target is not judged."""
from __future__ import annotations

import pytest

from evaluation.appends import _report, reader_of
from memory.errors import ConfigError


def test_the_reader_is_never_an_earlier_runs_writer() -> None:
    assert reader_of(["append-bench-1a2b3c-0", "append-bench-9f9f9f-1", "conv-26", "conv-30"]) == "conv-26"
    assert reader_of(["alice", "bob"]) == "alice"
    with pytest.raises(ConfigError, match="no user but the bench's own"):
        reader_of(["append-bench-1a2b3c-0"])


def figures(retrieve_ms: list[float]) -> dict[str, object]:
    return {"wall": 20.0, "window": 20.0, "added": 20000, "batch_ms": [40.0] * 200, "retrieve_ms": retrieve_ms,
            "served_ms": [], "index_ms": [], "errors": [], "server_cpu_s": 20.0}


def test_without_a_reader_the_retrieval_target_is_not_judged() -> None:
    stored = {"u": 0, "u:rows": 20000}
    alone = _report(figures([]), stored, build_s=1.0, archive="sample.jsonl", reader="alice", batch=100, writers=1,
                    readers=0, rate=1000.0)
    target = alone.splitlines()[-1]
    assert target == "targets: >= 1,000 messages/s met; retrieval p99 < 50 ms n/a (no reader)"
    served = _report(figures([10.0] * 99 + [80.0] * 2), stored, build_s=1.0, archive="sample.jsonl", reader="alice",
                     batch=100, writers=1, readers=1, rate=1000.0)
    assert served.splitlines()[-1].endswith("retrieval p99 < 50 ms MISSED")
