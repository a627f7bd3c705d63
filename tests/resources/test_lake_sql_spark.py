"""`warehouse sql` on Spark: the catalog every Spark of the product carries resolves `layer.table` in the lake,
the two engines return the same rows for filters, joins, aggregates and time travel, a query over DataFusion's
memory budget is answered by Spark, and a confined catalog (an analysts' Spark) reads but never writes."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from resources.lake_sql import READ_ONLY_PREFIX, AsOf, LakeSql, SqlRefused, read_only_message, read_only_session
from resources.spark import SESSION_LAKE
from tests.resources.test_lake_sql import assert_every_format_is_written, build_lake, build_typed_table
from tests.support.hostile import SQL
from warehouse_assets.cli.main import main

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return build_lake(tmp_path / "lake")


@pytest.fixture
def both(lake: Path, spark: SparkSession) -> Iterator[LakeSql]:
    yield LakeSql(str(lake), spark=lambda: (spark, "local test session"))
    spark.conf.unset(SESSION_LAKE)


def normalized(rows: pa.Table) -> list[tuple[Any, ...]]:
    def value(v: Any) -> Any:
        return round(v, 6) if isinstance(v, float) and math.isfinite(v) else v

    return sorted((tuple(value(v) for v in row.values()) for row in rows.to_pylist()), key=repr)


QUERIES = [
    "SELECT order_id, user_id, amount, dt FROM dwd.orders WHERE dt = '2026-03-02' AND amount > 40",
    "SELECT * FROM dwd.orders WHERE order_id = 457",
    "SELECT dt, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM dwd.orders GROUP BY dt",
    "SELECT u.name, count(*) AS n, max(o.amount) AS top FROM dwd.orders o JOIN dwd.users u ON o.user_id = u.user_id "
    "WHERE o.dt IN ('2026-03-01', '2026-03-03') GROUP BY u.name",
    "WITH big AS (SELECT user_id, amount FROM dwd.orders WHERE amount >= 45) "
    "SELECT user_id, count(*) AS n FROM big GROUP BY user_id HAVING count(*) > 5",
    "SELECT count(*) AS n, min(order_id) AS lo, max(order_id) AS hi FROM dwd.orders VERSION AS OF 1",
]


def test_spark_writes_every_format_for_every_type(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Spark labels instants with its session's time zone and answers strings as plain strings: the same text as the
    # JVM-free engine's in every format
    monkeypatch.setattr("warehouse_assets.cli.sql.spark_for", lambda settings: (spark, "local test session"))
    assert_every_format_is_written("spark", tmp_path / "lake", tmp_path, monkeypatch, capsys)


def test_both_engines_print_timestamps_as_the_same_text(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # DataFusion answers an instant labelled UTC and a cast one without a zone; Spark labels both with its session's
    # zone: the same text from both, in the business timezone with its offset, in every text format
    monkeypatch.setattr("warehouse_assets.cli.sql.spark_for", lambda settings: (spark, "local test session"))
    build_typed_table(tmp_path / "lake")
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(tmp_path / "lake"))
    query = "SELECT id, at, CAST(day AS TIMESTAMP) AS day_start FROM dwd.typed WHERE id = 1"
    printed: dict[str, dict[str, str]] = {}
    for engine in ("datafusion", "spark"):
        for fmt in ("table", "csv", "json"):
            assert main(["sql", "--engine", engine, "--format", fmt, query]) == 0
            out = capsys.readouterr().out
            printed.setdefault(fmt, {})[engine] = out if fmt != "table" else out[: out.rindex(" row(s) in ")]
    assert (
        printed["csv"]["datafusion"]
        == '"id","at","day_start"\n1,"2026-03-02 00:30:00+08:00","2026-03-02 00:00:00+08:00"\n'
    )
    assert printed["json"]["datafusion"] == (
        '{"id": 1, "at": "2026-03-02 00:30:00+08:00", "day_start": "2026-03-02 00:00:00+08:00"}\n'
    )
    assert "| 1  | 2026-03-02 00:30:00+08:00 | 2026-03-02 00:00:00+08:00 |" in printed["table"]["datafusion"]
    for fmt, by_engine in printed.items():
        assert by_engine["spark"] == by_engine["datafusion"], fmt


@pytest.mark.parametrize("query", QUERIES)
def test_both_engines_return_the_same_rows(both: LakeSql, query: str) -> None:
    jvm_free = both.run(query, engine="datafusion")
    on_spark = both.run(query, engine="spark")
    assert (jvm_free.engine, on_spark.engine) == ("datafusion", "spark")
    assert jvm_free.rows.num_rows > 0
    assert normalized(jvm_free.rows) == normalized(on_spark.rows)
    # a forced Spark still shows which files the query reads: delta-rs plans them while Spark answers
    assert on_spark.plan == jvm_free.plan


def test_a_forced_spark_names_a_missing_table_or_version_as_datafusion_does(both: LakeSql) -> None:
    for query, said in [
        ("SELECT * FROM dwd.nowhere", "no table dwd.nowhere"),
        ("SELECT * FROM dwd.orders VERSION AS OF 99", "dwd.orders has no readable version 99"),
    ]:
        with pytest.raises(SqlRefused, match=said):
            both.run(query, engine="datafusion")
        with pytest.raises(SqlRefused, match=said):
            both.run(query, engine="spark")


def test_both_engines_travel_to_the_same_version_and_time(both: LakeSql, lake: Path) -> None:
    query = "SELECT dt, count(*) AS n FROM dwd.orders GROUP BY dt"
    by_version = [both.run(query, engine=e, as_of=AsOf(version=2)) for e in ("datafusion", "spark")]
    assert (
        normalized(by_version[0].rows)
        == normalized(by_version[1].rows)
        == [(d, 100) for d in ("2026-03-01", "2026-03-02", "2026-03-03")]
    )
    # Delta's time of a commit is its log file's modification time (the commit info's own stamp is taken before
    # the file is written, and under load can precede it by more than the gap to the next commit)
    committed = (lake / "dwd" / "orders" / "_delta_log" / f"{1:020d}.json").stat().st_mtime_ns // 1_000_000
    instant = datetime.fromtimestamp(committed / 1000, tz=UTC)
    moment = AsOf(timestamp=instant)
    by_time = [both.run(query, engine=e, as_of=moment) for e in ("datafusion", "spark")]
    assert normalized(by_time[0].rows) == normalized(by_time[1].rows) == [("2026-03-01", 100), ("2026-03-02", 100)]
    own_clause = f"SELECT dt, count(*) AS n FROM dwd.orders TIMESTAMP AS OF '{instant.isoformat()}' GROUP BY dt"
    assert normalized(both.run(own_clause, engine="spark").rows) == normalized(by_time[0].rows)


def test_a_query_over_the_memory_budget_goes_to_spark(lake: Path, spark: SparkSession) -> None:
    query = "SELECT order_id, count(*) AS n FROM dwd.orders GROUP BY order_id"
    small = LakeSql(str(lake), spark=lambda: (spark, "local test session"), memory_budget=16 << 10)
    answer = small.run(query)
    assert answer.engine == "spark"
    assert "over the JVM-free engine's memory budget (16.0 KB)" in answer.why
    assert sorted(normalized(answer.rows)) == [(i, 1) for i in range(600)]


def test_names_resolve_to_tables_created_after_the_session_started(lake: Path, spark: SparkSession) -> None:
    spark.conf.set(SESSION_LAKE, str(lake))
    try:
        assert spark.sql("SELECT count(*) AS n FROM dwd.orders").collect()[0].n == 600
        write_deltalake(str(lake / "ads" / "fresh"), pa.table({"x": [1, 2, 3]}))  # after the first query
        assert spark.sql("SELECT sum(x) AS s FROM ads.fresh").collect()[0].s == 6
        with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
            spark.sql("SELECT * FROM ads.missing").collect()
    finally:
        spark.conf.unset(SESSION_LAKE)


def test_a_confined_catalog_reads_the_lake_and_writes_nothing(lake: Path, spark: SparkSession, tmp_path: Path) -> None:
    """What an analysts' Spark runs with (`lake_conf(confined=True)`): names only in its lake, no writes."""
    analysts = spark.newSession()
    analysts.conf.set("spark.sql.catalog.spark_catalog.lake", str(lake))
    analysts.conf.set("spark.sql.catalog.spark_catalog.confined", "true")
    analysts.conf.set(SESSION_LAKE, str(tmp_path / "elsewhere"))  # ignored: a confined lake is its own
    orders = DeltaTable(str(lake / "dwd" / "orders"))
    before = (orders.version(), sorted(orders.file_uris()))
    assert analysts.sql("SELECT count(*) AS n FROM dwd.orders").collect()[0].n == 600
    for write in (
        "INSERT INTO dwd.orders VALUES (9999, 1, 1.0, '2026-03-01')",
        "DELETE FROM dwd.orders WHERE dt = '2026-03-01'",
        "UPDATE dwd.orders SET amount = 0",
    ):
        with pytest.raises(Exception, match=r"read-only: writing dwd.orders \(INSERT, MERGE, UPDATE, DELETE\) is not"):
            analysts.sql(write).collect()
    outside = tmp_path / "outside"
    write_deltalake(str(outside), pa.table({"secret": [1]}))
    for path in (outside, lake / "dwd" / "orders"):  # by path, even inside the lake: tables are read by name
        with pytest.raises(Exception, match=r"read-only: reading files by path \(delta.`"):
            analysts.sql(f"SELECT * FROM delta.`{path}`").collect()
    orders = DeltaTable(str(lake / "dwd" / "orders"))
    assert (orders.version(), sorted(orders.file_uris())) == before


