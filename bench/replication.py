"""Benchmark: replication lag of a day of hourly partitions to a second lake, on the embedded stack and directly.

**On the stack** (the default run): the processes of the embedded stack as the soak starts them (``warehouse
spark-server``, ``dagster-webserver``, ``dagster-daemon run``, ``warehouse engine``, ``bench/soak.py``'s
``Supervisor``) on a temporary ``DAGSTER_HOME`` with the instance's ``dagster.yaml``, lake and landing area, and
``WAREHOUSE_SITES`` naming site ``dc2``, a second lake root in the same temporary folder. The catalog is a small one of
its own (``WAREHOUSE_CATALOG_DIR``): the example's ``ods.order`` and ``dws.order_hourly``, copied, the hourly table
given ``replicate_to: dc2`` (so the stack also has the replica asset ``dc2/dws/order_hourly`` and the ``replication``
sensor). The warehouse starts yesterday (business time); the bench plays the source: it lands
the simulated CDC segments of yesterday's hours one at a time (``--scale``), the next once the previous hour's
``dws.order_hourly`` partition is built, so the replica of one hour is published while the next is ingested, as in a
live day. Each hour goes through the product's whole path: the landing sensor's ingestion, the engine's run of the
hourly partition (one Delta overwrite commit), the ``replication`` sensor's tick (every 5 s at most), the replica run's
launch by Dagster, and its copy, publication (one commit on dc2) and verification.

For each publication (the first of each hour, and the republications of hours rebuilt by the late-data policy),
the lag is the source commit's time (the source table's Delta log entry of the version the replica run published)
-> the replica's publish commit time (the replica table's log entry of its version), and where it went: ``report``
(source commit -> the build's materialization), ``sensor`` (-> the replica run created), ``launch`` (-> its first
step), ``copy`` (-> the replica's commit: the run's copy, commit and verification). Then every hour's replica must
hold the source's latest build (its application transaction on the replica, read by delta-rs) with the same rows
(both read by delta-rs), every Dagster run the bench started must have succeeded, and ``warehouse status`` on the
stack must print dc2's lag (``status_lag=1``).

**Directly** (replication's own, ``own_*``): two lake roots, each hour of one day committed at site 1 by delta-rs
(``--rows`` per hour in ``--files`` files, one commit) and replicated at once by ``replicate_partition``, then a ranged
rewrite of six hours in one commit replicated again (their old files removed). No sensor, no run launch.

``lag_p50_s``/``lag_p90_s``/``lag_max_s``: over the stack's publications; ``hours``: the hours fed; ``published``:
hours published; ``publications``: replica commits; ``verified``: hours whose replica holds the source's latest build
with equal rows; ``report_p50_s``/``sensor_p50_s``/``sensor_p90_s``/``launch_p50_s``/``copy_p50_s``: the stages;
``runs``/``failed_runs``: the stack's runs; ``status_lag``; ``own_lag_p50_s``/``own_lag_p90_s``/``own_lag_max_s``/
``own_partitions``/``own_commits``/``own_removed``/``own_mb``/``own_equal``: the direct path (``own_equal=1``: site 2
reads the same rows as site 1). The ``RESULT`` line carries ``calib_ms`` and ``calib_spark_ms`` (the Spark one on the
stack's Spark Connect server, ``bench/calibration.py``). Exits 1 when an hour was not published and verified, a run
did not succeed, ``warehouse status`` showed no lag, or the direct path's replica differs.

    flock /tmp/bench.lock nice -n 10 .venv/bin/python bench/replication.py   # 24 hours on the stack; 200,000 rows
    .venv/bin/python bench/replication.py --quick    # 2 hours on the stack, 2,000 rows directly: about 2 minutes
    .venv/bin/python bench/replication.py --direct   # the direct path alone: seconds, no JVM
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from bench.calibration import calib_ms, calib_spark_connect_ms
from bench.handoff_latency import _failed_runs, _first_step, _sensor_ticked, _wait_until_idle
from bench.processes import LEFTOVER_GRACE_S, free_port
from bench.soak import Supervisor
from resources.delta_read import DeltaReader
from resources.delta_replica import Replicated, app_id, commit_time, replicate_partition
from resources.settings import Settings

KEY = ["dwd", "order_detail"]
DAY = "2026-03-01"
TZ = ZoneInfo(Settings.from_env().timezone)
SITE = "dc2"
QUICK_ODS_INTERVAL = 2  # seconds between the landing sensor's ticks in --quick (the product's: 15)
SOURCE = ["dws", "order_hourly"]  # the stack's replicated table (its path on both lakes)
TABLES = ("ods/order.yaml", "dws/order_hourly.sql")  # the example's tables the stack's catalog copies


def say(text: str) -> None:
    print(f"[replication {datetime.now():%H:%M:%S}] {text}", flush=True)


def _p(values: list[float], q: float) -> float:
    """The q-quantile (0.5, 0.9) of ``values``, interpolated; nan without values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[round(q * 10) - 1]


