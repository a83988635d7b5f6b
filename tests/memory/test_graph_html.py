"""`mnemo graph USER --html FILE`: one self-contained page; rendered in headless Chromium, its script
draws one SVG element per graph node."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory.graph_html import graph_data, render
from memory.store import Store


def test_page_is_self_contained(module_sample_store: Store) -> None:
    store = module_sample_store
    user = store.users()[0]
    data = graph_data(store, user)
    assert data["nodes"] and data["phases"] and data["profile"]
    assert len(data["edges"]) == len(data["nodes"]) - 1
    page = render(data)
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", page)
    # user text cannot close the data script
    evil = dict(data, nodes=[dict(data["nodes"][0], text="</script><script>alert(1)</script>")] + data["nodes"][1:])
    assert render(evil).count("</script>") == 2


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_rendered_page_draws_every_node(module_sample_store: Store, tmp_path: Path) -> None:
    from flows.cli import app

    store = module_sample_store
    user = store.users()[0]
    out = tmp_path / "graph.html"
    res = CliRunner().invoke(app, ["--store", store.uri, "graph", user, "--html", str(out)])
    assert res.exit_code == 0, res.output
    n = len(graph_data(store, user)["nodes"])
    assert f"{n} nodes" in res.output
    browser = _chromium()
    if browser is None:
        pytest.skip("no headless Chromium: install Debian's `chromium` package (.ci/run does) to render the page")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    drawn = re.findall(r"<(circle|polygon)\b[^>]*\bclass=\"node (fragment|insight)\"", dom)
    assert len(drawn) == n > 0
    assert f'data-nodes="{n}"' in dom
    assert dom.count('class="band') >= 1
