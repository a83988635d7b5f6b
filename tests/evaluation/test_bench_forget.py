"""`mnemo bench forget` end to end on a trimmed LoCoMo conversation (three sessions): the figures it
prints, the forgotten session gone, Recall@10 outside it not lower by more than 0.01."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.helpers import LOCOMO


def trimmed(path: Path, sessions: int = 3) -> Path:
    """The first LoCoMo sample cut to its first `sessions` sessions and the questions about them."""
    sample = json.loads(LOCOMO.read_text())[0]
    conv = sample["conversation"]
    keep = {f"session_{i}" for i in range(1, sessions + 1)}
    sample["conversation"] = {k: v for k, v in conv.items()
                              if not k.startswith("session_") or k.removesuffix("_date_time") in keep}
    sample["qa"] = [q for q in sample["qa"] if q.get("evidence") and all(
        int(m.group(1)) <= sessions for e in q["evidence"] for m in re.finditer(r"D(\d+):", str(e)))]
    for extra in ("observation", "session_summary", "event_summary"):
        sample.pop(extra, None)
    path.write_text(json.dumps([sample]))
    return path


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev split not present")
def test_bench_forget_prints_its_figures(tmp_path: Path) -> None:
    data = trimmed(tmp_path / "locomo3.json")
    out = CliRunner().invoke(app, ["bench", "forget", str(data), "--store", str(tmp_path / "store")])
    assert out.exit_code == 0, out.output
    text = out.output
    for figure in ("| table | rows deleted | rows re-derived |", "LLM calls paid / cache hits", "bytes reclaimed",
                   "Recall@10 (default strategy)", "| messages |"):
        assert figure in text, figure
    assert "| drop within 0.01 | yes |" in text
    hits = re.search(r"LLM calls paid / cache hits \| (\d+) / (\d+)", text)
    assert hits is not None and int(hits.group(2)) > 0   # the unchanged prompts came from the cache