# --- directly: replication's own lag ----------------------------------------------------------------------------


def _hour_rows(hour: int, rows: int, version: int) -> pa.Table:
    ids = pa.array(range(hour * rows, (hour + 1) * rows), pa.int64())
    return pa.table(
        {
            "order_id": ids,
            "user_id": pc.remainder(ids, 997),
            "amount": pc.multiply(pc.cast(ids, pa.float64()), 0.01 * version),
            "status": pa.array(["paid", "refunded", "created", "paid"] * (rows // 4) + ["paid"] * (rows % 4)),
            "dt": pa.array([DAY] * rows),
            "hh": pa.array([f"{hour:02d}"] * rows),
        }
    )


def _commit(uri: str, hours: list[int], rows: int, files: int, version: int) -> None:
    data = pa.concat_tables([_hour_rows(h, rows, version) for h in hours])
    predicate = " OR ".join(f"(dt = '{DAY}' AND hh = '{h:02d}')" for h in hours)
    write_deltalake(
        uri,
        data,
        partition_by=["dt", "hh"],
        mode="overwrite",
        predicate=predicate,
        target_file_size=max(1, data.nbytes // (files * len(hours))),
    )


def run_direct(rows: int, files: int) -> dict[str, object]:
    """Each hour committed by delta-rs and replicated at once by ``replicate_partition``, then a ranged rewrite."""
    with tempfile.TemporaryDirectory(prefix="replication-bench-") as tmp:
        source, replica = DeltaReader(f"{tmp}/site1"), DeltaReader(f"{tmp}/site2")
        uri = source.table_uri(KEY)
        done: list[Replicated] = []
        for hour in range(24):
            _commit(uri, [hour], rows, files, 1)
            done.append(replicate_partition(source, replica, KEY, {"dt": DAY, "hh": f"{hour:02d}"}))
        rewritten = list(range(6, 12))
        _commit(uri, rewritten, rows, files, 2)  # a ranged rewrite: six hours in one commit
        for hour in rewritten:
            done.append(replicate_partition(source, replica, KEY, {"dt": DAY, "hh": f"{hour:02d}"}))
        lags = sorted(d.lag_s for d in done if d.lag_s is not None)
        commits = sum(1 for d in done if d.replica_version is not None)
        a = source.read_rows(KEY, columns=["order_id", "amount", "hh"])[0].sort_by("order_id")
        b = replica.read_rows(KEY, columns=["order_id", "amount", "hh"])[0].sort_by("order_id")
        return {
            "own_lag_p50_s": round(statistics.median(lags), 3),
            "own_lag_p90_s": round(statistics.quantiles(lags, n=10)[-1], 3),
            "own_lag_max_s": round(lags[-1], 3),
            "own_partitions": len(done),
            "own_commits": commits,
            "own_removed": sum(d.files_removed for d in done),
            "own_mb": round(sum(d.bytes_copied for d in done) / 2**20, 1),
            "own_equal": int(a.equals(b) and a.num_rows == 24 * rows and commits == len(done)),
        }


# --- on the stack -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Publication:
    """One replica commit of one hour, and the moments its lag is made of (epoch seconds)."""

    hour: str
    source_version: int
    replica_version: int
    committed: float  # the source's log entry of source_version
    reported: float  # the build's materialization of the hour
    created: float  # the replica run created (the sensor's request launched)
    step: float  # its first step started
    published: float  # the replica's log entry of replica_version

    @property
    def lag(self) -> float:
        return self.published - self.committed


def write_catalog(tables: Path) -> None:
    """The stack's catalog: the example's tables of :data:`TABLES`, the hourly one replicating to :data:`SITE`."""
    from warehouse_assets.catalog.loader import TABLES_DIR

    for name in TABLES:
        text = (TABLES_DIR / name).read_text()
        if name.endswith(".sql"):
            head, sep, rest = text.partition("\n--- */")
            if not sep:
                raise SystemExit(f"{TABLES_DIR / name}: no header end (--- */) to add replicate_to to")
            text = f"{head}\nreplicate_to: {SITE}{sep}{rest}"
        (tables / name).parent.mkdir(parents=True, exist_ok=True)
        (tables / name).write_text(text)


def _materialized(instance: Any, key: list[str], partition: str) -> list[Any]:
    """The materialization records of one partition, newest first."""
    from dagster import AssetKey, AssetRecordsFilter

    return list(
        instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(key), asset_partitions=[partition]), limit=100
        ).records
    )


def _wait_built(instance: Any, supervisor: Supervisor, hour: str, timeout: float) -> None:
    """Until the source table's partition ``hour`` is materialized; SystemExit after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not _materialized(instance, SOURCE, hour):
        supervisor.ensure()
        if time.monotonic() > deadline:
            raise SystemExit(f"{'.'.join(SOURCE)} {hour} was not built within {timeout:.0f} s")
        time.sleep(0.5)


def unreplicated(instance: Any, site: DeltaReader, hours: list[str]) -> list[str]:
    """The hours whose replica does not hold the source's latest build yet (its version, as the replica's log
    records it per partition)."""
    from warehouse_assets.catalog.calendars import partition_values
    from warehouse_assets.materialize.replication import built_version

    behind = []
    for hour in hours:
        records = _materialized(instance, SOURCE, hour)
        built = built_version(records[0].asset_materialization.metadata, hour) if records else None
        held = site.app_version(SOURCE, app_id(partition_values("hourly", hour)))
        if built is None or held is None or held < built:
            behind.append(hour)
    return behind


def _wait_replicated(
    instance: Any, supervisor: Supervisor, site: DeltaReader, hours: list[str], timeout: float
) -> list[str]:
    """Until no run is queued or in progress and every hour's replica holds its latest build; the hours still behind."""
    deadline = time.monotonic() + timeout
    while True:
        supervisor.ensure()
        # the runs in progress finish; an hour still behind then waits for its replica run, which the sensor creates
        # within its interval: looked at again every 2 s, so the wait ends as soon as the last replica is published
        _wait_until_idle(instance, max(30.0, deadline - time.monotonic()))
        behind = unreplicated(instance, site, hours)
        if not behind or time.monotonic() > deadline:
            return behind
        time.sleep(2)


