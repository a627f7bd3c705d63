"""The product's stack on a PostgreSQL instance (dagster_home/postgres/dagster.yaml; docs/operations.md).

A PostgreSQL server from the machine's packages (`make system-packages` installs Debian's `postgresql`) runs on a
free loopback port from a data directory of its own; `warehouse dev` runs against it as
tests/test_embedded_stack.py runs the embedded stack. With no click, ingestion, ODS readiness and the engine build
a DWD, DWS and ADS day, and the runs, their events and the sensors' ticks are rows in PostgreSQL, none in SQLite.

The stack's catalog is the chain the test asserts on, ``ods.order`` to ``ads.daily_gmv``
(``WAREHOUSE_CATALOG_DIR``): what is stored where does not depend on how many tables write it, and the whole graph
runs in the embedded stack's own test.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterRunStatus

from tests.support.dev_stack import (
    DAY,
    ROOT,
    STACK_TIMEOUT_S,
    await_partition,
    free_port,
    launched_by_the_stack,
    start_stack,
)
from tests.support.jvm import SESSION_JIT
from warehouse_assets.catalog import TABLES_DIR
from warehouse_assets.center.state_store import PartitionStateStore

pytestmark = [pytest.mark.stack, pytest.mark.timeout(STACK_TIMEOUT_S)]

POSTGRES_INSTANCE = ROOT / "dagster_home" / "postgres" / "dagster.yaml"
CHAIN = ["ods/order.yaml", "dwd/order_detail.sql", "dws/user_order_daily.sql", "ads/daily_gmv.sql"]
IN_PROGRESS = {
    status.value
    for status in (
        DagsterRunStatus.QUEUED,
        DagsterRunStatus.NOT_STARTED,
        DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED,
        DagsterRunStatus.CANCELING,
    )
}
USER, DATABASE = "dagster", "dagster"


def _postgres_bin() -> Path:
    """The directory of ``initdb`` and ``postgres``: on PATH, else Debian's versioned one (newest first)."""
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).parent] if on_path else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "postgres").exists():
            return directory
    pytest.skip(
        "PostgreSQL is not installed: no initdb on PATH nor in /usr/lib/postgresql/*/bin "
        "(`make system-packages` installs Debian's postgresql when run as root)"
    )


