"""MemWeaver cognitive memory (memory/stages/summarize.py): segmentation at semantic breakpoints within size
bounds, Table 4/5 prompts, extractive `rules` summaries, phase and profile rows with provenance,
incremental re-synthesis, retrieval of summaries, the profile first in the context, `mnemo profile`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from memory import prompts
from memory.llm.rules import TASKS
from memory.read import PROFILE_KEY, read_profile
from memory.stages.summarize import MAX_PHASE, MIN_PHASE, segment
from memory.store import Store
from tests.helpers import SampleSplit, copy_store, ingest_and_consolidate


def _topics(sizes: list[int], dim: int = 32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = []
    for t, n in enumerate(sizes):
        center = np.zeros(dim)
        center[t] = 1.0
        block = center + 0.15 * rng.standard_normal((n, dim))
        out.append(block / np.linalg.norm(block, axis=1, keepdims=True))
    return np.concatenate(out).astype(np.float32)


def test_segments_break_at_topic_shifts() -> None:
    assert segment(_topics([12, 12, 12])) == [(0, 12), (12, 24), (24, 36)]
    assert segment(_topics([5])) == [(0, 5)]
    assert segment(np.zeros((0, 8), np.float32)) == []


def test_segments_respect_min_and_max_sizes() -> None:
    rng = np.random.default_rng(1)
    for n in (17, 40, 95, 300):
        vecs = rng.standard_normal((n, 16)).astype(np.float32)
        phases = segment(vecs)
        assert phases[0][0] == 0 and phases[-1][1] == n
        assert all(a == b for (_, a), (b, _) in zip(phases, phases[1:]))
        assert all(MIN_PHASE <= b - a <= MAX_PHASE for a, b in phases)
    assert segment(_topics([3, 3, 3])) == [(0, 9)]  # too small to split
    assert all(b - a >= 4 for a, b in segment(_topics([4, 2, 6, 4]), min_size=4))


def test_prompts_follow_tables_4_and_5() -> None:
    phase = {"user_id": "u", "phase_id": "p", "start": "2023-05-01", "end": "2023-05-09",
             "items": [{"id": "f1", "date": "2023-05-01", "text": "hiking: Ann hikes"}]}
    req = prompts.summarize_request(phase)
    assert req.messages[0]["content"] == "You are an expert at analyzing user behavior patterns."
    assert "**Cluster Activities (1 records, 2023-05-01 to 2023-05-09):**" in req.messages[1]["content"]
    assert "preferences and behavior patterns" in req.messages[1]["content"]
    preq = prompts.profile_request({"user_id": "u", "summaries": [{"id": "p", "start": "a", "end": "b", "text": "S1"}]})
    assert preq.messages[0]["content"] == "You are an expert at creating concise user preference summaries."
    assert "Cluster 1: S1" in preq.messages[1]["content"] and "max 300 words" in preq.messages[1]["content"]
    with pytest.raises(ValueError):
        prompts.validate_profile({"profile": "word " * 301})
    for blank in (" ", "\n\t"):              # the schema's minLength lets whitespace by: asked again, not stored
        with pytest.raises(ValueError, match="empty"):
            prompts.validate_profile({"profile": blank})
        with pytest.raises(ValueError, match="empty"):
            prompts.validate_summary({"summary": blank})
    prompts.validate_summary({"summary": "Ann hikes."})


def test_rules_summaries_are_extractive() -> None:
    items = [{"id": f"f{i}", "date": "2023-05-01", "text": t} for i, t in enumerate([
        "hiking: Ann hikes the Alps trail", "hiking: Ann plans another Alps hiking trail",
        "food: Ann cooks pasta", "hiking: Ann buys hiking boots for the trail"])]
    out = TASKS["summarize"]({"items": items, "start": "2023-05-01", "end": "2023-05-02"})["summary"]
    assert out.startswith("From 2023-05-01 to 2023-05-02:") and "Ann plans another Alps hiking trail" in out
    summaries = [{"id": str(i), "start": "", "end": "", "text": "word " * 120} for i in range(5)]
    prof = TASKS["profile"]({"summaries": summaries})["profile"]
    assert 0 < len(prof.split()) <= 300 and prof.startswith("- ")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, module_sample_store: Store,
           split_sample_stores: SampleSplit) -> tuple[Store, Store]:
    """The sample consolidated in one batch, and in two (split_sample) with the phase ids of batch 1
    as `first_phases`. Copies of the session's stores: tests must not write them."""
    tmp = tmp_path_factory.mktemp("summ")
    first = copy_store(split_sample_stores.first, tmp / "first")
    two = copy_store(split_sample_stores.two, tmp / "two")
    two.first_phases = {r["id"] for r in first.read("summaries").to_pylist() if r["level"] == "phase"}  # type: ignore[attr-defined]
    return module_sample_store, two


