"""`mnemo bench beam-anchors`: the raw-message anchors reproduce ANCHORS.md on the 100K development
chats when the markers are kept; the reader's marker stripping, the BM25 channel and the fusion; the
update-first share over the decidable questions beside the published one."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from evaluation.beam_report import anchor_lines
from evaluation.beam_anchors import Okapi, chat_messages, rankings, report, score_scale
from memory.errors import ConfigError
from memory.ingest.beam import read_beam
from memory.settings import Settings
from tests.helpers import REPO

BEAM = REPO.parent / "shared" / "data" / "beam"


def published(scale: str) -> dict[str, list[float]]:
    """ANCHORS.md's (R@5, R@10, update-first) per method of one scale."""
    out = {}
    for line in anchor_lines(BEAM / "ANCHORS.md", scale):
        if re.match(r"\| (dense|bm25|rrf) \|", line):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0]] = [float(c) for c in cells[1:]]
    return out


@pytest.mark.skipif(not (BEAM / "ANCHORS.md").is_file(), reason="BEAM development data not present")
def test_markers_kept_reproduce_the_published_100k_anchors() -> None:
    res = score_scale(BEAM, "100K", Settings(), keep_markers=True)
    want = published("100K")
    assert res["questions"] == 179 and set(want) == {"dense", "bm25", "rrf"}
    for method, (r5, r10, first) in want.items():
        got = res["rows"][method]
        assert (round(got["R@5"], 3), round(got["R@10"], 3)) == (r5, r10), method
        assert round(res["update_first"][method], 3) == first, method
    assert round(res["rows"]["dense"]["information_extraction"], 3) == 0.875
    assert "| dense | 0.484 | 0.595 | 0.350 |" in report(res) and "all-MiniLM-L6-v2" in report(res)


@pytest.mark.skipif(not (BEAM / "100K" / "1" / "chat.json").is_file(), reason="BEAM development data not present")
def test_the_messages_are_those_the_reader_stores() -> None:
    chat = BEAM / "100K" / "1" / "chat.json"
    stored = [(r["message_id"], r["text"]) for kind, r in read_beam(chat) if kind == "msg"]
    ids, texts = chat_messages(chat)
    assert list(zip(ids, texts)) == stored and len(ids) > 100
    kept = chat_messages(chat, keep_markers=True)[1]
    assert any("->->" in t for t in kept) and not any("->->" in t for t in texts)


def test_chat_messages_strip_markers_unless_kept_and_skip_malformed_ones(tmp_path: Path) -> None:
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"batch_number": 1, "turns": [[
        {"role": "user", "id": 4, "content": "My sprint ends April 19. ->-> 1,1", "time_anchor": "March-1-2024"},
        {"role": "assistant", "id": 5, "content": "Noted."},
        {"role": "assistant", "content": "no id: quarantined by the reader"}]]}]))
    assert chat_messages(chat) == (["4", "5"], ["My sprint ends April 19.", "Noted."])
    assert chat_messages(chat, keep_markers=True)[1][0] == "My sprint ends April 19. ->-> 1,1"


def test_a_scale_without_questions_with_evidence_is_a_config_error(tmp_path: Path) -> None:
    folder = tmp_path / "100K" / "1"
    folder.mkdir(parents=True)
    (folder / "chat.json").write_text(json.dumps([{"batch_number": 1, "turns": [[
        {"role": "user", "id": 0, "content": "Hello", "time_anchor": "March-1-2024"}]]}]))
    (folder / "probing_questions.json").write_text(json.dumps({"abstention": [{"question": "Who?"}]}))
    with pytest.raises(ConfigError, match="no chat has a question with evidence"):
        score_scale(tmp_path, "100K", Settings())


def test_okapi_counts_query_words_and_ranks_the_matching_text_first() -> None:
    bm25 = Okapi(["the beagle is named Biscuit", "I moved to Lisbon", "a bakery job in Lisbon Lisbon"])
    s = bm25.scores("Lisbon")
    assert s[0] == 0 and s[2] > s[1] > 0
    assert np.allclose(bm25.scores("Lisbon Lisbon"), 2 * s)
    assert not bm25.scores("zebra").any()


def test_rrf_fuses_the_two_rankings() -> None:
    vectors = np.eye(3, dtype=np.float32)
    bm25 = Okapi(["alpha", "beta", "gamma gamma"])
    order = rankings(np.array([1.0, 0.5, 0.0], np.float32), "gamma", vectors, bm25)
    assert order["dense"].tolist() == [0, 1, 2] and order["bm25"].tolist() == [2, 0, 1]
    # 1/(60 + rank) summed: 0 gets 1/61 + 1/62, 2 gets 1/63 + 1/61, 1 gets 1/62 + 1/63
    assert order["rrf"].tolist() == [0, 2, 1]


def test_a_missing_scale_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "100K").mkdir()
    with pytest.raises(ConfigError, match="no N/chat.json"):
        score_scale(tmp_path, "100K", Settings())


def test_an_update_naming_one_message_for_both_sides_is_counted_undecidable(tmp_path: Path) -> None:
    folder = tmp_path / "100K" / "1"
    folder.mkdir(parents=True)
    (folder / "chat.json").write_text(json.dumps([{"batch_number": 1, "turns": [[
        {"role": "user", "id": 0, "content": "I work at a bakery in Porto.", "time_anchor": "March-1-2024"},
        {"role": "assistant", "id": 1, "content": "Porto has fine bakeries."},
        {"role": "user", "id": 2, "content": "I moved: I now work at a bakery in Lisbon."}]]}]))
    (folder / "probing_questions.json").write_text(json.dumps({"knowledge_update": [
        {"question": "Where do I work now?", "source_chat_ids": {"original_info": [0], "updated_info": [2]}},
        {"question": "Where is the bakery I work at?",
         "source_chat_ids": {"original_info": [2], "updated_info": [2]}}]}))
    res = score_scale(tmp_path, "100K", Settings())
    assert res["uf n"] == 2 and res["uf undecidable"] == 1
    for method in ("dense", "bm25", "rrf"):
        assert res["uf decidable"][method] == 2 * res["update_first"][method]   # the one never first left out
    text = report(res)
    assert "update-first: 2 knowledge_update questions, 1 undecidable" in text and "| uf decidable |" in text
