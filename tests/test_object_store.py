"""The lake on an S3-compatible object store (moto's server on loopback): delta-rs with the options the
environment gives it, and two concurrent writers of one table losing nothing (S3 conditional writes)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import boto3
import pyarrow as pa
import pytest
from moto.server import ThreadedMotoServer

from resources.delta_lake import DeltaStore, storage_options

BUCKET = "lake"


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1").create_bucket(Bucket=BUCKET)
    try:
        yield env
    finally:
        server.stop()


def test_two_concurrent_delta_rs_writers_on_s3_lose_nothing(s3_env: dict[str, str]) -> None:
    root = f"s3://{BUCKET}/warehouse"
    store = DeltaStore(root, storage_options(root, s3_env))
    schema = pa.schema([("writer", pa.int64()), ("n", pa.int64())])
    store.create_table(("ods", "events"), schema, partition_by=[])
    errors: list[BaseException] = []
    rounds = 5

    def write(writer: int) -> None:
        try:
            for n in range(rounds):
                store.append(("ods", "events"), pa.table({"writer": [writer], "n": [n]}, schema=schema), [])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    table = store.table(("ods", "events"))
    rows = sorted(zip(*table.to_pyarrow_table().to_pydict().values(), strict=True))
    assert rows == sorted((w, n) for w in (1, 2) for n in range(rounds))
    assert table.version() == 2 * rounds  # one commit per append after the create: none overwrote another


def test_spark_writes_s3a_and_delta_rs_reads_the_same_rows_and_version(spark, s3_env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    from resources.spark import s3a_conf

    # the test session's one JVM was built before moto started: its endpoint goes in as per-bucket s3a keys
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for name, value in s3a_conf(s3_env).items():
        hadoop.set(name.replace("spark.hadoop.fs.s3a.", f"fs.s3a.bucket.{BUCKET}."), value)
    # nor does its environment hold moto's keys (a real deployment's JVM inherits AWS_ACCESS_KEY_ID...)
    hadoop.set(f"fs.s3a.bucket.{BUCKET}.access.key", s3_env["AWS_ACCESS_KEY_ID"])
    hadoop.set(f"fs.s3a.bucket.{BUCKET}.secret.key", s3_env["AWS_SECRET_ACCESS_KEY"])
    root = f"s3://{BUCKET}/spark"
    store = DeltaStore(root, storage_options(root, s3_env))
    rows = spark.createDataFrame([(1, "2026-01-01", "a"), (2, "2026-01-02", "b")], "id long, dt string, v string")
    rows.write.format("delta").partitionBy("dt").save(store.spark_path(("dwd", "t")))
    rows.limit(1).write.format("delta").mode("append").save(store.spark_path(("dwd", "t")))
    table = store.table(("dwd", "t"))
    assert table is not None and table.version() == 1
    got = sorted(zip(*table.to_pyarrow_table().select(["id", "dt", "v"]).to_pydict().values(), strict=True))
    assert got == sorted(tuple(r) for r in rows.union(rows.limit(1)).collect())
