"""Ingest: conversation archives (LoCoMo, LongMemEval, BEAM, generic JSONL / Parquet) into the store.

`read_archive` is pure: it parses one archive into Polars frames of `messages`, `sessions` and
(LoCoMo, on request) `observations`, plus the rows it set aside, each with a reason and its raw text.
`ingest` checks that batch against what the store already holds for each user (scoped reads), then
writes every table with one upsert (new messages: inserts of `write.INSERT_ROWS` rows). Ids are
deterministic, so ingesting a file twice adds nothing.

`append` (`append.py`) validates one user's batch of new turns exactly like an ingest and writes it.

Split at its seams: `readers.py` (one reader per format), `beam.py` (the BEAM reader and its time
rule), `validate.py` (batch validation into frames: `read_archive`), `write.py` (`ingest`: the
store-side checks and the upserts), `common.py` (formats, frame schemas, length limits, quarantine rows).

Bad rows never stop an ingest; they go to `quarantine` with their reason. Only an archive that cannot be
read at all (missing file, a directory where the format reads one file, unknown format, not JSON where
JSON is required) raises `IngestError`.
"""
from __future__ import annotations

from memory.ingest.append import AppendReport, append
from memory.ingest.common import FIELDS, FORMATS, MAX_ID_CHARS, MAX_TEXT_CHARS, REUSED_ID, STAGE, ArchiveBatch
from memory.ingest.readers import Reader
from memory.ingest.validate import read_archive
from memory.ingest.write import IngestReport, ingest, ingest_batch

__all__ = ["ingest", "ingest_batch", "IngestReport", "append", "AppendReport", "FORMATS", "read_archive", "ArchiveBatch", "Reader", "FIELDS", "REUSED_ID",
           "STAGE", "MAX_TEXT_CHARS", "MAX_ID_CHARS"]
