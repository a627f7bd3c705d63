"""Preparing a CDC batch: Canal lines → one classified record per change (parse, validate, type, dedupe, classify).

Two engines give the same result, an Arrow table of :data:`CLASSIFIED` columns plus the ODS columns, one row per
record (a row image of a DML message, or a whole line that cannot be applied or is DDL):

* :class:`InProcessPreparation` (the default): the lines parsed with orjson and typed with Arrow compute inside
  the run's process. A Spark job costs seconds of scheduling however small the batch (100,000 changes took
  6.5-11.3 s on Spark, README "Merge-into with partition pruning"); this engine takes about a second.
* :class:`SparkPreparation`: Spark's ``from_json``, ``try_cast`` and windows, for a batch whose lines exceed
  :data:`IN_PROCESS_MAX_BYTES` (the driver would hold the parsed batch in Python objects, several times the
  size of its lines) or when asked (``engine="spark"``).

:func:`preparation` picks one. ``status`` ∈ ok | quarantine | duplicate | superseded | ddl:

* a line that is not UTF-8 or not a Canal message, of another table, or a DML message without row image is
  quarantined whole (``row_index`` -1) with its reason; a DDL line is ``ddl``;
* each row image is typed by the catalog's columns (plus the source's new columns); a row with a missing primary
  key, binlog time or partition time, a value its column's type cannot hold, or an unreadable old partition time
  is quarantined with every reason;
* a change whose content hash (SHA-256 of ``type|es|row image as JSON|position``, persisted in
  ``ops.ingested_changes``) was taken in by an earlier batch, or already seen in this one, is a ``duplicate``;
* of the valid changes of one key, the newest (binlog time, then position) is ``ok``, the others ``superseded``;
  ``_moved_from`` lists every partition time the key had in the batch, so the merge can retire it elsewhere;
  ``_unplaced`` marks a key whose first change in the batch is an UPDATE with no ``old`` for its row (``old`` null,
  as a producer without before images writes): where it lived before is not in the batch, the ingestion looks it up
  by key before the merge. Canal's ``old`` lists every column the update changed, so an ``old`` without the
  partition time says the row stayed in its partition: ordinary updates cost no lookup.

The in-process engine reproduces Spark's reading of the JSON (``warehouse_assets/ingest/casts.py``) and hashes
the same bytes, so a change hashed by either engine is recognised by the other (``tests/test_preparation.py``
compares both engines column by column on the simulator's nasty cases). Known differences, all outside what
Canal writes: Spark's JSON reader also accepts single-quoted strings and keeps the other fields of a message
with an invalid escape sequence (the in-process engine quarantines both lines as malformed JSON); a row image
with the same column twice keeps both entries in Spark's map and its hash; and when two valid changes of a key
have equal binlog time and position (two shards carrying the same key), Spark's choice is arbitrary, the
in-process engine keeps the one of the greater stream name.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol
from zoneinfo import ZoneInfo

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from resources.column_types import UTC_MICROS, arrow_type
from resources.landing import COUNT_WINDOW_MINUTES, count_window
from resources.spark import arrow_frame
from warehouse_assets.catalog import CHANGED_AT, SNAPSHOT, OdsTable, Table
from warehouse_assets.ingest.casts import (
    cast_strings,
    map_to_json,
    spark_long,
    spark_map_array,
    spark_string,
    spark_string_map,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

Engine = Literal["auto", "in-process", "spark"]
IN_PROCESS_MAX_BYTES = 256 * 2**20
"""The switch: a batch whose lines hold more bytes than this is prepared on Spark (distributed over its
executors), a smaller one in the run's process. The in-process engine holds about 7 times its lines' size in
memory at its peak (100,000 changes: 68 MiB of lines, 0.5 GiB); 256 MiB of lines is about 400,000 changes."""
HOUR_MS = 3_600_000
WINDOW_MS = COUNT_WINDOW_MINUTES * 60_000  # the source counts' window
CANAL_SCHEMA = (
    "id bigint, database string, `table` string, pkNames array<string>, isDdl boolean, type string, "
    "es bigint, ts bigint, `sql` string, mysqlType map<string,string>, "
    "data array<map<string,string>>, old array<map<string,string>>, position string"
)
DML = ("INSERT", "UPDATE", "DELETE")
POS_SEGMENT = 10_000_000  # _pos = seq * 1e7 + line * 100 + row index: binlog order within a shard
POS_LINE = 100
DDL = "__ddl__"  # the line reason of a DDL message: not quarantined, counted as ``ddl``


def classified_schema(columns: Sequence[tuple[str, str]]) -> pa.Schema:
    """The classified records: source position, status and reason, the typed columns, change order and hash."""
    return pa.schema(
        [
            pa.field("_stream", pa.string()),
            pa.field("_segment", pa.string()),
            pa.field("_seq", pa.int64()),
            pa.field("_line", pa.int64()),
            pa.field("_row_index", pa.int64()),
            pa.field("_status", pa.string()),
            pa.field("_reason", pa.string()),
            pa.field("_raw_text", pa.string()),  # the line, for quarantined records only
            *[pa.field(name, arrow_type(ctype)) for name, ctype in columns],
            pa.field("_es", pa.int64()),
            pa.field("_pos", pa.int64()),
            pa.field("_op", pa.string()),
            pa.field("_msg_id", pa.int64()),
            pa.field("_change", pa.string()),
            pa.field("_moved_from", pa.list_(UTC_MICROS)),
            pa.field("_unplaced", pa.bool_()),
        ]
    )


@dataclass
class Classified:
    records: pa.Table  # classified_schema(columns)
    applied_source_columns: set[str]  # the mysqlType names of the messages whose records are applied


class Preparation(Protocol):
    """One batch's lines on one engine: what the ingestion asks before and while it classifies them."""

    def source_types(self) -> list[tuple[str, str]]:
        """(column, MySQL type) named by the ``mysqlType`` of the batch's DML messages of this table."""
        ...

    def binlog_hours(self) -> list[int]:
        """The epoch hours (``es`` // 1 h) of the lines' binlog times: where earlier copies may be recorded."""
        ...

    def classify(self, columns: Sequence[tuple[str, str]], seen: pa.Table | None) -> Classified:
        """Every record, classified; ``seen`` (``stream``, ``change``) holds changes earlier batches took in."""
        ...


