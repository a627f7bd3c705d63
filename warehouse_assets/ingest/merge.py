"""ODS ingestion: Canal binlog segments → ODS Delta tables through Spark's ``MERGE INTO``, pruned to the
partitions a batch touches.

For one ODS table, each batch:

1. takes the next segments of every shard stream after the position committed with the table (the batch
   number its last merge committed as Delta app transaction ``ingest:<table>``, whose per-stream positions
   ``ops.ingestion_positions`` journals), never past a gap;
2. the batch is prepared (``warehouse_assets/ingest/preparation.py``: in the run's process up to
   ``IN_PROCESS_MAX_BYTES`` of lines, on Spark above): the Canal JSON is parsed, the row images typed by the
   catalog's columns and validated, re-sent changes dropped (same content: in this batch, or recorded in
   ``ops.ingested_changes`` by an earlier one) and the newest change per primary key kept (binlog time, then
   binlog position);
3. rows that cannot be applied go to the ``ops.quarantine`` Delta table with the reason and their source
   position (segment, line);
4. the content hash of every change taken in goes to ``ops.ingested_changes`` (by stream and local binlog
   hour), and the rows ingested per shard stream and binlog hour to the ``ops.ingested_counts`` Delta
   table (what completeness readiness compares with the source's own counts, see :func:`ingested_counts`);
5. the batch's positions are journaled under a batch number no attempt used before, then Spark's Delta ``MERGE INTO``
   merges the batch into the partitions it touches, and the same commit records that batch number (Delta's
   idempotent writes) — so the position never runs ahead of committed data and a restart neither skips nor
   re-applies anything. A change that moved a key's partition time (Canal's ``old``) also retires the
   key in the partitions it left, as a tombstone: one key is live in one partition. An UPDATE whose ``old``
   does not say where the row was (``old`` null, or without the partition time, as ``binlog_row_image=MINIMAL``
   or a producer other than Canal gives) is looked up by key before the merge, for those keys only: first in
   the partitions the batch touches, then in the whole table for the keys not found there.

Every batch checks ``in = applied + quarantined + duplicates + superseded + ddl``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from resources.column_types import (
    UTC_MICROS,
    arrow_type,
    normalize_arrow_schema,
    spark_type_of_arrow,
    spark_type_of_mysql,
)
from resources.delta_lake import DeltaStore, MergeResult, ReadStats, batch_partitions
from resources.landing import Landing, Segment, read_lines
from warehouse_assets.catalog import ODS_CHANGE_COLUMNS, OdsTable, Table, periods
from warehouse_assets.ingest.ops_tables import (
    INGESTED_CHANGES,
    INGESTED_COUNTS,
    INGESTION_POSITIONS,
    QUARANTINE,
    OpsTable,
)
from warehouse_assets.ingest.preparation import (
    HOUR_MS,
    WINDOW_MS,
    Engine,
    classified_schema,
    local_hour,
    local_window,
    preparation,
)

# PySpark is imported inside the functions that compute: readiness and `warehouse why` read the ingestion state
# (positions, counts) through this module without loading it.
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

QUARANTINE_KEY = QUARANTINE.key
COUNTS_KEY = INGESTED_COUNTS.key
CHANGES_KEY = INGESTED_CHANGES.key
QUARANTINE_SCHEMA = QUARANTINE.schema
CHANGES_SCHEMA = INGESTED_CHANGES.schema


class ReconciliationError(RuntimeError):
    """Counts of an ingestion batch do not add up: something would have been lost."""


def position_app_id(table: Table) -> str:
    """The app transaction an ODS table's merges commit: its batch number (see :data:`INGESTION_POSITIONS`)."""
    return f"ingest:{table.fqn}"


def quarantine_app_id(table: Table, stream: str) -> str:
    return f"quarantine:{table.fqn}:{stream}"


def ods_arrow_schema(table: Table, extra: Sequence[tuple[str, str]] = ()) -> pa.Schema:
    fields = [pa.field(name, arrow_type(ctype)) for name, ctype in [*table.columns, *extra, *ODS_CHANGE_COLUMNS]]
    fields += [pa.field("dt", pa.string()), pa.field("hh", pa.string())]
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

    @property
    def partitions_changed(self) -> list[dict[str, str]]:
        """The partitions the batch's merge wrote to: those of its rows (inserted, updated, deleted), and those its
        moved keys left. Known from the batch itself, no scan."""
        return self.merge.partitions if self.merge is not None else []

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


