"""Ingest of BEAM chats (`--format beam`) into a real LanceDB store: user ids from the folders (or
given), one session per batch, BEAM's message ids, index markers stripped, times from the anchors,
malformed chats quarantined, idempotent re-ingest. The real development chats are used when present."""
from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from memory.errors import IngestError, InvalidUserIdError
from memory.ingest import ingest, read_archive
from memory.ingest.beam import EPOCH, STEP, chat_files, parse_anchor, strip_marker
from memory.store import Store
from tests.helpers import REPO

BEAM = REPO.parent / "shared/data/beam"
needs_beam = pytest.mark.skipif(not (BEAM / "100K/3/chat.json").exists(), reason="BEAM dev chats not available")
MARKER_AT_END = re.compile(r"->->\s*\S+\s*$")
UTC = timezone.utc


def _msg(mid: Any, role: str = "user", content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"role": role, "id": mid, "content": content, **extra}


def _write_chat(root: Path, scale: str, n: str, chat: Any) -> Path:
    path = root / scale / n / "chat.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(chat if isinstance(chat, str) else json.dumps(chat))
    return path


def _chat_order(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for batch in chat for group in batch["turns"] for m in group]


# -- the reader's rules, on small hand-written chats -------------------------------------------
def test_markers_and_anchors() -> None:
    assert strip_marker("Can you help? ->-> 1,2") == "Can you help?"
    assert strip_marker("```\ncode\n``` ->-> 3,N/A") == "```\ncode\n```"
    assert strip_marker("evaluate my approach ->-> 5,14)") == "evaluate my approach"
    assert strip_marker("a -> b ->-> 2,10\n") == "a -> b"
    for kept in ("no marker", "a ->-> 1,2 in the middle", "->-> x,y", ""):
        assert strip_marker(kept) == kept
    assert parse_anchor("March-15-2024") == datetime(2024, 3, 15, tzinfo=UTC)
    assert parse_anchor("Sep-01-2024") == datetime(2024, 9, 1, tzinfo=UTC)
    assert parse_anchor("next tuesday") is None and parse_anchor(20240315) is None


def test_times_follow_the_anchors(tmp_path: Path) -> None:
    chat = [
        {"batch_number": 1, "turns": [[_msg(0, content="before the anchor"), _msg(1, "assistant")],
                                       [_msg(2, time_anchor="March-15-2024"), _msg(3, "assistant")]]},
        {"batch_number": 2, "turns": [[_msg(4), _msg(5, "assistant")]]},            # no anchor: continues
        {"batch_number": 3, "turns": [[_msg(6, time_anchor="April-05-2024"), _msg(7, "assistant")]]},
        {"batch_number": 4, "turns": [[_msg(8, time_anchor="January-01-2024")]]},   # earlier: no going back
        {"batch_number": 5, "time_anchor": "May-01-2024", "turns": [[_msg(9), _msg(10, "assistant")]]},
    ]
    batch = read_archive(_write_chat(tmp_path, "100K", "7", chat), "beam")
    assert batch.quarantine == [] and batch.archive == "chat.json"
    ts = {r["message_id"]: r["ts"] for r in batch.messages.iter_rows(named=True)}
    march, april, may = (datetime(2024, m, d, tzinfo=UTC) for m, d in ((3, 15), (4, 5), (5, 1)))
    assert [ts[str(i)] for i in range(4)] == [march + k * STEP for k in range(4)]
    assert ts["4"] == march + 4 * STEP and ts["5"] == march + 5 * STEP
    assert ts["6"] == april and ts["7"] == april + STEP and ts["8"] == april + 2 * STEP
    assert ts["9"] == may and ts["10"] == may + STEP
    assert set(batch.messages["user_id"]) == {"beam-100K-7"}
    assert batch.sessions["session_id"].to_list() == [f"batch-{n}" for n in range(1, 6)]

    last = datetime.max.replace(tzinfo=UTC)     # an anchor on the last day: later steps stay at the end
    end = [{"batch_number": 1, "turns": [[_msg(i, time_anchor="December-31-9999" if i == 0 else None)
                                          for i in range(1500)]]}]
    ends = read_archive(_write_chat(tmp_path, "100K", "8", end), "beam").messages["ts"].to_list()
    assert len(ends) == 1500 and ends[-1] <= last and ends == sorted(ends)

    bare = [{"batch_number": 1, "turns": [[_msg(0), _msg(1, "assistant")]]}]
    times = read_archive(_write_chat(tmp_path, "500K", "2", bare), "beam").messages["ts"].to_list()
    assert times == [EPOCH, EPOCH + STEP]