def preparation(
    spark: SparkSession | None, table: Table, lines: pa.Table, timezone: str, engine: Engine = "auto"
) -> Preparation:
    """The engine for a batch: in process up to :data:`IN_PROCESS_MAX_BYTES` of lines, Spark above."""
    if engine == "auto":
        size = lines.column("value").nbytes + lines.column("raw").nbytes if lines.num_rows else 0
        engine = "in-process" if size <= IN_PROCESS_MAX_BYTES else "spark"
    if engine == "spark":
        if spark is None:
            raise ValueError("the Spark preparation needs a Spark session")
        return SparkPreparation(spark, table, lines)
    return InProcessPreparation(table, lines, timezone)


# --- in process ------------------------------------------------------------------------------------------------


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a batch is parsed and classified: it would otherwise walk the hundreds
    of thousands of young dicts and lists the batch allocates (none in a cycle) over and over."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parse(value: str) -> Any:
    """The JSON value of a line as Spark's reader sees it: leading whitespace and anything after the first
    value are ignored; None when the line is no JSON."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        pass  # trailing text, NaN, an integer beyond 64 bits, a lone surrogate: the standard library reads those
    try:
        return _DECODER.raw_decode(value.lstrip(" \t\r\n"))[0]
    except ValueError:
        return None


_DECODER = json.JSONDecoder()


class InProcessPreparation:
    """The batch parsed once in this process; classified with Arrow compute and dictionaries."""

    def __init__(self, table: Table, lines: pa.Table, timezone: str) -> None:
        with _collector_paused():
            self._parse_lines(table, lines, timezone)

    def _parse_lines(self, table: Table, lines: pa.Table, timezone: str) -> None:
        assert isinstance(table, OdsTable)
        self.table = table
        self.lines = lines
        self.timezone = timezone
        expected = re.compile(f"^(?:{table.source_tables})$")
        self.line_reasons: list[str | None] = []
        self.line_types: list[Any] = []  # the DML messages' mysqlType as given
        self.hours: set[int] = set()
        # one entry per row image of a DML message of this table
        self.row_line: list[int] = []
        self.row_index: list[int] = []
        self.row_image: list[dict[str, str | None] | None] = []
        self.row_old_time: list[str | None] = []
        self.row_has_old: list[bool] = []  # the row's ``old`` image is there (it names every changed column)
        self.row_es: list[int | None] = []
        self.row_op: list[str] = []
        self.row_msg_id: list[int | None] = []
        self.row_change: list[str] = []
        streams = lines.column("stream").to_pylist()
        values = lines.column("value").to_pylist()
        partition_time = table.partition_time
        database = table.source_database
        sha256 = hashlib.sha256
        row_line, row_index, row_image = self.row_line.append, self.row_index.append, self.row_image.append
        row_old_time, row_es, row_op = self.row_old_time.append, self.row_es.append, self.row_op.append
        row_msg_id, row_change = self.row_msg_id.append, self.row_change.append
        for i, value in enumerate(values):
            m = None if value is None else _parse(value)
            if not isinstance(m, dict):
                m = {}
            es = spark_long(m.get("es"))
            if es is not None:
                self.hours.add(es // HOUR_MS)
            data = spark_map_array(m.get("data"))
            reason = self._line_reason(value, m, data, streams[i], database, expected)
            self.line_reasons.append(reason)
            self.line_types.append(m.get("mysqlType") if reason is None else None)
            if reason is not None:
                continue
            op = spark_string(m.get("type"))
            assert op is not None and data is not None
            old = spark_map_array(m.get("old"))
            msg_id = spark_long(m.get("id"))
            position = spark_string(m.get("position"))
            head = (f"{op}|{es}|" if es is not None else f"{op}|").encode()
            tail = b"" if position is None else b"|" + position.encode()
            before_times = [None if o is None else o.get(partition_time) for o in old] if old is not None else []
            for index, image in enumerate(data):
                row_line(i)
                row_index(index)
                row_image(image)
                row_old_time(before_times[index] if index < len(before_times) else None)
                self.row_has_old.append(old is not None and index < len(old) and old[index] is not None)
                row_es(es)
                row_op(op)
                row_msg_id(msg_id)
                # Spark's sha2(concat_ws("|", type, es, to_json(row), position)): concat_ws skips nulls
                content = head + map_to_json(image) + tail if image is not None else head[:-1] + tail
                row_change(sha256(content).hexdigest())

    @staticmethod
    def _line_reason(
        value: str | None,
        m: dict[str, Any],
        data: list[Any] | None,
        stream: str,
        database: str,
        expected: re.Pattern[str],
    ) -> str | None:
        """Spark's ``_line_reason`` in SQL's three-valued logic (a comparison with null is neither true nor false)."""
        if value is None:
            return "invalid UTF-8"
        kind = spark_string(m.get("type"))
        if kind is None:
            return "malformed JSON"
        db, name = spark_string(m.get("database")), spark_string(m.get("table"))
        if (db is not None and db != database) or (name is not None and name != stream.rsplit(".", 1)[-1]):
            return f"unexpected table {'?' if db is None else db}.{'?' if name is None else name} in stream {stream}"
        if name is not None and not expected.search(name):
            return "table not part of this ODS table"
        is_ddl = m.get("isDdl")
        if is_ddl is True or kind not in DML:
            return DDL
        if not data:
            return "no row image in a DML message"
        return None

    def source_types(self) -> list[tuple[str, str]]:
        found: dict[str, str] = {}
        for given in self.line_types:
            if given is None or given.__class__ is not dict or found.keys() >= given.keys():
                continue  # the messages of a table mostly name the same columns: nothing new to look at
            for name, mysql_type in (spark_string_map(given) or {}).items():
                found.setdefault(name, str(mysql_type))
        return list(found.items())

    def binlog_hours(self) -> list[int]:
        return sorted(self.hours)

    def classify(self, columns: Sequence[tuple[str, str]], seen: pa.Table | None) -> Classified:
        with _collector_paused():
            return self._classify(columns, seen)

    def _classify(self, columns: Sequence[tuple[str, str]], seen: pa.Table | None) -> Classified:
        table = self.table
        assert isinstance(table, OdsTable)
        schema = classified_schema(columns)
        lines = self.lines
        n = len(self.row_line)
        line_stream = lines.column("stream").to_pylist()
        line_seq = lines.column("seq").to_pylist()
        line_no = lines.column("line").to_pylist()
        images = self.row_image
        # Arrow reads the row images' values by column name (a missing column is null; a null image, whose
        # children Arrow would leave empty, is read as an image without columns)
        images_by_column = pa.array(
            [{} if r is None else r for r in images], pa.struct([(name, pa.string()) for name, _ in columns])
        )
        raw = {name: images_by_column.field(name) for name, _ in columns}
        typed = {name: cast_strings(raw[name], ctype, self.timezone) for name, ctype in columns}
        old_raw = pa.array(self.row_old_time, pa.string())
        old_time = cast_strings(old_raw, "timestamp", self.timezone)
        es = pa.array(self.row_es, pa.int64())
        if table.kind == SNAPSHOT:
            typed[CHANGED_AT] = pc.multiply(es, 1000).cast(UTC_MICROS)
        streams = [line_stream[i] for i in self.row_line]
        order = [(line_seq[i], line_no[i], k) for i, k in zip(self.row_line, self.row_index, strict=True)]
        pos = [seq * POS_SEGMENT + line * POS_LINE + k for seq, line, k in order]

        reasons = self._reasons(columns, raw, typed, es, old_raw, old_time, n)
        # a re-sent change counts once: the first copy in binlog order, unless an earlier batch took it in
        recorded = (
            set() if seen is None else set(zip(seen["stream"].to_pylist(), seen["change"].to_pylist(), strict=True))
        )
        first: dict[tuple[str, str], int] = {}
        for i, key in enumerate(zip(streams, self.row_change, strict=True)):
            j = first.get(key)
            if j is None or order[i] < order[j]:
                first[key] = i
        unique = [
            first[key] == i and key not in recorded for i, key in enumerate(zip(streams, self.row_change, strict=True))
        ]
        valid = [reasons[i] is None and unique[i] for i in range(n)]
        # of a key's valid changes the newest wins; every partition time the key had in the batch is kept
        pk_values = list(zip(*(typed[pk].to_pylist() for pk in table.row_key), strict=True))
        times = typed[table.partition_time].cast(pa.int64()).to_pylist()
        olds = old_time.cast(pa.int64()).to_pylist()
        newest, oldest, was_at = self._by_key(valid, pk_values, times, olds, pos, streams)
        status = [
            "quarantine"
            if reasons[i] is not None
            else "duplicate"
            if not unique[i]
            else "ok"
            if newest[pk_values[i]] == i
            else "superseded"
            for i in range(n)
        ]
        moved = [was_at[pk_values[i]] if valid[i] else None for i in range(n)]
        # the key's first change here an UPDATE that does not say where the row was: the batch cannot know it
        unplaced_keys = {
            key
            for key, f in oldest.items()
            if self.row_op[f] == "UPDATE" and not self.row_has_old[f] and table.kind != SNAPSHOT
        }
        unplaced = [pk_values[i] in unplaced_keys if valid[i] else None for i in range(n)]
        values = lines.column("value").to_pylist()
        segments = lines.column("segment").to_pylist()
        record_columns: dict[str, Any] = {
            "_stream": streams,
            "_segment": [segments[i] for i in self.row_line],
            "_seq": [o[0] for o in order],
            "_line": [o[1] for o in order],
            "_row_index": self.row_index,
            "_status": status,
            "_reason": reasons,
            "_raw_text": [values[self.row_line[i]] if reasons[i] is not None else None for i in range(n)],
            **typed,
            "_es": es,
            "_pos": pos,
            "_op": self.row_op,
            "_msg_id": self.row_msg_id,
            "_change": self.row_change,
            "_moved_from": pa.array(moved, pa.list_(pa.int64())).cast(pa.list_(UTC_MICROS)),
            "_unplaced": unplaced,
        }
        records = pa.table([_as_array(record_columns[f.name], f.type) for f in schema], schema=schema)
        whole = [i for i, reason in enumerate(self.line_reasons) if reason is not None]
        if whole:
            records = pa.concat_tables([self._line_records(whole, schema), records])
        applied: set[str] = set()
        for i in range(n):
            given = self.line_types[self.row_line[i]]
            if status[i] == "ok" and given.__class__ is dict and not applied.issuperset(given):
                applied.update(given)  # type: ignore[arg-type]
        return Classified(records, applied)

    def _by_key(
        self,
        valid: list[bool],
        pk_values: list[tuple[Any, ...]],
        times: list[int],
        olds: list[int | None],
        pos: list[int],
        streams: list[str],
    ) -> tuple[dict[tuple[Any, ...], int], dict[tuple[Any, ...], int], dict[tuple[Any, ...], list[int]]]:
        """Of each key's valid changes: the newest, the oldest (by binlog time, position, stream), and every
        partition time the key had in the batch (images and ``old``), in the order met."""
        newest: dict[tuple[Any, ...], int] = {}
        oldest: dict[tuple[Any, ...], int] = {}
        was_at: dict[tuple[Any, ...], list[int]] = {}  # a key's distinct partition times
        for i in range(len(valid)):
            if not valid[i]:
                continue
            key = pk_values[i]
            j = newest.get(key)
            places = was_at.get(key)
            if j is None or places is None:
                newest[key], oldest[key], places = i, i, was_at.setdefault(key, [])
            else:
                if (self.row_es[i], pos[i], streams[i]) > (self.row_es[j], pos[j], streams[j]):
                    newest[key] = i
                f = oldest[key]
                if (self.row_es[i], pos[i], streams[i]) < (self.row_es[f], pos[f], streams[f]):
                    oldest[key] = i
            if times[i] not in places:
                places.append(times[i])
            old = olds[i]
            if old is not None and old not in places:
                places.append(old)
        return newest, oldest, was_at

    def _reasons(
        self,
        columns: Sequence[tuple[str, str]],
        raw: dict[str, pa.Array],
        typed: dict[str, pa.Array],
        es: pa.Array,
        old_raw: pa.Array,
        old_time: pa.Array,
        n: int,
    ) -> list[str | None]:
        """Every problem of a row image, joined by "; " in Spark's order (none: None)."""
        table = self.table
        assert isinstance(table, OdsTable)
        problems: list[tuple[pa.Array, Any]] = [
            (pc.is_null(typed[pk]), f"missing primary key {pk}") for pk in table.primary_key
        ]
        problems.append((pc.is_null(es), "missing binlog time es"))
        for name, _ in columns:
            bad = pc.and_(pc.is_valid(raw[name]), pc.is_null(typed[name]))
            problems.append((bad, (f"bad value for {name}: ", raw[name])))
        problems.append((pc.is_null(typed[table.partition_time]), f"missing partition time {table.partition_time}"))
        bad_old = pc.and_(pc.is_valid(old_raw), pc.is_null(old_time))
        problems.append((bad_old, (f"bad old value for {table.partition_time}: ", old_raw)))
        reasons: list[str | None] = [None] * n
        if not n:
            return reasons
        anything = problems[0][0]
        for mask, _ in problems[1:]:
            anything = pc.or_(anything, mask)
        if not pc.any(anything).as_py():
            return reasons
        flagged = pc.indices_nonzero(anything).to_pylist()
        masks = [mask.to_pylist() for mask, _ in problems]
        for i in flagged:
            parts = []
            for k, (_, text) in enumerate(problems):
                if masks[k][i]:
                    parts.append(text if isinstance(text, str) else text[0] + text[1][i].as_py())
            reasons[i] = "; ".join(parts)
        return reasons

    def _line_records(self, whole: list[int], schema: pa.Schema) -> pa.Table:
        lines = self.lines.take(pa.array(whole, pa.int64()))
        reasons = [self.line_reasons[i] for i in whole]
        text = [
            value if value is not None else bytes(raw).decode("latin-1")
            for value, raw in zip(lines.column("value").to_pylist(), lines.column("raw").to_pylist(), strict=True)
        ]
        given = {
            "_stream": lines.column("stream"),
            "_segment": lines.column("segment"),
            "_seq": lines.column("seq"),
            "_line": lines.column("line"),
            "_row_index": pa.array([-1] * len(whole), pa.int64()),
            "_status": pa.array(["ddl" if r == DDL else "quarantine" for r in reasons], pa.string()),
            "_reason": pa.array([None if r == DDL else r for r in reasons], pa.string()),
            "_raw_text": pa.array(text, pa.string()),
        }
        return pa.table(
            [given[f.name] if f.name in given else pa.nulls(len(whole), f.type) for f in schema], schema=schema
        )


