"""`memory.doctor` and `mnemo doctor [--fix]` on a real consolidated store: duplicates planted with a raw
LanceDB add (bypassing the upsert) are found and removed down to one copy per id, rows whose source
messages are gone are reported, rows without stored BM25 terms are reported and stored by `--fix`, and a
clean store says so."""
from __future__ import annotations

import json
from typing import Any

import lancedb
import pytest
from lancedb.expr import col
from typer.testing import CliRunner

from flows.cli import app
from memory import schemas
from memory.doctor import check, clear_dangling, dangling_pointers, duplicate_ids, missing_sources, remove_duplicates, session_mismatches, unstored_terms
from memory.store import Store
from retrieval.index import load_user


def doctor(store: Store, *args: str) -> Any:
    return CliRunner().invoke(app, ["--store", store.uri, "doctor", *args])


def plant_duplicates(store: Store, table: str, n: int) -> list[str]:
    """Add a second copy of `n` rows of `table` straight through LanceDB (the race's outcome); the
    copies differ in `run_id` so the kept one can be told apart."""
    rows = store.read(table).slice(0, n).to_pylist()
    for row in rows:
        row["run_id"] = "planted"
    lancedb.connect(store.uri).open_table(table).add(store.conform(table, rows))
    return [r["id"] for r in rows]


def test_a_consolidated_store_is_clean(sample_store: Store) -> None:
    report = check(sample_store)
    assert report.duplicates == {} and report.missing == {}
    assert report.ok
    res = doctor(sample_store)
    assert res.exit_code == 0, res.output
    assert "no duplicate ids, no missing sources" in res.output