def publications(instance: Any, lake: DeltaReader, site: DeltaReader, hours: list[str]) -> list[Publication]:
    """Every replica commit of the bench's hours, timed from both tables' Delta logs and the runs' records."""
    from dagster import AssetKey, RunsFilter

    from warehouse_assets.materialize.replication import built_version

    source_uri, replica_uri = lake.table_uri(SOURCE), site.table_uri(SOURCE)
    records = instance.fetch_materializations(AssetKey([SITE, *SOURCE]), limit=10_000).records
    runs = {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=[x.run_id for x in records]))}
    out = []
    for record in records:
        published = json.loads(str(record.asset_materialization.metadata["replicated"].value))
        for hour, done in published.items():
            if hour not in hours or done.get("replica_version") is None:
                continue  # an hour already published at that version commits nothing
            version, replica_version = int(done["source_version"]), int(done["replica_version"])
            builds = [
                b.timestamp
                for b in _materialized(instance, SOURCE, hour)
                if built_version(b.asset_materialization.metadata, hour) == version
            ]
            committed, at = commit_time(source_uri, version), commit_time(replica_uri, replica_version)
            if committed is None or at is None or not builds:
                raise SystemExit(f"{hour}: source v{version} or replica v{replica_version} has no log time or build")
            out.append(
                Publication(
                    hour,
                    version,
                    replica_version,
                    committed,
                    min(builds),
                    runs[record.run_id].create_timestamp.timestamp(),
                    _first_step(instance, record.run_id, 10),
                    at,
                )
            )
    return sorted(out, key=lambda p: p.replica_version)


def verified(lake: DeltaReader, site: DeltaReader, hours: list[str]) -> list[str]:
    """The hours whose replica reads the same rows (delta-rs) as the source at the version it published."""
    from warehouse_assets.catalog.calendars import partition_values

    good = []
    for hour in hours:
        spec = partition_values("hourly", hour)
        version = site.app_version(SOURCE, app_id(spec))
        if version is None:
            continue
        a = lake.read_rows(SOURCE, [spec], version=version)[0]
        b = site.read_rows(SOURCE, [spec])[0]
        order = [(c, "ascending") for c in a.column_names]
        if a.num_rows == b.num_rows and a.sort_by(order).equals(b.select(a.column_names).sort_by(order)):
            good.append(hour)
    return good


def status_lines(env: dict[str, str]) -> list[str]:
    """What ``warehouse status`` prints about the replication sites, run as a user runs it on the stack."""
    command = [sys.executable, "-m", "warehouse_assets.cli", "status"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    lines = done.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("replication sites")), len(lines))
    return lines[start : start + 2]