def test_malformed_chats_and_messages_are_quarantined(tmp_path: Path, store: Store) -> None:
    good = [{"batch_number": 1, "turns": [[_msg(0, time_anchor="March-15-2024", content="hi ->-> 1,1"),
                                           _msg(1, "assistant", "hello")]]}]
    _write_chat(tmp_path, "100K", "1", good)
    _write_chat(tmp_path, "100K", "2", "[{not json")
    _write_chat(tmp_path, "100K", "3", {"batch_number": 1})
    _write_chat(tmp_path, "100K", "4", [
        {"batch_number": 1, "turns": [[_msg(0, time_anchor="March-15-2024"), {"role": "assistant", "id": 1},
                                       {"role": "user", "content": "no id"}, "not a message",
                                       _msg(4, time_anchor="the day after"), _msg(5, "assistant", "kept")]]},
        {"turns": [[_msg(6)]]}, {"batch_number": 3, "turns": "nope"}, {"batch_number": 4, "turns": [_msg(7)]}])
    report = ingest(store, tmp_path, "beam")
    assert report.archive == tmp_path.name and report.format == "beam"
    assert report.users == ["beam-100K-1", "beam-100K-4"]
    assert report.messages_added == 4  # 100K/1: 0 and 1; 100K/4: 0 and 5
    assert report.reasons == {
        "invalid json": 1, "invalid chat: not a list of batches": 1, "missing field: content": 1,
        "missing field: id": 1, "invalid message: not an object": 1,
        "unparsable time anchor: 'the day after'": 1, "missing field: batch_number": 1,
        "invalid batch: no list of turns": 1, "invalid group: not a list of messages": 1}
    q = {r["reason"]: r for r in store.read("quarantine").to_pylist()}
    assert q["invalid json"]["source"] == "100K/2/chat.json" and q["invalid json"]["raw"] == "[{not json"
    assert q["invalid json"]["user_id"] == "beam-100K-2"
    assert q["missing field: id"]["source"] == "100K/4/chat.json:beam-100K-4/batch-1/group 0/2"
    assert [r["text"] for r in store.read("messages", "beam-100K-1").to_pylist()] == ["hi", "hello"]
    kept = {r["message_id"]: r for r in store.read("messages", "beam-100K-4").to_pylist()}
    # a malformed message still takes its time step
    assert kept["5"]["ts"] == datetime(2024, 3, 15, tzinfo=UTC) + 5 * STEP

    before = {t: store.read(t, columns=["id"]).num_rows for t in ("messages", "sessions", "quarantine")}
    again = ingest(store, tmp_path, "beam")
    assert again.messages_added == 0 and again.quarantined == report.quarantined
    assert {t: store.read(t, columns=["id"]).num_rows for t in before} == before


def test_user_id_override_and_bad_paths(tmp_path: Path, store: Store) -> None:
    chat = [{"batch_number": 1, "turns": [[_msg(0), _msg(1, "assistant")]]}]
    one = _write_chat(tmp_path / "data", "100K", "1", chat)
    _write_chat(tmp_path / "data", "100K", "2", chat)
    assert ingest(store, one, "beam", user_id="carol").users == ["carol"]
    assert ingest(store, one.parent, "beam", user_id="dave").users == ["dave"]  # a folder of one chat
    with pytest.raises(IngestError, match="holds 2 chats"):
        ingest(store, tmp_path / "data", "beam", user_id="erin")
    with pytest.raises(InvalidUserIdError):
        ingest(store, one, "beam", user_id="erin\n")
    with pytest.raises(IngestError, match="no chat.json"):
        ingest(store, _empty(tmp_path / "empty"), "beam")
    odd = tmp_path / "x y" / "chat.json"
    odd.parent.mkdir()
    odd.write_text(json.dumps(chat))
    with pytest.raises(IngestError, match="give a user id"):
        ingest(store, odd, "beam")
    bad = _write_chat(tmp_path / "bad", "1M", "1", "{oops")
    with pytest.raises(IngestError, match="not a JSON archive"):
        ingest(store, bad, "beam")
    with pytest.raises(IngestError, match="list of batches"):
        ingest(store, _write_chat(tmp_path / "shape", "1M", "1", {"a": 1}), "beam")
    assert sorted(store.users()) == ["carol", "dave"]


