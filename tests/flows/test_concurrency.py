"""The whole service under load on one real store: 8 concurrent HTTP clients append turns
(`POST /v1/users/{u}/messages`) and retrieve, while a consolidation runs in another process and a
forget (`POST /v1/users/{u}/forget`) goes through the service. Afterwards: no duplicate id
(`memory.doctor`), every accepted append stored, no request failed except the documented 409 / 503
with Retry-After (retried as told), and the retrieval latency percentiles printed."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, ContextManager

import httpx
import numpy as np
import pytest

from flows.service import create_app
from memory.doctor import check
from memory.embed import Embedder
from memory.ingest import ingest
from memory.settings import Settings
from memory.store import Store
from retrieval.retriever import Retriever
from tests.helpers import REPO, SAMPLE, copy_store

CLIENTS = 8
#: clients keep going at least this long, and until the consolidation and the forget are done
MIN_SECONDS = 8.0
#: the most a client waits on a Retry-After (the test honours it, capped)
MAX_RETRY_WAIT_S = 1.0
QUERIES = ("what is my dog's name?", "where do I work?", "what do I do on Tuesdays?", "hobbies")


def pending_users(tmp: Path, copies: int) -> Path:
    """The sample archive under new user ids (`alice0`, `bob0`, ...): work for the consolidation."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    out = tmp / "pending.jsonl"
    with out.open("w") as fh:
        for c in range(copies):
            for r in rows:
                fh.write(json.dumps({**r, "user_id": f"{r['user_id']}{c}", "message_id": f"{r['message_id']}-{c}"})
                         + "\n")
    return out


