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