def _empty(path: Path) -> Path:
    path.mkdir()
    return path


# -- the development chats ---------------------------------------------------------------------
@needs_beam
def test_one_100k_chat(store: Store) -> None:
    path = BEAM / "100K/3/chat.json"
    chat = json.loads(path.read_text())
    report = ingest(store, path, "beam")
    assert report.users == ["beam-100K-3"] and report.quarantined == 0
    assert report.sessions == len(chat) and report.messages_added == len(_chat_order(chat))
    rows = store.read("messages", "beam-100K-3").to_pylist()
    assert {r["session_id"] for r in rows} == {f"batch-{b['batch_number']}" for b in chat}
    by_id = {r["message_id"]: r for r in rows}
    order = _chat_order(chat)
    assert list(by_id) and set(by_id) == {str(m["id"]) for m in order}
    assert not any(MARKER_AT_END.search(r["text"]) for r in rows)
    for m in order:
        got = by_id[str(m["id"])]
        assert got["speaker"] == m["role"] and m["content"].startswith(got["text"])
    times = [by_id[str(m["id"])]["ts"] for m in order]
    assert all(a < b for a, b in zip(times, times[1:]))
    assert times[0] == datetime(2024, 3, 15, tzinfo=UTC)  # the chat's first anchor, March-15-2024

    again = ingest(store, path, "beam")
    assert again.messages_added == 0 and store.read("messages", columns=["id"]).num_rows == len(order)


@needs_beam
def test_a_folder_of_chats(tmp_path: Path, store: Store) -> None:
    whole = read_archive(BEAM, "beam")  # every development chat passes the limits and shape checks
    assert whole.quarantine == [] and len(set(whole.messages["user_id"])) == 16
    assert "beam-1M-3" in set(whole.messages["user_id"])

    root = tmp_path / "beam"
    for n in ("1", "2"):
        shutil.copytree(BEAM / "100K" / n, root / "100K" / n)
    _write_chat(root, "100K", "3", '[{"batch_number": 1, "turns": [[{"role": "user", "id": 0,')
    report = ingest(store, root, "beam")
    assert report.users == ["beam-100K-1", "beam-100K-2"] and report.reasons == {"invalid json": 1}
    assert sorted(store.users()) == ["beam-100K-1", "beam-100K-2"]
    total = sum(len(_chat_order(json.loads((root / "100K" / k / "chat.json").read_text()))) for k in ("1", "2"))
    assert report.messages_added == total
    assert ingest(store, root, "beam").messages_added == 0


@needs_beam
def test_a_folder_of_linked_chats(tmp_path: Path) -> None:
    """A BEAM folder assembled from links to chat folders (one scale's chat next to another's) reads
    every linked chat, in natural order, and a link back up the tree is walked once."""
    root = tmp_path / "beam"
    (root / "100K").mkdir(parents=True)
    (root / "1M").mkdir()
    (root / "100K" / "10").symlink_to(BEAM / "100K" / "10")
    (root / "100K" / "2").symlink_to(BEAM / "100K" / "2")
    (root / "1M" / "loop").symlink_to(root)
    assert [p.parent.name for p in chat_files(root)] == ["2", "10"]
    batch = read_archive(root, "beam")
    assert batch.quarantine == [] and sorted(set(batch.messages["user_id"])) == ["beam-100K-10", "beam-100K-2"]
