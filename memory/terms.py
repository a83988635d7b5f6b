"""The words of a memory that BM25 indexes: one tokenizer for the rows written and the queries read.

A searchable row's terms are worked out once, when it is written (`Store.conform` fills
`schemas.TERMS`), so a user's first query reads them instead of tokenizing the whole history (the
tokenizing was a third of a cold query on a 1M-token chat). Tokens are runs of letters and digits of
any script, lower-cased (Polars' Rust regex: `\\w` with marks, no underscore; no Unicode
normalization), without scikit-learn's English stop words, with a light plural folding
("paintings" -> "painting") as the only stemming. A change to any of that renames `schemas.TERMS`,
so terms of an older tokenizer are never mixed with new ones.
"""
from __future__ import annotations

from collections.abc import Collection
from functools import cache

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memory import schemas

#: letters and digits of any script (Rust regex `\w`, marks included), no underscore: "café", "гитару"
TOKEN_RE = r"[^\W_]+"
#: texts are tokenized in this many parts per Polars thread, run at once (`pl.collect_all`)
PARTS_PER_THREAD = 2


@cache
def stop_words() -> frozenset[str]:
    """scikit-learn's English stop words (imported on first use: it costs a no-op run 0.7 s)."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
    return frozenset(ENGLISH_STOP_WORDS)


@cache
def _stop_series() -> pl.Series:
    return pl.Series(sorted(stop_words()))


def _fold(token: str) -> str:
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def words(text: pl.Expr) -> pl.Expr:
    """Lowercase word tokens of a text column: one Polars expression for documents and queries, so
    both sides split alike (Python's `\\w` differs from Rust's on combining marks: Hindi, Thai)."""
    return text.str.to_lowercase().str.extract_all(TOKEN_RE)


def tokenize(text: str, skip: Collection[str] = ()) -> list[str]:
    """Lowercase word tokens without stop words (nor the words in `skip`), plurals folded (the query side)."""
    found = pl.Series([text], dtype=pl.Utf8).to_frame("t").select(words(pl.col("t"))).item().to_list()
    stop = stop_words()
    return [_fold(t) for t in found if t not in stop and t not in skip]


def message_text(speaker: pa.Array | pa.ChunkedArray, text: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A turn as the index searches it: "speaker: text" (a missing speaker or text counts as "")."""
    return pc.binary_join_element_wise(pc.fill_null(speaker, ""), pc.fill_null(text, ""), ": ")


def text_parts(texts: pa.Array) -> list[tuple[int, int]]:
    """(start, end) row ranges of about equal text length, a few per Polars thread: one long turn
    can outweigh thousands of fragments, so equal row counts would leave threads idle."""
    n = len(texts)
    parts = max(1, min(n, pl.thread_pool_size() * PARTS_PER_THREAD))
    if parts == 1:
        return [(0, n)] if n else []
    lengths = pc.fill_null(pc.utf8_length(texts), 0).to_numpy(zero_copy_only=False)
    cuts = np.searchsorted(np.cumsum(lengths), np.linspace(0, lengths.sum(), parts + 1)[1:-1])
    bounds = [0, *sorted(set(int(x) + 1 for x in cuts if 0 <= x < n - 1)), n]
    return [(a, z) for a, z in zip(bounds, bounds[1:]) if z > a]


def _tokens(texts: pa.Array, docs: np.ndarray) -> pl.LazyFrame:
    """(doc, tok) of every term of `texts` in order, `docs` the doc number of each text."""
    tok = pl.col("tok")
    folded = pl.when((tok.str.len_chars() > 3) & tok.str.ends_with("s") & ~tok.str.ends_with("ss")) \
        .then(tok.str.slice(0, tok.str.len_chars() - 1)).otherwise(tok)
    return (pl.LazyFrame({"doc": pl.Series("doc", docs, dtype=pl.UInt32),
                          "text": pl.Series("text", texts, dtype=pl.Utf8).fill_null("")})
            .select("doc", words(pl.col("text")).alias("tok"))
            .explode("tok").drop_nulls("tok")
            .filter(~tok.is_in(_stop_series().implode()))
            .select("doc", folded.alias("tok")))


def token_frame(texts: pa.Array | pa.ChunkedArray, docs: np.ndarray | None = None) -> pl.DataFrame:
    """(doc, tok) of every term of `texts` in text order, tokenized in parts of about equal length on
    Polars' threads; `docs` numbers the texts (default 0, 1, ...)."""
    arr = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    docs = np.arange(len(arr), dtype=np.uint32) if docs is None else np.asarray(docs, dtype=np.uint32)
    parts = pl.collect_all([_tokens(arr.slice(a, z - a), docs[a:z]) for a, z in text_parts(arr)])
    return pl.concat(parts) if parts else pl.DataFrame({"doc": [], "tok": []},
                                                      schema={"doc": pl.UInt32, "tok": pl.Utf8})


def terms(texts: pa.Array | pa.ChunkedArray) -> pa.ListArray:
    """The terms of each text, in order (an empty list for a missing text): `schemas.TERMS`."""
    frame = token_frame(texts)
    counts = np.bincount(frame["doc"].to_numpy(), minlength=len(texts)) if frame.height else \
        np.zeros(len(texts), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), frame["tok"].to_arrow().cast(pa.string()))


def with_terms(name: str, table: pa.Table) -> pa.Table:
    """`table` (rows of table `name`, in its schema) with the terms of its texts, when it is searchable."""
    if schemas.TERMS not in table.column_names:
        return table
    text = table.column("text")
    if name == schemas.MEMORY_TABLES["message"]:
        text = message_text(table.column("speaker"), text)
    return table.set_column(table.schema.get_field_index(schemas.TERMS), table.schema.field(schemas.TERMS),
                            terms(text))