def _as_array(values: Any, arrow_type: pa.DataType) -> pa.Array:
    if isinstance(values, pa.ChunkedArray | pa.Array):
        return values.cast(arrow_type)
    return pa.array(values, arrow_type)


def local_hour(epoch_hour: int, tz: str) -> str:
    """The key of a binlog hour in the ops tables: local "YYYY-MM-DDTHH"."""
    return datetime.fromtimestamp(epoch_hour * 3600, ZoneInfo(tz)).strftime("%Y-%m-%dT%H")


def local_window(epoch_window: int, tz: str) -> str:
    """The key of a binlog window (``es // WINDOW_MS``) in ``ops.ingested_counts`` and the source counts: local
    "YYYY-MM-DDTHH:MM", its start."""
    return count_window(datetime.fromtimestamp(epoch_window * WINDOW_MS / 1000, ZoneInfo(tz)))


# --- on Spark -------------------------------------------------------------------------------------------------


class SparkPreparation:
    """The batch on Spark: parsing, typing and the windows distributed over the session's executors."""

    def __init__(self, spark: SparkSession, table: Table, lines: pa.Table) -> None:
        self.spark = spark
        self.table = table
        self.lines = lines

    def source_types(self) -> list[tuple[str, str]]:
        from pyspark.sql import functions as F

        if not self.lines.num_rows:
            return []
        # only DML messages of this table: a line quarantined as a whole must not change the schema
        parsed = (
            arrow_frame(self.spark, self.lines.select(["stream", "value"]))
            .toDF("_stream", "_value")
            .withColumn("_m", F.from_json("_value", CANAL_SCHEMA))
            .where(_line_reason(self.table).isNull())
        )
        pairs = parsed.select(F.explode("_m.mysqlType").alias("name", "type")).distinct().collect()
        return [(str(row["name"]), str(row["type"])) for row in pairs]

    def binlog_hours(self) -> list[int]:
        from pyspark.sql import functions as F

        if not self.lines.num_rows:
            return []
        found = (
            arrow_frame(self.spark, self.lines.select(["value"]))
            .select(F.floor(F.from_json("value", "struct<es: bigint>")["es"] / HOUR_MS).alias("h"))
            .where(F.col("h").isNotNull())
            .distinct()
            .collect()
        )
        return sorted(int(r["h"]) for r in found)

    def classify(self, columns: Sequence[tuple[str, str]], seen: pa.Table | None) -> Classified:
        from pyspark.sql import functions as F

        earlier = None
        if seen is not None and seen.num_rows:
            earlier = arrow_frame(self.spark, seen.select(["stream", "change"])).toDF("_stream", "_change")
        classified = prepare_batch(self.spark, self.table, self.lines, columns, earlier).persist()
        try:
            applied = {
                str(r["name"])
                for r in classified.where(F.col("_status") == "ok")
                .select(F.explode(F.from_json("_raw_text", "struct<mysqlType: map<string,string>>")["mysqlType"]))
                .select(F.col("key").alias("name"))
                .distinct()
                .collect()
            }
            schema = classified_schema(columns)
            quarantined = F.col("_status").isin("quarantine", "ddl") | F.col("_reason").isNotNull()
            records = classified.withColumn("_raw_text", F.when(quarantined, F.col("_raw_text"))).toArrow()
        finally:
            classified.unpersist()
        return Classified(records.select(schema.names).cast(schema), applied)


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
    from pyspark.sql import functions as F

    columns = list(columns or table.columns)
    raw = arrow_frame(spark, lines).toDF(*[f"_{c}" for c in lines.column_names])
    msg = raw.withColumn("_m", F.from_json("_value", CANAL_SCHEMA))
    msg = msg.withColumn("_line_reason", _line_reason(table))
    assert isinstance(table, OdsTable)
    rows = _with_reasons(_typed_rows(msg, table, columns), table, columns)
    rows, status = _deduplicated(rows, table, seen)
    return _line_level(msg, columns).unionByName(_record_level(rows, status, columns))


