"""BEAM chats (`--format beam`): one `chat.json`, or a folder holding `SCALE/N/chat.json` folders.

A chat is a JSON list of batches `{"batch_number": int, "turns": [[message, ...], ...]}`; a message is
`{"role", "id", "content", "time_anchor"?, ...}`. Each chat is one user, `beam-<SCALE>-<N>` named after
the two folders above its `chat.json` (`100K/3/chat.json` -> `beam-100K-3`); `user_id` replaces that
name when PATH holds a single chat. Each batch is one session, `batch-<batch_number>`. A message keeps
BEAM's `id` (as a string) as its message id and its `role` as speaker; its text is its `content` with the
trailing index marker (`->-> i,j`, also `i,N/A` and `i,j)`) and the blanks before it removed, nothing else.

Times. BEAM has no timestamps, only dates ("time anchors" such as `March-15-2024`, read with the exact
formats of :data:`ANCHOR_FORMATS`, midnight UTC) on some user messages: the first message of each batch
in the released chats. A batch's own `time_anchor`, when set, counts as an anchor of its first message
when that message has none. Messages are taken in chat order (batches in file order, then groups, then
messages) and timed so:

- the first message gets the chat's first anchor (so the first anchor also covers the messages before
  it), or :data:`EPOCH` (2024-01-01 00:00 UTC) in a chat with no anchor at all;
- every later message gets one :data:`STEP` (one minute) after the message before it, or its own anchor
  when that is later.

Times are thus strictly increasing in chat order (the order is stable across reads), a batch without an
anchor continues where the previous one ended, and an anchor earlier than the time already reached does
not move time back. Every message of a well-formed batch and group takes its step, well-formed or not,
so a malformed message never shifts the others' times.

Set aside with a reason (the rest goes on): a batch without a `turns` list or an integer `batch_number`,
a group that is not a list, a message that is not an object or lacks `id`, `role` or `content`, a
message whose anchor does not parse; in a folder also a `chat.json` that is not JSON, is not a list of
batches, whose folders do not make a valid user id, or whose user id an earlier chat already took. A
single `chat.json` that is not a JSON list cannot be read at all (IngestError).
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from memory.errors import IngestError
from memory.ingest.common import Reader, dump_raw, quarantine_row, record, valid_user

__all__ = ["ANCHOR_FORMATS", "EPOCH", "STEP", "beam_user", "chat_files", "parse_anchor", "read_beam",
           "strip_marker"]

#: the accepted time anchor formats (strict `strptime`, no guessing): `March-15-2024`, `Mar-15-2024`, ISO date
ANCHOR_FORMATS = ("%B-%d-%Y", "%b-%d-%Y", "%Y-%m-%d")
#: the time of the first message of a chat with no time anchor at all
EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
#: the time between two messages in chat order (unless an anchor moves time forward)
STEP = timedelta(minutes=1)
#: the last time a step can reach: messages after an anchor at the very end of year 9999 share it
_LAST = datetime.max.replace(tzinfo=timezone.utc) - STEP

_MARKER = re.compile(r"->->[ \t]*\d+[ \t]*,[ \t]*(?:\d+|N/A)\)?\s*")
_SEGMENT = re.compile(r"(\d+)")


def strip_marker(content: str) -> str:
    """`content` without its trailing `->-> i,j` index marker (and the spaces before it), if it has one."""
    at = content.rfind("->->")
    if at < 0 or not _MARKER.fullmatch(content, at):
        return content
    return content[:at].rstrip(" \t")


def parse_anchor(value: Any) -> datetime | None:
    """A time anchor (`March-15-2024`) as midnight UTC of that day; None if it does not parse."""
    if not isinstance(value, str):
        return None
    for fmt in ANCHOR_FORMATS:
        try:
            return datetime.strptime(value.strip(), fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def beam_user(chat: Path) -> str:
    """The user id a chat's folders name: `.../100K/3/chat.json` -> `beam-100K-3` (may be invalid)."""
    folder = chat.resolve().parent
    return f"beam-{folder.parent.name}-{folder.name}"


def chat_files(path: Path) -> list[Path]:
    """`path` itself if it is a file, else every `chat.json` under it in natural order (100K/2 before 100K/10)."""
    if path.is_file():
        return [path]

    def natural(p: Path) -> list[tuple[int, int | str]]:
        return [(0, int(s)) if s.isdigit() else (1, s) for s in _SEGMENT.split(p.relative_to(path).as_posix()) if s]

    return sorted((p for p in _under(path) if p.is_file()), key=natural)


