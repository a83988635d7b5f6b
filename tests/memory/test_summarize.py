"""MemWeaver cognitive memory (memory/stages/summarize.py): segmentation at semantic breakpoints within size
bounds, Table 4/5 prompts, extractive `rules` summaries, phase and profile rows with provenance,
incremental re-synthesis, retrieval of summaries, the profile first in the context, `mnemo profile`."""
from __future__ import annotations


import numpy as np
import pytest
from typer.testing import CliRunner

from memory import prompts
from memory.llm.rules import TASKS
from memory.read import PROFILE_KEY, read_profile
from memory.stages.summarize import MAX_PHASE, MIN_PHASE, segment
from memory.store import Store
from tests.helpers import SampleSplit, copy_store


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
    phase = {"user_id": "u", "phase_id": "p", "number": 2, "start": "2023-05-01", "end": "2023-05-09",
             "items": [{"id": "f1", "date": "2023-05-01", "text": "hiking: Ann hikes"}]}
    req = prompts.summarize_request(phase)
    assert req.messages[0]["content"] == "You are an expert at analyzing user behavior patterns."
    assert "Cluster 2 Activities (1 records" in req.messages[1]["content"]
    assert "preferences and behavior patterns" in req.messages[1]["content"]
    preq = prompts.profile_request({"user_id": "u", "summaries": [{"id": "p", "start": "a", "end": "b", "text": "S1"}]})
    assert preq.messages[0]["content"] == "You are an expert at creating concise user preference summaries."
    assert "Cluster 1: S1" in preq.messages[1]["content"] and "max 300 words" in preq.messages[1]["content"]
    with pytest.raises(ValueError):
        prompts.validate_profile({"profile": "word " * 301})


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