def test_phases_cover_every_fragment_once(stores: tuple[Store, Store]) -> None:
    one, _ = stores
    for user in one.users():
        frags = {r["id"]: r for r in one.read("fragments", user).to_pylist()}
        prof, phases = read_profile(one, user)
        members = [m for p in phases for m in p["member_ids"]]
        assert sorted(members) == sorted(frags)
        for p in phases:
            assert set(p["source_ids"]) == {s for m in p["member_ids"] for s in frags[m]["source_ids"]}
            assert p["date"] and p["content"]
        assert prof is not None and prof["key"] == PROFILE_KEY and len(prof["content"].split()) <= 300
        assert set(prof["member_ids"]) == {p["id"] for p in phases}
    rows = one.read("summaries").to_pylist()
    assert all(r["vector"] is not None and r["prompt_version"] and r["run_id"] for r in rows)


def test_incremental_summarizes_only_new_phases(stores: tuple[Store, Store]) -> None:
    _, two = stores
    rows = two.read("summaries").to_pylist()
    phases = {r["id"] for r in rows if r["level"] == "phase"}
    assert two.first_phases and two.first_phases < phases  # type: ignore[attr-defined]
    for user in two.users():
        prof, ph = read_profile(two, user)
        assert prof is not None and set(prof["member_ids"]) == {p["id"] for p in ph}
        assert sorted(m for p in ph for m in p["member_ids"]) == sorted(
            two.read("fragments", user, columns=["id"]).column("id").to_pylist())


def test_summaries_are_retrievable_and_profile_leads_the_context(stores: tuple[Store, Store]) -> None:
    from retrieval import RetrievalSettings, Retriever

    one, _ = stores
    r = Retriever(one, RetrievalSettings(refresh_ms=0))
    user = one.users()[0]
    res = r.retrieve(user, "what does this person like?", k=3, kinds=["summary"])
    assert res.items and all(it.kind == "summary" and it.source_ids for it in res.items)
    res = r.retrieve(user, "what does this person like?", k=5)
    assert len(res.items) <= 5 and res.profile is not None and res.profile.key == PROFILE_KEY
    assert res.to_dict()["profile"]["id"] == res.profile.id
    ctx = res.context()
    assert ctx.startswith("User profile (")
    prof, _ = read_profile(one, user)
    assert prof is not None
    assert prof["content"].splitlines()[0] in ctx


def test_profile_command(stores: tuple[Store, Store]) -> None:
    from flows.cli import app

    one, _ = stores
    user = one.users()[0]
    out = CliRunner().invoke(app, ["--store", one.uri, "profile", user])
    assert out.exit_code == 0, out.output
    assert f"Profile of {user}" in out.output and "Phases (" in out.output and " to " in out.output
    missing = CliRunner().invoke(app, ["--store", one.uri, "profile", "nobody"])
    assert missing.exit_code == 1


#: a user's turns about their garden, each answered by the assistant's advice in several sentences
GARDEN = [
    ("I planted six tomato plants in my backyard garden last weekend.",
     "I recommend Roma and San Marzano tomatoes for a backyard. I would water them deeply twice a week. "
     "I suggest a layer of Pine Bark mulch around them. I always stake Roma tomatoes early."),
    ("My tomatoes have yellow leaves at the bottom now and I am worried.",
     "I think it is a Nitrogen deficiency. I recommend Miracle-Gro Tomato Food every two weeks. "
     "I would remove the yellow leaves first. I find Epsom Salt helps the leaves too."),
    ("I also started growing basil on my kitchen windowsill in March.",
     "I love Genovese Basil on a sunny windowsill. I pinch off the flower buds every week. "
     "I harvest Genovese Basil from the top. I keep the soil moist with a Self-Watering pot."),
    ("I harvested my first ripe tomatoes today and made a salad with my basil.",
     "I store Roma tomatoes at room temperature. I save San Marzano seeds every autumn. "
     "I pair Genovese Basil with Buffalo Mozzarella. I pick Roma tomatoes when fully red."),
]


