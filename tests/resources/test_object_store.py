"""The lake on an S3-compatible object store (moto's server on loopback): the product's ODS merge and derived
overwrite through Spark's Delta on ``s3a://``, read back by delta-rs on ``s3://`` with the options the environment
gives it; two concurrent writers of one table lose nothing with each engine's documented S3 commit coordination
(delta-rs: conditional put; Spark's Delta: S3SingleDriverLogStore, writers inside one driver)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from resources.delta_lake import DeltaStore, storage_options
from resources.spark import port_open
from tests.support.dev_stack import free_port

pytestmark = pytest.mark.stack

BUCKET = "lake"


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    """moto's S3 server on a free loopback port, in a process of its own (a server thread in this process would
    wait for the GIL that a blocking delta-rs call holds), one for the module: the JVM caches its s3a file system
    per bucket, so a second server on another port would leave Spark calling the first one's dead port."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", port):
            assert server.poll() is None, f"moto's server exited with {server.returncode}"
            assert time.monotonic() < deadline, "moto's server did not open its port within 60 s"
            time.sleep(0.2)
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }
        s3 = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name=env["AWS_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        s3.create_bucket(Bucket=BUCKET)
        with pytest.MonkeyPatch.context() as monkeypatch:
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            yield env
    finally:
        server.terminate()
        server.wait(timeout=30)


def _run_concurrently(write: Callable[[int], None], writers: tuple[int, ...]) -> list[BaseException]:
    """Runs ``write(writer)`` for every writer in a thread of its own, all at once; returns what they raised."""
    errors: list[BaseException] = []

    def guarded(writer: int) -> None:
        try:
            write(writer)
        except BaseException as exc:  # noqa: BLE001 - returned to the test, which asserts there were none
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_two_concurrent_delta_rs_writers_on_s3_lose_nothing(s3_env: dict[str, str]) -> None:
    root = f"s3://{BUCKET}/warehouse"
    store = DeltaStore(root, storage_options(root, s3_env))
    schema = pa.schema([("writer", pa.int64()), ("n", pa.int64())])
    store.create_table(("ods", "events"), schema, partition_by=[])
    rounds = 5

    def write(writer: int) -> None:
        for n in range(rounds):
            store.append(("ods", "events"), pa.table({"writer": [writer], "n": [n]}, schema=schema), [])

    assert _run_concurrently(write, writers=(1, 2)) == []
    table = store.table(("ods", "events"))
    rows = sorted(zip(*store.read_rows(("ods", "events"))[0].to_pydict().values(), strict=True))
    assert rows == sorted((w, n) for w in (1, 2) for n in range(rounds))
    assert table.version() == 2 * rounds  # one commit per append after the create: none overwrote another


@pytest.fixture(scope="module")
def s3_spark(spark: SparkSession, s3_env: dict[str, str]) -> SparkSession:
    """The test session's one JVM pointed at moto: it was built before moto started, so its endpoint and keys go
    in as per-bucket s3a keys (a deployment's sessions get ``s3a_conf()`` when built and inherit AWS_* keys)."""
    from resources.spark import s3a_conf

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for name, value in s3a_conf(s3_env).items():
        hadoop.set(name.replace("spark.hadoop.fs.s3a.", f"fs.s3a.bucket.{BUCKET}."), value)
    hadoop.set(f"fs.s3a.bucket.{BUCKET}.access.key", s3_env["AWS_ACCESS_KEY_ID"])
    hadoop.set(f"fs.s3a.bucket.{BUCKET}.secret.key", s3_env["AWS_SECRET_ACCESS_KEY"])
    return spark


def _rows(store: DeltaStore, key: tuple[str, ...], columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted(zip(*store.read_rows(key, columns=columns)[0].to_pydict().values(), strict=True))


def test_an_ods_merge_and_a_derived_overwrite_through_spark_on_s3_read_back_by_delta_rs(
    s3_spark: SparkSession, s3_env: dict[str, str]
) -> None:
    root = f"s3://{BUCKET}/spark"
    store = DeltaStore(root, storage_options(root, s3_env))
    ods, dwd = ("ods", "order"), ("dwd", "order_detail")
    batch = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "amount": pa.array([10, 20, 30], pa.int64()),
            "dt": ["2026-01-01", "2026-01-01", "2026-01-02"],
            "_es": pa.array([1, 1, 1], pa.int64()),
            "_pos": pa.array([1, 2, 3], pa.int64()),
            "_op": ["INSERT", "INSERT", "INSERT"],
        }
    )
    first = store.merge(s3_spark, ods, batch, primary_key=["id"], partition_by=["dt"], app_transaction=("shard-0", 1))
    changes = pa.table(
        {
            "id": pa.array([2, 3], pa.int64()),
            "amount": pa.array([21, 30], pa.int64()),
            "dt": ["2026-01-01", "2026-01-02"],
            "_es": pa.array([2, 2], pa.int64()),
            "_pos": pa.array([4, 5], pa.int64()),
            "_op": ["UPDATE", "DELETE"],
        }
    )
    second = store.merge(
        s3_spark, ods, changes, primary_key=["id"], partition_by=["dt"], app_transaction=("shard-0", 2)
    )
    # the same batch again: its app transaction is recorded, Delta applies nothing
    store.merge(s3_spark, ods, changes, primary_key=["id"], partition_by=["dt"], app_transaction=("shard-0", 2))
    table = store.table(ods)
    assert table is not None and second.version > first.version
    assert _rows(store, ods, ["id", "amount", "dt"]) == [(1, 10, "2026-01-01"), (2, 21, "2026-01-01")]
    assert store.app_versions(ods, ["shard-0"]) == {"shard-0": 2}

    live, _ = store.read(s3_spark, ods, partitions=[{"dt": "2026-01-01"}])
    daily = live.groupBy("dt").agg(F.sum("amount").alias("gmv"), F.count("*").alias("orders"))
    written = store.overwrite(dwd, daily, ["dt"], [{"dt": "2026-01-01"}])
    assert written.rows == 1
    derived = store.table(dwd)
    assert derived is not None and derived.version() == written.version
    assert _rows(store, dwd, ["dt", "gmv", "orders"]) == [("2026-01-01", 31, 2)]


def test_two_spark_writers_of_one_table_on_s3_lose_nothing(s3_spark: SparkSession, s3_env: dict[str, str]) -> None:
    """Two threads of the one driver overwrite partitions of one table at once: Delta's S3SingleDriverLogStore
    serialises their log writes in the driver, and a conflicting commit is written again on the new version."""
    root = f"s3://{BUCKET}/writers"
    store = DeltaStore(root, storage_options(root, s3_env))
    key, rounds = ("dws", "daily"), 3
    store.overwrite(
        key,
        s3_spark.createDataFrame([("2026-01-01", 0, 0)], "dt string, writer int, n int"),
        ["dt"],
        [{"dt": "2026-01-01"}],
    )

    def write(writer: int) -> None:
        for n in range(rounds):
            dt = f"2026-02-{writer * 10 + n:02d}"
            df = s3_spark.createDataFrame([(dt, writer, n)], "dt string, writer int, n int")
            store.overwrite(key, df, ["dt"], [{"dt": dt}])

    assert _run_concurrently(write, writers=(1, 2)) == []
    table = store.table(key)
    assert table is not None
    expected = [("2026-01-01", 0, 0)] + [(f"2026-02-{w * 10 + n:02d}", w, n) for w in (1, 2) for n in range(rounds)]
    assert _rows(store, key, ["dt", "writer", "n"]) == sorted(expected)
    assert table.version() == 2 * rounds  # one commit per write after the first: none replaced another
