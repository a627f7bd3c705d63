"""One table format, two readers: what the product writes with Spark's Delta, delta-rs reads
as the same rows, version and partitions, and the reverse for the tables delta-rs still writes (the ops
tables); a repaired partition reads ``VERSION AS OF`` the version before the repair; a plain Spark session
with nothing but Delta's extension opens a table the product wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore
from resources.spark import DELTA_CONF, jars_dir
from tests.support.jvm import QUICK_JIT
from tests.support.lake import table_rows
from warehouse_assets.ingest.ops_tables import INGESTED_COUNTS

DAYS = ["2026-03-01", "2026-03-02"]


def _derived(spark: SparkSession, store: DeltaStore, amount: str = "1.50", days: list[str] = DAYS) -> None:
    """A daily derived table, one partition overwrite per day, as the runtime writes it."""
    for day in days:
        rows = [(i, f"u{i % 3}", Decimal(amount), day) for i in range(4)]
        df = spark.createDataFrame(rows, "id bigint, user string, amount decimal(10,2), dt string")
        store.overwrite(("dws", "sales"), df, ["dt"], [{"dt": day}])


@pytest.fixture(scope="module")
def derived_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding the daily derived table (:func:`_derived`), written once for the module."""
    lake = tmp_path_factory.mktemp("derived") / "lake"
    _derived(spark, DeltaStore(str(lake)))
    return lake


@pytest.fixture
def derived(derived_lake: Path, tmp_path: Path) -> DeltaStore:
    """A copy of the module's lake for one test to read and write (the Delta log's paths are relative)."""
    shutil.copytree(derived_lake, tmp_path / "lake")
    return DeltaStore(str(tmp_path / "lake"))


def _ods(spark: SparkSession, store: DeltaStore) -> None:
    """An hourly ODS table, two change batches merged by key with tombstones, as the ingestion merges them."""
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("v", pa.string()),
            ("_es", pa.int64()),
            ("_pos", pa.int64()),
            ("_deleted", pa.bool_()),
            ("_op", pa.string()),
            ("dt", pa.string()),
            ("hh", pa.string()),
        ]
    )
    first = pa.table(
        [
            [1, 2, 3],
            ["a", "b", "c"],
            [1, 1, 1],
            [1, 2, 3],
            [False] * 3,
            ["INSERT"] * 3,
            [DAYS[0]] * 3,
            ["10", "10", "11"],
        ],
        schema=schema,
    )
    second = pa.table([[2], ["b"], [2], [4], [True], ["DELETE"], [DAYS[0]], ["10"]], schema=schema)
    for number, batch in enumerate((first, second), start=1):
        store.merge(
            spark,
            ("ods", "items"),
            batch,
            primary_key=["id"],
            partition_by=["dt", "hh"],
            app_transaction=("ingest:ods.items", number),
            tombstone_column="_deleted",
        )


def _spark_rows(
    spark: SparkSession, path: str, columns: list[str], version: int | None = None
) -> list[tuple[Any, ...]]:
    travel = f" VERSION AS OF {version}" if version is not None else ""
    return sorted(tuple(r) for r in spark.sql(f"SELECT * FROM delta.`{path}`{travel}").select(*columns).collect())


def _rs_rows(path: str, columns: list[str], version: int | None = None) -> list[tuple[Any, ...]]:
    data = table_rows(path, version=version).select(columns).to_pylist()
    return sorted(tuple(r[c] for c in columns) for r in data)


def _spark_version_and_partitions(spark: SparkSession, path: str) -> tuple[int, list[str]]:
    version = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    assert version is not None and detail is not None
    return int(version["version"]), list(detail["partitionColumns"])


def test_tables_spark_writes_read_the_same_with_delta_rs(spark: SparkSession, derived: DeltaStore) -> None:
    store = derived
    _ods(spark, store)
    for key, columns in (
        (("dws", "sales"), ["id", "user", "amount", "dt"]),
        (("ods", "items"), ["id", "v", "_deleted", "dt", "hh"]),
    ):
        path = store.table_uri(key)
        table = DeltaTable(path)
        version, partition_columns = _spark_version_and_partitions(spark, path)
        assert (table.version(), table.metadata().partition_columns) == (version, partition_columns)
        assert _rs_rows(path, columns) == _spark_rows(spark, path, columns)
        by_rs = sorted(tuple(sorted(p.items())) for p in table.partitions())
        by_spark = sorted(
            tuple(sorted((c, str(r[c])) for c in partition_columns))
            for r in spark.sql(f"SELECT DISTINCT {', '.join(partition_columns)} FROM delta.`{path}`").collect()
        )
        assert by_rs == by_spark
        # only table features both engines read: deletion vectors on the tables Spark merges into (delta-rs reads
        # them through DataFusion), none on the tables it overwrites; no column mapping
        protocol = table.protocol()
        features = {*(protocol.reader_features or []), *(protocol.writer_features or [])}
        merged = key[0] == "ods"
        assert features & {"deletionVectors", "columnMapping"} == ({"deletionVectors"} if merged else set())
        assert table.metadata().configuration.get("delta.enableDeletionVectors") == ("true" if merged else "false")
    ods = _rs_rows(store.table_uri(("ods", "items")), ["id", "v", "_deleted", "hh"])
    assert ods == [(1, "a", False, "10"), (2, "b", True, "10"), (3, "c", False, "11")]  # 2's tombstone
    assert DeltaTable(store.table_uri(("ods", "items"))).transaction_version("ingest:ods.items") == 2


