"""Supersession (issue 12): a user says a value, later changes it -> the older fragment is closed and
the newer one current; unrelated facts untouched; a contradiction flagged; idempotent re-runs.
Real LanceDB, the real embedder, the `rules` backend through the whole consolidation."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evaluation.forget import BACKEND as CACHED_RULES
from memory.ingest import ingest
from memory.llm.rules.supersede import decide, quantities
from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.stages.supersede import supersede_user
from memory.store import Store

TURNS = [
    ("s1", "2024-03-01T10:00:00Z", "My Git repository for the budget tracker has 150 commits merged into the "
                                   "main branch so far."),
    ("s1", "2024-03-01T10:05:00Z", "I adopted a grey cat called Miso from the shelter near my flat last winter."),
    ("s1", "2024-03-01T10:09:00Z", "I have written Flask routes for the homepage and handled HTTP requests "
                                   "in this project."),
    ("s2", "2024-04-10T09:00:00Z", "The commits merged into the main branch of my budget tracker repository "
                                   "have now reached 165 after the sprint."),
    ("s2", "2024-04-10T09:04:00Z", "I have never written Flask routes or handled HTTP requests in this "
                                   "project, honestly."),
]


def _archive(tmp_path: Path) -> Path:
    path = tmp_path / "changes.jsonl"
    rows: list[dict[str, Any]] = []
    for i, (session, ts, text) in enumerate(TURNS):
        rows.append({"user_id": "dana", "session_id": session, "message_id": f"m{i}", "speaker": "Dana",
                     "text": text, "timestamp": ts})
        rows.append({"user_id": "dana", "session_id": session, "message_id": f"a{i}", "speaker": "assistant",
                     "text": "Thanks for telling me.", "timestamp": ts.replace(":00Z", ":30Z")})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _fragments(store: Store, user: str = "dana") -> list[dict[str, Any]]:
    return store.read("fragments", user).to_pylist()


def _consolidated(tmp_path: Path) -> Store:
    settings = Settings(store=str(tmp_path / "store"))
    store = open_store(settings)
    ingest(store, _archive(tmp_path), "jsonl")
    consolidate(store, settings)
    return store


def test_rules_decide_updates_and_contradictions() -> None:
    old = {"subject": "Dana", "key": "git repository", "content": "Dana has 150 commits merged into the main "
           "branch of the repository", "source_ids": ["m0"]}
    new = {"subject": "Dana", "key": "commits", "content": "Dana says the commits merged into the main branch "
           "have now reached 165", "source_ids": ["m3"]}
    assert decide(new, old, 0.4) == "update"
    assert decide(new, new | {"source_ids": ["m9"]}, 1.0) is None             # same value: not a change
    cat = {"subject": "Dana", "key": "cat", "content": "Dana adopted a grey cat called Miso from the shelter",
           "source_ids": ["m1"]}
    assert decide(new, cat, 0.1) is None                                      # unrelated fact
    assert decide(new, old | {"subject": "Bob"}, 0.9) is None                 # another subject
    said = {"subject": "Dana", "key": "flask", "content": "Dana has written Flask routes and handled HTTP "
            "requests in this project", "source_ids": ["m2"]}
    never = {"subject": "Dana", "key": "flask", "content": "Dana has never written Flask routes or handled "
             "HTTP requests in this project", "source_ids": ["m4"]}
    assert decide(never, said, 0.8) == "contradiction"
    assert [q.value for q in quantities("Uses Python 3.11 and Flask 2.3.1 in 2024 with 12 workers")] == [12.0]


def test_consolidation_closes_the_replaced_fragment(tmp_path: Path) -> None:
    store = _consolidated(tmp_path)
    frags = _fragments(store)
    by_source = {}
    for f in frags:
        for s in f["source_ids"]:
            by_source.setdefault(s, []).append(f)
    assert all(f["supersede_version"] and f["valid_from"] for f in frags)     # every fragment examined
    old = [f for f in by_source["m0"] if "150" in f["content"]]
    new = [f for f in by_source["m3"] if "165" in f["content"]]
    assert old and new
    assert old[0]["superseded_by"] == new[0]["id"]
    assert old[0]["valid_until"] == new[0]["valid_from"] and old[0]["valid_until"].startswith("2024-04-10")
    assert new[0]["superseded_by"] is None and new[0]["valid_until"] is None
    # unrelated facts stay current; the contradiction is recorded, not a replacement
    assert all(f["superseded_by"] is None for f in by_source["m1"])
    flagged = [f for f in by_source["m4"] if f["contradicts"]]
    assert flagged and any(flagged[0]["contradicts"] == f["id"] for f in by_source["m2"])
    assert all(f["superseded_by"] is None for f in by_source["m2"])
    assert len(frags) == len({f["id"] for f in frags})                        # nothing deleted or doubled


def test_rerun_and_backfill_are_idempotent(tmp_path: Path) -> None:
    store = _consolidated(tmp_path)
    before = {f["id"]: (f["superseded_by"], f["valid_until"], f["contradicts"]) for f in _fragments(store)}
    settings = Settings(store=store.uri)
    assert consolidate(store, settings).counts.get("fragments", 0) == 0       # nothing new
    assert supersede_user(store, "dana") == {"examined": 0, "superseded": 0, "contradictions": 0,
                                             "replaced_turns": 0, "contradicted_turns": 0, "change_fragments": 0}
    after = {f["id"]: (f["superseded_by"], f["valid_until"], f["contradicts"]) for f in _fragments(store)}
    assert after == before


def test_backfill_on_a_store_never_examined(tmp_path: Path) -> None:
    """An older store (validity columns null): `supersede_user` decides once, then finds nothing."""
    store = _consolidated(tmp_path)
    rows = _fragments(store)
    for r in rows:
        r.update(valid_from=None, valid_until=None, superseded_by=None, contradicts=None, supersede_version=None,
                 replaces_sources=None, contradicts_sources=None)
    store.upsert("fragments", rows)
    counts = supersede_user(store, "dana")
    assert counts["examined"] == len(rows) and counts["superseded"] >= 1 and counts["contradictions"] >= 1
    assert any("150" in f["content"] and f["superseded_by"] for f in _fragments(store))
    assert supersede_user(store, "dana")["examined"] == 0
    assert _fragments(store, "other") == []                                   # one user's rows only


def test_llm_transformation_closes_the_fragment_it_names() -> None:
    """LLM backends decide in the reason stage: the prompt numbers fragments, a transformation naming
    `supersedes` / `superseded_by` closes the earlier one with the prompt's version on the row."""
    from memory import prompts
    from memory.stages.reason import close_superseded

    when = datetime(2024, 4, 10, tzinfo=timezone.utc)
    old = {"id": "f-old", "subject": "Dana", "category": "factual", "key": "commits", "content": "Has 150 commits",
           "date": "2024-03-01", "source_ids": ["m0"]}
    other = {"id": "f-cat", "subject": "Dana", "category": "factual", "key": "cat", "content": "Has a cat Miso",
             "date": "2024-03-01", "source_ids": ["m1"]}
    new = {"id": "f-new", "subject": "Dana", "category": "factual", "key": "commits", "content": "Has 165 commits",
           "date": "2024-04-10", "source_ids": ["m3"], "session_ts": when}
    pair = {"user_id": "dana", "link_id": "l1", "earlier": [old, other], "later": [new]}
    request = prompts.reason_request(pair)
    assert "[F1] [commits, 2024-03-01]: Dana Has 150 commits" in request.messages[-1]["content"]
    assert request.prompt_version == prompts.REASON_VERSION == "premem-reason-v2"
    answer = {"extended_insight": [
        {"inference_type": "transformation", "key": "commit count", "date": "2024-03-01 to 2024-04-10",
         "value": "Dana's commits grew from 150 to 165", "supersedes": "F1", "superseded_by": "F3"},
        {"inference_type": "connection", "key": "x", "date": "2024-04-10", "value": "unrelated",
         "supersedes": "F2", "superseded_by": "F3"}]}                       # only transformations close
    items = prompts.parse_reasoning(answer)
    frags = {f["id"]: dict(f) for f in (old, other, new)}
    assert close_superseded(pair, items, frags) == ["f-old"]
    assert frags["f-old"]["superseded_by"] == "f-new" and frags["f-old"]["valid_until"] == when.isoformat()
    assert frags["f-old"]["supersede_version"] == "premem-reason-v2"
    assert frags["f-cat"].get("superseded_by") is None and frags["f-new"].get("superseded_by") is None
    assert close_superseded(pair, items, frags) == []                       # already closed: idempotent



