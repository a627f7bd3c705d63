"""Handoff latency: from an upstream partition becoming ready to its downstream run starting, with the real daemon.

The embedded default runs as ``warehouse dev --no-simulate`` does (Spark Connect, webserver, daemon,
``dagster_home/dagster.yaml``) on a temporary ``DAGSTER_HOME``, lake and landing area. Two kinds of
handoff alternate, one at a time (every run of the previous one finished, then a random 0–3 s pause so
deliveries do not line up with sensor ticks):

* **external** — the bench plays the ad partner: it drops day D's ``marketing_spend`` files and then their
  ``_SUCCESS`` marker (t0), with ``ads.daily_gmv`` D already materialized, so the marker is the last input
  of ``ads.marketing_roi`` D::

    t0 marker lands → t1 ext_marketing_spend reports the partition (sensor interval)
       → t2 the engine submits the run → t3 the run starts (dequeue + run worker launch)

* **ods** — the bench plays the readiness sensor: ``ods.order`` hour H's rows are in the lake and it reports
  the hour (t0). Its checks are blocking, so ``dws.order_hourly`` H waits for their verdicts::

    t0 hour reported → t1 ods_quality_checks has judged it (sensor interval + a check run's launch)
       → t2 the engine submits the run → t3 the run starts

Prints each handoff, P50 / P90 / max of t0→t3 per kind and overall, and of each stage, and a last line of
key=value figures (overall).

    .venv/bin/python bench/handoff_latency.py [--handoffs 30]

Settings that move the figures (environment / dagster.yaml): WAREHOUSE_EXTERNAL_SENSOR_INTERVAL (10 s),
WAREHOUSE_ODS_CHECKS_INTERVAL (10 s), WAREHOUSE_ENGINE_POLL_SECONDS (0.25 s),
run_coordinator.config.dequeue_interval_seconds (1 s).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from resources.settings import Settings  # noqa: E402

TZ = ZoneInfo(Settings.from_env().timezone)  # the warehouse started below inherits this environment
ROI = ["ads", "marketing_roi"]
GMV = ["ads", "daily_gmv"]
ODS = ["ods", "order"]
HOURLY = ["dws", "order_hourly"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _seed_gmv(lake: Path, days: list[date]) -> None:
    """ads.daily_gmv for every day, written as the compiler would (one Delta partition per day)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from resources.delta_lake import DeltaStore

    table = pa.table(
        {
            "ds": [f"{d:%Y-%m-%d}" for d in days],
            "gmv": pa.array([100_000 + 10 * i for i in range(len(days))], pa.decimal128(18, 2)),
            "paying_users": pa.array([40 + i for i in range(len(days))], pa.int64()),
            "orders": pa.array([90 + i for i in range(len(days))], pa.int64()),
            "dt": [f"{d:%Y-%m-%d}" for d in days],
        }
    )
    uri = str(lake / "ads" / "daily_gmv")
    write_deltalake(uri, table, partition_by=["dt"], configuration=DeltaStore(str(lake)).table_configuration())


