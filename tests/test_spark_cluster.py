"""The warehouse on a Spark cluster (docs/operations.md: "A Spark cluster").

A standalone master and one worker, separate JVMs started from the pyspark wheel (``spark-class``), on
loopback. The same slice runs three times on one simulated source (two ODS tables ingested with ``MERGE INTO``,
a chain through every layer overwritten partition by partition for two days, one table Z-ordered with
``OPTIMIZE ... ZORDER BY``): with the test session's local Spark, with ``WAREHOUSE_SPARK_MODE=master`` (the
driver in its own process, the executors on the worker), and with ``connect`` through a Spark Connect server
started by ``warehouse spark-server`` in front of the cluster. Every table each run wrote must equal the local
run's, row for row. The executors receive Delta's jars from the session (``spark.jars``), never from a
hand-made classpath: the worker is started with none; and not the s3a jars (the AWS SDK's 690 MB), the lake being on
a local path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import instance_for_test
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources import LandingResource, resources_from_env
from resources.spark import port_open, s3a_jar, spark_home
from simulator.cdc import SimulationConfig, simulate
from tests.support.dev_stack import free_port
from tests.support.instances import memory_backed_dir, pooled_event_log
from tests.support.jvm import QUICK_JIT
from tests.support.lake import row_dicts
from warehouse_assets.catalog import load_catalog
from warehouse_assets.cli.headless import materialize_range, run_ingest
from warehouse_assets.materialize.zorder import build_zorder_job

# a test's limit covers the module's fixtures in its first test: a standalone cluster and the local reference run
pytestmark = [pytest.mark.spark, pytest.mark.stack, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
WAREHOUSE = Path(sys.executable).parent / "warehouse"
TZ = ZoneInfo("Asia/Shanghai")
START, END = datetime(2026, 1, 1, tzinfo=TZ), datetime(2026, 1, 3, tzinfo=TZ)  # two days
SEGMENT_MINUTES = 1440  # one landing segment per shard and day: the ingestion is not what is tested here
SLICE = ["dwd.user_snapshot", "dwd.order_detail", "dws.user_order_daily", "ads.daily_gmv"]
ODS = ["ods.order", "ods.user"]
ZORDERED = {"table": "dwd.order_detail", "partitions": ["2026-01-01", "2026-01-02"]}
TIMEOUT = 600.0


def _materialize(lake: Path, landing: Path, env: Mapping[str, str]) -> bool:
    """The headless path (``warehouse ingest`` of the slice's ODS tables, then ``warehouse materialize``)."""
    resources = resources_from_env({**env, "WAREHOUSE_LAKE_ROOT": str(lake), "WAREHOUSE_LANDING_ROOT": str(landing)})
    resources["landing"] = LandingResource(root=str(landing), timezone=str(TZ), segment_minutes=SEGMENT_MINUTES)
    # one pooled event log on memory-backed storage (tests/support/instances.py): the hour reports are stored in less
    # than half the time Dagster's in-memory storage takes
    with (
        memory_backed_dir("cluster-home-") as home,
        instance_for_test(temp_dir=str(home), overrides=pooled_event_log(home)) as instance,
    ):
        run_ingest(instance, resources, ODS)  # MERGE INTO
        if not materialize_range(instance, resources, START, END, tables=SLICE, ingest=False):  # partition overwrites
            return False
        zorder = build_zorder_job(load_catalog()).execute_in_process(  # OPTIMIZE ... ZORDER BY
            run_config={"ops": {"zorder_partition_files": {"config": ZORDERED}}},
            instance=instance,
            resources={"lake": resources["lake"], "spark": resources["spark"]},
        )
        return zorder.success


def _rows(lake: Path, fqn: str) -> list[str]:
    layer, name = fqn.split(".")
    return sorted(json.dumps(row, sort_keys=True, default=str) for row in row_dicts(lake / layer / name))


def _start(args: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    try:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()  # the child holds its own descriptor


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _run(args: list[str], env: Mapping[str, str], log: Path) -> None:
    process = _start(args, env, log)
    try:
        code = process.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _stop(process)
    assert code == 0, f"{' '.join(args[1:4])} ended with {code}:\n" + log.read_text()[-4000:]


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as response:
            return int(json.load(response).get("aliveworkers", 0))
    except OSError:
        return 0


@dataclass
class Cluster:
    """A standalone master and worker started on loopback: the master URL, a folder for logs, their env."""

    url: str
    ui_port: int
    root: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]]

    def ready(self) -> Cluster:
        """The cluster once a worker has registered with the master (the worker retries until the master listens)."""
        deadline = time.monotonic() + 120
        while _alive_workers(self.ui_port) < 1:
            for process, log in zip(self.processes, ("master.log", "worker.log"), strict=True):
                assert process.poll() is None, (self.root / log).read_text()
            assert time.monotonic() < deadline, "no worker registered with the master within 120 s"
            time.sleep(0.5)
        return self


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The master and the worker, both started at once and not waited for: their JVMs start while the module's
    other fixtures (the source, the local reference run) are built; a test waits with :meth:`Cluster.ready`."""
    root = tmp_path_factory.mktemp("cluster")
    home = spark_home()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(root / "logs"),
        "PYSPARK_PYTHON": sys.executable,
        # every JVM of the module (master, worker, executors, drivers, the Connect server) lives a minute or two:
        # compiled by C1 alone it spends about half the CPU it spends with C2's optimizing compiles, which so short
        # a life never pays back; the results are the same
        "JAVA_TOOL_OPTIONS": QUICK_JIT,
    }
    port, ui_port = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = str(home / "bin" / "spark-class")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(
            _start(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(ui_port)],
                env, root / "master.log",
            )
        )  # fmt: skip
        processes.append(
            _start(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "2",
                 "--memory", "4g", "--work-dir", str(root / "work"), "--webui-port", str(free_port())],
                env, root / "worker.log",
            )
        )  # fmt: skip
        yield Cluster(url, ui_port, root, env, processes)
    finally:
        for process in reversed(processes):
            _stop(process)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    landing = tmp_path_factory.mktemp("source") / "landing"
    simulate(
        landing,
        datetime(2026, 1, 1),
        datetime(2026, 1, 3),
        SimulationConfig(seed=5, scale=0.03, batch_minutes=SEGMENT_MINUTES),
    )
    return landing


@pytest.fixture(scope="module")
def local_lake(source: Path, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("local") / "lake"
    landing = lake.parent / "landing"
    shutil.copytree(source, landing)
    assert _materialize(lake, landing, {}), "the local run failed"  # the test session's Spark settings
    return lake


def _assert_same_tables(lake: Path, local_lake: Path) -> None:
    for fqn in [*ODS, *SLICE]:
        expected = _rows(local_lake, fqn)
        assert expected, f"the local run wrote no {fqn}"
        assert _rows(lake, fqn) == expected, f"{fqn} differs from the local run's"
    # the same history too: the Z-order committed last on both
    zordered = DeltaTable(str(lake / "dwd" / "order_detail")).history(1)[0]["operation"]
    assert zordered == "OPTIMIZE", zordered


@pytest.mark.parametrize("mode", ["master", "connect"])
def test_the_slice_on_a_cluster_equals_the_local_run(
    mode: str, cluster: Cluster, source: Path, local_lake: Path
) -> None:
    url, root, cluster_env = cluster.ready().url, cluster.root, cluster.env
    lake, landing = root / mode / "lake", root / mode / "landing"
    shutil.copytree(source, landing)
    env = {**cluster_env, "WAREHOUSE_SPARK_MODE": mode, "WAREHOUSE_SPARK_MASTER": url}
    apps_before = set((root / "work").glob("app-*"))
    server = None
    if mode == "connect":
        port = free_port()
        server_env = {**env, "WAREHOUSE_LOG_DIR": str(root / mode)}
        server = _start([str(WAREHOUSE), "spark-server", "--port", str(port)], server_env, root / mode / "server.log")
        env["WAREHOUSE_SPARK_CONNECT_URL"] = f"sc://127.0.0.1:{port}"
        env["WAREHOUSE_LOG_DIR"] = str(root / mode)  # where the run finds the server's token
        deadline = time.monotonic() + 180
        while not port_open("127.0.0.1", port):
            assert server.poll() is None, (root / mode / "server.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the Spark Connect server did not listen within 180 s"
            time.sleep(0.5)
    try:
        _run([sys.executable, "-m", "tests.test_spark_cluster", str(lake), str(landing)], env, root / mode / "run.log")
    finally:
        if server is not None:
            _stop(server)
    if mode == "connect":  # `warehouse spark-server` stopped by SIGTERM stops its server (a process group of its own)
        deadline = time.monotonic() + 30
        while port_open("127.0.0.1", port):
            assert time.monotonic() < deadline, "the Spark Connect server outlived `warehouse spark-server`"
            time.sleep(0.5)
    _assert_same_tables(lake, local_lake)
    # the work ran on the cluster: the worker started an executor for this mode's application
    apps = set((root / "work").glob("app-*")) - apps_before
    assert apps, "the worker ran no executor for this run"
    # with Delta's jars from the session, and not the AWS SDK's 690 MB: the lake is on a local path
    sent = {jar.name for app in apps for jar in app.glob("*/*.jar")}
    assert any(name.startswith("delta-spark") for name in sent), sorted(sent)
    assert not [name for name in sent if s3a_jar(Path(name))], sorted(sent)


def main(argv: list[str]) -> int:
    """The subprocess side: the slice with the Spark that WAREHOUSE_SPARK_MODE names (one session per process)."""
    lake, landing = (Path(arg) for arg in argv)
    os.chdir(ROOT)
    return 0 if _materialize(lake, landing, os.environ) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