def _line_level(msg: DataFrame, columns: Sequence[tuple[str, str]]) -> DataFrame:
    """One record per line refused whole (malformed, of another table) or carrying DDL."""
    from pyspark.sql import functions as F

    return msg.where(F.col("_line_reason").isNotNull()).select(
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
        F.lit(None).cast("boolean").alias("_unplaced"),
    )


def _typed_rows(msg: DataFrame, table: OdsTable, columns: Sequence[tuple[str, str]]) -> DataFrame:
    """One row per row image of the lines' messages, its values cast to the table's types, with its binlog order."""
    from pyspark.sql import functions as F

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
    typed = [
        F.timestamp_millis("_es").alias(name)
        if name == CHANGED_AT and table.kind == SNAPSHOT
        else _typed(F.col("_r")[name], ctype).alias(name)
        for name, ctype in columns
    ]
    # an UPDATE's ``old`` (parallel to ``data``) names the partition time the row had before, if it changed
    old_time = F.try_element_at(F.col("_old"), F.col("_row_index") + 1)[table.partition_time]
    return rows.select(
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
        F.try_element_at(F.col("_old"), F.col("_row_index") + 1).isNotNull().alias("_has_old"),
        (F.col("_seq") * POS_SEGMENT + F.col("_line") * POS_LINE + F.col("_row_index")).alias("_pos"),
    )