def _seed_ods(lake: Path, hours: list[datetime]) -> None:
    """ods.order rows for each hour (three orders an hour), merged state as the ingestion leaves it."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from resources.delta_lake import DeltaStore
    from simulator.cdc import merged_order_row
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.ingestion import ods_arrow_schema

    rows = []
    for n, hour in enumerate(hours):
        for i in range(3):
            created = hour + timedelta(minutes=10 * i + 5)
            rows.append(merged_order_row(1000 * n + i, 10 + i, created, 1000 * n + i, course_id=1 + i % 2))
    data = pa.Table.from_pylist(rows, schema=ods_arrow_schema(load_catalog()["ods.order"]))
    uri = str(lake / "ods" / "order")
    write_deltalake(uri, data, partition_by=["dt", "hh"], configuration=DeltaStore(str(lake)).table_configuration())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handoffs", type=int, default=30, help="handoffs in all, half of each kind")
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for one handoff")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    from dagster import AssetKey, AssetMaterialization, AssetRecordsFilter, DagsterInstance

    from simulator.external import marketing_rows, write_marketing
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.quality import report_valid

    work = Path(tempfile.mkdtemp(prefix="handoff-"))
    home, lake, external = work / "dagster_home", work / "lake", work / "landing" / "external"
    home.mkdir(parents=True)
    (work / "landing").mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    today = datetime.now(TZ).date()
    n_ext = (args.handoffs + 1) // 2
    days = [today - timedelta(days=n_ext + 1 - i) for i in range(n_ext)]  # within the lookback
    midnight = datetime(today.year, today.month, today.day, tzinfo=TZ) - timedelta(days=2)
    hours = [midnight + timedelta(hours=i) for i in range(args.handoffs - n_ext)]  # the day before yesterday
    _seed_gmv(lake, days)
    _seed_ods(lake, hours)
    plan: list[tuple[str, str]] = []
    for i in range(max(len(days), len(hours))):
        plan += [("external", f"{days[i]:%Y-%m-%d}")] if i < len(days) else []
        plan += [("ods", f"{hours[i]:%Y-%m-%d-%H:00}")] if i < len(hours) else []
    os.environ["DAGSTER_HOME"] = str(home)
    with DagsterInstance.from_config(str(home)) as instance:
        gmv = load_catalog()[".".join(GMV)]
        for d in days:
            report_valid(instance, gmv, f"{d}", "seeded by the bench")

    port, spark_port = _free_port(), _free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(lake),
        WAREHOUSE_LANDING_ROOT=str(work / "landing"),
        WAREHOUSE_LOG_DIR=str(work),
        WAREHOUSE_SPARK_MODE="connect",
        WAREHOUSE_SPARK_CONNECT_URL=f"sc://127.0.0.1:{spark_port}",
        WAREHOUSE_SPARK_DRIVER_MEMORY=os.environ.get("WAREHOUSE_SPARK_DRIVER_MEMORY", "2g"),
        DAGSTER_TELEMETRY_ENABLED="false",
    )
    settings = {
        "external_sensor_interval_s": env.get("WAREHOUSE_EXTERNAL_SENSOR_INTERVAL", "10"),
        "ods_checks_interval_s": env.get("WAREHOUSE_ODS_CHECKS_INTERVAL", "10"),
        "engine_poll_s": env.get("WAREHOUSE_ENGINE_POLL_SECONDS", "0.25"),
    }
    print(f"[bench] {work}: starting the embedded stack (Spark Connect + dagster dev) …", flush=True)
    log = (work / "dev.log").open("wb")
    stack = subprocess.Popen(
        [sys.executable, "-m", "warehouse_assets.cli", "dev", "--no-simulate", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    rows: list[tuple[str, dict[str, float]]] = []
    try:
        instance = DagsterInstance.from_config(str(home))
        # wait until the daemon's sensors tick (the external sensor records a tick with its cursor)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert stack.poll() is None, f"the stack exited; see {work / 'dev.log'}"
            sensors = ("ext_marketing_spend", "ods_quality_checks")
            if all(_sensor_ticked(instance, name) for name in sensors):
                break
            time.sleep(2)
        else:
            raise SystemExit(f"the sensors never ticked within 300 s; see {work / 'dev.log'}")
        print("[bench] stack is up; one handoff at a time, the kinds alternating", flush=True)
        for n, (kind, key) in enumerate(plan, start=1):
            _wait_until_idle(instance, args.timeout)
            time.sleep(random.uniform(0, 3))
            if kind == "external":
                day = date.fromisoformat(key)
                write_marketing(external, f"dt={key}", marketing_rows(7, day), datetime.now(TZ))  # marker last
                t0 = time.time()
                record = _wait_for_run(instance, ROI, key, t0, args.timeout, stack)
                reported = instance.fetch_materializations(
                    AssetRecordsFilter(asset_key=AssetKey(["ext", "marketing_spend"]), asset_partitions=[key]), limit=1
                ).records[0]
                ready = reported.timestamp
            else:
                t0 = time.time()
                instance.report_runless_asset_event(AssetMaterialization(asset_key=AssetKey(ODS), partition=key))
                record = _wait_for_run(instance, HOURLY, key, t0, args.timeout, stack)
                ready = _judged_at(instance, key)
            row = {
                "total": record.start_time - t0,
                "ready": ready - t0,
                "engine": record.create_timestamp.timestamp() - ready,
                "launch": record.start_time - record.create_timestamp.timestamp(),
            }
            rows.append((kind, row))
            stage = "sensor" if kind == "external" else "checks"
            print(
                f"[{n:>2}/{len(plan)}] {kind:<8} {key}: run started {row['total']:5.1f}s after t0 "
                f"({stage} {row['ready']:4.1f}s, engine {row['engine']:4.1f}s, "
                f"queue+launch {row['launch']:4.1f}s)",
                flush=True,
            )
    finally:
        os.killpg(stack.pid, signal.SIGINT)
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def figures(name: str, kind: str | None = None) -> tuple[float, float, float]:
        values = [r[name] for k, r in rows if kind in (None, k)]
        return statistics.median(values), _percentile(values, 0.9), max(values)

    print()
    for kind, title, ready in (
        ("external", "external marker → ads.marketing_roi run start", "  marker → reported (ext sensor)"),
        ("ods", "ODS hour reported → dws.order_hourly run start", "  reported → checks judged (check run)"),
    ):
        count = sum(1 for k, _ in rows if k == kind)
        print(f"{title} ({count} handoffs)")
        for name, label in (
            ("total", "  t0 → run start"),
            ("ready", ready),
            ("engine", "  ready → run created (engine)"),
            ("launch", "  run created → started (dequeue + launch)"),
        ):
            p50, p90, top = figures(name, kind)
            print(f"{label:<44} P50 {p50:5.1f}s   P90 {p90:5.1f}s   max {top:5.1f}s")
    p50, p90, top = figures("total")
    print(f"{'all handoffs: t0 → run start':<44} P50 {p50:5.1f}s   P90 {p90:5.1f}s   max {top:5.1f}s")
    stages = {name: statistics.mean(r[name] for _, r in rows) for name in ("ready", "engine", "launch")}
    dominant = max(stages, key=lambda k: stages[k])
    ext_p90, ods_p90 = figures("total", "external")[1], figures("total", "ods")[1]
    print(
        f"handoffs={len(rows)} p50={p50:.2f} p90={p90:.2f} max={top:.2f} external_p90={ext_p90:.2f} "
        f"ods_p90={ods_p90:.2f} mean_ready={stages['ready']:.2f} mean_engine={stages['engine']:.2f} "
        f"mean_launch={stages['launch']:.2f} dominant={dominant} " + " ".join(f"{k}={v}" for k, v in settings.items())
    )
    return 0


def _sensor_ticked(instance: object, name: str) -> bool:
    """The daemon has evaluated the sensor at least once (it stored the sensor's state with a tick time)."""
    for state in instance.all_instigator_state():  # type: ignore[attr-defined]
        data = state.instigator_data
        if state.name == name and data is not None and getattr(data, "last_tick_timestamp", None):
            return True
    return False


def _wait_for_run(
    instance: object, asset: list[str], key: str, t0: float, timeout: float, stack: subprocess.Popen[bytes]
) -> object:
    """The engine's run of ``asset`` ``key`` created after t0, once it has started."""
    from dagster import AssetKey, RunsFilter

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert stack.poll() is None, "the stack exited"
        records = instance.get_run_records(  # type: ignore[attr-defined]
            RunsFilter(tags={"warehouse/engine": "center"}), limit=50
        )
        for record in records:
            run = record.dagster_run
            partition = run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start")
            ours = AssetKey(asset) in (run.asset_selection or set())
            if ours and partition == key and record.start_time and record.create_timestamp.timestamp() >= t0 - 1:
                return record
        time.sleep(0.2)
    raise SystemExit(f"no run of {'/'.join(asset)} {key} started within {timeout:.0f} s")


def _judged_at(instance: object, key: str) -> float:
    """When the last of ods.order's checks recorded its verdict on hour ``key``."""
    from dagster import AssetCheckKey, AssetKey

    stamps = []
    for name in ("unique", "not_null"):
        history = instance.event_log_storage.get_asset_check_execution_history(  # type: ignore[attr-defined]
            AssetCheckKey(AssetKey(ODS), name), limit=5
        )
        stamps += [r.event.timestamp for r in history if r.event and r.evaluation and r.evaluation.partition == key]
    return max(stamps)


def _wait_until_idle(instance: object, timeout: float) -> None:
    """No run queued or in progress (the previous handoff's downstream runs have finished)."""
    from dagster import DagsterRunStatus, RunsFilter

    busy = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not instance.get_runs(RunsFilter(statuses=busy), limit=1):  # type: ignore[attr-defined]
            return
        time.sleep(0.5)


if __name__ == "__main__":
    raise SystemExit(main())
