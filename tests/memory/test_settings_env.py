"""`MNEMO_*` variables no setting reads are named in a warning with the closest setting, since
pydantic-settings ignores them and a typo would otherwise go unnoticed."""
from __future__ import annotations

import logging

import pytest

from memory.settings import load_settings, setting_variables, unknown_variables


def test_every_field_and_section_field_has_its_variable() -> None:
    names = setting_variables()
    assert {"MNEMO_STORE", "MNEMO_WRITE_LEASE_WAIT_S", "MNEMO_RETRIEVAL_K", "MNEMO_RETRIEVAL_WRITE_WAIT_S",
            "MNEMO_RETRIEVAL_RECALL_BOOST", "MNEMO_API_KEY"} <= names


def test_unknown_variables_get_the_closest_setting() -> None:
    env = {"MNEMO_WRITE_WAIT_S": "3", "MNEMO_STORE": "x", "MNEMO_REPO_DIR": "/r", "MNEMO_ZZZ": "1",
           "HOME": "/root", "mnemo_store": "y", "MNEMO_RETRIEVAL_RECAL_BOOST": "1"}   # a section's: an error
    assert unknown_variables(env) == {"MNEMO_WRITE_WAIT_S": "MNEMO_WRITE_LEASE_WAIT_S", "MNEMO_ZZZ": None}


def test_load_settings_warns_and_goes_on(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("MNEMO_SHARDSIZE", "3")
    monkeypatch.setenv("MNEMO_SHARD_SIZE", "7")
    with caplog.at_level(logging.WARNING, logger="memory.settings"):
        s = load_settings()
    assert s.shard_size == 7
    assert [r.getMessage() for r in caplog.records] == [
        "MNEMO_SHARDSIZE is no mnemo setting and is ignored (did you mean MNEMO_SHARD_SIZE?)"]
