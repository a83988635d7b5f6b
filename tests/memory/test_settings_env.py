"""`MNEMO_*` variables no setting reads are named in a warning with the closest setting, since
pydantic-settings ignores them and a typo would otherwise go unnoticed."""
from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from memory.settings import RetrievalSettings, Settings, load_settings, setting_variables, unknown_variables


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


@pytest.mark.parametrize("variable, value, says", [
    ("MNEMO_STORE", "", "the store is set but blank"),
    ("MNEMO_STORE", "  ", "the store is set but blank"),
    ("MNEMO_EMBED_BATCH_SIZE", "0", "greater than or equal to 1"),
    ("MNEMO_EMBED_DEVICE", "tpu", "unknown device 'tpu' (known: cpu, cuda, mps"),
    ("MNEMO_EMBED_DEVICE", "cuda:x", "unknown device"),
    ("MNEMO_RETRIEVAL_CALIB_HIGH_Q", "7", "less than or equal to 1"),
    ("MNEMO_RETRIEVAL_CALIB_LOW_Q", "-0.1", "greater than or equal to 0"),
    ("MNEMO_RETRIEVAL_CALIB_TAU_Q", "1.5", "less than or equal to 1"),
    ("MNEMO_RETRIEVAL_PORT", "99999", "less than or equal to 65535"),
    ("MNEMO_RETRIEVAL_PORT", "0", "greater than or equal to 1"),
    ("MNEMO_RETRIEVAL_KINDS", '["bogus"]', "unknown memory kinds ['bogus'] (known: message, fragment"),
    ("MNEMO_RETRIEVAL_KINDS", "[]", "no memory kind given"),
    ("MNEMO_SHARD_SIZE", "0", "greater than or equal to 1"),
])
def test_a_value_out_of_range_is_refused_at_load(monkeypatch: pytest.MonkeyPatch, variable: str, value: str,
                                                 says: str) -> None:
    """Refused where the settings are read (the CLI's exit 2), not deep in torch, numpy or uvicorn."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as err:
        load_settings()
    assert says in str(err.value)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "mps", "mps:0", "cpu:0", "xpu", "hpu"])
def test_the_devices_torch_runs_on_are_taken(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setenv("MNEMO_EMBED_DEVICE", device)
    monkeypatch.setenv("MNEMO_RETRIEVAL_KINDS", '["summary", "message"]')
    s = load_settings()
    assert s.embed_device == device and s.retrieval.kinds == ("summary", "message")


def test_a_section_override_is_validated() -> None:
    """`with_overrides` validates like loading (serve's --port 99999 is exit 2, not an OverflowError)."""
    with pytest.raises(ValidationError, match="retrieval.port"):
        Settings().with_overrides(retrieval={"port": 99999})
    with pytest.raises(ValidationError, match="less than or equal to 65535"):
        RetrievalSettings().with_overrides(port=99999)
    assert RetrievalSettings().with_overrides(port=9000, host=None).port == 9000