def test_tables_delta_rs_writes_read_the_same_with_spark(spark: SparkSession, store: DeltaStore) -> None:
    entries: list[dict[str, object]] = [
        {"table": "ods.order", "stream": "s", "hour": f"{DAYS[0]}T{h:02d}", "rows": h, "seq_to": 1, "date": DAYS[0]}
        for h in range(3)
    ]
    store.append(INGESTED_COUNTS.key, INGESTED_COUNTS.rows(entries), INGESTED_COUNTS.partition_by)
    store.append(INGESTED_COUNTS.key, INGESTED_COUNTS.rows(entries[:1]), INGESTED_COUNTS.partition_by)
    path = store.table_uri(INGESTED_COUNTS.key)
    columns = ["table", "stream", "hour", "rows", "date"]
    assert _spark_rows(spark, path, columns) == _rs_rows(path, columns)
    assert _spark_version_and_partitions(spark, path) == (1, ["table", "date"])
    assert _spark_rows(spark, path, columns, version=0) == _rs_rows(path, columns, version=0)


def test_a_repaired_partition_reads_version_as_of_before_the_repair(spark: SparkSession, derived: DeltaStore) -> None:
    store = derived
    path = store.table_uri(("dws", "sales"))
    before = DeltaTable(path).version()
    _derived(spark, store, amount="9.00", days=DAYS[1:])  # the repair re-runs one day
    old = [(i, f"u{i % 3}", Decimal("1.50"), DAYS[1]) for i in range(4)]
    query = f"SELECT id, user, amount, dt FROM delta.`{path}` VERSION AS OF {before} WHERE dt = '{DAYS[1]}'"
    assert sorted(tuple(r) for r in spark.sql(query).collect()) == old
    now = f"SELECT amount FROM delta.`{path}` WHERE dt = '{DAYS[1]}'"
    assert {r[0] for r in spark.sql(now).collect()} == {Decimal("9.00")}


PLAIN_SESSION = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    jars, conf = sys.argv[1], json.loads(sys.argv[2])
    builder = SparkSession.builder.master("local[1]").config("spark.driver.extraClassPath", jars)
    for name, value in conf.items():
        builder = builder.config(name, value)
    spark = builder.config("spark.ui.enabled", "false").getOrCreate()
    path = sys.stdin.readline().strip()  # the table to read, once the test has written it
    rows = spark.sql(f"SELECT id, user, CAST(amount AS STRING) AS amount, dt FROM delta.`{path}`").collect()
    print(json.dumps(sorted([list(r) for r in rows])))
    spark.stop()
    """
)


@dataclass
class PlainSession:
    process: subprocess.Popen[str]
    log: Path  # what it printed on stderr


@pytest.fixture(scope="module", autouse=True)
def plain_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlainSession]:
    """A plain Spark session's process, started with the module's first test: its JVM and session start while the
    other tests run, and waits for the path of the table it reads."""
    folder = tmp_path_factory.mktemp("plain")
    script = folder / "plain_reader.py"
    script.write_text(PLAIN_SESSION)
    with (folder / "stderr.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, str(script), str(jars_dir() / "*"), json.dumps(DELTA_CONF)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            # a JVM living seconds: C1's compiles alone (half the CPU of C2's, which so short a life never pays back)
            env={**os.environ, "JAVA_TOOL_OPTIONS": QUICK_JIT},
        )
    try:
        yield PlainSession(process, folder / "stderr.log")
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_a_plain_spark_session_with_only_deltas_extension_reads_a_product_table(
    derived: DeltaStore, plain_session: PlainSession
) -> None:
    store = derived
    process = plain_session.process
    out, _ = process.communicate(store.table_uri(("dws", "sales")) + "\n", timeout=600)
    assert process.returncode == 0, plain_session.log.read_text()[-3000:]
    rows = json.loads(out.strip().splitlines()[-1])
    assert rows == sorted([[i, f"u{i % 3}", "1.50", day] for day in DAYS for i in range(4)])
