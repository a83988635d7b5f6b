"""Shared fixtures: a real LanceDB store in a temp dir (never mocked), the sample archive consolidated
once per session (tests get private copies), the embedder, one Prefect test server for the session,
and a real uvicorn server on loopback for HTTP tests."""
from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import pytest
import uvicorn

from memory.embed import Embedder, get_embedder
from memory.runs import RunReport
from memory.store import Store
from tests.helpers import SampleSplit, build_consolidated, build_split, copy_store


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the `MNEMO_*` settings of the shell that runs it (a test sets what it needs)."""
    for name in list(os.environ):
        if name.startswith("MNEMO_"):
            monkeypatch.delenv(name)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty store with 384-d vectors (all-MiniLM-L6-v2's width)."""
    return Store(str(tmp_path / "store"), dim=384)


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real default embedder (all-MiniLM-L6-v2), loaded and warmed once."""
    emb = get_embedder()
    emb.embed(["warm up"])
    return emb


# -- the sample archive, consolidated ---------------------------------------------------------------
@pytest.fixture(scope="session")
def consolidated_sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunReport]:
    """examples/sample.jsonl ingested and consolidated once with default Settings: (store dir, report).
    Never open it directly: take a copy (`sample_store`, `module_sample_store`, `copy_store`)."""
    return build_consolidated(tmp_path_factory.mktemp("sample") / "store")


@pytest.fixture
def sample_store(consolidated_sample: tuple[Path, RunReport], tmp_path: Path) -> Store:
    """A private copy of the consolidated sample store for one test (free to write)."""
    return copy_store(consolidated_sample[0], tmp_path / "sample")


@pytest.fixture(scope="module")
def module_sample_store(consolidated_sample: tuple[Path, RunReport],
                        tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A copy of the consolidated sample store shared by one module's tests (which must not write it)."""
    return copy_store(consolidated_sample[0], tmp_path_factory.mktemp("sample-copy") / "store")


@pytest.fixture(scope="session")
def split_sample_stores(tmp_path_factory: pytest.TempPathFactory) -> SampleSplit:
    """The sample cut in two (helpers.split_sample) and consolidated batch by batch with default
    Settings, built once: the store after batch 1 and after both batches (take copies of either)."""
    return build_split(tmp_path_factory.mktemp("split"))


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server (SQLite) for the whole test session."""
    import prefect.settings
    from prefect.testing.utilities import prefect_test_harness

    # no telemetry from the test server (it would try the network)
    with prefect.settings.temporary_settings(updates={prefect.settings.PREFECT_SERVER_ANALYTICS_ENABLED: False}):
        with prefect_test_harness(server_startup_timeout=60):
            yield


@contextmanager
def _serve(app: Any, **config: Any) -> Iterator[str]:
    """Run an ASGI app with uvicorn on a free loopback port in a thread; yield its base URL.
    `config` goes to uvicorn.Config (e.g. access_log=False, timeout_graceful_shutdown=1)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # handed to uvicorn: no window for another process to take the port
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="session")
def serve_app() -> Callable[[Any], ContextManager[str]]:
    """`with serve_app(app, **uvicorn_config) as url:` runs the app on loopback for the block."""
    return _serve


@pytest.fixture
def store_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The table of every `Store.read` during the test, in order (every handle; `.clear()` it to start
    counting later): how tests check that a path reads what it must and no more."""
    reads: list[str] = []
    real = Store.read

    def recording(self: Store, name: str, *args: Any, **kw: Any) -> Any:
        reads.append(name)
        return real(self, name, *args, **kw)

    monkeypatch.setattr(Store, "read", recording)
    return reads
