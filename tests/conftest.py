"""Shared fixtures: a real LanceDB store in a temp dir (never mocked), one Prefect test server for
the session, and a real uvicorn server on loopback for HTTP tests."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import pytest
import uvicorn

from memory.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty store with 384-d vectors (all-MiniLM-L6-v2's width)."""
    return Store(str(tmp_path / "store"), dim=384)


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
def _serve(app: Any) -> Iterator[str]:
    """Run an ASGI app with uvicorn on a free loopback port in a thread; yield its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
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


@pytest.fixture(scope="session")
def serve_app() -> Callable[[Any], ContextManager[str]]:
    """`with serve_app(app) as url:` runs the app on loopback for the block."""
    return _serve