def stack_figures(pubs: list[Publication]) -> dict[str, object]:
    lags = [p.lag for p in pubs]
    stages = {
        "report": [p.reported - p.committed for p in pubs],
        "sensor": [p.created - p.reported for p in pubs],
        "launch": [p.step - p.created for p in pubs],
        "copy": [p.published - p.step for p in pubs],
    }
    return {
        "lag_p50_s": round(_p(lags, 0.5), 2),
        "lag_p90_s": round(_p(lags, 0.9), 2),
        "lag_max_s": round(max(lags), 2) if lags else float("nan"),
        **{f"{stage}_p50_s": round(_p(values, 0.5), 2) for stage, values in stages.items()},
        "sensor_p90_s": round(_p(stages["sensor"], 0.9), 2),
    }


def stack_env(
    work: Path, first: Any, mark: str, port: int, spark_port: int, ods_interval: int | None = None
) -> dict[str, str]:
    """The environment of the stack's processes: its home, lakes, landing area, catalog and site, on Spark Connect;
    the landing sensor's interval ``ods_interval`` seconds where given (else the product's)."""
    from warehouse_assets.cli.dev import DEV_MARK

    return dict(
        os.environ,
        DAGSTER_HOME=str(work / "dagster_home"),
        WAREHOUSE_START=f"{first:%Y-%m-%d}",
        WAREHOUSE_LAKE_ROOT=str(work / "lake"),
        WAREHOUSE_LANDING_ROOT=str(work / "landing"),
        WAREHOUSE_CATALOG_DIR=str(work / "tables"),
        WAREHOUSE_SITES=json.dumps({SITE: str(work / SITE)}),
        WAREHOUSE_LOG_DIR=str(work),
        WAREHOUSE_SPARK_MODE="connect",
        WAREHOUSE_SPARK_CONNECT_URL=f"sc://127.0.0.1:{spark_port}",
        WAREHOUSE_SPARK_DRIVER_MEMORY=os.environ.get("WAREHOUSE_SPARK_DRIVER_MEMORY", "2g"),
        WAREHOUSE_SIMULATE_LIVE="0",  # the bench is the source
        DAGSTER_TELEMETRY_ENABLED="false",
        **({"WAREHOUSE_ODS_SENSOR_INTERVAL": str(ods_interval)} if ods_interval else {}),
        **{DEV_MARK: mark},
    )


def _engine_alive(instance: Any) -> bool:
    """The engine beats (its heartbeat; the catalog has no external table, whose watcher other benches wait for)."""
    from warehouse_assets.center.heartbeat import EngineDown, engine_status

    try:
        engine_status(instance)
    except EngineDown:
        return False
    return True


def _wait_up(instance: Any, supervisor: Supervisor, work: Path) -> None:
    """Until the landing sensor has ticked and the engine beats; SystemExit after 600 s."""
    limit = time.monotonic() + 600
    while not (_sensor_ticked(instance, "ods_landing") and _engine_alive(instance)):
        supervisor.ensure()
        if time.monotonic() > limit:
            raise SystemExit(f"the stack did not come up within 600 s; logs in {work}")
        time.sleep(2)


def _said(pubs: list[Publication], failed: list[str], behind: list[str], status: list[str]) -> None:
    for p in pubs:
        say(
            f"{p.hour} source v{p.source_version} -> {SITE} v{p.replica_version}: lag {p.lag:5.2f} s (report "
            f"{p.reported - p.committed:4.2f}, sensor {p.created - p.reported:4.2f}, launch {p.step - p.created:4.2f}, "
            f"copy {p.published - p.step:4.2f})"
        )
    for line in failed:
        say(f"run not succeeded: {line}")
    if behind:
        say(f"not replicated at their latest build: {', '.join(behind)}")
    say("warehouse status: " + " | ".join(line.strip() for line in status))


