"""`mnemo bench updates`: on one BEAM 100K development chat (messages shortened, every id and question
kept) the figures print with validity on and off, a kept store is reused (nothing consolidated or
examined again), and a missing scale is a ConfigError."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from evaluation.updates import bench_updates
from memory.errors import ConfigError
from tests.evaluation.test_bench_beam import CHAT, shortened_copy


@pytest.mark.skipif(not (CHAT / "chat.json").is_file(), reason="BEAM development data not present")
def test_bench_updates_on_one_100k_chat(tmp_path: Path) -> None:
    shortened_copy(CHAT, tmp_path / "data" / "100K" / "1")
    store = tmp_path / "stores"
    out = bench_updates(str(tmp_path / "data"), scales=["100K"], store=str(store))
    assert "BEAM 100K updates: 1 chats, 2 knowledge_update and 2 contradiction_resolution" in out
    for label in ("update-first (KU, top-10)", "CR both + flagged in context()", "overall R@10 (every ability)"):
        row = next(ln for ln in out.splitlines() if ln.startswith(f"| {label} |"))
        on, off = (float(x) for x in row.split("|")[2:4])
        assert 0.0 <= on <= 1.0 and 0.0 <= off <= 1.0
    assert (store / "100K").is_dir()
    again = bench_updates(str(tmp_path / "data"), scales=["100K"], store=str(store))
    assert "examined now {'examined': 0," in again                          # decided once, kept
    assert re.findall(r"\| update-first.*", again) == re.findall(r"\| update-first.*", out)
    with pytest.raises(ConfigError):
        bench_updates(str(tmp_path / "data"), scales=["500K"])