def test_llm_transformation_named_backwards_closes_the_older_fragment() -> None:
    """A model that names the pair the wrong way round ("the newer replaced by the older") must not
    close the current value: the fragment said later replaces the other, whatever the answer says."""
    from memory import prompts
    from memory.stages.reason import close_superseded

    march, april = datetime(2024, 3, 1, tzinfo=timezone.utc), datetime(2024, 4, 10, tzinfo=timezone.utc)
    paris = {"id": "f-paris", "subject": "Ann", "category": "factual", "key": "home", "content": "Lives in Paris",
             "date": "2024-03-01", "source_ids": ["m0"], "session_ts": march}
    berlin = {"id": "f-berlin", "subject": "Ann", "category": "factual", "key": "home", "content": "Lives in Berlin",
              "date": "2024-04-10", "source_ids": ["m3"], "session_ts": april}
    # the answer swaps the two (Paris "replaces" Berlin), and a late session's pair (the pool holds the
    # newer one) where the answer says the newer F1 is replaced by F2
    for pair, supersedes, superseded_by in (({"earlier": [paris], "later": [berlin]}, "F2", "F1"),
                                            ({"earlier": [berlin], "later": [paris]}, "F1", "F2")):
        items = prompts.parse_reasoning({"extended_insight": [
            {"inference_type": "transformation", "key": "moved", "date": "2024-04", "value": "Ann moved",
             "supersedes": supersedes, "superseded_by": superseded_by}]})
        frags = {f["id"]: dict(f) for f in (paris, berlin)}
        assert close_superseded({"user_id": "ann", "link_id": "l1", **pair}, items, frags) == ["f-paris"]
        assert frags["f-paris"]["superseded_by"] == "f-berlin" and frags["f-paris"]["valid_until"] == april.isoformat()
        assert frags["f-berlin"].get("superseded_by") is None and frags["f-berlin"].get("valid_until") is None