def ensure_ods_table(store: DeltaStore, table: Table, spark: SparkSession) -> None:
    """The ODS table, created on first use with deletion vectors: a merge marks the rows it replaces or deletes
    instead of rewriting every file holding one."""
    if not store.exists(table.key):
        store.create_merged_table(spark, table.key, ods_arrow_schema(table), table.partition_by, table.description)


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


def _last_journaled_batch(store: DeltaStore, table: Table) -> int:
    """The highest batch number any attempt journaled for the table, committed or not (from the Delta log)."""
    if not store.exists(INGESTION_POSITIONS.key):
        return 0
    files, _ = store.live_files(INGESTION_POSITIONS.key, [{"table": table.fqn}], deletions=False)
    return max((int(f["partition.batch"]) for f in files), default=0)


def journal_positions(store: DeltaStore, table: Table, positions: dict[str, int]) -> tuple[str, int]:
    """Journal every stream's position after the next batch (the committed ones moved on by ``positions``);
    returns the app transaction the batch's commit must carry.

    Each attempt takes a batch number no earlier attempt journaled. A killed run's merge may go on in Spark
    (the Connect server outlives its client) and commit while the retry prepares: sharing its number, the
    retry's merge would be skipped as already applied while its own, longer, positions were taken as
    committed. With a higher number, the retry's merge applies its batch (re-applying a change is a no-op:
    the newest change of a key wins) and Delta's conflict check refuses the older one once it committed."""
    batch, committed = committed_batch(store, table)
    after = {**committed, **{s: max(seq, committed.get(s, 0)) for s, seq in positions.items()}}
    attempt = time.time_ns()
    number = max(batch, _last_journaled_batch(store, table)) + 1
    rows = INGESTION_POSITIONS.rows(
        [
            {"table": table.fqn, "batch": str(number), "attempt": attempt, "stream": s, "seq": q}
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
    return position_app_id(table), number


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


def _columns_with_drift(
    store: DeltaStore, table: Table, source_types: Sequence[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Catalog columns, plus columns the source added (already in the ODS table, or new in this batch).

    A column the source adds is kept, never dropped: it joins the ODS table (schema evolution by the
    merge), typed from its MySQL type. ``source_types``: the (column, MySQL type) pairs the batch's DML messages
    of this table name. Returns (all columns, the ones new to the table); the new ones are candidates until
    :func:`_applied_columns` keeps those an applied record carries.
    """
    declared = [name for name, _ in table.columns]
    known: dict[str, str] = {}
    existing = store.arrow_schema(table.key)
    if existing is not None:
        internal = {*(name for name, _ in ODS_CHANGE_COLUMNS), "dt", "hh", *table.partition_by}
        for f in existing:
            if f.name not in declared and f.name not in internal:
                known[f.name] = spark_type_of_arrow(f.type)
    found: dict[str, str] = {}
    for name, mysql_type in source_types:
        if name not in declared and name not in known and not name.startswith("_"):
            found.setdefault(name, spark_type_of_mysql(mysql_type))
    extras = sorted({**known, **found}.items())
    return [*table.columns, *extras], sorted(found.items())


def _applied_columns(
    applied_source_columns: set[str], columns: list[tuple[str, str]], new: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``columns`` and ``new`` without the new columns that no applied record's ``mysqlType`` names.

    Only applied records may evolve the schema: a message whose every row is quarantined must not."""
    dropped = {name for name, _ in new if name not in applied_source_columns}
    return [c for c in columns if c[0] not in dropped], [c for c in new if c[0] not in dropped]


# --- applying a batch -------------------------------------------------------------------------------------


def _recorded_changes(
    store: DeltaStore, table: Table, hours: Sequence[str], committed: dict[str, int]
) -> pa.Table | None:
    """The changes of ``hours`` taken in by committed batches (``stream``, ``change``), None if none.

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
    return recorded.select(["stream", "change"]) if recorded.num_rows else None


def _ingested_changes(records: pa.Table, table: Table, tz: str) -> pa.Table:
    """The distinct changes taken in (applied, or collapsed into a newer change of the same key), in the
    shape of ``ops.ingested_changes`` plus each change's local binlog ``window`` (what the source counts by)."""
    taken = records.filter(pc.is_in(records["_status"], pa.array(["ok", "superseded"])))
    # the binlog hour, floored (Spark's floor(es / 1 h)): the local hour key of its earlier copies
    hour = _local_keys(taken["_es"], HOUR_MS, lambda h: local_hour(h, tz))
    window = _local_keys(taken["_es"], WINDOW_MS, lambda w: local_window(w, tz))
    out = pa.table(
        {
            "table": pa.array([table.fqn] * taken.num_rows, pa.string()),
            "stream": taken["_stream"],
            "hour": hour,
            "change": taken["_change"],
            "seq": taken["_seq"],
        }
    )
    return out.cast(CHANGES_SCHEMA).append_column("window", window)


def _local_keys(es: pa.ChunkedArray, unit_ms: int, key: Callable[[int], str]) -> pa.Array:
    """The key of each binlog time's unit (``es`` floored to ``unit_ms``), each distinct unit keyed once."""
    epoch = pc.floor(pc.divide(es.cast(pa.float64()), float(unit_ms))).cast(pa.int64())
    distinct = pc.unique(epoch)
    keys = pa.array([key(int(u)) for u in distinct.to_pylist()], pa.string())
    return pc.take(keys, pc.index_in(epoch, value_set=distinct))


def _by_hour(changes: pa.Table) -> dict[tuple[str, str], int]:
    """Changes per (stream, local hour)."""
    grouped = changes.group_by(["stream", "hour"]).aggregate([("change", "count")]).to_pylist()
    return {(str(g["stream"]), str(g["hour"])): int(g["change_count"]) for g in grouped}


def _by_window(changes: pa.Table) -> dict[tuple[str, str], int]:
    """Changes per (stream, local window)."""
    grouped = changes.group_by(["stream", "window"]).aggregate([("change", "count")]).to_pylist()
    return {(str(g["stream"]), str(g["window"])): int(g["change_count"]) for g in grouped}


def _partition_values(times: pa.Array | pa.ChunkedArray, tz: str) -> tuple[pa.Array, pa.Array]:
    """An ODS row's partition (``dt``, ``hh``): the local date and hour of its partition time."""
    local = pc.local_timestamp(times.cast(pa.timestamp("us", tz=tz)))
    return local.cast(pa.date32()).cast(pa.string()), pc.utf8_lpad(pc.hour(local).cast(pa.string()), 2, "0")


def _applied(records: pa.Table, table: Table, columns: Sequence[tuple[str, str]], tz: str) -> tuple[pa.Table, pa.Table]:
    """The applied records as ODS rows (plus ``_op``), and the rows retiring keys from partitions they left.

    Per applied change, one row for each other partition its key was in during the batch (or just before
    it, by ``old``): the merge retires the key there, so it stays live in one partition (see DeltaStore.merge).
    The row carries the old partition time and the newest change's order values."""
    assert isinstance(table, OdsTable)
    ok = records.filter(pc.equal(records["_status"], "ok"))
    dt, hh = _partition_values(ok[table.partition_time], tz)
    names = [name for name, _ in columns]
    applied = pa.table(
        {
            **{name: ok[name] for name in names},
            "_es": ok["_es"],
            "_pos": ok["_pos"],
            "_stream": ok["_stream"],
            "_deleted": pc.equal(ok["_op"], "DELETE"),
            "dt": dt,
            "hh": hh,
            "_op": ok["_op"],
        }
    )
    moved_from = ok["_moved_from"].combine_chunks() if ok.num_rows else pa.array([], pa.list_(UTC_MICROS))
    parents = pc.list_parent_indices(moved_from)
    left = applied.take(parents)
    times = pc.list_flatten(moved_from)
    left_dt, left_hh = _partition_values(times, tz)
    elsewhere = pc.or_(pc.not_equal(left_dt, left["dt"]), pc.not_equal(left_hh, left["hh"]))
    left = left.set_column(left.schema.get_field_index(table.partition_time), table.partition_time, times)
    left = left.set_column(left.schema.get_field_index("dt"), "dt", left_dt)
    left = left.set_column(left.schema.get_field_index("hh"), "hh", left_hh).filter(elsewhere)
    # one row per key and partition it left (the earliest of its times there)
    left = left.sort_by([(table.partition_time, "ascending")])
    key_rows = zip(*(left[c].to_pylist() for c in [*table.row_key, "dt", "hh"]), strict=True)
    firsts: dict[tuple[Any, ...], int] = {}
    for i, key in enumerate(key_rows):
        firsts.setdefault(key, i)
    return applied, left.take(pa.array(sorted(firsts.values()), pa.int64()))


def _quarantined(records: pa.Table, table: Table) -> pa.Table:
    rows = records.filter(pc.equal(records["_status"], "quarantine"))
    return pa.table(
        {
            "table": pa.array([table.fqn] * rows.num_rows, pa.string()),
            "stream": rows["_stream"],
            "segment": rows["_segment"],
            "line": rows["_line"],
            "row_index": rows["_row_index"],
            "reason": rows["_reason"],
            "raw": rows["_raw_text"],
        }
    ).cast(QUARANTINE_SCHEMA)


@dataclass
class PreparedBatch:
    """A batch ready to apply: what ``ingest_batch`` records and merges, with its counts."""

    applied: pa.Table  # one row per key: the ODS row plus ``_op``
    moved_out: pa.Table  # per moved key, each partition it left (same columns)
    unplaced: pa.Table  # the applied rows of keys whose partition before the batch is unknown (same columns)
    quarantined: pa.Table  # in the shape of ops.quarantine
    changes: pa.Table  # in the shape of ops.ingested_changes
    counts: dict[str, int]  # records per status
    columns: list[tuple[str, str]]  # the catalog's, plus the source's added columns
    new_columns: list[tuple[str, str]]  # the added columns the ODS table does not have yet
    engine: str = "in-process"


def prepare_changes(
    spark: SparkSession | None,
    store: DeltaStore,
    table: Table,
    lines: pa.Table,
    streams: Sequence[str],
    *,
    tz: str,
    engine: Engine = "auto",
    against_earlier: bool = True,
) -> PreparedBatch:
    """Parse, validate, type, dedupe and classify a batch's lines (see ``warehouse_assets/ingest/preparation.py``),
    against the changes earlier batches of ``streams`` took in (``against_earlier=False``: as if none had, for a
    re-ingest of the whole history); ``tz``: the local time of partitions, hours and the Canal row images' datetimes."""
    prep = preparation(spark, table, lines, tz, engine)
    columns, new_columns = _columns_with_drift(store, table, prep.source_types() if lines.num_rows else [])
    if not lines.num_rows:
        empty = classified_schema(columns).empty_table()
        return PreparedBatch(
            applied=pa.Table.from_pylist([], schema=_applied_schema(table, columns)),
            moved_out=pa.Table.from_pylist([], schema=_applied_schema(table, columns)),
            unplaced=pa.Table.from_pylist([], schema=_applied_schema(table, columns)),
            quarantined=QUARANTINE_SCHEMA.empty_table(),
            changes=_ingested_changes(empty, table, tz),
            counts={},
            columns=columns,
            new_columns=new_columns,
        )
    committed = committed_positions(store, table, list(streams))
    hours = sorted({local_hour(h, tz) for h in prep.binlog_hours()})
    earlier = _recorded_changes(store, table, hours, committed) if against_earlier else None
    classified = prep.classify(columns, earlier)
    columns, new_columns = _applied_columns(classified.applied_source_columns, columns, new_columns)
    records = classified.records
    counts = {str(k): int(v) for k, v in zip(*pc.value_counts(records["_status"]).flatten(), strict=True)}
    applied, moved_out = _applied(records, table, columns, tz)
    ok = records.filter(pc.equal(records["_status"], "ok"))
    unplaced = applied.filter(pc.fill_null(ok["_unplaced"], False)) if ok.num_rows else applied
    target = _applied_schema(table, columns)
    return PreparedBatch(
        applied=applied.select(target.names).cast(target),
        moved_out=moved_out.select(target.names).cast(target),
        unplaced=unplaced.select(target.names).cast(target),
        quarantined=_quarantined(records, table),
        # "ingested" = distinct DML row changes taken into the table (applied, or collapsed into a newer
        # change of the same key), by the local hour of their binlog time — what the source counts
        changes=_ingested_changes(records, table, tz),
        counts=counts,
        columns=columns,
        new_columns=new_columns,
        engine=type(prep).__name__,
    )


def _applied_schema(table: Table, columns: Sequence[tuple[str, str]]) -> pa.Schema:
    schema = ods_arrow_schema(table, extra=[c for c in columns if c not in table.columns])
    return pa.schema([*schema, pa.field("_op", pa.string())])


def record_batch(
    store: DeltaStore, table: Table, prepared: PreparedBatch, segments: Sequence[Segment], positions: dict[str, int]
) -> tuple[str, int]:
    """Record the batch before its merge: quarantine, changes taken in, ingested counts (each once), and the
    positions journaled under the next batch number; returns the app transaction the merge must commit."""
    if prepared.quarantined.num_rows:
        _write_quarantine(store, table, prepared.quarantined, segments)
    _write_changes(store, table, prepared.changes, positions)
    _write_counts(store, table, prepared.changes, positions)
    return journal_positions(store, table, positions)


def ingest_batch(
    spark: SparkSession,
    store: DeltaStore,
    table: Table,
    segments: Sequence[Segment],
    *,
    prune: bool = True,
    tz: str | None = None,
    engine: Engine = "auto",
) -> BatchReport:
    """``tz``: the local time of the ODS partitions and source counts (default: the business timezone);
    ``engine``: where the batch is prepared (default: in process up to ``IN_PROCESS_MAX_BYTES`` of lines)."""
    tz = tz or periods().timezone
    started = time.monotonic()
    report = BatchReport(table=table.fqn, segments=len(segments))
    ensure_ods_table(store, table, spark)
    positions: dict[str, int] = {}
    for segment in segments:
        positions[segment.stream] = max(positions.get(segment.stream, 0), segment.seq)
    report.positions = positions
    lines = read_lines(segments)
    prepared = prepare_changes(spark, store, table, lines, list(positions), tz=tz, engine=engine)
    report.rows_in = sum(prepared.counts.values())
    report.rows_duplicate = prepared.counts.get("duplicate", 0)
    report.rows_superseded = prepared.counts.get("superseded", 0)
    report.ddl_lines = prepared.counts.get("ddl", 0)
    report.ingested = _by_hour(prepared.changes)
    report.new_columns = [name for name, _ in prepared.new_columns]
    report.prepare_seconds = time.monotonic() - started
    report.rows_applied = prepared.applied.num_rows
    report.rows_quarantined = prepared.quarantined.num_rows
    report.check()
    moved_out = _with_located_moves(spark, store, table, prepared)
    txn = record_batch(store, table, prepared, segments, positions)
    if prepared.applied.num_rows:
        report.merge = store.merge(
            spark,
            table.key,
            prepared.applied,
            primary_key=table.row_key,
            partition_by=table.partition_by,
            app_transaction=txn,
            prune=prune,
            tombstone_column="_deleted",
            merge_schema=bool(prepared.new_columns),
            moved_out=moved_out,
        )
    else:
        store.commit_app_transactions(table.key, dict([txn]))
    report.seconds = time.monotonic() - started
    return report


def _with_located_moves(spark: SparkSession, store: DeltaStore, table: Table, prepared: PreparedBatch) -> pa.Table:
    """The batch's moved-out rows, plus one per partition where a key whose change did not say where it was is
    live now, other than its new one. Looked up by key for those keys only: first in the partitions the batch
    touches (where an ordinary update finds its row), then in the whole table for the keys not found there."""
    assert isinstance(table, OdsTable)
    unplaced = prepared.unplaced
    if not unplaced.num_rows:
        return prepared.moved_out
    pk, parts = list(table.primary_key), list(table.partition_by)
    where = [table.partition_time, *parts]
    near = store.live_rows_of_keys(
        spark,
        table.key,
        unplaced.select(pk),
        where,
        partitions=batch_partitions(prepared.applied, parts),
        tombstone_column="_deleted",
    )
    found_near = set(zip(*(near[c].to_pylist() for c in pk), strict=True))
    keys = list(zip(*(unplaced[c].to_pylist() for c in pk), strict=True))
    farther = unplaced.filter(pa.array([k not in found_near for k in keys], pa.bool_())).select(pk)
    far = store.live_rows_of_keys(spark, table.key, farther, where, tombstone_column="_deleted")
    found = [*near.to_pylist(), *far.to_pylist()]
    if not found:
        return prepared.moved_out
    row_of = {key: i for i, key in enumerate(keys)}
    new_place = list(zip(*(unplaced[c].to_pylist() for c in parts), strict=True))
    already = set(zip(*(prepared.moved_out[c].to_pylist() for c in [*pk, *parts]), strict=True))
    take: list[int] = []
    times: list[Any] = []
    places: dict[str, list[Any]] = {c: [] for c in parts}
    for live in found:
        key = tuple(live[c] for c in pk)
        place = tuple(live[c] for c in parts)
        i = row_of[key]
        if place == new_place[i] or (*key, *place) in already:
            continue
        already.add((*key, *place))
        take.append(i)
        times.append(live[table.partition_time])
        for c in parts:
            places[c].append(live[c])
    if not take:
        return prepared.moved_out
    left = unplaced.take(pa.array(take, pa.int64()))
    schema = left.schema
    for name, values in [(table.partition_time, times), *places.items()]:
        index = schema.get_field_index(name)
        left = left.set_column(index, schema.field(index), pa.array(values).cast(schema.field(index).type))
    log.info("%s: %d key(s) found live where an update without its old partition time left them", table.fqn, len(take))
    return pa.concat_tables([prepared.moved_out, left.select(prepared.moved_out.schema.names)])


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
    rows = rows.select(CHANGES_SCHEMA.names)
    _append(store, INGESTED_CHANGES, rows, {changes_app_id(table, s): v for s, v in fresh.items()})


def _write_counts(store: DeltaStore, table: Table, changes: pa.Table, positions: dict[str, int]) -> None:
    """Append the batch's per-window ingested rows once (app transactions per stream, like the quarantine)."""
    rows, fresh = _not_yet_recorded(store, COUNTS_KEY, lambda s: counts_app_id(table, s), changes, positions)
    if not fresh:
        return
    entries: list[dict[str, object]] = [
        {
            "table": table.fqn,
            "stream": stream,
            "hour": window[:13],
            "window": window,
            "rows": n,
            "seq_to": positions[stream],
            "date": window[:10],
        }
        for (stream, window), n in sorted(_by_window(rows).items())
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


def ingest_next_batch(
    spark: SparkSession,
    store: DeltaStore,
    landing: Landing,
    table: Table,
    *,
    max_segments_per_stream: int = 288,
    engine: Engine = "auto",
) -> BatchReport | None:
    """Apply the oldest pending segments of one ODS table (at most ``max_segments_per_stream`` per shard) as one
    batch; None when nothing is pending."""
    segments = pending_segments(store, landing, table, max_segments_per_stream)
    if not segments:
        return None
    batch = ingest_batch(spark, store, table, segments, tz=landing.timezone, engine=engine)
    positions = committed_positions(store, table, list(batch.positions))
    behind = {s: p for s, p in positions.items() if p < batch.positions[s]}
    if behind:  # never loop on a batch whose position did not stick
        raise RuntimeError(f"{table.fqn}: positions not recorded after a batch: {behind} < {batch.positions}")
    return batch


def ingest_table(
    spark: SparkSession,
    store: DeltaStore,
    landing: Landing,
    table: Table,
    *,
    max_segments_per_stream: int = 288,
    progress: Callable[[BatchReport], None] | None = None,
    engine: Engine = "auto",
) -> TableReport:
    """Apply every pending segment of one ODS table, in batches of at most a day of segments per shard."""
    report = TableReport(table.fqn)
    while True:
        batch = ingest_next_batch(
            spark, store, landing, table, max_segments_per_stream=max_segments_per_stream, engine=engine
        )
        if batch is None:
            return report
        report.batches.append(batch)
        if progress:
            progress(batch)
