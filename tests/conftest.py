"""Shared fixtures: a real LanceDB store in a temp dir (never mocked)."""
from __future__ import annotations

from pathlib import Path

import pytest

from memory.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty store with 384-d vectors (all-MiniLM-L6-v2's width)."""
    return Store(str(tmp_path / "store"), dim=384)