def _under(path: Path) -> list[Path]:
    """Every `chat.json` below `path`, through linked folders too (a BEAM folder assembled from links
    to chats; `Path.rglob` does not follow them before Python 3.13), each real folder once."""
    seen: set[str] = set()
    found = []
    for root, dirs, files in os.walk(path, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:      # a link back up the tree
            dirs[:] = []
            continue
        seen.add(real)
        if "chat.json" in files:
            found.append(Path(root) / "chat.json")
    return found


def read_beam(path: Path, user_id: str | None = None) -> Reader:
    """("msg", record) / ("bad", quarantine row) pairs of every chat under `path` (see the module doc)."""
    if path.is_file():
        user = user_id if user_id is not None else beam_user(path)
        if not valid_user(user):
            raise IngestError(f"cannot name a user after the folders of {path} ({user!r} is not a valid user id): "
                              "give a user id", archive=str(path))
        try:
            chat = json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError) as exc:
            raise IngestError(f"{path.name} is not a JSON archive: {exc}", archive=str(path)) from exc
        if not isinstance(chat, list):
            raise IngestError(f"{path.name}: a BEAM chat is a JSON list of batches", archive=str(path))
        yield from _read_chat(chat, user, "/".join(path.resolve().parts[-3:]))
        return
    files = chat_files(path)
    if not files:
        raise IngestError(f"{path} holds no chat.json (a BEAM folder holds SCALE/N/chat.json)", archive=str(path))
    if user_id is not None and len(files) > 1:
        raise IngestError(f"a user id names one chat, but {path} holds {len(files)} chats: give one chat.json",
                          archive=str(path), chats=len(files))
    taken: set[str] = set()
    for file in files:
        label, blob = file.relative_to(path).as_posix(), file.read_bytes()
        user = user_id if user_id is not None else beam_user(file)
        try:
            chat = json.loads(blob)
            problem = None if isinstance(chat, list) else "invalid chat: not a list of batches"
        except (ValueError, UnicodeDecodeError):
            chat, problem = None, "invalid json"
        if problem is None and not valid_user(user):
            problem = "no valid user id from the folder names"
        if problem is None and user in taken:
            problem = "user id of an earlier chat"
        if problem is not None:
            yield "bad", quarantine_row(user, label, problem, blob.decode("utf-8", errors="replace"))
            continue
        taken.add(user)
        yield from _read_chat(chat, user, label)


def _read_chat(chat: list[Any], user: str, label: str) -> Reader:
    slots: list[tuple[str, str, Any, Any]] = []  # session id, source, message, its anchor
    for b, batch in enumerate(chat):
        source = f"{label}:{user}/batch {b}"  # names the user, as its messages' sources do
        turns = batch.get("turns") if isinstance(batch, dict) else None
        number = batch.get("batch_number") if isinstance(batch, dict) else None
        if not isinstance(turns, list):
            yield "bad", quarantine_row(user, source, "invalid batch: no list of turns", dump_raw(batch))
            continue
        if not isinstance(number, int) or isinstance(number, bool):
            yield "bad", quarantine_row(user, source, "missing field: batch_number", dump_raw(batch))
            continue
        batch_anchor = _given(batch.get("time_anchor"))
        for g, group in enumerate(turns):
            if not isinstance(group, list):
                yield "bad", quarantine_row(user, f"{label}:{user}/batch-{number}/group {g}",
                                            "invalid group: not a list of messages", dump_raw(group))
                continue
            for k, message in enumerate(group):
                anchor = _given(message.get("time_anchor")) if isinstance(message, dict) else None
                if anchor is None:
                    anchor = batch_anchor
                batch_anchor = None  # the batch's anchor belongs to its first message only
                # the source names the user and the session, so a forget of either finds a bad turn
                slots.append((f"batch-{number}", f"{label}:{user}/batch-{number}/group {g}/{k}", message, anchor))

    anchors = [parse_anchor(anchor) for *_, anchor in slots]
    ts = next((t for t in anchors if t is not None), EPOCH)
    for i, ((sid, source, message, anchor), when) in enumerate(zip(slots, anchors)):
        if i:
            ts = ts + STEP if ts <= _LAST else ts
        if when is not None and when > ts:
            ts = when
        problem = _problem(message, anchor, when)
        if problem:
            yield "bad", quarantine_row(user, source, problem, dump_raw(message))
            continue
        yield "msg", record(user, sid, str(message["id"]), message["role"], strip_marker(message["content"]), ts,
                            source, dump_raw(message))


def _given(anchor: Any) -> Any:
    """An anchor value, None when absent or blank."""
    return None if anchor is None or (isinstance(anchor, str) and not anchor.strip()) else anchor


def _problem(message: Any, anchor: Any, when: datetime | None) -> str | None:
    if not isinstance(message, dict):
        return "invalid message: not an object"
    mid = message.get("id")
    if not ((isinstance(mid, int) and not isinstance(mid, bool)) or (isinstance(mid, str) and mid.strip())):
        return "missing field: id"
    if not isinstance(message.get("role"), str) or not message["role"].strip():
        return "missing field: role"
    if not isinstance(message.get("content"), str):
        return "missing field: content"
    if anchor is not None and when is None:
        return f"unparsable time anchor: {str(anchor)[:60]!r}"
    return None
