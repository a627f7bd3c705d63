"""Handoff latency: from an upstream partition becoming ready to its downstream run starting, with the real daemon.

The embedded default runs as ``warehouse dev --no-simulate`` does (Spark Connect, webserver, daemon,
``dagster_home/dagster.yaml``) on a temporary ``DAGSTER_HOME``, lake and landing area. For each of N days
the bench plays the ad partner: it drops day D's ``marketing_spend`` files and then its ``_SUCCESS``
marker (t0), with ``ads.daily_gmv`` D already materialized, so the marker is the last input of
``ads.marketing_roi`` D. Nothing else is touched; the stack does the rest:

    t0 marker lands → t1 ext_marketing_spend reports the partition (sensor interval)
       → t2 warehouse_automation creates the run (automation interval)
       → t3 the run starts (queued-run dequeue interval + run worker launch)

Handoffs run one at a time (the previous run finished, a random 0–3 s pause so deliveries do not line up
with sensor ticks). Prints each handoff, P50 / P90 / max of t0→t3 and of each stage, and a last line of
key=value figures.

    .venv/bin/python bench/handoff_latency.py [--handoffs 30]

Settings that move the figures (environment / dagster.yaml): WAREHOUSE_EXTERNAL_SENSOR_INTERVAL (10 s),
WAREHOUSE_AUTOMATION_INTERVAL (15 s), run_coordinator.config.dequeue_interval_seconds (1 s).
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

TZ = ZoneInfo("Asia/Shanghai")
ROI = ["ads", "marketing_roi"]
GMV = ["ads", "daily_gmv"]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handoffs", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for one handoff")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    from dagster import AssetKey, AssetMaterialization, AssetRecordsFilter, DagsterInstance

    from resources.external_simulator import marketing_rows, write_marketing

    work = Path(tempfile.mkdtemp(prefix="handoff-"))
    home, lake, external = work / "dagster_home", work / "lake", work / "landing" / "external"
    home.mkdir(parents=True)
    (work / "landing").mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    today = datetime.now(TZ).date()
    days = [today - timedelta(days=args.handoffs + 1 - i) for i in range(args.handoffs)]  # within the lookback
    _seed_gmv(lake, days)
    os.environ["DAGSTER_HOME"] = str(home)
    with DagsterInstance.from_config(str(home)) as instance:
        for d in days:
            instance.report_runless_asset_event(AssetMaterialization(asset_key=AssetKey(GMV), partition=f"{d}"))

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
        "automation_interval_s": env.get("WAREHOUSE_AUTOMATION_INTERVAL", "15"),
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
    rows: list[dict[str, float]] = []
    try:
        instance = DagsterInstance.from_config(str(home))
        # wait until the daemon's sensors tick (the external sensor records a tick with its cursor)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert stack.poll() is None, f"the stack exited; see {work / 'dev.log'}"
            if _sensor_ticked(instance, "ext_marketing_spend") and _sensor_ticked(instance, "warehouse_automation"):
                break
            time.sleep(2)
        else:
            raise SystemExit(f"the sensors never ticked within 300 s; see {work / 'dev.log'}")
        print("[bench] stack is up; delivering one day at a time", flush=True)
        for n, d in enumerate(days, start=1):
            time.sleep(random.uniform(0, 3))
            key = f"{d:%Y-%m-%d}"
            write_marketing(external, f"dt={key}", marketing_rows(7, d), datetime.now(TZ))  # marker last
            t0 = time.time()
            record = _wait_for_run(instance, key, t0, args.timeout, stack)
            reported = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(["ext", "marketing_spend"]), asset_partitions=[key]), limit=1
            ).records[0]
            row = {
                "total": record.start_time - t0,
                "sensor": reported.timestamp - t0,
                "automation": record.create_timestamp.timestamp() - reported.timestamp,
                "launch": record.start_time - record.create_timestamp.timestamp(),
            }
            rows.append(row)
            print(
                f"[{n:>2}/{len(days)}] {key}: run started {row['total']:5.1f}s after the marker "
                f"(sensor {row['sensor']:4.1f}s, automation {row['automation']:4.1f}s, "
                f"queue+launch {row['launch']:4.1f}s)",
                flush=True,
            )
            _wait_until_finished(instance, record.dagster_run.run_id, args.timeout)
    finally:
        os.killpg(stack.pid, signal.SIGINT)
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def figures(name: str) -> tuple[float, float, float]:
        values = [r[name] for r in rows]
        return statistics.median(values), _percentile(values, 0.9), max(values)

    print()
    for name, label in (
        ("total", "marker → run start"),
        ("sensor", "  marker → reported (ext sensor)"),
        ("automation", "  reported → run created (automation)"),
        ("launch", "  run created → started (dequeue + launch)"),
    ):
        p50, p90, top = figures(name)
        print(f"{label:<44} P50 {p50:5.1f}s   P90 {p90:5.1f}s   max {top:5.1f}s")
    p50, p90, top = figures("total")
    stages = {name: statistics.mean(r[name] for r in rows) for name in ("sensor", "automation", "launch")}
    dominant = max(stages, key=lambda k: stages[k])
    print(
        f"handoffs={len(rows)} p50={p50:.2f} p90={p90:.2f} max={top:.2f} "
        f"mean_sensor={stages['sensor']:.2f} mean_automation={stages['automation']:.2f} "
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


def _wait_for_run(instance: object, key: str, t0: float, timeout: float, stack: subprocess.Popen[bytes]) -> object:
    from dagster import RunsFilter

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert stack.poll() is None, "the stack exited"
        records = instance.get_run_records(  # type: ignore[attr-defined]
            RunsFilter(tags={"dagster/sensor_name": "warehouse_automation"}), limit=50
        )
        for record in records:
            run = record.dagster_run
            partition = run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start")
            if partition == key and record.start_time and record.create_timestamp.timestamp() >= t0 - 1:
                return record
        time.sleep(0.2)
    raise SystemExit(f"no run of ads/marketing_roi {key} started within {timeout:.0f} s")


def _wait_until_finished(instance: object, run_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)  # type: ignore[attr-defined]
        if run is not None and run.is_finished:
            return
        time.sleep(0.5)


if __name__ == "__main__":
    raise SystemExit(main())
