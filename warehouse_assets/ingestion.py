"""ODS ingestion: Canal binlog segments → ODS Delta tables through merge-into (design AD-1, seed 001).

For one ODS table, each batch:

1. takes the next segments of every shard stream after the position committed with the table (the batch
   number its last merge committed as Delta app transaction ``ingest:<table>``, whose per-stream positions
   ``ops.ingestion_positions`` journals), never past a gap;
2. Spark parses the Canal JSON, types the row images by the catalog's columns, validates them, drops
   re-sent changes (same content: in this batch, or recorded in ``ops.ingested_changes`` by an earlier
   one) and keeps the newest change per primary key (binlog time, then binlog position);
3. rows that cannot be applied go to the ``ops.quarantine`` Delta table with the reason and their source
   position (segment, line);
4. the content hash of every change taken in goes to ``ops.ingested_changes`` (by stream and local binlog
   hour), and the rows ingested per shard stream and binlog hour to the ``ops.ingested_counts`` Delta
   table (what completeness readiness compares with the source's own counts, see :func:`ingested_counts`);
5. the batch's positions are journaled under the next batch number, then Spark's Delta ``MERGE INTO``
   merges the batch into the partitions it touches, and the same commit records that batch number (Delta's
   idempotent writes) — so the position never runs ahead of committed data and a restart neither skips nor
   re-applies anything. A change that moved a key's partition time (Canal's ``old``) also retires the
   key in the partitions it left, as a tombstone: one key is live in one partition.

Every batch checks ``in = applied + quarantined + duplicates + superseded + ddl``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc

from resources.delta_lake import DeltaStore, MergeResult, ReadStats, normalize_arrow_schema, spark_type
from resources.landing import Landing, Segment, read_lines
from warehouse_assets.catalog import OdsTable, Table
from warehouse_assets.ops_tables import (
    INGESTED_CHANGES,
    INGESTED_COUNTS,
    INGESTION_POSITIONS,
    QUARANTINE,
    OpsTable,
)
from warehouse_assets.partitions import periods

# PySpark is imported inside the functions that compute: readiness and `warehouse why` read the ingestion state
# (positions, counts) through this module without loading it.
if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

QUARANTINE_KEY = QUARANTINE.key
COUNTS_KEY = INGESTED_COUNTS.key
CHANGES_KEY = INGESTED_CHANGES.key
QUARANTINE_SCHEMA = QUARANTINE.schema
CHANGES_SCHEMA = INGESTED_CHANGES.schema
HOUR_MS = 3_600_000
CANAL_SCHEMA = (
    "id bigint, database string, `table` string, pkNames array<string>, isDdl boolean, type string, "
    "es bigint, ts bigint, `sql` string, mysqlType map<string,string>, "
    "data array<map<string,string>>, old array<map<string,string>>, position string"
)
DML = ("INSERT", "UPDATE", "DELETE")
POS_SEGMENT = 10_000_000  # _pos = seq * 1e7 + line * 100 + row index: binlog order within a shard
POS_LINE = 100


class ReconciliationError(RuntimeError):
    """Counts of an ingestion batch do not add up: something would have been lost."""


def position_app_id(table: Table) -> str:
    """The app transaction an ODS table's merges commit: its batch number (see :data:`INGESTION_POSITIONS`)."""
    return f"ingest:{table.fqn}"


def quarantine_app_id(table: Table, stream: str) -> str:
    return f"quarantine:{table.fqn}:{stream}"