def test_an_llm_backends_fragments_carry_the_reason_prompts_version(tmp_path: Path) -> None:
    """With an LLM backend the reason stage decides validity: the fragments the supersede stage
    examined say so (the reason prompt's version), not the rules' version, which a later rules
    re-decide (`supersede_user`) would treat as its own and decide again."""
    from memory import prompts

    settings = Settings(store=str(tmp_path / "store"), llm=CACHED_RULES)   # rules answered as an LLM
    store = open_store(settings)
    ingest(store, _archive(tmp_path), "jsonl")
    consolidate(store, settings)
    versions = {f["supersede_version"] for f in store.read("fragments").to_pylist()}
    assert versions == {prompts.REASON_VERSION}
    assert supersede_user(store, "dana")["examined"] == 0

def test_an_assistants_advice_is_never_compared() -> None:
    """Two fragments of an assistant's replies with a changed number are no update of the user's
    facts (the assistant explains: "New York is 6 hours behind", later "Tokyo is 8 hours ahead");
    the same two said by the user are."""
    import numpy as np

    from memory.llm.rules.turns import Turns
    from memory.stages.supersede import plan

    at = {"m1": datetime(2024, 3, 1, tzinfo=timezone.utc), "m2": datetime(2024, 4, 1, tzinfo=timezone.utc)}
    vec = np.ones(8, dtype=np.float32)

    def frags(subject: str) -> list[dict[str, Any]]:
        return [{"id": f"f{i}", "subject": subject, "key": "study plan", "source_ids": [m], "vector": vec,
                 "content": f"{subject} has a study plan of {hours} hours per week for the statistics exam"}
                for i, (m, hours) in enumerate((("m1", 6), ("m2", 8)))]

    def turns(speaker: str) -> Turns:
        return Turns([{"message_id": m, "speaker": speaker, "text": "", "ts": ts, "vector": vec}
                      for m, ts in at.items()], skip=["assistant"])
    mine = frags("user")
    plan(mine, ["f0", "f1"], at, turns=turns("user"))
    assert mine[0]["superseded_by"] == "f1"
    advice = frags("assistant")
    plan(advice, ["f0", "f1"], at, turns=turns("assistant"))
    assert advice[0].get("superseded_by") is None and all(f["supersede_version"] for f in advice)
