"""How retrieval shows a turn's time: in its speaker's zone, with the offset its timestamp gave."""
from __future__ import annotations

import polars as pl
import pyarrow as pa

__all__ = ["shown_time"]


def shown_time(ts: pa.ChunkedArray | pa.Array, offset: pa.ChunkedArray | pa.Array | None) -> pa.Array:
    """A turn's time as shown ("2024-02-10 23:32 -08:00"): in its speaker's zone with the offset its
    timestamp gave (the day its relative dates were read in), else in UTC without one."""
    frame = pl.DataFrame({"ts": pl.Series(ts), "off": pl.Series(offset, dtype=pl.Int32) if offset is not None
                          else pl.Series([None] * len(ts), dtype=pl.Int32)})
    zoned = isinstance(frame.schema["ts"], pl.Datetime) and frame.schema["ts"].time_zone
    if zoned:           # the store's column is UTC already; another zone's wall clock is not the base
        frame = frame.with_columns(pl.col("ts").dt.convert_time_zone("UTC"))
    off = pl.col("off")
    hhmm = ((off.abs() // 60).cast(pl.String).str.zfill(2) + ":" + (off.abs() % 60).cast(pl.String).str.zfill(2))
    local = pl.when(off.is_null()).then(pl.col("ts").dt.strftime("%Y-%m-%d %H:%M")).otherwise(
        (pl.col("ts") + pl.duration(minutes=off)).dt.strftime("%Y-%m-%d %H:%M") + " "
        + pl.when(off < 0).then(pl.lit("-")).otherwise(pl.lit("+")) + hhmm)
    return frame.select(local.alias("date")).to_arrow().column("date").combine_chunks().cast(pa.string())