def test_phase_summaries_read_the_users_memories_not_the_assistants(tmp_path: Path) -> None:
    """A phase summary reads the fragments that cite a user's turn; those citing only an assistant's
    turns paraphrase its advice, and a `rules` summary would otherwise quote them (they are most of
    an assistant chat's fragments)."""
    rows = []
    for i, (mine, advice) in enumerate(GARDEN):
        for j, (speaker, text) in enumerate((("user", mine), ("assistant", advice))):
            rows.append({"user_id": "gina", "session_id": "s1", "message_id": f"m{2 * i + j}", "speaker": speaker,
                         "text": text, "timestamp": f"2024-04-0{i + 1}T10:0{j}:00Z"})
    archive = tmp_path / "garden.jsonl"
    archive.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    store = ingest_and_consolidate(tmp_path / "store", archive, assistant_fragments_per_turn=None)
    said = {f"m{2 * i + 1}" for i in range(len(GARDEN))}
    frags = store.read("fragments", "gina", columns=["id", "text", "source_ids"]).to_pylist()
    advice = {f["id"] for f in frags if set(f["source_ids"]) <= said}
    phases = [p for p in store.read("summaries", "gina").to_pylist() if p["level"] == "phase"]
    assert len(advice) > len(frags) / 2 and phases
    texts = {f["id"]: f["text"] for f in frags}
    for p in phases:
        assert set(p["member_ids"]) & advice                    # the phase covers the advice ...
        quoted = [fid for fid in p["member_ids"] if " ".join(texts[fid].split()[:6]) in p["content"]]
        assert quoted and not set(quoted) & advice, (p["content"], quoted)   # ... and quotes the user

def test_a_phase_of_advice_only_is_still_summarized() -> None:
    from datetime import UTC, datetime

    from memory.graph import Node
    from memory.stages.summarize import phase_context

    def node(i: int, source: str) -> Node:
        return Node(id=f"f{i}", kind="fragment", session_ts=datetime(2024, 1, 1, tzinfo=UTC), position=i,
                    vector=np.zeros(4, np.float32), source_ids=[source], text=f"t{i}")
    mixed = [node(0, "m0"), node(1, "m1"), node(2, "m1")]
    assert [it["id"] for it in phase_context("u", mixed, {"m1"})["items"]] == ["f0"]
    assert [it["id"] for it in phase_context("u", mixed[1:], {"m1"})["items"]] == ["f1", "f2"]
    assert phase_context("u", mixed, {"m1"})["phase_id"] == phase_context("u", mixed)["phase_id"]


def test_a_replaced_value_leaves_the_phases_and_the_profile(tmp_path: Path) -> None:
    """A phase summary (and the profile built from them, which heads every context) reads only what
    still holds: a fragment closed in the same run is left out, and a stored phase whose member a
    later run closed is summarized again under its id; a phase of replaced values only says so."""
    def turns(session: int, day: int, text: str) -> list[dict[str, str]]:
        return [{"user_id": "erin", "session_id": f"erin-s{session}", "message_id": f"erin-s{session}-m{i}",
                 "speaker": spk, "text": t, "timestamp": f"2024-0{day}-05T08:0{i}:00Z"}
                for i, (spk, t) in enumerate([("Erin", text), ("assistant", "Nice.")], start=1)]
    parts = []
    for name, rows in (("a", turns(1, 1, "I set my daily running distance goal to 3 miles per day.")
                        + turns(2, 2, "I have now increased my daily running distance goal to 5 miles per day.")),
                       ("b", turns(3, 3, "I have now increased my daily running distance goal to 7 miles per day."))):
        parts.append(tmp_path / f"{name}.jsonl")
        parts[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = ingest_and_consolidate(tmp_path / "s1", parts[0], llm="rules")
    first = {r["id"]: r["content"] for r in store.read("summaries", "erin").to_pylist() if r["level"] == "phase"}
    assert any("5 miles" in c for c in first.values()) and not any("3 miles" in c for c in first.values())
    ingest_and_consolidate(tmp_path / "s1", parts[1], llm="rules")
    rows = store.read("summaries", "erin").to_pylist()
    phases = {r["id"]: r["content"] for r in rows if r["level"] == "phase"}
    assert set(first) <= set(phases)                       # the stale phase was summarized again, same id
    for pid in first:
        assert "5 miles" not in phases[pid] or "(replaced since)" in phases[pid]
    profile = next(r["content"] for r in rows if r["level"] == "profile")
    assert "7 miles" in profile
    assert all("(replaced since)" in line for line in profile.splitlines() if "3 miles" in line or "5 miles" in line)
