"""The warehouse's own Delta tables (``ops.*``): what the ingestion records about itself, declared once.

Each is written by exactly-once appends (app transactions per ODS table and stream, see
:meth:`resources.delta_lake.DeltaStore.append`), one small commit per batch, so ``lake_maintenance`` compacts
them besides vacuuming and checkpointing them like every other table. Readers prune by partition: a readiness
tick reads the dates it judges, an ingestion batch the hours its changes fall in.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class OpsTable:
    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    description: str
    retention_hours: int | None = None  # time-travel window (log and removed files); None: the lake's

    @property
    def key(self) -> tuple[str, str]:
        return ("ops", self.name)

    @property
    def fqn(self) -> str:
        return "ops." + self.name

    def rows(self, entries: list[dict[str, object]]) -> pa.Table:
        return pa.Table.from_pylist(entries, schema=self.schema)


QUARANTINE = OpsTable(
    "quarantine",
    pa.schema(
        [
            pa.field("table", pa.string()),
            pa.field("stream", pa.string()),
            pa.field("segment", pa.string()),
            pa.field("line", pa.int64()),
            pa.field("row_index", pa.int64()),
            pa.field("reason", pa.string()),
            pa.field("raw", pa.string()),
        ]
    ),
    ("table",),
    "CDC records that could not be applied: the reason and their source position (segment, line).",
)

INGESTED_COUNTS = OpsTable(
    "ingested_counts",
    pa.schema(
        [
            pa.field("table", pa.string()),
            pa.field("stream", pa.string()),
            pa.field("hour", pa.string()),  # local binlog hour "YYYY-MM-DDTHH"
            # its local 5-minute window "YYYY-MM-DDTHH:MM" (the source counts' key); null in entries written before
            # windows were counted, which count for their hour only
            pa.field("window", pa.string()),
            pa.field("rows", pa.int64()),
            pa.field("seq_to", pa.int64()),  # the stream's last segment in the batch that counted these rows
            pa.field("date", pa.string()),  # the hour's local date: the partition a readiness tick prunes to
        ]
    ),
    ("table", "date"),
    "Rows ingested per ODS table, shard stream and local binlog window (5 minutes), one entry per batch.",
)

# One row per distinct change taken in (applied or superseded): what a re-sent change is recognised by in
# a later batch. Partitioned by hour, so a batch reads only the hours its changes fall in.
INGESTED_CHANGES = OpsTable(
    "ingested_changes",
    pa.schema(
        [
            pa.field("table", pa.string()),
            pa.field("stream", pa.string()),
            pa.field("hour", pa.string()),  # local binlog hour "YYYY-MM-DDTHH", as in ops.ingested_counts
            pa.field("change", pa.string()),  # content hash: op, binlog time, row image
            pa.field("seq", pa.int64()),  # the segment of its first copy
        ]
    ),
    ("table", "hour"),
    "Content hashes of the changes ingested per ODS table, stream and local binlog hour.",
)

# Every shard stream's position after each ODS batch, written before the batch's merge. Delta on Spark records
# one application transaction per commit, so the merge commits the batch number (``ingest:<table>``) and
# this journal says which segment of each stream that batch reached: the positions of the batch number the
# ODS table committed are the committed ones, and an attempt that crashed before its merge counts for nothing.
INGESTION_POSITIONS = OpsTable(
    "ingestion_positions",
    pa.schema(
        [
            pa.field("table", pa.string()),
            pa.field("batch", pa.string()),  # the attempt's batch number, committed by the ODS merge (a partition)
            pa.field("attempt", pa.int64()),  # when this attempt wrote it (ns): a re-run's rows win
            pa.field("stream", pa.string()),
            pa.field("seq", pa.int64()),  # the stream's last segment applied once the batch commits
        ]
    ),
    ("table", "batch"),  # a reader opens the committed batch's partition only, however long the history
    "Every shard stream's ingestion position after each ODS batch; the ODS table commits the batch number.",
)

OPS_TABLES: tuple[OpsTable, ...] = (QUARANTINE, INGESTED_COUNTS, INGESTED_CHANGES, INGESTION_POSITIONS)
