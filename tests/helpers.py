"""Helpers shared by the consolidation tests: the sample archive cut in two, and a simulated kill."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from memory.store import Store

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample.jsonl"


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