class Tally:
    """Every answer the clients got: latencies of retrievals, refusals by code, failures."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.retrieve_ms: list[float] = []
        self.refused: dict[int, int] = {}
        self.failures: list[str] = []
        self.appended: dict[str, set[str]] = {}

    def answer(self, what: str, res: httpx.Response) -> bool:
        """True when the request is done (200); False when it must be retried (409 / 503 with
        Retry-After, after waiting as told); anything else is a failure."""
        if res.status_code == 200:
            return True
        with self.lock:
            if res.status_code in (409, 503) and res.headers.get("retry-after"):
                self.refused[res.status_code] = self.refused.get(res.status_code, 0) + 1
            else:
                self.failures.append(f"{what}: {res.status_code} {res.text[:200]}")
                return True
        time.sleep(min(float(res.headers["retry-after"]), MAX_RETRY_WAIT_S))
        return False


def client_loop(url: str, n: int, tally: Tally, stop: threading.Event, readers: list[str]) -> None:
    """Client `n`: appends two turns to its own user, retrieves for a consolidated user, again."""
    user, sent = f"client{n}", 0
    tally.appended[user] = set()
    with httpx.Client(base_url=url, timeout=120) as http:
        while not stop.is_set():
            ts = datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=sent)
            turns = [{"session_id": f"live{sent // 20}", "message_id": f"{user}-m{sent + i}", "speaker": "user",
                      "text": f"note {sent + i} from client {n}: I moved my piano lesson to day {sent % 7}",
                      "timestamp": (ts + timedelta(seconds=i)).isoformat()} for i in range(2)]
            while not tally.answer(f"append {user}", res := http.post(f"/v1/users/{user}/messages",
                                                                      json={"messages": turns})):
                pass
            if res.status_code == 200:
                tally.appended[user].update(t["message_id"] for t in turns)
            sent += 2
            reader = readers[(n + sent) % len(readers)]
            start = time.perf_counter()
            res = http.post(f"/v1/users/{reader}/retrieve", json={"query": QUERIES[sent % len(QUERIES)], "k": 5})
            ms = (time.perf_counter() - start) * 1000
            if tally.answer(f"retrieve {reader}", res) and res.status_code == 200:
                with tally.lock:
                    tally.retrieve_ms.append(ms)


@pytest.mark.slow
def test_eight_clients_append_and_retrieve_during_a_consolidation_and_a_forget(
        tmp_path: Path, consolidated_sample: tuple[Path, Any], embedder: Embedder,
        serve_app: Callable[..., ContextManager[str]]) -> None:
    store = copy_store(consolidated_sample[0], tmp_path / "store")      # alice, bob: consolidated
    ingest(store, pending_users(tmp_path, 2), "jsonl")                   # alice0.., bob0..: pending
    settings = Settings(store=store.uri, write_lease_wait_s=10.0)
    service_store = Store(store.uri, dim=store.dim, write_lease_wait_s=settings.write_lease_wait_s)
    retriever = Retriever(service_store, settings.retrieval, embedder=embedder)
    code = ("import sys; from memory.runs import consolidate, open_store; from memory.settings import Settings; "
            "s = Settings(store=sys.argv[1], shard_size=1, run_lease_wait_s=600); "
            "r = consolidate(open_store(s), s, on_shard=lambda _: print('shard', flush=True)); "
            "print(r.status, flush=True)")
    tally, stop, running = Tally(), threading.Event(), threading.Event()
    forgot: list[dict[str, Any]] = []
    said: list[str] = []

    def listen(out: Any) -> None:          # the run's lines; the forget starts after its first commit
        for line in out:
            said.append(line.strip())
            running.set()

    with serve_app(create_app(retriever, settings), access_log=False) as url:
        run = subprocess.Popen([sys.executable, "-c", code, store.uri], cwd=REPO, text=True, stdout=subprocess.PIPE)
        listener = threading.Thread(target=listen, args=(run.stdout,))
        listener.start()
        clients = [threading.Thread(target=client_loop, args=(url, n, tally, stop, ["alice", "bob"]))
                   for n in range(CLIENTS)]
        start = time.perf_counter()
        for t in clients:
            t.start()

        def forget_loop() -> None:     # once the run is under way; 409 while it holds the run lease
            running.wait(timeout=600)
            with httpx.Client(base_url=url, timeout=300) as http:
                while not tally.answer("forget bob", res := http.post("/v1/users/bob/forget",
                                                                      json={"sessions": ["bob-s1"]})):
                    pass
                if res.status_code == 200:
                    forgot.append(res.json())

        forgetter = threading.Thread(target=forget_loop)
        forgetter.start()
        run_status = run.wait(timeout=900)
        listener.join(timeout=60)
        forgetter.join(timeout=900)
        while time.perf_counter() - start < MIN_SECONDS:
            time.sleep(0.2)
        stop.set()
        for t in clients:
            t.join(timeout=300)
        seconds = time.perf_counter() - start
    shards = said.count("shard")      # the 4 pending users, and the clients' users appended before it planned
    assert run_status == 0 and said[-1] == "completed" and shards >= 4, said
    ms = np.array(tally.retrieve_ms)
    appended = sum(len(v) for v in tally.appended.values())
    print(f"\n{CLIENTS} clients for {seconds:.1f}s during a consolidation ({shards} shard commits) and a forget: "
          f"{appended} turns appended, {len(ms)} retrievals: p50 {np.percentile(ms, 50):.1f} ms, "
          f"p99 {np.percentile(ms, 99):.1f} ms, max {ms.max():.1f} ms; refused and retried: {tally.refused or 'none'}; "
          f"failed: {len(tally.failures)}")
    assert tally.failures == []
    assert forgot and forgot[0]["messages"] > 0
    report = check(store)
    assert report.duplicates == {}, report.lines()
    for user, ids in tally.appended.items():
        stored = set(store.read("messages", user, columns=["message_id"]).column("message_id").to_pylist())
        assert ids <= stored, f"{user}: {len(ids - stored)} accepted turns missing"
    marks = {r["user_id"] for r in store.read("watermarks", columns=["user_id"]).to_pylist()}
    assert {"alice0", "bob0", "alice1", "bob1"} <= marks
