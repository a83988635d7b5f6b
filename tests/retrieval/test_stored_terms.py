"""BM25 terms stored with every searchable row (`schemas.TERMS`): worked out by `Store.conform` on
every write and read by the index instead of tokenizing the history, with bit-identical scores; a
store an older mnemo wrote (no terms column, or nulls in it) is tokenized on load."""
from __future__ import annotations

import shutil
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa

from memory import schemas, terms
from memory.embed import Embedder
from memory.store import Store
from memory.terms import tokenize
from retrieval.index import TRACKED, load_user
from retrieval.lexical import BM25Index
from tests.helpers import ALICE, write_user

TEXTS = ["Caroline went to the LGBTQ support groups twice", None, "", "Mon résumé, ma гитару, 吉他 x_y",
         "a long turn about guitars and chords " * 50, "Melanie paints sunrises and sunsets"] * 5
QUERIES = ["When did Caroline go to the support group?", "guitar chords", "résumé гитару", "sunrise", "nothing"]


def test_terms_are_the_query_tokenizer_applied_to_each_text() -> None:
    stored = terms.terms(pa.array(TEXTS, pa.string())).to_pylist()
    assert stored == [tokenize(t or "") for t in TEXTS]
    assert stored[0] == ["caroline", "went", "lgbtq", "support", "group", "twice"] and stored[1] == stored[2] == []
    assert terms.terms(pa.array([], pa.string())).to_pylist() == []


def test_bm25_from_stored_terms_is_bm25_from_the_texts() -> None:
    stored = terms.terms(pa.array(TEXTS, pa.string()))
    some = pa.array([None if i % 4 == 1 else t for i, t in enumerate(stored.to_pylist())], schemas.STR_LIST)
    full, read, part = (BM25Index(TEXTS, b=0.9), BM25Index(TEXTS, b=0.9, terms=stored),
                        BM25Index(TEXTS, b=0.9, terms=some))
    assert (full.tokenized, read.tokenized, part.tokenized) == (len(TEXTS), 0, sum(i % 4 == 1 for i in range(30)))
    for q in QUERIES:
        want = full.scores(q)
        assert np.array_equal(read.scores(q), want) and np.array_equal(part.scores(q), want), q
    assert full.scores(QUERIES[0]).argmax() == 0 and full.scores(QUERIES[2])[3] > 0
    assert np.array_equal(full.terms, read.terms) and abs(full.matrix - read.matrix).max() == 0


def test_a_written_row_carries_its_terms_and_the_index_reads_them(tmp_path: Path, embedder: Embedder) -> None:
    st = Store(str(tmp_path / "s"), dim=embedder.dim)
    write_user(st, embedder, "alice", ALICE)
    msgs = st.read("messages", "alice", columns=["speaker", "text", schemas.TERMS]).to_pylist()
    assert msgs and all(m[schemas.TERMS] == tokenize(f"{m['speaker']}: {m['text']}") for m in msgs)
    assert "alice" in msgs[0][schemas.TERMS]              # the speaker is searched with the turn
    frags = st.read("fragments", "alice", columns=["text", schemas.TERMS]).to_pylist()
    assert frags and all(f[schemas.TERMS] == tokenize(f["text"]) for f in frags)
    idx = load_user(st, "alice", lexical=(1.2, 0.75))
    assert idx.lexical(1.2, 0.75).tokenized == 0 and idx.size == len(msgs) + len(frags) + 1
    lazy = load_user(st, "alice")                          # no lexical channel: terms not read, nor kept
    assert lazy.lexical(1.2, 0.75).tokenized == idx.size
    assert np.array_equal(lazy.lexical(1.2, 0.75).scores("hiking Alps"), idx.lexical(1.2, 0.75).scores("hiking Alps"))


def test_a_store_an_older_mnemo_wrote_is_tokenized_with_the_same_scores(tmp_path: Path,
                                                                         embedder: Embedder) -> None:
    new = Store(str(tmp_path / "new"), dim=embedder.dim)
    write_user(new, embedder, "alice", ALICE)
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    db = lancedb.connect(str(tmp_path / "old"))
    for name in schemas.MEMORY_TABLES.values():          # as written before terms were stored
        if name in db.table_names():
            db.open_table(name).drop_columns([schemas.TERMS])
    names = set(db.table_names())
    before = tuple(db.open_table(t).version if t in names else 0 for t in TRACKED)
    old = Store(str(tmp_path / "old"), dim=embedder.dim)
    pinned = load_user(old, "alice", lexical=(1.2, 0.75), versions=before)   # versions without the column
    latest = load_user(old, "alice", lexical=(1.2, 0.75))                    # the column added on open: nulls
    raw = db.open_table("fragments")
    assert schemas.TERMS in raw.schema.names                               # added on open, as nulls
    raw.checkout(before[1])
    assert schemas.TERMS not in raw.schema.names                           # the pinned version has none
    assert old.read("fragments", "alice", columns=["id", schemas.TERMS], version=before[1]) \
        .column(schemas.TERMS).null_count == len(ALICE)                    # read as nulls
    want = load_user(new, "alice", lexical=(1.2, 0.75))
    n = want.size
    assert pinned.lexical(1.2, 0.75).tokenized == latest.lexical(1.2, 0.75).tokenized == n
    assert want.lexical(1.2, 0.75).tokenized == 0
    for q in ("hiking in the Alps", "kitten Luna", "watercolor sunsets painting"):
        scores = {i: s for i, s in zip(want.meta.column("id").to_pylist(), want.lexical(1.2, 0.75).scores(q))}
        assert max(scores.values()) > 0
        for idx in (pinned, latest):
            got = dict(zip(idx.meta.column("id").to_pylist(), idx.lexical(1.2, 0.75).scores(q)))
            assert got == scores, q
