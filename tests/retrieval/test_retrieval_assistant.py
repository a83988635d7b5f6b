"""Memories of an assistant's own replies (`RetrievalSettings.assistant_speakers`,
`strategies.assistant_memories`): fragments and insights citing only assistant turns are not
searched, the assistant turns themselves and memories citing a user turn are."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory.embed import Embedder
from memory.settings import load_settings
from memory.store import Store
from retrieval import RetrievalSettings, Retriever
from retrieval.strategies import assistant_memories
from tests.helpers import ts

USER = "carol"
TURNS = [("user", "I adopted a beagle puppy named Max and he keeps pulling on the leash"),
         ("Assistant", "Leash training a puppy takes patience: reward loose-leash walking with treats, "
                       "stop when the dog pulls, and keep training sessions short and frequent.")]
#: (id, text, cited turns): three paraphrases of the assistant's advice, one of the user's turn,
#: and an insight citing both turns
MEMORIES = [("f-a1", "leash training: assistant says reward loose-leash walking with treats", [1]),
            ("f-a2", "training sessions: assistant says keep dog training sessions short", [1]),
            ("f-a3", "pulling dog: assistant says stop walking when the dog pulls on the leash", [1]),
            ("f-u1", "beagle puppy: user adopted a beagle puppy named Max who pulls on the leash", [0])]
QUERY = "how should I train my dog to stop pulling on the leash"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Store:
    st = Store(str(tmp_path_factory.mktemp("assistant") / "store"), dim=embedder.dim)
    msgs = [{"id": f"{USER}-m{i}", "user_id": USER, "session_id": "s1", "message_id": f"m{i}", "seq": i,
             "speaker": sp, "text": text, "ts": ts(1)} for i, (sp, text) in enumerate(TURNS)]
    for m, v in zip(msgs, embedder.embed([f"{m['speaker']}: {m['text']}" for m in msgs])):
        m["vector"] = v
    st.upsert("messages", msgs)
    frags: list[dict[str, Any]] = [
        {"id": fid, "user_id": USER, "session_id": "s1", "session_ts": ts(1), "subject": "user",
         "category": "factual", "key": text.split(":")[0], "content": text, "date": "2023-05-01", "text": text,
         "source_ids": [f"m{i}" for i in cited]} for fid, text, cited in MEMORIES]
    for f, v in zip(frags, embedder.embed([f["text"] for f in frags])):
        f["vector"] = v
    st.upsert("fragments", frags)
    ins: dict[str, Any] = {"id": "i-both", "user_id": USER, "key": "dog", "content": "user trains a beagle puppy",
           "date": "2023-05-01", "text": "dog: user is leash training a beagle puppy with treats",
           "source_ids": ["m0", "m1"], "parent_ids": ["f-u1"], "session_ts": ts(1)}
    ins["vector"] = embedder.embed([str(ins["text"])])[0]
    st.upsert("insights", [ins])
    return st


def _ids(store: Store, embedder: Embedder, strategy: str, **settings: Any) -> list[str]:
    r = Retriever(store, RetrievalSettings(refresh_ms=0, **settings), embedder=embedder)
    return r.retrieve(USER, QUERY, k=10, strategy=strategy).ids


def test_the_mask_marks_memories_citing_only_assistant_turns(store: Store, embedder: Embedder) -> None:
    r = Retriever(store, RetrievalSettings(refresh_ms=0), embedder=embedder)
    idx = r.user_index(USER)
    ids = idx.meta.column("id").to_pylist()
    marked = {ids[i] for i in np.flatnonzero(assistant_memories(idx, ("assistant",)))}
    assert marked == {"f-a1", "f-a2", "f-a3"}            # the turn itself, the user's and the mixed insight stay
    assert not assistant_memories(idx, ("nobody",)).any()


@pytest.mark.parametrize("strategy", ["familiarity", "rfmem", "rfmem-hybrid", "hybrid", "hybrid-walk"])
def test_assistant_memories_are_not_searched(store: Store, embedder: Embedder, strategy: str) -> None:
    got = _ids(store, embedder, strategy)
    assert not {"f-a1", "f-a2", "f-a3"} & set(got)
    assert f"{USER}-m1" in got or "i-both" in got          # the advice is still found through its turn
    every = _ids(store, embedder, strategy, assistant_speakers=(), dedupe_sources=False)
    assert {"f-a1", "f-a2", "f-a3"} <= set(every)          # off: every memory is searched again


def test_setting_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().retrieval.assistant_speakers == ("assistant",)
    monkeypatch.setenv("MNEMO_RETRIEVAL_ASSISTANT_SPEAKERS", '["assistant", "system"]')
    assert load_settings().retrieval.assistant_speakers == ("assistant", "system")
    monkeypatch.setenv("MNEMO_RETRIEVAL_ASSISTANT_SPEAKERS", "[]")
    assert load_settings().retrieval.assistant_speakers == ()
