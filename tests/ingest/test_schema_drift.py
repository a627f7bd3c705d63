"""Schema drift keeps every value, and re-applying the same segments changes nothing."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from simulator.cdc import SimulationConfig, simulate
from tests.support import oracle
from tests.support.lake import row_dicts, table_rows
from warehouse_assets.catalog import load_catalog
from warehouse_assets.ingest.merge import QUARANTINE_KEY, ingest_batch, ingest_table, spark_type_of_mysql

CATALOG = load_catalog()


def _live(store: DeltaStore, fqn: str) -> list[dict]:
    table = CATALOG[fqn]
    rows = row_dicts(store.table_uri(table.key))
    oracle.assert_each_key_live_once(rows, table.primary_key, table.partition_by)
    return [r for r in rows if not r["_deleted"]]


def test_a_new_source_column_joins_the_ods_table(spark: SparkSession, tmp_path: Path) -> None:
    landing_dir = tmp_path / "landing"
    simulate(
        landing_dir,
        datetime(2026, 3, 2),
        datetime(2026, 3, 2, 12),
        SimulationConfig(scale=0.05, schema_drift_at=datetime(2026, 3, 2, 6)),
    )
    store = DeltaStore(str(tmp_path / "lake"))
    report = ingest_table(spark, store, Landing(landing_dir), CATALOG["ods.user"], max_segments_per_stream=36)
    assert [b.new_columns for b in report.batches if b.new_columns] == [["phone"]]
    rows = {r["id"]: r for r in _live(store, "ods.user")}
    truth = oracle.replay(landing_dir)["user"]
    assert set(rows) == set(truth)
    with_phone = {k for k, r in truth.items() if r.get("phone")}
    assert with_phone, "the drifted rows should carry a phone"
    for key, row in truth.items():
        assert rows[key]["phone"] == row.get("phone"), key


def test_a_changed_column_type_is_quarantined_with_its_value(spark: SparkSession, tmp_path: Path) -> None:
    stream = tmp_path / "landing" / "binlog" / "edu_user" / "user_00"
    stream.mkdir(parents=True)
    row = {
        "id": "4",
        "name": "n",
        "city": "c",
        "grade": "G3",
        "channel": "x",
        "create_time": "2026-03-02 10:00:00",
        "update_time": "2026-03-02 10:00:00",
    }
    message = {
        "id": 1,
        "database": "edu_user",
        "table": "user_00",
        "pkNames": ["id"],
        "isDdl": False,
        "type": "INSERT",
        "es": 1772416800000,
        "ts": 1772416800100,
        "sql": "",
        "mysqlType": {"grade": "varchar(8)"},
        "sqlType": {},
        "data": [row],
        "old": None,
    }
    (stream / "000001-20260302T1000.jsonl").write_text(json.dumps(message) + "\n")
    store = DeltaStore(str(tmp_path / "lake"))
    report = ingest_table(spark, store, Landing(tmp_path / "landing"), CATALOG["ods.user"])
    assert report.total("rows_quarantined") == 1
    quarantined = row_dicts(store.table_uri(QUARANTINE_KEY))
    assert quarantined[0]["reason"] == "bad value for grade: G3"
    assert (quarantined[0]["segment"], quarantined[0]["line"]) == ("000001-20260302T1000.jsonl", 1)


def test_mysql_types_map_to_spark_types() -> None:
    assert spark_type_of_mysql("varchar(20)") == "string"
    assert spark_type_of_mysql("bigint(20) unsigned") == "bigint"
    assert spark_type_of_mysql("decimal(12, 4)") == "decimal(12,4)"
    assert spark_type_of_mysql("datetime") == "timestamp"


def test_applying_the_same_segments_twice_changes_no_content(spark: SparkSession, tmp_path: Path) -> None:
    landing_dir = tmp_path / "landing"
    simulate(landing_dir, datetime(2026, 3, 2), datetime(2026, 3, 2, 8), SimulationConfig(scale=0.05, dup_rate=0.02))
    landing = Landing(landing_dir)
    tables = [CATALOG[fqn] for fqn in ("ods.order", "ods.user")]
    once = DeltaStore(str(tmp_path / "once"))
    for table in tables:
        ingest_table(spark, once, landing, table)
    # the same lake (the Delta logs' paths are relative), then every segment applied to it a second time
    shutil.copytree(tmp_path / "once", tmp_path / "twice")
    twice = DeltaStore(str(tmp_path / "twice"))
    for table in tables:
        segments = [
            s
            for st in landing.streams(table.source_database or "", table.source_tables or "")
            for s in landing.segments(st)
        ]
        ingest_batch(spark, twice, table, segments)  # the whole stream delivered a second time
        assert _content(once, table.key).equals(_content(twice, table.key)), table.fqn


def _content(store: DeltaStore, key: list[str]) -> pa.Table:
    data = table_rows(store.table_uri(key))
    return data.sort_by([(name, "ascending") for name in data.column_names])


def _user_message(msg_id: int, table: str, row: dict[str, str | None], mysql_types: dict[str, str]) -> str:
    return json.dumps(
        {
            "id": msg_id,
            "database": "edu_user",
            "table": table,
            "pkNames": ["id"],
            "isDdl": False,
            "type": "INSERT",
            "es": 1772416800000 + msg_id,
            "ts": 1772416800100 + msg_id,
            "sql": "",
            "mysqlType": mysql_types,
            "sqlType": {},
            "data": [row],
            "old": None,
        }
    )


@pytest.mark.parametrize(
    ("table", "key", "reason"),
    [
        ("user_01", "5", "unexpected table edu_user.user_01 in stream edu_user.user_00"),  # the whole line
        ("user_00", None, "missing primary key id"),  # its only record
    ],
)
def test_a_quarantined_record_does_not_change_the_schema(
    spark: SparkSession, tmp_path: Path, table: str, key: str | None, reason: str
) -> None:
    stream = tmp_path / "landing" / "binlog" / "edu_user" / "user_00"
    stream.mkdir(parents=True)
    types = {"id": "bigint(20)", "name": "varchar(32)", "create_time": "datetime", "update_time": "datetime"}
    row: dict[str, str | None] = {
        "id": "4",
        "name": "n",
        "city": "c",
        "grade": "3",
        "channel": "x",
        "create_time": "2026-03-02 10:00:00",
        "update_time": "2026-03-02 10:00:00",
    }
    applied = _user_message(1, "user_00", row, types)
    drifted = _user_message(2, table, {**row, "id": key, "coupon": "C1"}, {**types, "coupon": "varchar(16)"})
    (stream / "000001-20260302T1000.jsonl").write_text(applied + "\n" + drifted + "\n")

    store = DeltaStore(str(tmp_path / "lake"))
    report = ingest_table(spark, store, Landing(tmp_path / "landing"), CATALOG["ods.user"])
    batch = report.batches[0]
    assert (batch.rows_in, batch.rows_applied, batch.rows_quarantined) == (2, 1, 1)
    assert batch.new_columns == []
    schema = DeltaTable(store.table_uri(CATALOG["ods.user"].key)).schema().to_arrow()
    assert "coupon" not in pa.schema(schema).names  # type: ignore[call-overload]
    assert [r["id"] for r in _live(store, "ods.user")] == [4]
    quarantined = row_dicts(store.table_uri(QUARANTINE_KEY))
    assert [(q["line"], q["reason"], q["raw"]) for q in quarantined] == [(2, reason, drifted)]