def _with_reasons(rows: DataFrame, table: OdsTable, columns: Sequence[tuple[str, str]]) -> DataFrame:
    """The rows with ``_reason``: why a row is quarantined (a missing key or time, a value of the wrong type), or
    null."""
    from pyspark.sql import functions as F

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
    return rows


def _deduplicated(rows: DataFrame, table: OdsTable, seen: DataFrame | None) -> tuple[DataFrame, Column]:
    """The rows with what deduplication needs (``_change``, the newest per key, the partition times the key had), and
    each row's status: quarantine, duplicate, superseded or ok."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

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
    newest = Window.partitionBy(valid.alias("valid"), *table.row_key).orderBy(F.col("_es").desc(), F.col("_pos").desc())
    rows = rows.withColumn("_rank", F.when(valid, F.row_number().over(newest)))
    # every partition time the key had in the batch (images and ``old``): the newest change leaves the others
    changes = Window.partitionBy(valid.alias("valid"), *table.row_key)
    was_at = F.array_union(F.collect_set(table.partition_time).over(changes), F.collect_set("_old_time").over(changes))
    rows = rows.withColumn("_moved_from", F.when(valid, was_at))
    # the key's first change here an UPDATE that does not say where the row was: the batch cannot know it
    oldest = Window.partitionBy(valid.alias("valid"), *table.row_key).orderBy(
        F.col("_es").asc(), F.col("_pos").asc(), F.col("_stream").asc()
    )
    first = F.first(F.struct(F.col("_op"), F.col("_has_old"))).over(
        oldest.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    )
    unplaced = (first["_op"] == F.lit("UPDATE")) & ~first["_has_old"] & F.lit(table.kind != SNAPSHOT)
    rows = rows.withColumn("_unplaced", F.when(valid, unplaced))
    status = (
        F.when(F.col("_reason").isNotNull(), F.lit("quarantine"))
        .when(~unique, F.lit("duplicate"))
        .when(F.col("_rank") > 1, F.lit("superseded"))
        .otherwise(F.lit("ok"))
    )
    return rows, status


def _record_level(rows: DataFrame, status: Column, columns: Sequence[tuple[str, str]]) -> DataFrame:
    """The classified records of the row images, in the columns every batch's records have."""
    from pyspark.sql import functions as F

    return rows.select(
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
        "_unplaced",
    )
