"""The capture connector against a real MariaDB: its binlog → landing segments → ODS tables equal to the source.

A MariaDB server (Debian's ``mariadb-server``, installed by ``make system-mariadb``) is started once for the module
on a free loopback port with a row-based binlog; each test starts on an emptied binlog (``RESET MASTER``) and fresh
databases holding the example warehouse's sharded ``order`` (``edu_trade.order_00``..``order_03``) and ``user``
(``edu_user.user_00``..``user_03``) tables with the simulated source's columns. The workload sets each statement's
binlog time (``SET TIMESTAMP``), so windows and hours are known in advance.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.support import oracle
from tests.support.lake import row_dicts
from warehouse_assets import cli
from warehouse_assets.catalog import load_catalog
from warehouse_assets.ingest.capture import (
    STATE_FILE,
    CaptureState,
    RowsChange,
    SegmentWriter,
    Source,
    canal_value,
    load_state,
)
from warehouse_assets.ingest.merge import ingest_table, ingested_counts
from warehouse_assets.ingest.readiness import hour_key, readiness, ready_hours

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]  # MariaDB started, windows waited on

CATALOG = load_catalog()
TZ = ZoneInfo("Asia/Shanghai")
WAREHOUSE = Path(sys.executable).with_name("warehouse")
SHARDS = 4
ORDER_COLUMNS = (
    "id bigint(20) PRIMARY KEY, user_id bigint(20) NOT NULL, course_id bigint(20), amount decimal(10,2), "
    "status varchar(16), pay_time datetime NULL, create_time datetime NOT NULL, update_time datetime"
)
USER_COLUMNS = (
    "id bigint(20) PRIMARY KEY, name varchar(64), city varchar(32), grade tinyint(4), channel varchar(32), "
    "create_time datetime NOT NULL, update_time datetime"
)
PASSWORD = "capture-test"


def _binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class MariaDB:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"mysql://warehouse@127.0.0.1:{self.port}"

    def connect(self) -> Any:
        import pymysql

        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="warehouse", password=PASSWORD, autocommit=True, charset="utf8mb4"
        )


@pytest.fixture(scope="module")
def mariadb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    """One server for the module's tests (initialising and starting one costs seconds); :func:`mariadb` empties it."""
    server, install = _binary("mariadbd"), _binary("mariadb-install-db")
    if server is None or install is None:
        pytest.skip("MariaDB is not installed: `make system-mariadb` installs Debian's mariadb-server (as root)")
    tmp_path = tmp_path_factory.mktemp("mariadb")
    datadir = tmp_path / "mariadb"
    run_dir = Path(tempfile.mkdtemp(prefix="mdb"))  # a unix socket path must stay short
    user = ["--user=root"] if os.geteuid() == 0 else []
    subprocess.run(
        [install, "--no-defaults", f"--datadir={datadir}", "--auth-root-authentication-method=normal",
         "--skip-test-db", *user],
        check=True, capture_output=True,
    )  # fmt: skip
    port = _free_port()
    log = open(tmp_path / "mariadb.log", "wb")  # noqa: SIM115 - open while the server runs
    process = subprocess.Popen(
        [server, "--no-defaults", *user, f"--datadir={datadir}", f"--socket={run_dir}/sock", f"--port={port}",
         "--bind-address=127.0.0.1", "--log-bin=binlog", "--binlog-format=ROW", "--binlog-row-metadata=FULL",
         "--server-id=1", "--default-time-zone=+08:00", "--character-set-server=utf8mb4",
         "--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for_socket(run_dir / "sock", process, tmp_path / "mariadb.log")
        subprocess.run(
            [_binary("mariadb") or "mariadb", "--no-defaults", f"--socket={run_dir}/sock", "-uroot", "-e",
             f"CREATE USER 'warehouse'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}';"
             "GRANT ALL ON *.* TO 'warehouse'@'127.0.0.1';"],
            check=True, capture_output=True,
        )  # fmt: skip
        yield MariaDB(port, process)
    finally:
        _stop_group(process)
        log.close()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def mariadb(mariadb_server: MariaDB) -> MariaDB:
    """The module's server as a new one is: no binary log (a capture from the earliest position sees only this test's
    changes) and only the warehouse's empty source tables."""
    with mariadb_server.connect() as conn, conn.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS edu_trade")
        cur.execute("DROP DATABASE IF EXISTS edu_user")
        cur.execute("RESET MASTER")  # deletes every binary log, the drops above included
    _create_schema(mariadb_server)
    return mariadb_server


def _wait_for_socket(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"MariaDB did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)


def _stop_group(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        os.killpg(process.pid, sig)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _create_schema(db: MariaDB) -> None:
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE edu_trade")
        cur.execute("CREATE DATABASE edu_user")
        for database in ("edu_trade", "edu_user"):  # what pt-heartbeat (or the capture's heartbeat) updates
            cur.execute(f"CREATE TABLE {database}.heartbeat (id bigint PRIMARY KEY, ts datetime NOT NULL)")
        for shard in range(SHARDS):
            cur.execute(f"CREATE TABLE edu_trade.order_{shard:02d} ({ORDER_COLUMNS})")
            cur.execute(f"CREATE TABLE edu_user.user_{shard:02d} ({USER_COLUMNS})")


# --- the workload: statements at set binlog times, with the row changes each made ------------------------------


@dataclass
class Workload:
    """Runs statements at chosen binlog times and counts the row changes per stream and local hour."""

    conn: Any
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)

    def at(self, when: datetime, stream: str, sql: str, args: Any = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SET TIMESTAMP = %s", (int(when.timestamp()),))
            changed = cur.execute(sql, args)
        if changed:
            local = when.astimezone(TZ)
            window = local.replace(minute=local.minute - local.minute % 5).strftime("%Y-%m-%dT%H:%M")
            self.counts[(stream, window)] += changed  # the source counts per 5-minute window

    def uncounted(self, when: datetime, sql: str) -> None:
        """A statement whose changes are no ODS table's (DDL, the heartbeat table)."""
        with self.conn.cursor() as cur:
            cur.execute("SET TIMESTAMP = %s", (int(when.timestamp()),))
            cur.execute(sql)

    def new_user(self, when: datetime, user_id: int, rng: random.Random) -> None:
        self.at(
            when,
            f"edu_user.user_{user_id % SHARDS:02d}",
            f"INSERT INTO edu_user.user_{user_id % SHARDS:02d} VALUES (%s, %s, %s, %s, %s, NOW(), NOW())",
            (user_id, f"用户{user_id}", rng.choice(["北京", "上海", "成都"]), rng.randint(1, 12), "wechat"),
        )

    def new_order(self, when: datetime, order_id: int, user_id: int, coupon: str | None = None) -> None:
        shard = f"order_{user_id % SHARDS:02d}"
        extra = ("", "") if coupon is None else (", coupon", ", %s")
        self.at(
            when,
            f"edu_trade.{shard}",
            f"INSERT INTO edu_trade.{shard} (id, user_id, course_id, amount, status, create_time, update_time"
            f"{extra[0]}) VALUES (%s, %s, %s, %s, 'created', NOW(), NOW(){extra[1]})",
            (order_id, user_id, order_id % 7 + 1, f"{99 + order_id % 5 * 100}.50", *([coupon] if coupon else [])),
        )

    def order_update(self, when: datetime, order_id: int, user_id: int, assignments: str) -> None:
        shard = f"order_{user_id % SHARDS:02d}"
        self.at(when, f"edu_trade.{shard}", f"UPDATE edu_trade.{shard} SET {assignments} WHERE id = %s", (order_id,))


def _base() -> datetime:
    """Two hours before the current hour began (business time): the workload's hours are all in the past."""
    now = datetime.now(TZ).replace(minute=0, second=0, microsecond=0)
    return now - timedelta(hours=2)


def _mixed_workload(db: MariaDB, base: datetime) -> Workload:
    """Inserts, updates (one moving a row to another hour), deletes, multi-row statements, a transaction over
    two shards and ``ALTER TABLE ... ADD COLUMN`` on every order shard, over a bit more than an hour."""
    rng = random.Random(14)
    work = Workload(db.connect())
    minute = timedelta(minutes=1)
    for user_id in range(1, 13):
        work.new_user(base + user_id * 20 * timedelta(seconds=1), user_id, rng)
    users = {o: rng.randint(1, 12) for o in range(1, 41)}
    for order_id in range(1, 31):
        work.new_order(base + (2 + order_id) * minute, order_id, users[order_id])
    for order_id in range(1, 21):  # paid
        work.order_update(
            base + (10 + order_id) * minute,
            order_id,
            users[order_id],
            "status = 'paid', pay_time = NOW(), update_time = NOW()",
        )
    for order_id in (21, 22, 23):
        shard = f"order_{users[order_id] % SHARDS:02d}"
        work.at(base + 33 * minute, f"edu_trade.{shard}", f"DELETE FROM edu_trade.{shard} WHERE id = %s", (order_id,))
    # one statement changing several rows of a shard (one Canal message with several rows)
    shard = f"order_{users[24] % SHARDS:02d}"
    work.at(
        base + 34 * minute,
        f"edu_trade.{shard}",
        f"UPDATE edu_trade.{shard} SET status = 'cancelled', update_time = NOW() WHERE status = 'created'",
    )
    # a create_time moved an hour later: the key leaves its hour for the next
    work.order_update(base + 35 * minute, 5, users[5], "create_time = create_time + INTERVAL 1 HOUR")
    for shard_no in range(SHARDS):
        work.uncounted(base + 36 * minute, f"ALTER TABLE edu_trade.order_{shard_no:02d} ADD COLUMN coupon varchar(16)")
    for order_id in range(31, 37):
        work.new_order(base + (37 + order_id - 31) * minute, order_id, users[order_id], coupon=f"C{order_id}")
    work.order_update(base + 45 * minute, 2, users[2], "coupon = 'LATE', update_time = NOW()")
    # one transaction over two shards
    work.conn.begin()
    work.new_order(base + 50 * minute, 37, 4)
    work.new_order(base + 50 * minute, 38, 5)
    work.conn.commit()
    work.at(base + 52 * minute, "edu_user.user_03", "DELETE FROM edu_user.user_03 WHERE id = 11")
    work.at(
        base + 53 * minute,
        "edu_user.user_01",
        "UPDATE edu_user.user_01 SET city = '杭州', update_time = NOW() WHERE id = 1",
    )
    # the next hour: more orders, and a user multi-row insert
    for order_id in (39, 40):
        work.new_order(base + (62 + order_id - 39) * minute, order_id, users[order_id], coupon=None)
    work.at(
        base + 70 * minute,
        "edu_user.user_00",
        "INSERT INTO edu_user.user_00 VALUES (20, 'a', '北京', 3, 'app', NOW(), NOW()),"
        " (24, 'b', '上海', 4, 'app', NOW(), NOW())",
    )
    return work


# --- running the capture --------------------------------------------------------------------------------------


def _start_capture(db: MariaDB, landing: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "WAREHOUSE_LANDING_ROOT": str(landing),
        "WAREHOUSE_CAPTURE_PASSWORD": PASSWORD,
    }
    log = open(landing.parent / "capture.log", "ab")  # noqa: SIM115 - the child holds it
    return subprocess.Popen(
        [str(WAREHOUSE), "capture", "--source", db.url, "--server-id", "77", *extra],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _wait_until_closed(landing: Path, until: datetime, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until the capture has closed every window before ``until`` (its open window starts at or after it)."""
    deadline = time.monotonic() + timeout
    while True:
        state = load_state(landing) if (landing / STATE_FILE).exists() else None
        if state is not None and state.window is not None and state.window >= until.timestamp() * 1000:
            return
        if process.poll() is not None or time.monotonic() > deadline:
            log = (landing.parent / "capture.log").read_text(errors="replace")
            raise AssertionError(
                f"the capture did not close the windows before {until} (exit {process.poll()}):\n{log}"
            )
        time.sleep(0.2)


def _source_rows(db: MariaDB, database: str, table: str) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    with db.connect() as conn, conn.cursor() as cur:
        for shard in range(SHARDS):
            cur.execute(f"SELECT * FROM {database}.{table}_{shard:02d}")
            names = [d[0] for d in cur.description]
            for values in cur.fetchall():
                row = dict(zip(names, values, strict=True))
                rows[int(row["id"])] = row
    return rows


def _ods_rows(store: DeltaStore, fqn: str) -> dict[int, dict[str, Any]]:
    table = CATALOG[fqn]
    rows = row_dicts(store.table_uri(table.key))
    oracle.assert_each_key_live_once(rows, table.primary_key, table.partition_by)
    return {int(r["id"]): r for r in rows if not r["_deleted"]}


def _assert_ods_equals_source(db: MariaDB, store: DeltaStore, fqn: str, database: str, table: str) -> None:
    source, ods = _source_rows(db, database, table), _ods_rows(store, fqn)
    assert sorted(ods) == sorted(source), f"{fqn}: keys differ from the source's"
    for key, row in source.items():
        for column, value in row.items():
            expected = value.replace(tzinfo=TZ) if isinstance(value, datetime) else value
            assert ods[key][column] == expected, f"{fqn} id={key} {column}: {ods[key][column]!r} != {expected!r}"


def _assert_counts_match(store: DeltaStore, landing: Landing, work: Workload, fqn: str) -> None:
    table = CATALOG[fqn]
    ingested, _ = ingested_counts(store, table)
    streams = landing.streams(table.source_database, table.source_tables)  # type: ignore[attr-defined]
    for stream in streams:
        published = {w: n for w, n in landing.source_counts(stream).items() if n}
        made = {w: n for (s, w), n in work.counts.items() if s == stream}
        assert published == made, f"{stream}: the published counts differ from the row changes made"
        made_hours: Counter[str] = Counter()
        for window, n in made.items():
            made_hours[window[:13]] += n
        assert ingested.rows.get(stream, {}) == made_hours, f"{stream}: the ingested counts differ from the source's"


def _ingest(spark: SparkSession, tmp_path: Path, landing: Landing) -> DeltaStore:
    store = DeltaStore(str(tmp_path / "lake"))
    for fqn in ("ods.order", "ods.user"):
        ingest_table(spark, store, landing, CATALOG[fqn])
    return store


# --- the connector's parts, without a server --------------------------------------------------------------------


def _change(stream: str, when: datetime, row_id: int) -> RowsChange:
    database, table = stream.split(".")
    row = {"id": str(row_id), "create_time": when.strftime("%Y-%m-%d %H:%M:%S")}
    return RowsChange(
        database, table, "INSERT", int(when.timestamp()) * 1000, ("id",),
        {"id": "bigint(20)", "create_time": "datetime"}, {"id": -5, "create_time": 93}, (row,),
    )  # fmt: skip


def _landing_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_windows_written_again_after_a_crash_are_the_same_bytes_and_counts(tmp_path: Path) -> None:
    t0 = datetime(2026, 3, 2, 9, 58, tzinfo=TZ)
    minute = timedelta(minutes=1)
    streams = ["edu_trade.order_00", "edu_trade.order_01", "edu_trade.heartbeat"]
    transactions = [  # (changes, commit time, position where the transaction begins)
        ([_change("edu_trade.order_00", t0, 1)], t0, ("binlog.000001", 100)),
        ([_change("edu_trade.order_01", t0 + minute, 2)], t0 + minute, ("binlog.000001", 200)),
        ([_change("edu_trade.order_00", t0 + 3 * minute, 3)], t0 + 3 * minute, ("binlog.000001", 300)),
        ([_change("edu_trade.heartbeat", t0 + 14 * minute, 1)], t0 + 14 * minute, ("binlog.000002", 4)),
        ([], t0 + 21 * minute, ("binlog.000002", 400)),
    ]

    def replay(root: Path, state: CaptureState, first: int) -> SegmentWriter:
        writer = SegmentWriter(Landing(root), state, streams)
        for changes, when, position in transactions[first:]:
            writer.commit(changes, int(when.timestamp() * 1000), position)
        return writer

    whole = replay(tmp_path / "whole", CaptureState("binlog.000001", 4), 0)
    assert whole.state.log_file == "binlog.000002" and whole.state.log_pos == 400
    files = _landing_files(tmp_path / "whole")
    assert sorted(f for f in files if f.startswith("binlog/edu_trade/order_00/")) == [
        "binlog/edu_trade/order_00/000001-20260302T0955.jsonl",
        "binlog/edu_trade/order_00/000002-20260302T1000.jsonl",
        "binlog/edu_trade/order_00/000003-20260302T1005.jsonl",  # empty: the shard was idle, and says so
        "binlog/edu_trade/order_00/000004-20260302T1010.jsonl",
    ]
    assert files["binlog/edu_trade/order_00/000003-20260302T1005.jsonl"] == b""
    # counted per 5-minute window, the idle ones as 0
    assert files["counts/edu_trade/order_00.jsonl"] == (
        b'{"window": "2026-03-02T09:55", "rows": 1}\n{"window": "2026-03-02T10:00", "rows": 1}\n'
        b'{"window": "2026-03-02T10:05", "rows": 0}\n{"window": "2026-03-02T10:10", "rows": 0}\n'
    )
    # killed while closing the second window: the first close was saved; some later files, the counts
    # included, were written already (as in the run above) when the process died
    partial = tmp_path / "partial"
    writer = SegmentWriter(Landing(partial), CaptureState("binlog.000001", 4), streams)
    for changes, when, position in transactions[:3]:
        writer.commit(changes, int(when.timestamp() * 1000), position)  # closes the first window
    for name in ("binlog/edu_trade/order_00/000002-20260302T1000.jsonl", "counts/edu_trade/order_00.jsonl"):
        (partial / name).write_bytes(files[name])
    saved = load_state(partial)
    assert saved is not None and (saved.log_file, saved.log_pos) == ("binlog.000001", 300)
    resumed = replay(partial, saved, 2)  # re-reads from binlog.000001:300, the third transaction
    assert _landing_files(partial) == files
    assert resumed.state.to_json() == whole.state.to_json()


def test_canal_values_and_source_urls() -> None:
    assert canal_value(datetime(2026, 3, 2, 10, 5, 7)) == "2026-03-02 10:05:07"
    assert canal_value(Decimal("19.90")) == "19.90"
    assert canal_value(None) is None and canal_value(7) == "7"
    assert Source.parse("mysql://cdc@db.internal:3307", "pw") == Source("db.internal", 3307, "cdc", "pw")
    with pytest.raises(ValueError, match="WAREHOUSE_CAPTURE_PASSWORD"):
        Source.parse("mysql://cdc:secret@db:3306")
    with pytest.raises(ValueError, match="expected mysql://USER@HOST"):
        Source.parse("postgres://cdc@db:5432")


# --- tests ----------------------------------------------------------------------------------------------------


def test_capture_mirrors_inserts_updates_deletes_and_a_new_column_into_the_ods_tables(
    mariadb: MariaDB, spark: SparkSession, tmp_path: Path
) -> None:
    base = _base()
    work = _mixed_workload(mariadb, base)
    landing_dir = tmp_path / "landing"
    # started after the workload, from the binlog's start; its own heartbeat (real time) closes the windows
    capture = _start_capture(mariadb, landing_dir, "--start", "earliest", "--heartbeat-seconds", "1")
    try:
        _wait_until_closed(landing_dir, base + timedelta(hours=2), capture)
    finally:
        _stop_group(capture)
    assert capture.returncode == 0, (tmp_path / "capture.log").read_text()

    landing = Landing(landing_dir)
    order_streams = landing.streams("edu_trade", "order_[0-9]{2}")
    assert order_streams == [f"edu_trade.order_{i:02d}" for i in range(SHARDS)]
    # the simulator's layout: contiguous segments per shard from 1, one per 5-minute window, heartbeats too
    for stream in [*order_streams, "edu_trade.heartbeat", "edu_user.user_00", "edu_user.heartbeat"]:
        segments = landing.segments(stream)
        assert len(segments) == len(list(landing.stream_dir(stream).glob("*.jsonl"))) >= 24, stream
        assert all(b.start == a.end for a, b in zip(segments, segments[1:], strict=False)), stream
    assert landing.heartbeat_clock("edu_trade") is not None

    store = _ingest(spark, tmp_path, landing)
    _assert_ods_equals_source(mariadb, store, "ods.order", "edu_trade", "order")
    _assert_ods_equals_source(mariadb, store, "ods.user", "edu_user", "user")
    assert _ods_rows(store, "ods.order")[36]["coupon"] == "C36"  # the column added by ALTER TABLE
    _assert_counts_match(store, landing, work, "ods.order")
    _assert_counts_match(store, landing, work, "ods.user")
    # and so the readiness sensor's rule finds the workload's two hours complete: watermark and counts
    hours = [hour_key(base), hour_key(base + timedelta(hours=1))]
    for fqn in ("ods.order", "ods.user"):
        assert ready_hours(readiness(store, landing, CATALOG[fqn]), None)[:2] == hours, fqn


def test_the_capture_command_names_a_missing_or_bad_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WAREHOUSE_CAPTURE_SOURCE", raising=False)
    with pytest.raises(SystemExit, match="give --source"):
        cli.main(["capture"])
    with pytest.raises(SystemExit, match="WAREHOUSE_CAPTURE_PASSWORD"):
        cli.main(["capture", "--source", "mysql://cdc:secret@db:3306"])


def test_a_killed_capture_restarts_where_it_left_off_losing_and_duplicating_nothing(
    mariadb: MariaDB, spark: SparkSession, tmp_path: Path
) -> None:
    base = _base()
    landing_dir = tmp_path / "landing"
    capture = _start_capture(mariadb, landing_dir, "--start", "current", "--heartbeat-seconds", "0")
    in_flight, resume = threading.Event(), threading.Event()
    try:
        deadline = time.monotonic() + 60
        while not (landing_dir / STATE_FILE).exists():  # its start position is saved before it reads
            assert capture.poll() is None and time.monotonic() < deadline, (tmp_path / "capture.log").read_text()
            time.sleep(0.1)
        work = Workload(mariadb.connect())
        rng = random.Random(3)
        step = timedelta(seconds=12)

        def produce() -> None:  # 400 transactions over 80 minutes of binlog time: 16 windows
            for i in range(1, 401):
                when = base + i * step
                user_id = rng.randint(1, 50)
                if i % 5 == 0 and i - 3 in _order_user:
                    work.order_update(when, i - 3, _order_user[i - 3], "status = 'paid', update_time = NOW()")
                elif i % 7 == 0:
                    work.new_user(when, 1000 + i, rng)
                else:
                    _order_user[i] = user_id
                    work.new_order(when, i, user_id)
                if i == 150:  # the capture is killed here, with changes of its open window in flight
                    in_flight.set()
                    resume.wait(120)
                time.sleep(0.005)

        _order_user: dict[int, int] = {}
        producer = threading.Thread(target=produce)
        producer.start()
        assert in_flight.wait(120), "the workload did not reach its middle"
        _wait_until_closed(landing_dir, base + timedelta(minutes=25), capture)
        os.killpg(capture.pid, signal.SIGKILL)
        capture.wait()
        killed_at = load_state(landing_dir)
        # no heartbeat of its own either: its row would race the source's heartbeat below for the same key
        capture = _start_capture(mariadb, landing_dir, "--heartbeat-seconds", "0")
        resume.set()
        producer.join()
        # the source's heartbeat after the workload's last window closes it (a counted change would stay open)
        work.uncounted(base + timedelta(hours=2), "INSERT INTO edu_user.heartbeat VALUES (1, NOW())")
        _wait_until_closed(landing_dir, base + timedelta(hours=2), capture)
    finally:
        resume.set()
        _stop_group(capture)
    assert killed_at is not None and killed_at.window is not None
    assert killed_at.window <= (base + 150 * step).timestamp() * 1000, "nothing was in flight when it was killed"

    landing = Landing(landing_dir)
    seen: Counter[str] = Counter()
    for stream in landing.streams("edu_trade", "order_[0-9]{2}") + landing.streams("edu_user", "user_[0-9]{2}"):
        segments = landing.segments(stream)
        assert len(segments) == len(list(landing.stream_dir(stream).glob("*.jsonl"))), f"{stream}: a gap"
        ids = []
        for segment in segments:
            for line in segment.path.read_text(encoding="utf-8").splitlines():
                message = json.loads(line)
                ids.append(message["id"])
                for row in message["data"]:
                    seen[json.dumps([stream, message["type"], message["es"], row], sort_keys=True)] += 1
        assert ids == list(range(1, len(ids) + 1)), f"{stream}: message ids are not 1..n"
    duplicated = [change for change, n in seen.items() if n > 1]
    assert not duplicated, f"changes written twice: {duplicated[:3]}"
    assert sum(seen.values()) == sum(work.counts.values()), "row changes lost"

    store = _ingest(spark, tmp_path, landing)
    _assert_ods_equals_source(mariadb, store, "ods.order", "edu_trade", "order")
    _assert_ods_equals_source(mariadb, store, "ods.user", "edu_user", "user")
    _assert_counts_match(store, landing, work, "ods.order")
    _assert_counts_match(store, landing, work, "ods.user")
