"""Re-ingesting ODS hours from what the warehouse holds: the landing area's retained segments of every shard stream.

An ODS hour whose data in the lake is bad (a taint's root) while its source's change stream is right, or was corrected
by changes the source re-sent, is rebuilt without the source sending it again:

1. the pending segments are applied first, as the ingestion does (a correction the source re-sent is among them);
2. every retained segment of the table's streams, from the first one up to the committed positions, is prepared as one
   batch, not against the changes earlier batches took in (the merge is idempotent: each key's newest change wins,
   by binlog time and position, whatever batch it came in);
3. the rows whose partition is one of the hours (each key's newest change; a key that left the hour as a tombstone
   there, as the merge leaves it) replace those partitions in one Delta overwrite. The ingestion's positions, counts
   and journal of changes stay as they are: nothing new was taken in.

The caller reports the hours again and judges their checks (:func:`warehouse_assets.ingest.job.report_completed_hours`):
their downstream sees new data. The cost is the stream's whole retained history, read once per re-ingest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from resources.delta_lake import DeltaStore
from resources.landing import Landing, read_lines
from resources.spark import arrow_frame
from warehouse_assets.catalog import BY_PERIOD, OdsTable, Table
from warehouse_assets.ingest.merge import committed_positions, ingest_table, prepare_changes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class Reingested:
    """What a re-ingest did: the rows each hour holds now, the segments read, the pending batches applied first."""

    table: str
    rows: dict[str, int]  # hour key → rows written (tombstones included)
    segments: int
    pending_batches: int
    seconds: float

    def describe(self) -> str:
        hours = ", ".join(f"{k} ({n} rows)" for k, n in self.rows.items())
        pending = f", after applying {self.pending_batches} pending batch(es)" if self.pending_batches else ""
        return f"{self.table}: re-ingested {hours} from {self.segments} retained landing segment(s){pending}"


def reingest_hours(
    spark: SparkSession, store: DeltaStore, landing: Landing, table: Table, hours: list[str]
) -> Reingested:
    """Rebuild the partitions ``hours`` (hour keys, ``2026-01-05-13:00``) of the ODS ``table`` from its retained
    landing segments (see the module's doc). Raises ``ValueError`` naming what is missing when it cannot."""
    if not isinstance(table, OdsTable):
        raise ValueError(f"{table.fqn} is not an ODS table: only an ODS hour is re-ingested from the landing area")
    if tuple(table.partition_by) != ("dt", "hh"):
        raise ValueError(f"{table.fqn} is partitioned by {table.partition_by}, not by (dt, hh): cannot re-ingest hours")
    pdef = BY_PERIOD[table.period]
    for key in hours:
        if not pdef.has_partition_key(key):
            raise ValueError(f"{key!r} is not an hour of {table.fqn} (e.g. {pdef.get_first_partition_key()})")
    started = time.monotonic()
    streams = landing.streams(table.source_database, table.source_tables)
    if not streams:
        raise ValueError(f"the landing area {landing.root} holds no stream of {table.fqn}: nothing to re-ingest from")
    gone = [s for s in streams if landing.first_segment(s) is None]
    if gone:
        raise ValueError(
            f"the landing area no longer holds the first segments of {', '.join(gone)}: {table.fqn} cannot be "
            "rebuilt from it; release the hour instead (accepted as is)"
        )
    pending = ingest_table(spark, store, landing, table)
    positions = committed_positions(store, table, streams)
    segments = [seg for s in streams for seg in landing.segments(s) if seg.seq <= positions.get(s, 0)]
    short = [s for s in streams if positions.get(s, 0) > len([g for g in segments if g.stream == s])]
    if short:
        raise ValueError(f"the landing area misses segments of {', '.join(short)} before their committed position")
    prepared = prepare_changes(
        spark, store, table, read_lines(segments), streams, tz=landing.timezone, against_earlier=False
    )
    wanted = {_partition(key): key for key in hours}
    rows = pa.concat_tables([prepared.applied, _tombstones(prepared.moved_out, prepared.applied.schema)])
    rows = _newest_per_key(rows, table).drop_columns(["_op"])
    keep = pc.is_in(pc.binary_join_element_wise(rows["dt"], rows["hh"], "/"), pa.array([f"{d}/{h}" for d, h in wanted]))
    rows = rows.filter(keep)
    counts = {key: 0 for key in hours}
    for dt, hh in zip(rows["dt"].to_pylist(), rows["hh"].to_pylist(), strict=True):
        counts[wanted[(dt, hh)]] += 1
    specs = [{"dt": d, "hh": h} for d, h in wanted]
    store.overwrite(table.key, arrow_frame(spark, rows), table.partition_by, specs, operation="reingest")
    return Reingested(table.fqn, counts, len(segments), len(pending.batches), time.monotonic() - started)


def _partition(key: str) -> tuple[str, str]:
    """An hour key's Delta partition values (local date and hour)."""
    start = BY_PERIOD["hourly"].time_window_for_partition_key(key).start
    return start.strftime("%Y-%m-%d"), start.strftime("%H")


def _tombstones(moved_out: pa.Table, schema: pa.Schema) -> pa.Table:
    """The rows retiring keys from the partitions they left, as the merge writes them: flagged deleted."""
    flagged = moved_out.set_column(
        moved_out.schema.get_field_index("_deleted"), "_deleted", pa.array([True] * moved_out.num_rows, pa.bool_())
    )
    return flagged.select(schema.names).cast(schema)


def _newest_per_key(rows: pa.Table, table: Table) -> pa.Table:
    """One row per key and partition: a key's live row wins over a tombstone of the same partition (it came back)."""
    if not rows.num_rows:
        return rows
    ordered = rows.sort_by([("_deleted", "ascending"), ("_es", "descending"), ("_pos", "descending")])
    seen: set[tuple[object, ...]] = set()
    keep: list[int] = []
    columns = [ordered[c].to_pylist() for c in [*table.row_key, "dt", "hh"]]
    for i, key in enumerate(zip(*columns, strict=True)):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return ordered.take(pa.array(keep, pa.int64()))
