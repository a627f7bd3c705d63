"""The ops tables: declared once, maintained like every table, read by a readiness tick only where it judges."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.readiness_history import build_history, tick
from resources.delta_lake import DeltaLakeResource, DeltaStore, ReadStats, storage_options
from resources.spark import SparkResource
from warehouse_assets.catalog import load_catalog
from warehouse_assets.ingest.maintenance import build_maintenance
from warehouse_assets.ingest.ops_tables import (
    INGESTED_CHANGES,
    INGESTED_COUNTS,
    INGESTION_POSITIONS,
    OPS_TABLES,
    QUARANTINE,
)


class RecordingStore(DeltaStore):
    """A store that remembers what each read of rows read."""

    reads: list[tuple[tuple[str, ...], ReadStats, int]]

    def read_rows(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        rows, stats = super().read_rows(key, *args, **kwargs)
        self.reads.append((tuple(key), stats, rows.num_rows))
        return rows, stats


def _one_tick(root: Path, days: int) -> tuple[list[str], list[tuple[tuple[str, ...], ReadStats, int]], int]:
    """What one tick reports and reads, and how many files ``ops.ingested_counts`` holds."""
    history = build_history(root, days)
    store = RecordingStore(history.store.root)
    store.reads = []
    files_in_table = len(store.live_files(INGESTED_COUNTS.key)[0])
    return tick(replace(history, store=store)), store.reads, files_in_table


def test_a_readiness_tick_reads_the_same_ops_files_and_rows_at_30_and_300_days(tmp_path: Path) -> None:
    reported_30, reads_30, files_30 = _one_tick(tmp_path / "d30", 30)
    reported_300, reads_300, files_300 = _one_tick(tmp_path / "d300", 300)
    assert reported_30 == reported_300 == ["2026-10-31-22:00", "2026-10-31-23:00"]
    read_keys = [INGESTION_POSITIONS.key, INGESTED_COUNTS.key]
    assert [key for key, _, _ in reads_30] == [key for key, _, _ in reads_300] == read_keys
    # the positions: the committed batch's partition only, one row per shard stream
    (_, positions_30, streams_30), (_, positions_300, streams_300) = reads_30[0], reads_300[0]
    assert (positions_30.files_read, streams_30) == (positions_300.files_read, streams_300) == (1, 2)
    (_, stats_30, rows_30), (_, stats_300, rows_300) = reads_30[1], reads_300[1]
    # ten times the history in the table, the same files and rows read: the lookback week and the day after
    assert files_300 == 10 * files_30 == 300
    assert (stats_300.files_read, rows_300) == (stats_30.files_read, rows_30)
    assert stats_30.files_read == 8 and rows_30 == 8 * 24 * 2  # 8 dates of one daily batch, 2 shard streams


def test_lake_maintenance_compacts_checkpoints_and_vacuums_the_ops_tables(tmp_path: Path) -> None:
    store = DeltaStore(str(tmp_path / "lake"), time_travel_hours=0)
    for batch in range(1, 13):  # twelve small batches of the same day: one file each
        entries: list[dict[str, object]] = [
            {"table": "ods.order", "stream": "edu_trade.order_00", "hour": f"2026-03-02T{batch:02d}"}
            | {"rows": 5, "seq_to": batch, "date": "2026-03-02"}
        ]
        store.append(INGESTED_COUNTS.key, INGESTED_COUNTS.rows(entries), INGESTED_COUNTS.partition_by)
    for ops in (QUARANTINE, INGESTED_CHANGES, INGESTION_POSITIONS):  # one batch each: maintained too
        store.append(ops.key, ops.schema.empty_table(), ops.partition_by)
    table_dir = Path(store.table_uri(INGESTED_COUNTS.key))
    assert len(store.live_files(INGESTED_COUNTS.key)[0]) == 12

    job, _ = build_maintenance(load_catalog())
    lake = DeltaLakeResource(root=store.root, time_travel_hours=0)
    # no catalog table exists in this lake: the Spark resource is declared by the op but no session starts
    result = job.execute_in_process(resources={"lake": lake, "spark": SparkResource()})
    assert result.success
    done = result.output_for_node("maintain_lake")
    assert set(done) == {ops.fqn for ops in OPS_TABLES}  # every ops table is maintained
    assert done["ops.ingested_counts"]["files_compacted"] == 12
    assert len(store.live_files(INGESTED_COUNTS.key)[0]) == 1
    assert (table_dir / "_delta_log" / "_last_checkpoint").is_file()
    data_files = [p for p in table_dir.rglob("*.parquet") if "_delta_log" not in p.parts]
    assert len(data_files) == 1  # the twelve replaced files vacuumed (a zero time-travel window)
    rows, _ = store.read_rows(INGESTED_COUNTS.key, [{"table": "ods.order", "date": "2026-03-02"}])
    assert sorted(rows.column("seq_to").to_pylist()) == list(range(1, 13))


def test_app_transactions_survive_compaction(tmp_path: Path) -> None:
    store = DeltaStore(str(tmp_path / "lake"))
    rows = INGESTED_COUNTS.rows(
        [{"table": "t", "stream": "s", "hour": "2026-03-02T00", "rows": 1, "seq_to": 1, "date": "2026-03-02"}]
    )
    for seq in (1, 2, 3):
        store.append(INGESTED_COUNTS.key, rows, INGESTED_COUNTS.partition_by, app_transactions={"counts:t:s": seq})
    store.maintain(INGESTED_COUNTS.key, compact=True)
    assert store.app_versions(INGESTED_COUNTS.key, ["counts:t:s", "other"]) == {"counts:t:s": 3, "other": 0}


def test_lake_storage_options_come_from_dagster_deltalake_and_the_environment() -> None:
    env = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "eu-west-1"}
    assert storage_options("data/lake", env) == {}
    s3 = storage_options("s3://bucket/lake", env)
    assert {k: s3[k] for k in ("access_key_id", "secret_access_key", "region")} == {
        "access_key_id": "AKIA",
        "secret_access_key": "secret",
        "region": "eu-west-1",
    }
    assert "provider" not in s3
    assert storage_options("gs://bucket/lake", {"GOOGLE_SERVICE_ACCOUNT": "/k.json"})["service_account"] == "/k.json"
    # explicit options of the resource win over the environment's
    lake = DeltaLakeResource(root="s3://bucket/lake", storage_options={"region": "us-east-1"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_REGION", "eu-west-1")
        assert lake.store().storage_options["region"] == "us-east-1"
    with pytest.raises(Exception, match="unsupported scheme"):
        storage_options("ftp://host/lake", {})


def test_the_delta_layer_with_dagster_deltalake_imports_no_pyspark() -> None:
    code = "import sys, resources.delta_lake, dagster_deltalake; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_s3_endpoint_configures_both_engines_and_bad_values_fail_clearly() -> None:
    from resources.spark import s3a_conf

    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000/", "AWS_REGION": "us-east-1"}
    s3 = storage_options("s3://bucket/lake", env)
    assert s3["endpoint"] == "http://127.0.0.1:9000/"
    assert {k: s3[k] for k in ("allow_http", "virtual_hosted_style_request")} == {
        "allow_http": "true",
        "virtual_hosted_style_request": "false",
    }
    assert s3a_conf(env) == {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
    }
    # AWS's own S3: no endpoint, virtual-hosted addressing, https
    assert s3a_conf({}) == {}
    aws = storage_options("s3://bucket/lake", {})
    assert "endpoint" not in aws and "allow_http" not in aws and "virtual_hosted_style_request" not in aws
    for bad in ("127.0.0.1:9000", "ftp://host", "http://host:0", "http://host/path"):
        with pytest.raises(ValueError, match="AWS_ENDPOINT_URL"):
            s3a_conf({"AWS_ENDPOINT_URL": bad})
