"""The two preparation engines agree: the same lines classified in process and on Spark give the same records,
column by column (status, reason, typed values, order, the persisted change hash, the partitions a key left),
the same source columns and binlog hours; and ingestion on either engine leaves the same tables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore
from resources.landing import Landing, read_lines
from simulator.cdc import SimulationConfig, simulate
from tests.ingest.test_ingestion import DB, _local, message, order
from tests.support.lake import table_rows
from warehouse_assets.catalog import Table, load_catalog
from warehouse_assets.ingest.merge import CHANGES_KEY, QUARANTINE_KEY, ingest_table
from warehouse_assets.ingest.preparation import InProcessPreparation, SparkPreparation, classified_schema

CATALOG = load_catalog()
TZ = "Asia/Shanghai"


def _lines(rows: Sequence[tuple[str, int, int, str | bytes]]) -> pa.Table:
    """Lines as ``read_lines`` gives them: (stream, seq, line number, text or undecodable bytes)."""
    values: list[str | None] = []
    raws: list[bytes | None] = []
    for _, _, _, text in rows:
        if isinstance(text, bytes):
            try:
                values.append(text.decode("utf-8"))
                raws.append(None)
            except UnicodeDecodeError:
                values.append(None)
                raws.append(text)
        else:
            values.append(text)
            raws.append(None)
    return pa.table(
        {
            "stream": pa.array([r[0] for r in rows], pa.string()),
            "segment": pa.array([f"{r[1]:06d}-20260302T1000.jsonl" for r in rows], pa.string()),
            "seq": pa.array([r[1] for r in rows], pa.int64()),
            "line": pa.array([r[2] for r in rows], pa.int64()),
            "value": pa.array(values, pa.string()),
            "raw": pa.array(raws, pa.binary()),
        }
    )


def _sorted(records: pa.Table) -> list[dict[str, Any]]:
    """The records in source order, comparable: instants as microseconds (year 1 in UTC is before Python's
    datetime), NaN as text (NaN equals nothing), the partitions a key left as a sorted list (a set in Spark)."""
    records = records.sort_by([(c, "ascending") for c in ("_stream", "_seq", "_line", "_row_index")])
    as_micros = {pa.timestamp("us", tz="UTC"): pa.int64(), pa.list_(pa.timestamp("us", tz="UTC")): pa.list_(pa.int64())}
    records = records.cast(pa.schema([pa.field(f.name, as_micros.get(f.type, f.type)) for f in records.schema]))
    rows = records.to_pylist()
    for row in rows:
        if row["_moved_from"] is not None:
            row["_moved_from"] = sorted(row["_moved_from"])
        for name, value in row.items():
            if isinstance(value, float) and value != value:
                row[name] = "NaN"
    return rows


def assert_engines_agree(
    spark: SparkSession, table: Table, lines: pa.Table, columns: Sequence[tuple[str, str]], seen: pa.Table | None
) -> list[dict[str, Any]]:
    fast = InProcessPreparation(table, lines, TZ)
    slow = SparkPreparation(spark, table, lines)
    assert sorted(fast.source_types()) == sorted(set(slow.source_types()))
    assert fast.binlog_hours() == slow.binlog_hours()
    mine, theirs = fast.classify(columns, seen), slow.classify(columns, seen)
    assert mine.records.schema == theirs.records.schema == classified_schema(columns)
    assert mine.applied_source_columns == theirs.applied_source_columns
    expected, got = _sorted(theirs.records), _sorted(mine.records)
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert have == want, {k: (have[k], want[k]) for k in want if have[k] != want[k]}
    return got


# --- hand-written nasty lines -----------------------------------------------------------------------------------

STREAM = f"{DB}.order_00"


def _nasty() -> list[str | bytes]:
    good = message(1, "INSERT", [order(1)], 1)
    truncated = message(9, "INSERT", [order(9)], 9)
    odd = json.loads(message(12, "INSERT", [order(12)], 12))
    odd["data"][0].update({"course_id": 3, "amount": 10.5, "status": True, "user_id": None})  # non-string values
    escaped = order(13, status='quote " back \\ slash / tab\t nl\n ctl\x01\x1f del\x7f 中文 é 😀')
    return [
        good,
        '{"data":[{"id":"2"',  # malformed JSON
        b'{"data":[{"id":"3","status":"\xff\xfe"}]}',  # invalid UTF-8
        message(4, "INSERT", [order(4, id=None)], 4),  # a row without its primary key
        message(5, "INSERT", [order(5)], 5, table="order_01"),  # another shard's message in this stream
        message(6, "INSERT", [order(6, create_time="2026-02-30 25:61:00")], 6),  # impossible datetime
        message(7, "ALTER", [], 7, isDdl=True, data=None, sql="ALTER TABLE order_00 ADD COLUMN coupon varchar(16)"),
        message(8, "INSERT", [order(8), order(80, id=None)], 8),  # second row of the statement is bad
        good,  # re-sent message 1
        truncated[: len(truncated) // 2],
        "#@!corrupted binlog event at 1772416860000",
        json.dumps(odd),  # spaces after separators, numbers and booleans where strings belong
        message(13, "INSERT", [escaped], 13),
        message(14, "INSERT", [order(14)], 14) + " trailing text",
        "  " + message(15, "INSERT", [order(15)], 15),
        message(16, "INSERT", [order(16, amount="10.005", user_id=" 7 ", course_id="+3")], 16),  # Spark's rounding
        message(17, "INSERT", [order(17, amount="99999999.995", course_id="0x10")], 17),  # overflow, hex
        message(18, "INSERT", [order(18, create_time="2026-03-02 10:01:60")], 18),
        message(19, "INSERT", [order(19, create_time="2026-3-2 10:01:00", update_time="2026-03-02T10:01:00")], 19),
        message(20, "UPDATE", [order(20)], 20, old=[{"create_time": "yesterday"}]),  # bad old partition time
        message(21, "UPDATE", [order(21, create_time=_local(70))], 21, old=[{"create_time": _local(1)}]),  # moved
        message(
            22, "UPDATE", [order(21, create_time=_local(130), status="paid")], 22, old=[{"create_time": _local(70)}]
        ),
        message(23, "INSERT", [order(23)], 23, es="12"),  # es as a string: no binlog time
        message(24, "INSERT", [order(24)], 24, type=None),  # no type: not a Canal message
        message(25, "INSERT", [order(25)], 25, database=None),  # no database: judged by its table
        message(26, "INSERT", [order(26)], 26, table="user_00"),
        message(27, "QUERY", [order(27)], 27),  # not DML
        message(28, "INSERT", [], 28),  # no row image
        message(29, "INSERT", [order(29)], 29, data="not a list"),
        message(30, "INSERT", [order(30), None], 30),  # a null row image
        message(31, "INSERT", [order(31)], 31, position="mysql-bin.000003:4567"),
        message(31, "INSERT", [order(31)], 31, position="mysql-bin.000003:4999"),  # same content, other position
        message(32, "INSERT", [order(32)], 32, mysqlType={"id": "bigint(20)", "coupon": "varchar(16)", "n": 7}),
        "[1, 2, 3]",
        "null",
        message(33, "DELETE", [order(1)], 33),  # key 1 deleted later in the batch
        message(34, "UPDATE", [order(8, status="paid")], 34),  # key 8 superseded
    ]


def test_the_engines_agree_on_hand_written_nasty_lines(spark: SparkSession) -> None:
    table = CATALOG["ods.order"]
    rows = [(STREAM, 1, i, text) for i, text in enumerate(_nasty(), start=1)]
    rows += [(f"{DB}.order_01", 2, 1, message(40, "INSERT", [order(40, user_id="8")], 2, table="order_01"))]
    lines = _lines(rows)
    columns = [*table.columns, ("coupon", "string")]
    got = assert_engines_agree(spark, table, lines, columns, None)
    statuses = {s for s in (r["_status"] for r in got)}
    assert statuses == {"ok", "quarantine", "duplicate", "superseded", "ddl"}
    # the hash of a change recorded by an earlier batch makes its copy a duplicate, on both engines
    first = next(r for r in got if r["_status"] == "ok")
    seen = pa.table({"stream": [first["_stream"]], "change": [first["_change"]]})
    again = assert_engines_agree(spark, table, lines, columns, seen)
    assert next(r for r in again if r["_change"] == first["_change"])["_status"] == "duplicate"


@pytest.mark.parametrize(
    ("spark_type", "values"),
    [
        ("bigint", ["1", " 1 ", "+1", "-1", "1.0", "1e3", "0x10", "", "abc", "9223372036854775808", "１２", "\t7\n"]),
        ("int", ["2147483647", "2147483648", "-2147483648", "01"]),
        ("tinyint", ["127", "128", "-129", "5"]),
        ("smallint", ["32767", "32768", "-7"]),
        ("decimal(10,2)", ["10.005", "-10.005", "99999999.995", "1e3", "1.", ".", ".5", "1e-3", " 2.5 ", "１２"]),
        ("double", ["1.5", "NaN", "Infinity", "inf", "-Infinity", "1d", "1.5D", "1e3", "x", " 2 "]),
        ("boolean", ["true", "yes", "t", "Y", "0", "1", "no", "maybe", " TRUE "]),
        ("date", ["2026-03-02", "2026-3-2", "2026-03-02 10:00", "2026-03-02T10:00:00", "2026", "2026-03", "x"]),
        ("timestamp", ["2024-02-29 00:00:00", "2023-02-29 00:00:00", "2026-03-02 24:00:00", "0001-01-01 00:00:00"]),
    ],
)
def test_the_engines_cast_values_alike(spark: SparkSession, spark_type: str, values: list[str]) -> None:
    table = CATALOG["ods.order"]
    rows = [
        (STREAM, 1, i, message(i, "INSERT", [order(i, drifted=value)], 1)) for i, value in enumerate(values, start=1)
    ]
    assert_engines_agree(spark, table, _lines(rows), [*table.columns, ("drifted", spark_type)], None)


# --- the simulator's nasty cases ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    landing = tmp_path_factory.mktemp("landing")
    config = SimulationConfig(scale=0.05, dup_rate=0.05, malformed_rate=0.02, schema_drift_at=datetime(2026, 3, 2, 4))
    simulate(landing, datetime(2026, 3, 2), datetime(2026, 3, 2, 8), config)
    return landing


@pytest.mark.parametrize(
    ("fqn", "statuses"),
    [
        ("ods.user", {"ok", "quarantine", "duplicate"}),  # drift, malformed lines, re-sent messages
        ("ods.order", {"ok", "superseded"}),
        ("ods.attendance", {"ok", "superseded"}),
    ],
)
def test_the_engines_agree_on_the_simulated_sources(
    spark: SparkSession, simulated: Path, fqn: str, statuses: set[str]
) -> None:
    table = CATALOG[fqn]
    landing = Landing(simulated)
    assert table.source_database and table.source_tables
    segments = [
        s for stream in landing.streams(table.source_database, table.source_tables) for s in landing.segments(stream)
    ]
    lines = read_lines(segments)
    extras = sorted(
        (name, "string")
        for name, _ in InProcessPreparation(table, lines, TZ).source_types()
        if name not in dict(table.columns)
    )
    got = assert_engines_agree(spark, table, lines, [*table.columns, *extras], None)
    assert statuses <= {r["_status"] for r in got}


def test_ingestion_on_either_engine_leaves_the_same_tables(
    spark: SparkSession, simulated: Path, tmp_path: Path
) -> None:
    table = CATALOG["ods.user"]
    landing = Landing(simulated)
    lakes = {engine: DeltaStore(str(tmp_path / engine)) for engine in ("in-process", "spark")}
    # the 8 hours in two batches per engine: the second's re-sent changes are judged against those the first
    # recorded, as well as against its own
    batches = {}
    for engine, store in lakes.items():
        report = ingest_table(spark, store, landing, table, max_segments_per_stream=48, engine=engine)  # type: ignore[arg-type]
        batches[engine] = len(report.batches)
    assert batches == {"in-process": 2, "spark": 2}

    def content(store: DeltaStore, key: Sequence[str], order_by: Sequence[str]) -> list[dict[str, Any]]:
        data = table_rows(store.table_uri(key))
        return data.sort_by([(c, "ascending") for c in order_by]).to_pylist()

    a, b = lakes["in-process"], lakes["spark"]
    assert content(a, table.key, ["id", "dt", "hh"]) == content(b, table.key, ["id", "dt", "hh"])
    assert content(a, CHANGES_KEY, ["stream", "change"]) == content(b, CHANGES_KEY, ["stream", "change"])
    order_q = ["stream", "segment", "line", "row_index"]
    assert content(a, QUARANTINE_KEY, order_q) == content(b, QUARANTINE_KEY, order_q)
    assert pc.sum(table_rows(a.table_uri(CHANGES_KEY))["seq"]).as_py() > 0
