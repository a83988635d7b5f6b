"""`mnemo bench beam --nightly-users N`: does a nightly run cost what its new work costs, however many
users the store holds?

From a consolidated scale store (every chat one user), two stores are cloned from its users with no
work pending: one holding only the first of them, and one holding each `ceil(N / users)` times under distinct ids
(`beam-100K-3-u2`, ...; row ids re-derived, vectors and all rows copied, no re-consolidation: the rows of
the other users are what a real store of N users would hold). The same new session (the user's last
session again, a year later, under new ids) is ingested into both, and one nightly consolidation of
all users is timed in each, embedder loaded beforehand. Goal: the N-user run costs at most 2x the
1-user run.
"""
from __future__ import annotations

import json
import math
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memory.embed import embedder_for
from memory.ids import make_id
from memory.ingest import ingest
from memory.nightly import pending_users
from memory.runs import RunReport, consolidate, open_store
from memory.schemas import USER_TABLES
from memory.settings import Settings
from memory.store import Store


def clone_users(src: Store, dst: Store, users: list[str], copies: int) -> int:
    """Copy the rows of `users` in every user-scoped table of `src` into the empty store `dst`, each user
    `copies` times (the first under its own id). Returns the users written."""
    for name in USER_TABLES:
        if not src.has_table(name):
            continue
        t = pa.concat_tables([dst.conform(name, src.read(name, u)) for u in users])
        if t.num_rows == 0:
            continue
        parts = [t]
        for c in range(2, copies + 1):
            uid = pc.binary_join_element_wise(t.column("user_id"), pa.scalar(f"u{c}"), "-")
            ids = pa.array([make_id(i, c) for i in t.column("id").to_pylist()], pa.string())
            parts.append(dst.conform(name, t.set_column(t.schema.get_field_index("id"), "id", ids)
                                     .set_column(t.schema.get_field_index("user_id"), "user_id", uid)))
        with dst.write_lease():
            tbl = dst.table(name)
            tbl.add(pa.concat_tables(parts))
            tbl.create_scalar_index("user_id", index_type="BTREE")   # as the store's first upsert does
    return len(users) * copies


def again_session(store: Store, user: str, out: Path) -> int:
    """Write the user's last session again, a year later under new ids, as a jsonl archive at `out`."""
    sessions = store.read("sessions", user, columns=["session_id", "ts"]).to_pylist()
    last = max(sessions, key=lambda s: s["ts"])["session_id"]
    rows = [r for r in store.read("messages", user).to_pylist() if r["session_id"] == last]
    lines = [json.dumps({"user_id": user, "session_id": f"{last}-again", "message_id": f"{r['message_id']}-again",
                         "speaker": r["speaker"], "text": r["text"],
                         "timestamp": (r["ts"] + timedelta(days=365)).isoformat()}) for r in rows]
    out.write_text("\n".join(lines) + "\n")
    return len(lines)


def _timed_nightly(root: Path, src: Store, cfg: Settings, users: list[str], archive: Path,
                   copies: int) -> tuple[int, float, float, RunReport]:
    st = open_store(cfg.with_overrides(store=str(root)))
    n = clone_users(src, st, users, copies)
    ingest(st, archive, "jsonl")
    t0, cpu = time.perf_counter(), time.process_time()
    report = consolidate(st, cfg.with_overrides(store=str(root)), kind="bench-nightly")
    return n, time.perf_counter() - t0, time.process_time() - cpu, report


def settled_users(src: Store) -> list[str]:
    """The consolidated users of `src` with no work pending (a retry would add work to the timed run)."""
    return sorted(set(src.count_by_user("watermarks")) - set(pending_users(src)))


def bench_nightly(src: Store, n_users: int, cfg: Settings) -> str:
    """The report lines: one new session for the first settled user in a 1-user store and in a store of
    about `n_users` (the settled users of `src`, cloned)."""
    users = settled_users(src)
    if not users:
        return "nightly: no consolidated user without pending work to clone"
    copies = max(1, math.ceil(n_users / len(users)))
    embedder_for(cfg).embed(["warm up"])
    with tempfile.TemporaryDirectory(prefix="mnemo-nightly-") as tmp:
        archive = Path(tmp) / "again.jsonl"
        n_msgs = again_session(src, users[0], archive)
        one = _timed_nightly(Path(tmp) / "one", src, cfg, users[:1], archive, 1)
        many = _timed_nightly(Path(tmp) / "many", src, cfg, users, archive, copies)
    return "\n".join(nightly_lines(users[0], n_msgs, one, many))


def nightly_lines(user: str, n_msgs: int, one: tuple[int, float, float, RunReport],
                  many: tuple[int, float, float, RunReport]) -> list[str]:
    def stages(r: RunReport) -> str:
        return ", ".join(f"{k} {v:.2f}s" for k, v in r.timings.items())

    lines = [f"nightly run adding one session ({n_msgs} messages) to {user} (wall incl. planning and compaction):"]
    for users, wall, cpu, r in (one, many):
        counts: dict[str, Any] = r.counts
        lines.append(f"  {users:4d}-user store: {wall:.2f} s wall, {cpu:.2f} s CPU ({counts.get('users', 0)} users "
                     f"with new sessions, {counts.get('messages', 0)} messages; {stages(r)}); {r.compaction}")
    ratio, cpu_ratio = many[1] / max(one[1], 1e-9), many[2] / max(one[2], 1e-9)
    lines.append(f"  ratio {many[0]}-user / 1-user: {ratio:.2f} wall, {cpu_ratio:.2f} CPU   (goal <= 2.0)")
    return lines