def _server_user() -> pwd.struct_passwd | None:
    """PostgreSQL refuses to run as root: then the server runs as Debian's `postgres` user, else `nobody`."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.skip("running as root and neither a `postgres` nor a `nobody` user exists to run PostgreSQL")


@pytest.fixture(scope="module")
def postgres() -> Iterator[dict[str, str]]:
    """A PostgreSQL server on a free loopback port, password authentication; the instance's DAGSTER_PG_* settings."""
    bin_dir, user = _postgres_bin(), _server_user()
    as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
    # under /tmp rather than pytest's tmp_path: its base directory is private to root, out of the server user's reach
    base = Path(tempfile.mkdtemp(prefix="warehouse-postgres-"))
    password = secrets.token_hex(16)
    (base / "password").write_text(password)
    if user:
        for path in (base, base / "password"):
            os.chown(path, user.pw_uid, user.pw_gid)
    data, port = base / "data", free_port()
    subprocess.run(
        [bin_dir / "initdb", "-D", data, "-U", USER, f"--pwfile={base / 'password'}", "--auth=scram-sha-256"]
        + ["--encoding=UTF8", "--locale=C", "--no-sync"],
        check=True,
        capture_output=True,
        **as_user,
    )
    log = (base / "postgres.log").open("wb")
    server = subprocess.Popen(
        [bin_dir / "postgres", "-D", data, "-p", str(port), "-c", "listen_addresses=127.0.0.1"]
        # no Unix socket (nothing to collide with the machine's own server); a test server need not survive a crash
        + ["-c", "unix_socket_directories=", "-c", "fsync=off"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **as_user,
    )
    try:
        connect = {"host": "127.0.0.1", "port": port, "user": USER, "password": password}
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"PostgreSQL exited: {(base / 'postgres.log').read_text()[-2000:]}"
            try:
                admin = psycopg2.connect(dbname="postgres", **connect)
                break
            except psycopg2.OperationalError:
                assert time.monotonic() < deadline, "PostgreSQL did not accept connections within 60 s"
                time.sleep(0.5)
        admin.autocommit = True  # CREATE DATABASE runs outside a transaction
        admin.cursor().execute(f"CREATE DATABASE {DATABASE}")
        admin.close()
        yield {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(port),
            "DAGSTER_PG_USER": USER,
            "DAGSTER_PG_PASSWORD": password,
            "DAGSTER_PG_DB": DATABASE,
        }
    finally:
        try:
            os.killpg(server.pid, signal.SIGINT)  # PostgreSQL's fast shutdown
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
        shutil.rmtree(base, ignore_errors=True)


def _query(settings: dict[str, str], sql: str, *args: object) -> list[tuple]:
    with (
        psycopg2.connect(
            host=settings["DAGSTER_PG_HOST"],
            port=settings["DAGSTER_PG_PORT"],
            user=settings["DAGSTER_PG_USER"],
            password=settings["DAGSTER_PG_PASSWORD"],
            dbname=settings["DAGSTER_PG_DB"],
        ) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, args)
        return cursor.fetchall()


def test_the_postgres_instance_differs_from_the_embedded_one_only_in_storage() -> None:
    embedded = yaml.safe_load((ROOT / "dagster_home" / "dagster.yaml").read_text())
    production = yaml.safe_load(POSTGRES_INSTANCE.read_text())
    assert {k: v for k, v in production.items() if k != "storage"} == {
        k: v for k, v in embedded.items() if k != "storage"
    }, "dagster_home/postgres/dagster.yaml must keep the embedded instance's settings besides its storage"
    settings = production["storage"]["postgres"]["postgres_db"]
    assert settings["scheme"] == "postgresql+psycopg2"  # the driver dagster-postgres depends on
    assert {name: value["env"] for name, value in settings.items() if name != "scheme"} == {
        "hostname": "DAGSTER_PG_HOST",
        "port": "DAGSTER_PG_PORT",
        "username": "DAGSTER_PG_USER",
        "password": "DAGSTER_PG_PASSWORD",
        "db_name": "DAGSTER_PG_DB",
    }


def test_the_stack_on_postgres_builds_a_day_without_a_click(
    postgres: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(POSTGRES_INSTANCE, home / "dagster.yaml")
    tables = tmp_path / "tables"
    for name in CHAIN:
        (tables / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(TABLES_DIR / name, tables / name)
    for name, value in {"DAGSTER_HOME": str(home), "WAREHOUSE_CATALOG_DIR": str(tables), **postgres}.items():
        monkeypatch.setenv(name, value)
    port, target, day = free_port(), AssetKey(["ads", "daily_gmv"]), f"{DAY:%Y-%m-%d}"
    # the stack's Spark Connect server lives these few minutes, its busiest the first: C1 alone compiles it, in the
    # code cache each worker's session has (in C1's default 48 MB its sweeper recompiles: 8 JVM CPU s more here)
    jit = {"JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {SESSION_JIT}".strip()}
    with start_stack(tmp_path, home, port, free_port(), env={**postgres, **jit}) as proc:
        instance = await_partition(proc, port, home, target, day)
        # read while the stack runs: stopping it kills the runs it started meanwhile (the next hours' work)
        runs = dict(_query(postgres, "SELECT run_id, status FROM runs"))
    hours = {f"{day}-{hour:02d}:00" for hour in range(24)}
    assert hours <= instance.get_materialized_partitions(AssetKey(["ods", "order"]))
    for key in (["dwd", "order_detail"], ["dws", "user_order_daily"]):
        assert day in instance.get_materialized_partitions(AssetKey(key)), key
    # the day was built by a run the stack launched (a sensor or the dependency center), none by hand
    latest = instance.fetch_materializations(AssetRecordsFilter(asset_key=target, asset_partitions=[day]), limit=1)
    run = instance.get_run_by_id(latest.records[0].run_id)
    assert run is not None and launched_by_the_stack(run), run and run.tags

    # the instance's rows are PostgreSQL's: runs, their events and the sensors' ticks; nothing in Dagster's SQLite
    finished = {run_id: status for run_id, status in runs.items() if status not in IN_PROGRESS}
    assert finished and set(finished.values()) == {DagsterRunStatus.SUCCESS.value}, runs
    assert run.run_id in runs
    assert (run.run_id,) in _query(
        postgres,
        "SELECT run_id FROM event_logs WHERE dagster_event_type = %s AND asset_key = %s AND partition = %s",
        DagsterEventType.ASSET_MATERIALIZATION.value,
        target.to_string(),
        day,
    )
    assert _query(postgres, "SELECT count(*) FROM job_ticks")[0][0] > 0
    assert not (home / "history").exists() and not (home / "schedules").exists(), sorted(home.rglob("*.db"))

    # what reads the instance outside Dagster's processes reads it from PostgreSQL too: the partition state store
    # (replayed from the event log) and `warehouse why`
    store = PartitionStateStore(instance, tmp_path / "partition_states.db")
    store.rebuild()
    for key in (["ods", "order"], ["dwd", "order_detail"], ["dws", "user_order_daily"], target.path):
        materialized = {s.partition for s in store.all_states() if s.asset_key == "/".join(key) and s.materialized}
        assert materialized == instance.get_materialized_partitions(AssetKey(key)), key
    state = store.states(target, [day])[day]
    assert state.run_id == run.run_id and not state.in_progress and not state.failed, state
    store.close()
    why = subprocess.run(
        [sys.executable, "-m", "warehouse_assets.cli", "why", "ads.daily_gmv", day],
        cwd=ROOT,
        env={
            **os.environ,
            "WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"),
            "WAREHOUSE_LANDING_ROOT": str(tmp_path / "landing"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert why.returncode == 0 and "it is built: nothing to build" in why.stdout, why.stdout + why.stderr