def run_stack(hours: int, scale: float, timeout: float, keep: bool, ods_interval: int | None) -> dict[str, object]:
    """The embedded stack on a temporary home, fed ``hours`` hours of yesterday one at a time; its figures."""
    from dagster import DagsterInstance

    from simulator.cdc import SimulationConfig, simulate
    from warehouse_assets.cli.dev import stop_marked

    work = Path(tempfile.mkdtemp(prefix="replication-stack-"))
    first = datetime.now(TZ).date() - timedelta(days=1)  # yesterday: every hour of it has ended
    midnight = datetime(first.year, first.month, first.day)
    keys = [f"{midnight + timedelta(hours=h):%Y-%m-%d-%H}:00" for h in range(hours)]
    mark = uuid.uuid4().hex
    port, spark_port = free_port(), free_port()
    env = stack_env(work, first, mark, port, spark_port, ods_interval)
    home, landing = Path(env["DAGSTER_HOME"]), Path(env["WAREHOUSE_LANDING_ROOT"])
    home.mkdir(parents=True)
    landing.mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    write_catalog(work / "tables")
    names = ("DAGSTER_HOME", "WAREHOUSE_START", "WAREHOUSE_CATALOG_DIR", "WAREHOUSE_SITES")
    os.environ.update({k: env[k] for k in names})
    config = SimulationConfig(scale=scale, tz=str(TZ))
    lake, site = DeltaReader(env["WAREHOUSE_LAKE_ROOT"]), DeltaReader(str(work / SITE))
    with DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()  # storage created once, before three processes race to create it
    supervisor = Supervisor(env, work, port, spark_port)
    say(f"{work}: {hours} hour(s) of {first} at scale {scale}, replicated to {SITE} ({work / SITE})")
    try:
        for name in ("spark_connect", "webserver", "daemon", "engine"):
            supervisor.start(name)
        instance = DagsterInstance.from_config(str(home))
        _wait_up(instance, supervisor, work)
        calib_spark = calib_spark_connect_ms(env["WAREHOUSE_SPARK_CONNECT_URL"], work)
        say(f"the stack is up (calib_spark_ms={calib_spark}); landing one hour at a time")
        for n, key in enumerate(keys, start=1):
            simulate(landing, midnight, midnight + timedelta(hours=n), config)
            fed = time.monotonic()
            _wait_built(instance, supervisor, key, timeout)
            say(f"{key}: {'.'.join(SOURCE)} built {time.monotonic() - fed:.1f} s after its segments landed")
        behind = _wait_replicated(instance, supervisor, site, keys, timeout)
        pubs = publications(instance, lake, site, keys)
        good = verified(lake, site, keys)
        failed = _failed_runs(instance, 0)  # every run of the bench's instance
        runs = instance.get_runs_count()
        status = status_lines(env)
    finally:
        supervisor.stop()
        # what Dagster's stop left (a code server, the warm launcher): signalled now, waited for by polling
        stop_marked(mark, grace=LEFTOVER_GRACE_S)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    _said(pubs, failed, behind, status)
    shows_lag = any(line.strip().startswith(f"{SITE} (") and "lag P50" in line for line in status)
    return {
        **stack_figures(pubs),
        "hours": hours,
        "published": len({p.hour for p in pubs}),
        "publications": len(pubs),
        "verified": len(set(good) - set(behind)),
        "runs": runs,
        "failed_runs": len(failed),
        "status_lag": int(shows_lag),
        "calib_spark_ms": calib_spark,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 hours on the stack, 2,000 rows an hour directly")
    parser.add_argument("--direct", action="store_true", help="the direct path alone (no stack)")
    parser.add_argument("--hours", type=int, default=24, help="hours fed to the stack")
    parser.add_argument("--scale", type=float, default=0.05, help="the simulated sources' volume (1.0: full)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for one hour's build")
    parser.add_argument("--keep", action="store_true", help="keep the stack's temporary directory")
    parser.add_argument(
        "--ods-interval",
        type=int,
        default=None,
        help=f"seconds between the landing sensor's ticks (default: the product's; --quick {QUICK_ODS_INTERVAL})",
    )
    parser.add_argument("--rows", type=int, default=200_000, help="rows per hour, directly")
    parser.add_argument("--files", type=int, default=4, help="files per hour, directly")
    args = parser.parse_args()
    if args.quick:
        # two hours: the first one's replica is published while the second is ingested, as in a live day
        args.hours, args.rows = 2, 2_000
        # each hour's segments wait for the landing sensor's next tick before anything the lag times begins: a
        # shorter interval takes that wait out of the smoke test, not out of the figures
        args.ods_interval = args.ods_interval or QUICK_ODS_INTERVAL
    if not 1 <= args.hours <= 24:
        parser.error(f"--hours {args.hours}: from 1 to 24 (the hours of one day)")
    calib = calib_ms()
    figures = run_direct(args.rows, args.files)
    say("directly: " + " ".join(f"{k}={v}" for k, v in figures.items()))
    ok = figures["own_equal"] == 1
    if not args.direct:
        stack = run_stack(args.hours, args.scale, args.timeout, args.keep, args.ods_interval)
        figures = {**stack, **figures}
        ok = ok and stack["verified"] == args.hours and not stack["failed_runs"] and stack["status_lag"] == 1
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()) + f" calib_ms={calib}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