@pytest.mark.parametrize("request_sql", list(SQL))
def test_the_hostile_matrix_is_refused_by_the_plan_on_both_engines_in_the_servers_words(
    both: LakeSql, lake: Path, spark: SparkSession, tmp_path: Path, request_sql: str
) -> None:
    """`warehouse sql` refuses each request by an engine's plan, with exactly the words of the JVM check the
    analysts' server runs (the same request sent straight to a read-only session), whichever engine was asked:
    Spark's plan, DataFusion's, or Spark's for what DataFusion cannot plan. (On a real analysts' server:
    test_analysts_server.py.)"""
    text = request_sql.format(lake=lake, outside=tmp_path, mark=tmp_path / "code-ran")
    messages = {}
    for engine in ("spark", "datafusion", "auto"):
        with pytest.raises(SqlRefused) as refused:
            both.run(text, engine=engine)  # type: ignore[arg-type]
        messages[engine] = str(refused.value)
        assert messages[engine].startswith(READ_ONLY_PREFIX) and SQL[request_sql] in messages[engine], messages
    assert not (tmp_path / "code-ran").exists()
    server = read_only_session(spark)
    server.conf.set(SESSION_LAKE, str(lake))
    with pytest.raises(Exception) as direct:
        server.sql(text).collect()
    said = read_only_message(direct.value)
    assert messages == dict.fromkeys(messages, said)
    assert DeltaTable(str(lake / "dwd" / "orders")).version() == 5