def test_planted_duplicates_are_found_and_fixed_to_one_copy(sample_store: Store) -> None:
    rows_before = sample_store.read("fragments", columns=["id"]).num_rows
    planted = plant_duplicates(sample_store, "fragments", 3)
    planted_insights = plant_duplicates(sample_store, "insights", 1)
    assert duplicate_ids(sample_store) == {"fragments": dict.fromkeys(sorted(planted), 2),
                                           "insights": {planted_insights[0]: 2}}

    res = doctor(sample_store)
    assert res.exit_code == 1, res.output
    assert "fragments: 3 duplicate ids (3 extra rows" in res.output
    assert "mnemo doctor --fix" in res.output

    res = doctor(sample_store, "--fix", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["removed"] == {"fragments": 3, "insights": 1} and data["ok"]

    assert duplicate_ids(sample_store) == {}
    kept = sample_store.read("fragments", where=col("id").isin(planted), columns=["id", "run_id"])
    assert sorted(kept.column("id").to_pylist()) == sorted(planted)
    assert set(kept.column("run_id").to_pylist()) == {"planted"}   # the last written copy is kept
    assert sample_store.read("fragments", columns=["id"]).num_rows == rows_before
    assert remove_duplicates(sample_store) == {}
    assert doctor(sample_store).exit_code == 0


def test_rows_whose_source_messages_are_gone_are_reported(sample_store: Store) -> None:
    frag = sample_store.read("fragments", columns=["id", "user_id", "source_ids"]).to_pylist()[0]
    gone = frag["source_ids"][0]
    sample_store.delete("messages", (col("user_id") == frag["user_id"]) & (col("message_id") == gone))

    missing = missing_sources(sample_store)
    assert "fragments" in missing
    hit = [r for r in missing["fragments"] if r["id"] == frag["id"]]
    assert hit and hit[0]["missing"] == [gone] and hit[0]["user_id"] == frag["user_id"]
    for rows in missing.values():   # only the deleted message is missing, only for its user
        assert {m for r in rows for m in r["missing"]} == {gone}
        assert {r["user_id"] for r in rows} == {frag["user_id"]}

    res = doctor(sample_store, "--fix")
    assert res.exit_code == 1, res.output   # missing sources are reported, never "fixed"
    assert "rows with missing source messages" in res.output and gone in res.output


def test_rows_without_stored_terms_are_reported_and_stored_by_fix(sample_store: Store) -> None:
    """A consolidated store has every row's BM25 terms; rows an older mnemo wrote (terms null) are
    reported, not a problem, and `--fix` stores them, the same as a write would, nothing else changed."""
    assert unstored_terms(sample_store) == {}
    want = {name: sample_store.read(name).sort_by("id") for name in ("messages", "fragments")}
    raw = lancedb.connect(sample_store.uri)
    for name in want:
        raw.open_table(name).update(values_sql={schemas.TERMS: "NULL"})
    assert unstored_terms(sample_store) == {name: t.num_rows for name, t in want.items()}
    assert load_user(sample_store, want["messages"].column("user_id")[0].as_py(),
                     lexical=(1.2, 0.75)).lexical(1.2, 0.75).tokenized > 0

    res = doctor(sample_store)
    assert res.exit_code == 0, res.output
    assert f"messages: {want['messages'].num_rows} rows without stored BM25 terms" in res.output
    res = doctor(sample_store, "--fix", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["terms_stored"] == {name: t.num_rows for name, t in want.items()}
    assert report["compacted"] == sorted(want)
    assert unstored_terms(sample_store) == {}
    assert all(sample_store.data_files()[name][0] == 1 for name in want)   # the rewrite's files merged
    for name, before in want.items():
        assert sample_store.read(name).sort_by("id").equals(before), name   # terms, vectors, all


def test_session_rows_disagreeing_with_their_messages_are_remade_by_fix(sample_store: Store) -> None:
    """A session row counting fewer turns than are stored, and a session with no row (what an append
    racing a forget left in an older mnemo), are reported (exit 1) and `--fix` writes them again."""
    want = {r["session_id"]: r for r in sample_store.read("sessions").to_pylist()}
    raw = lancedb.connect(sample_store.uri).open_table("sessions")
    raw.update(where="session_id = 'alice-s2'", values={"n_messages": 2})
    raw.delete("session_id = 'alice-s3'")
    assert [(r["session_id"], r["row"]) for r in session_mismatches(sample_store)] == [("alice-s2", 2),
                                                                                     ("alice-s3", None)]
    res = doctor(sample_store)
    assert res.exit_code == 1 and "sessions: 2 rows disagree with their messages" in res.output, res.output
    res = doctor(sample_store, "--fix", "--json")
    assert res.exit_code == 0 and json.loads(res.output)["sessions_remade"] == 2, res.output
    assert session_mismatches(sample_store) == []
    got = {r["session_id"]: r for r in sample_store.read("sessions").to_pylist()}
    assert got["alice-s2"] == want["alice-s2"]
    assert {**got["alice-s3"], "archive": want["alice-s3"]["archive"]} == want["alice-s3"]   # its archive unknown


def test_a_forget_left_unfinished_is_reported(sample_store: Store) -> None:
    """A forget that died (its run row `purging`): the forgotten text may still be on disk, exit 1."""
    from memory.forget import forget
    from memory.settings import Settings

    forget(sample_store, Settings(store=sample_store.uri), "alice", messages=["alice-s1-m01"])
    assert doctor(sample_store).exit_code == 0
    lancedb.connect(sample_store.uri).open_table("runs").update(where="kind = 'forget'", values={"status": "purging"})
    res = doctor(sample_store)
    # the command it names finishes the forget; never a bare `mnemo forget alice` (that forgets all of alice)
    assert res.exit_code == 1 and "of alice is purging" in res.output, res.output
    assert "`mnemo consolidate --users alice` finishes it" in res.output, res.output


def test_validity_naming_a_row_stored_nowhere_is_reported_and_cleared_by_fix(sample_store: Store) -> None:
    """A fragment closed by a row that no longer exists (what a forget killed after deleting the
    messages left, before forgets cleared such pointers) keeps a current value closed: reported,
    exit 1, and `--fix` makes it current again; pointers to stored rows are left alone."""
    closed = [r for r in sample_store.read("fragments").to_pylist() if r["superseded_by"]]
    assert closed, "the sample has a superseded fragment"
    victim = {**closed[0], "superseded_by": "gone-row", "valid_until": "2024-03-19T20:10:00+00:00"}
    sample_store.upsert("fragments", [victim])
    version = sample_store.version("fragments")
    report = check(sample_store)
    assert report.dangling == {"fragments": [{"id": victim["id"], "user_id": victim["user_id"],
                                              "names": ["gone-row"]}]} and not report.ok
    assert report.compacted == [] and sample_store.version("fragments") == version   # a check writes nothing
    res = doctor(sample_store)
    assert res.exit_code == 1 and "1 rows whose validity names a row stored nowhere" in res.output, res.output
    fixed = doctor(sample_store, "--fix")
    assert fixed.exit_code == 0 and "cleared 1" in fixed.output, fixed.output
    row = sample_store.read_ids("fragments", [victim["id"]]).to_pylist()[0]
    assert row["superseded_by"] is None and row["valid_until"] is None
    others = {r["id"]: r["superseded_by"] for r in closed[1:]}
    assert {r["id"]: r["superseded_by"] for r in sample_store.read_ids("fragments", others).to_pylist()} == others
    assert check(sample_store).ok


def test_fix_clears_only_what_is_still_stored_nowhere(sample_store: Store) -> None:
    """`--fix` acts after its check, which holds no lease: a row the check found stored nowhere and a
    forget re-derived since is stored again, and the pointer naming it stays (clearing it would have
    made a replaced value current beside its replacement)."""
    closed = [r for r in sample_store.read("fragments").to_pylist() if r["superseded_by"]]
    victim = {**closed[0], "superseded_by": "re-derived", "valid_until": "2024-03-19T20:10:00+00:00"}
    sample_store.upsert("fragments", [victim])
    found = dangling_pointers(sample_store)
    assert [b["names"] for b in found["fragments"]] == [["re-derived"]]
    sample_store.upsert("fragments", [{**closed[0], "id": "re-derived", "superseded_by": None,
                                       "valid_until": None}])               # what the forget wrote meanwhile
    assert clear_dangling(sample_store, found) == {}
    assert sample_store.read_ids("fragments", [victim["id"]]).to_pylist()[0]["superseded_by"] == "re-derived"
    stale = lambda store: found                             # noqa: E731  the check ran before the forget's writes
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("memory.doctor.dangling_pointers", stale)
        report = check(sample_store, fix=True)
    assert report.ok and report.dangling == {} and report.pointers_cleared == 0   # resolved, not "run --fix"