_ARROW_TYPES: dict[str, pa.DataType] = {
    "bigint": pa.int64(),
    "int": pa.int32(),
    "smallint": pa.int16(),
    "tinyint": pa.int8(),
    "string": pa.string(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}


def _arrow_type(spark_type: str) -> pa.DataType:
    if spark_type.startswith("decimal"):
        precision, scale = spark_type[len("decimal(") : -1].split(",")
        return pa.decimal128(int(precision), int(scale))
    return _ARROW_TYPES[spark_type]


def ods_arrow_schema(table: Table, extra: Sequence[tuple[str, str]] = ()) -> pa.Schema:
    fields = [pa.field(name, _arrow_type(ctype)) for name, ctype in [*table.columns, *extra]]
    fields += [
        pa.field("_es", pa.int64()),
        pa.field("_pos", pa.int64()),
        pa.field("_stream", pa.string()),
        pa.field("_deleted", pa.bool_()),
        pa.field("dt", pa.string()),
        pa.field("hh", pa.string()),
    ]
    return normalize_arrow_schema(pa.schema(fields))


def counts_app_id(table: Table, stream: str) -> str:
    return f"counts:{table.fqn}:{stream}"


def changes_app_id(table: Table, stream: str) -> str:
    return f"changes:{table.fqn}:{stream}"


@dataclass
class BatchReport:
    table: str
    segments: int
    rows_in: int = 0
    rows_applied: int = 0
    rows_quarantined: int = 0
    rows_duplicate: int = 0
    rows_superseded: int = 0
    ddl_lines: int = 0
    positions: dict[str, int] = field(default_factory=dict)
    new_columns: list[str] = field(default_factory=list)
    merge: MergeResult | None = None
    ingested: dict[tuple[str, str], int] = field(default_factory=dict)  # (stream, local hour) -> rows
    seconds: float = 0.0
    prepare_seconds: float = 0.0

    def check(self) -> None:
        accounted = (
            self.rows_applied + self.rows_quarantined + self.rows_duplicate + self.rows_superseded + self.ddl_lines
        )
        if self.rows_in != accounted:
            raise ReconciliationError(
                f"{self.table}: {self.rows_in} records in but {accounted} accounted for "
                f"(applied {self.rows_applied}, quarantined {self.rows_quarantined}, duplicates "
                f"{self.rows_duplicate}, superseded {self.rows_superseded}, ddl {self.ddl_lines})"
            )


@dataclass
class TableReport:
    table: str
    batches: list[BatchReport] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(int(getattr(b, name)) for b in self.batches)

    def metadata(self) -> dict[str, Any]:
        return {
            "batches": len(self.batches),
            "segments": self.total("segments"),
            "rows_in": self.total("rows_in"),
            "rows_applied": self.total("rows_applied"),
            "rows_quarantined": self.total("rows_quarantined"),
            "rows_duplicate": self.total("rows_duplicate"),
            "rows_superseded": self.total("rows_superseded"),
            "seconds": round(sum(b.seconds for b in self.batches), 3),
        }


def ensure_ods_table(store: DeltaStore, table: Table) -> None:
    if not store.exists(table.key):
        store.create_table(table.key, ods_arrow_schema(table), table.partition_by, table.description)


def committed_batch(store: DeltaStore, table: Table) -> tuple[int, dict[str, int]]:
    """The last batch number the ODS table committed and every stream's position after it (0 and none
    before the first batch). A journaled attempt the table did not commit counts for nothing; of the
    attempts of the committed batch, the last one is the one whose merge committed."""
    batch = store.app_versions(table.key, [position_app_id(table)])[position_app_id(table)]
    if batch == 0:
        return 0, {}
    rows, _ = store.read_rows(INGESTION_POSITIONS.key, [{"table": table.fqn, "batch": str(batch)}])
    if not rows.num_rows:
        raise RuntimeError(f"{table.fqn}: batch {batch} is committed but {INGESTION_POSITIONS.fqn} has no positions")
    last = pc.max(rows["attempt"]).as_py()
    rows = rows.filter(pc.equal(rows["attempt"], last))
    return batch, dict(zip(rows["stream"].to_pylist(), rows["seq"].to_pylist(), strict=True))


def committed_positions(store: DeltaStore, table: Table, streams: Sequence[str]) -> dict[str, int]:
    positions = committed_batch(store, table)[1]
    return {s: positions.get(s, 0) for s in streams}


def journal_positions(store: DeltaStore, table: Table, positions: dict[str, int]) -> tuple[str, int]:
    """Journal every stream's position after the next batch (the committed ones moved on by ``positions``);
    returns the app transaction the batch's commit must carry."""
    batch, committed = committed_batch(store, table)
    after = {**committed, **{s: max(seq, committed.get(s, 0)) for s, seq in positions.items()}}
    attempt = time.time_ns()
    rows = INGESTION_POSITIONS.rows(
        [
            {"table": table.fqn, "batch": str(batch + 1), "attempt": attempt, "stream": s, "seq": q}
            for s, q in sorted(after.items())
        ]
    )
    store.append(
        INGESTION_POSITIONS.key,
        rows,
        INGESTION_POSITIONS.partition_by,
        retention_hours=INGESTION_POSITIONS.retention_hours,
        operation=f"record {INGESTION_POSITIONS.fqn}",
    )
    return position_app_id(table), batch + 1


def pending_segments(
    store: DeltaStore, landing: Landing, table: Table, limit_per_stream: int | None = None
) -> list[Segment]:
    assert isinstance(table, OdsTable)
    streams = landing.streams(table.source_database, table.source_tables)
    positions = committed_positions(store, table, streams)
    pending: list[Segment] = []
    for stream in streams:
        segments = landing.segments(stream, positions[stream])
        pending.extend(segments[:limit_per_stream] if limit_per_stream else segments)
    return pending


# --- schema drift ------------------------------------------------------------------------------------------


def spark_type_of_mysql(mysql_type: str) -> str:
    """The Spark type an ODS column gets for a MySQL column type (as Canal's ``mysqlType`` spells it)."""
    t = mysql_type.lower().strip()
    base = t.split("(")[0].replace(" unsigned", "").strip()
    if base == "decimal" and "(" in t:
        return "decimal" + t[t.index("(") : t.index(")") + 1].replace(" ", "")
    return {
        "tinyint": "tinyint",
        "smallint": "smallint",
        "mediumint": "int",
        "int": "int",
        "integer": "int",
        "bigint": "bigint",
        "float": "double",
        "double": "double",
        "datetime": "timestamp",
        "timestamp": "timestamp",
        "date": "date",
        "bit": "boolean",
    }.get(base, "string")


def _columns_with_drift(
    spark: SparkSession, store: DeltaStore, table: Table, lines: pa.Table
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Catalog columns, plus columns the source added (already in the ODS table, or new in this batch).

    A column the source adds is kept, never dropped: it joins the ODS table (schema evolution by the
    merge), typed from its MySQL type. Returns (all columns, the ones new to the table); the new ones are
    candidates until :func:`_applied_columns` keeps those an applied record carries.
    """
    from pyspark.sql import functions as F

    declared = [name for name, _ in table.columns]
    known: dict[str, str] = {}
    existing = store.arrow_schema(table.key)
    if existing is not None:
        internal = {"_es", "_pos", "_stream", "_deleted", "dt", "hh", *table.partition_by}
        for f in existing:
            if f.name not in declared and f.name not in internal:
                known[f.name] = _spark_type_of_arrow(f.type)
    found: dict[str, str] = {}
    if lines.num_rows:
        # only DML messages of this table: a line quarantined as a whole must not change the schema
        parsed = (
            spark.createDataFrame(lines.select(["stream", "value"]))
            .toDF("_stream", "_value")
            .withColumn("_m", F.from_json("_value", CANAL_SCHEMA))
            .where(_line_reason(table).isNull())
        )
        pairs = parsed.select(F.explode("_m.mysqlType").alias("name", "type")).distinct().collect()
        for row in pairs:
            name = str(row["name"])
            if name not in declared and name not in known and not name.startswith("_"):
                found.setdefault(name, spark_type_of_mysql(str(row["type"])))
    extras = sorted({**known, **found}.items())
    return [*table.columns, *extras], sorted(found.items())


def _applied_columns(
    classified: DataFrame, columns: list[tuple[str, str]], new: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``columns`` and ``new`` without the new columns that no applied record's ``mysqlType`` names.

    Only applied records may evolve the schema: a message whose every row is quarantined must not."""
    from pyspark.sql import functions as F

    if not new:
        return columns, new
    names = {
        str(r["name"])
        for r in classified.where(F.col("_status") == "ok")
        .select(F.explode(F.from_json("_raw_text", "struct<mysqlType: map<string,string>>")["mysqlType"]))
        .select(F.col("key").alias("name"))
        .distinct()
        .collect()
    }
    dropped = {name for name, _ in new if name not in names}
    return [c for c in columns if c[0] not in dropped], [c for c in new if c[0] not in dropped]


def _spark_type_of_arrow(t: pa.DataType) -> str:
    name = spark_type(t)
    return "timestamp" if name.startswith("timestamp") else name


# --- the Spark preparation ---------------------------------------------------------------------------------


def _typed(raw: Column, spark_type: str) -> Column:
    from pyspark.sql import functions as F

    if spark_type == "timestamp":
        return F.try_to_timestamp(raw, F.lit("yyyy-MM-dd HH:mm:ss"))
    return raw.try_cast(spark_type)


def _line_reason(table: Table) -> Column:
    """Why a whole line cannot be applied (``__ddl__`` for DDL), null for a DML message of this table.

    Over the columns ``_value`` (the line) and ``_m`` (it parsed as a Canal message) and ``_stream``."""
    from pyspark.sql import functions as F

    assert isinstance(table, OdsTable)
    expected_tables = f"^(?:{table.source_tables})$"
    stream_table = F.substring_index("_stream", ".", -1)
    return (
        F.when(F.col("_value").isNull(), F.lit("invalid UTF-8"))
        .when(F.col("_m").isNull() | F.col("_m.type").isNull(), F.lit("malformed JSON"))
        .when(
            (F.col("_m.database") != F.lit(table.source_database)) | (F.col("_m.table") != stream_table),
            F.concat(
                F.lit("unexpected table "),
                F.coalesce(F.col("_m.database"), F.lit("?")),
                F.lit("."),
                F.coalesce(F.col("_m.table"), F.lit("?")),
                F.lit(" in stream "),
                F.col("_stream"),
            ),
        )
        .when(~F.col("_m.table").rlike(expected_tables), F.lit("table not part of this ODS table"))
        .when(F.col("_m.isDdl") | ~F.col("_m.type").isin(*DML), F.lit("__ddl__"))
        .when(F.col("_m.data").isNull() | (F.size("_m.data") == 0), F.lit("no row image in a DML message"))
    )


def prepare_batch(
    spark: SparkSession,
    table: Table,
    lines: pa.Table,
    columns: Sequence[tuple[str, str]] | None = None,
    seen: DataFrame | None = None,
) -> DataFrame:
    """Classify every record of the raw lines; returns one row per record with a ``status`` column.

    status ∈ ok | quarantine | duplicate | superseded | ddl; ``reason`` says why for quarantine.
    ``columns`` (name, Spark type) defaults to the catalog's; schema drift adds to it. ``seen``
    (``_stream``, ``_change``) holds changes taken in by earlier batches: a copy of one is a duplicate.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns = list(columns or table.columns)
    raw = spark.createDataFrame(lines).toDF(*[f"_{c}" for c in lines.column_names])
    msg = raw.withColumn("_m", F.from_json("_value", CANAL_SCHEMA))
    msg = msg.withColumn("_line_reason", _line_reason(table))
    line_level = msg.where(F.col("_line_reason").isNotNull()).select(
        "_stream",
        "_segment",
        "_seq",
        "_line",
        F.lit(-1).cast("long").alias("_row_index"),
        F.when(F.col("_line_reason") == "__ddl__", F.lit("ddl")).otherwise(F.lit("quarantine")).alias("_status"),
        F.when(F.col("_line_reason") == "__ddl__", F.lit(None)).otherwise(F.col("_line_reason")).alias("_reason"),
        F.coalesce(F.col("_value"), F.decode(F.col("_raw"), "ISO-8859-1")).alias("_raw_text"),
        *[F.lit(None).cast(ctype).alias(name) for name, ctype in columns],
        F.lit(None).cast("bigint").alias("_es"),
        F.lit(None).cast("bigint").alias("_pos"),
        F.lit(None).cast("string").alias("_op"),
        F.lit(None).cast("bigint").alias("_msg_id"),
        F.lit(None).cast("string").alias("_change"),
        F.lit(None).cast("array<timestamp>").alias("_moved_from"),
    )
    rows = msg.where(F.col("_line_reason").isNull()).select(
        "_stream",
        "_segment",
        "_seq",
        "_line",
        "_value",
        F.col("_m.id").alias("_msg_id"),
        F.col("_m.type").alias("_op"),
        F.col("_m.es").alias("_es"),
        F.col("_m.old").alias("_old"),
        F.col("_m.position").alias("_position"),
        F.posexplode("_m.data").alias("_row_index", "_r"),
    )
    typed = [_typed(F.col("_r")[name], ctype).alias(name) for name, ctype in columns]
    assert isinstance(table, OdsTable)
    # an UPDATE's ``old`` (parallel to ``data``) names the partition time the row had before, if it changed
    old_time = F.try_element_at(F.col("_old"), F.col("_row_index") + 1)[table.partition_time]
    rows = rows.select(
        "_stream",
        "_segment",
        "_seq",
        "_line",
        F.col("_row_index").cast("long").alias("_row_index"),
        "_value",
        "_msg_id",
        "_op",
        "_es",
        "_position",
        "_r",
        *typed,
        old_time.alias("_old_time_raw"),
        _typed(old_time, "timestamp").alias("_old_time"),
        (F.col("_seq") * POS_SEGMENT + F.col("_line") * POS_LINE + F.col("_row_index")).alias("_pos"),
    )
    problems: list[Column] = []
    for pk in table.primary_key:
        problems.append(F.when(F.col(pk).isNull(), F.lit(f"missing primary key {pk}")))
    problems.append(F.when(F.col("_es").isNull(), F.lit("missing binlog time es")))
    for name, _ctype in columns:
        bad = F.col("_r")[name].isNotNull() & F.col(name).isNull()
        problems.append(F.when(bad, F.concat(F.lit(f"bad value for {name}: "), F.col("_r")[name])))
    problems.append(
        F.when(F.col(table.partition_time).isNull(), F.lit(f"missing partition time {table.partition_time}"))
    )
    bad_old = F.col("_old_time_raw").isNotNull() & F.col("_old_time").isNull()  # the row's old partition unknown
    problems.append(F.when(bad_old, F.concat(F.lit(f"bad old value for {table.partition_time}: "), "_old_time_raw")))
    rows = rows.withColumn("_reason", F.concat_ws("; ", *problems))
    rows = rows.withColumn("_reason", F.when(F.col("_reason") == "", F.lit(None)).otherwise(F.col("_reason")))
    # a re-sent message (same content in the same stream) counts once, in this batch or after an earlier
    # one; then the newest change per key wins.
    # Content, not the message id: real Canal gives all messages of one Canal batch the same id. The binlog time
    # has whole seconds, so a row changed A→B→A→B within one second repeats its content: a source that writes the
    # change's binlog position (``position``, as ``warehouse capture`` does) tells such changes apart, and a
    # re-sent copy still carries the same position. Without it (null) the hash is the content's alone.
    change = F.sha2(
        F.concat_ws("|", F.col("_op"), F.col("_es").cast("string"), F.to_json(F.col("_r")), F.col("_position")), 256
    )
    rows = rows.withColumn("_change", change)
    if seen is not None:
        earlier = seen.select("_stream", "_change").distinct().withColumn("_seen", F.lit(True))
        rows = rows.join(earlier, ["_stream", "_change"], "left")
    else:
        rows = rows.withColumn("_seen", F.lit(None).cast("boolean"))
    first_copy = Window.partitionBy("_stream", "_change").orderBy("_seq", "_line", "_row_index")
    rows = rows.withColumn("_copy", F.row_number().over(first_copy))
    unique = (F.col("_copy") == 1) & F.col("_seen").isNull()
    valid = F.col("_reason").isNull() & unique
    newest = Window.partitionBy(valid.alias("valid"), *table.primary_key).orderBy(
        F.col("_es").desc(), F.col("_pos").desc()
    )
    rows = rows.withColumn("_rank", F.when(valid, F.row_number().over(newest)))
    # every partition time the key had in the batch (images and ``old``): the newest change leaves the others
    changes = Window.partitionBy(valid.alias("valid"), *table.primary_key)
    was_at = F.array_union(F.collect_set(table.partition_time).over(changes), F.collect_set("_old_time").over(changes))
    rows = rows.withColumn("_moved_from", F.when(valid, was_at))
    status = (
        F.when(F.col("_reason").isNotNull(), F.lit("quarantine"))
        .when(~unique, F.lit("duplicate"))
        .when(F.col("_rank") > 1, F.lit("superseded"))
        .otherwise(F.lit("ok"))
    )
    record_level = rows.select(
        "_stream",
        "_segment",
        "_seq",
        "_line",
        "_row_index",
        status.alias("_status"),
        "_reason",
        F.col("_value").alias("_raw_text"),
        *[name for name, _ in columns],
        "_es",
        "_pos",
        "_op",
        "_msg_id",
        "_change",
        "_moved_from",
    )
    return line_level.unionByName(record_level)


# --- applying a batch -------------------------------------------------------------------------------------


def _local_hour(epoch_hour: int, tz: str) -> str:
    """The key of a binlog hour in the ops tables and the source counts: local "YYYY-MM-DDTHH"."""
    return datetime.fromtimestamp(epoch_hour * 3600, ZoneInfo(tz)).strftime("%Y-%m-%dT%H")


def _binlog_hours(spark: SparkSession, lines: pa.Table, tz: str) -> list[str]:
    """The local hours of the binlog times in the lines: where their earlier copies can be recorded."""
    from pyspark.sql import functions as F

    found = (
        spark.createDataFrame(lines.select(["value"]))
        .select(F.floor(F.from_json("value", "struct<es: bigint>")["es"] / HOUR_MS).alias("h"))
        .where(F.col("h").isNotNull())
        .distinct()
        .collect()
    )
    return sorted({_local_hour(int(r["h"]), tz) for r in found})


def _recorded_changes(
    spark: SparkSession, store: DeltaStore, table: Table, hours: Sequence[str], committed: dict[str, int]
) -> DataFrame | None:
    """The changes of ``hours`` taken in by committed batches (``_stream``, ``_change``), None if none.

    Only those from segments up to a stream's committed position: a batch that crashed before its merge
    had recorded its changes already, and its re-run must apply them, not take them for duplicates."""
    if not hours or not committed:
        return None
    recorded, _ = store.read_rows(
        CHANGES_KEY, [{"table": table.fqn, "hour": h} for h in hours], columns=["stream", "change", "seq"]
    )
    if not recorded.num_rows:
        return None
    keep = pa.array([False] * recorded.num_rows, pa.bool_())
    for stream, position in committed.items():
        mine = pc.and_(pc.equal(recorded["stream"], stream), pc.less_equal(recorded["seq"], position))
        keep = pc.or_(keep, mine)
    recorded = recorded.filter(keep)
    if not recorded.num_rows:
        return None
    return spark.createDataFrame(recorded.select(["stream", "change"])).toDF("_stream", "_change")


def _ingested_changes(classified: DataFrame, table: Table, tz: str) -> pa.Table:
    """The distinct changes taken in (applied, or collapsed into a newer change of the same key), in the
    shape of ``ops.ingested_changes``."""
    from pyspark.sql import functions as F

    taken = (
        classified.where(F.col("_status").isin("ok", "superseded"))
        .select(
            F.col("_stream").alias("stream"),
            F.floor(F.col("_es") / HOUR_MS).alias("h"),
            F.col("_change").alias("change"),
            F.col("_seq").alias("seq"),
        )
        .toArrow()
    )
    epoch_hours = pc.unique(taken["h"])
    keys = pa.array([_local_hour(int(h), tz) for h in epoch_hours.to_pylist()], pa.string())
    hour = pc.take(keys, pc.index_in(taken["h"], value_set=epoch_hours))
    out = pa.table(
        {
            "table": pa.array([table.fqn] * taken.num_rows, pa.string()),
            "stream": taken["stream"],
            "hour": hour,
            "change": taken["change"],
            "seq": taken["seq"],
        }
    )
    return out.cast(CHANGES_SCHEMA)


def _by_hour(changes: pa.Table) -> dict[tuple[str, str], int]:
    """Changes per (stream, local hour)."""
    grouped = changes.group_by(["stream", "hour"]).aggregate([("change", "count")]).to_pylist()
    return {(str(g["stream"]), str(g["hour"])): int(g["change_count"]) for g in grouped}


def _partition_values(table: Table) -> list[Column]:
    """An ODS row's partition (``dt``, ``hh``): the local date and hour of its partition time."""
    from pyspark.sql import functions as F

    assert isinstance(table, OdsTable)
    return [
        F.date_format(table.partition_time, "yyyy-MM-dd").alias("dt"),
        F.date_format(table.partition_time, "HH").alias("hh"),
    ]


def _moved_out(table: Table, ok: DataFrame) -> DataFrame:
    """Per applied change, one row for each other partition its key was in during the batch (or just before
    it, by ``old``): the merge retires the key there, so it stays live in one partition (see DeltaStore.merge).
    The row carries the old partition time and the newest change's order values."""
    from pyspark.sql import functions as F

    assert isinstance(table, OdsTable)
    left = ok.withColumnsRenamed({"dt": "_to_dt", "hh": "_to_hh"}).withColumn(
        table.partition_time, F.explode("_moved_from")
    )
    left = left.select("*", *_partition_values(table))
    left = left.where((F.col("dt") != F.col("_to_dt")) | (F.col("hh") != F.col("_to_hh")))
    return left.dropDuplicates([*table.primary_key, "dt", "hh"]).drop("_to_dt", "_to_hh", "_moved_from")


def ingest_batch(
    spark: SparkSession,
    store: DeltaStore,
    table: Table,
    segments: Sequence[Segment],
    *,
    prune: bool = True,
    tz: str | None = None,
) -> BatchReport:
    """``tz``: the local time of the ODS partitions and source counts (default: the business timezone)."""
    from pyspark.sql import functions as F

    tz = tz or periods().timezone
    started = time.monotonic()
    report = BatchReport(table=table.fqn, segments=len(segments))
    ensure_ods_table(store, table)
    positions: dict[str, int] = {}
    for segment in segments:
        positions[segment.stream] = max(positions.get(segment.stream, 0), segment.seq)
    report.positions = positions
    lines = read_lines(segments)
    columns, new_columns = _columns_with_drift(spark, store, table, lines)
    applied: pa.Table | None = None
    moved_out: pa.Table | None = None
    quarantined = pa.Table.from_pylist([], schema=QUARANTINE_SCHEMA)
    changes = CHANGES_SCHEMA.empty_table()
    if lines.num_rows:
        committed = committed_positions(store, table, list(positions))
        seen = _recorded_changes(spark, store, table, _binlog_hours(spark, lines, tz), committed)
        classified = prepare_batch(spark, table, lines, columns, seen).persist()
        try:
            columns, new_columns = _applied_columns(classified, columns, new_columns)
            counts = {
                r["_status"]: int(r["n"]) for r in classified.groupBy("_status").agg(F.count("*").alias("n")).collect()
            }
            report.rows_in = sum(counts.values())
            report.rows_duplicate = counts.get("duplicate", 0)
            report.rows_superseded = counts.get("superseded", 0)
            report.ddl_lines = counts.get("ddl", 0)
            # "ingested" = distinct DML row changes taken into the table (applied, or collapsed into a newer
            # change of the same key), by the local hour of their binlog time — what the source counts
            changes = _ingested_changes(classified, table, tz)
            report.ingested = _by_hour(changes)
            assert isinstance(table, OdsTable)
            ok = classified.where(F.col("_status") == "ok").select(
                *[name for name, _ in columns],
                "_es",
                "_pos",
                "_stream",
                (F.col("_op") == "DELETE").alias("_deleted"),
                *_partition_values(table),
                "_op",
                "_moved_from",
            )
            applied = ok.drop("_moved_from").toArrow()
            moved_out = _moved_out(table, ok).toArrow()
            quarantined = (
                classified.where(F.col("_status") == "quarantine")
                .select(
                    F.lit(table.fqn).alias("table"),
                    F.col("_stream").alias("stream"),
                    F.col("_segment").alias("segment"),
                    F.col("_line").alias("line"),
                    F.col("_row_index").alias("row_index"),
                    F.col("_reason").alias("reason"),
                    F.col("_raw_text").alias("raw"),
                )
                .toArrow()
            )
        finally:
            classified.unpersist()
    report.new_columns = [name for name, _ in new_columns]
    schema = ods_arrow_schema(table, extra=[c for c in columns if c not in table.columns])
    if applied is None:
        applied = pa.Table.from_pylist([], schema=schema)
    report.prepare_seconds = time.monotonic() - started
    report.rows_applied = applied.num_rows
    report.rows_quarantined = quarantined.num_rows
    report.check()
    if quarantined.num_rows:
        _write_quarantine(store, table, quarantined, segments)
    _write_changes(store, table, changes, positions)
    _write_counts(store, table, changes, positions)
    txn = journal_positions(store, table, positions)
    if applied.num_rows:
        target = pa.schema([*schema, pa.field("_op", pa.string())])
        batch = applied.select(target.names).cast(target)
        report.merge = store.merge(
            spark,
            table.key,
            batch,
            primary_key=table.primary_key,
            partition_by=table.partition_by,
            app_transaction=txn,
            prune=prune,
            tombstone_column="_deleted",
            merge_schema=bool(new_columns),
            moved_out=moved_out.select(target.names).cast(target) if moved_out is not None else None,
        )
    else:
        store.commit_app_transactions(table.key, dict([txn]))
    report.seconds = time.monotonic() - started
    return report


def _write_quarantine(store: DeltaStore, table: Table, rows: pa.Table, segments: Sequence[Segment]) -> None:
    """Append quarantined records once: the commit records, per stream, the last segment quarantined."""
    streams = sorted({s.stream for s in segments})
    versions = store.app_versions(QUARANTINE_KEY, [quarantine_app_id(table, s) for s in streams])
    done = {s: versions[quarantine_app_id(table, s)] for s in streams}
    seq_of = {s.name: s.seq for s in segments}
    keep = [
        done.get(stream, 0) < seq_of[segment]
        for stream, segment in zip(rows.column("stream").to_pylist(), rows.column("segment").to_pylist(), strict=True)
    ]
    rows = rows.filter(pa.array(keep))
    if not rows.num_rows:
        return
    last: dict[str, int] = {}
    for s in segments:
        last[s.stream] = max(last.get(s.stream, 0), s.seq)
    _append(store, QUARANTINE, rows, {quarantine_app_id(table, s): v for s, v in last.items()})


def _append(store: DeltaStore, ops: OpsTable, rows: pa.Table, app_transactions: dict[str, int]) -> None:
    store.append(
        ops.key,
        rows.cast(ops.schema),
        ops.partition_by,
        app_transactions=app_transactions,
        retention_hours=ops.retention_hours,
        operation=f"record {ops.fqn}",
    )


def _not_yet_recorded(
    store: DeltaStore, key: Sequence[str], app_id: Callable[[str], str], changes: pa.Table, positions: dict[str, int]
) -> tuple[pa.Table, dict[str, int]]:
    """The changes an ops table does not hold yet, and the streams whose recorded position moves on.

    Written before the merge, so a crash in between re-runs the batch: its changes up to the position
    recorded then are skipped, those of segments that arrived since (a longer re-run) are not."""
    versions = store.app_versions(key, [app_id(s) for s in positions])
    done = {s: versions[app_id(s)] for s in positions}
    fresh = {s: seq for s, seq in positions.items() if done.get(s, 0) < seq}
    keep = pa.array([False] * changes.num_rows, pa.bool_())
    for stream in fresh:
        mine = pc.and_(pc.equal(changes["stream"], stream), pc.greater(changes["seq"], done.get(stream, 0)))
        keep = pc.or_(keep, mine)
    return changes.filter(keep), fresh


def _write_changes(store: DeltaStore, table: Table, changes: pa.Table, positions: dict[str, int]) -> None:
    """Record the batch's changes once (app transactions per stream, like the quarantine)."""
    rows, fresh = _not_yet_recorded(store, CHANGES_KEY, lambda s: changes_app_id(table, s), changes, positions)
    if not fresh:
        return
    _append(store, INGESTED_CHANGES, rows, {changes_app_id(table, s): v for s, v in fresh.items()})


def _write_counts(store: DeltaStore, table: Table, changes: pa.Table, positions: dict[str, int]) -> None:
    """Append the batch's per-hour ingested rows once (app transactions per stream, like the quarantine)."""
    rows, fresh = _not_yet_recorded(store, COUNTS_KEY, lambda s: counts_app_id(table, s), changes, positions)
    if not fresh:
        return
    entries: list[dict[str, object]] = [
        {"table": table.fqn, "stream": stream, "hour": hour, "rows": n, "seq_to": positions[stream], "date": hour[:10]}
        for (stream, hour), n in sorted(_by_hour(rows).items())
    ]
    _append(
        store, INGESTED_COUNTS, INGESTED_COUNTS.rows(entries), {counts_app_id(table, s): v for s, v in fresh.items()}
    )


@dataclass
class IngestedCounts:
    """Rows ingested per stream and local hour, and how far (segment position) each stream's counts go."""

    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    seq: dict[str, int] = field(default_factory=dict)
    read: ReadStats = field(default_factory=ReadStats)  # the ops.ingested_counts files read for them

    def hours_counted_after(self, seen: dict[str, int], entries: list[dict[str, Any]]) -> set[str]:
        return {e["hour"] for e in entries if e["seq_to"] > seen.get(e["stream"], 0)}


def ingested_counts(
    store: DeltaStore, table: Table, dates: Sequence[str] | None = None
) -> tuple[IngestedCounts, list[dict[str, Any]]]:
    """The ingested rows of one ODS table, summed per (stream, hour), and the raw entries.

    ``dates`` (local "YYYY-MM-DD") limits the read to those partitions; without, the table's whole history."""
    partitions = [{"table": table.fqn}] if dates is None else [{"table": table.fqn, "date": d} for d in dates]
    found, read = store.read_rows(COUNTS_KEY, partitions)
    result = IngestedCounts(read=read)
    entries = found.to_pylist()
    for e in entries:
        per = result.rows.setdefault(e["stream"], {})
        per[e["hour"]] = per.get(e["hour"], 0) + int(e["rows"])
        result.seq[e["stream"]] = max(result.seq.get(e["stream"], 0), int(e["seq_to"]))
    return result, entries


def ingest_table(
    spark: SparkSession,
    store: DeltaStore,
    landing: Landing,
    table: Table,
    *,
    max_segments_per_stream: int = 288,
    progress: Callable[[BatchReport], None] | None = None,
) -> TableReport:
    """Apply every pending segment of one ODS table, in batches of at most a day of segments per shard."""
    report = TableReport(table.fqn)
    while True:
        segments = pending_segments(store, landing, table, max_segments_per_stream)
        if not segments:
            return report
        batch = ingest_batch(spark, store, table, segments, tz=landing.timezone)
        positions = committed_positions(store, table, list(batch.positions))
        behind = {s: p for s, p in positions.items() if p < batch.positions[s]}
        if behind:  # never loop on a batch whose position did not stick
            raise RuntimeError(f"{table.fqn}: positions not recorded after a batch: {behind} < {batch.positions}")
        report.batches.append(batch)
        if progress:
            progress(batch)