def test_warehouse_sqls_spark_session_refuses_by_the_plan_and_the_shared_session_keeps_writing(
    lake: Path, spark: SparkSession, tmp_path: Path
) -> None:
    """What the syntax check might miss, Spark's plan check refuses: every request of the matrix sent straight to the
    read-only session `warehouse sql` answers in, with the analysts' server's message; the process's shared session
    (the product's own work) still writes."""
    session = read_only_session(spark)
    session.conf.set(SESSION_LAKE, str(lake))
    before = DeltaTable(str(lake / "dwd" / "orders")).version()
    for request, said in SQL.items():
        text = request.format(lake=lake, outside=tmp_path, mark=tmp_path / "code-ran")
        with pytest.raises(Exception) as refused:
            session.sql(text).collect()
        message = read_only_message(refused.value)
        assert message is not None and said in message, (request, str(refused.value)[:500])
    assert not (tmp_path / "code-ran").exists() and DeltaTable(str(lake / "dwd" / "orders")).version() == before
    assert session.sql("SELECT count(*) AS n FROM dwd.orders").collect()[0].n == 600
    spark.conf.set(SESSION_LAKE, str(lake))
    try:
        spark.sql("INSERT INTO dwd.users VALUES (7, 'user 7')").collect()
        assert spark.sql("SELECT count(*) AS n FROM dwd.users").collect()[0].n == 8
    finally:
        spark.conf.unset(SESSION_LAKE)
