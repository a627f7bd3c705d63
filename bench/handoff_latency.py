"""Handoff latency: from an upstream partition becoming ready to its downstream run starting, with the real daemon.

The embedded default runs as ``warehouse dev --no-simulate`` does (Spark Connect, webserver, daemon, engine,
``dagster_home/dagster.yaml``) on a temporary ``DAGSTER_HOME``, lake and landing area. Two kinds of handoff
alternate, one at a time (every run of the previous one finished, then a random 0–3 s pause so deliveries do
not line up with ticks):

* **external** — the bench plays the ad partner: it drops day D's ``marketing_spend`` files and then their
  ``_SUCCESS`` marker (t0), with ``ads.daily_gmv`` D already materialized, so the marker is the last input of
  ``ads.marketing_roi`` D::

    t0 marker lands → reported (the engine's watcher) → submitted (the engine) → created (the webserver)
       → first step (coordinator's launch, warm fork)

* **ods** — the bench plays the source: the simulated CDC segments (all five ODS sources) of hour H land.
  The landing sensor starts an ``ods_ingest`` run; its ``ods.order`` commit completes H (t0), the run reports H
  and logs its checks' verdicts, and ``dws.order_hourly`` H (checks blocking) is started by the engine::

    landed → t0 committed (landing sensor, run launch, merge) → reported (readiness in the run)
       → judged (checks in the run) → submitted → created → first step

A handoff is t0 → the downstream run's first step started (the run is at work). ``detect`` is the time for a
ready upstream to reach the instance where the engine reads it: marker → reported, commit → reported. The whole
chain of an ODS hour is landed → reported. The ODS hours begin on the warehouse's first day (``WAREHOUSE_START``
of the stack), so when they pass its end (over 48 handoffs) every daily partition a first day can have is built:
the bench prints the time from the day's last hour reported to its DWD, DWS and ADS partitions materialized, per
layer, naming the last table of each.

Prints each handoff, P50 / P90 / max per kind and stage, and a last line ``RESULT handoffs= p90= max=
launch_p90= detect_p90= ... calib_ms= calib_spark_ms=`` (the machine's calibration, ``bench/calibration.py``; the
Spark one on the stack's Spark Connect server once it is up, before the first handoff). The bench fails instead when
a run it timed did not succeed, when any run of the stack failed meanwhile, or when the stack did not settle between
handoffs.

    .venv/bin/python bench/handoff_latency.py [--handoffs 60]
    .venv/bin/python bench/handoff_latency.py --quick    # 4 handoffs, no wait for late-data rebuilds: a smoke test

Settings that move the figures (environment / dagster.yaml): WAREHOUSE_ENGINE_POLL_SECONDS (0.1 s; the watcher
looks every round), the landing sensor's 15 s interval; the run coordinator's limits (a run over them queues
for the daemon, dequeue_interval_seconds).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.calibration import calib_ms, calib_spark_connect_ms
from bench.processes import free_port
from resources.settings import Settings

TZ = ZoneInfo(Settings.from_env().timezone)  # the warehouse started below inherits this environment
ROI = ["ads", "marketing_roi"]
GMV = ["ads", "daily_gmv"]
ODS = ["ods", "order"]
HOURLY = ["dws", "order_hourly"]
SLOW_LAUNCH_S = 1.0  # a launch slower than this names the runs that held the slots when its run was created
IDLE_S = 3.0  # no run queued or in progress for this long before a handoff (the engine polls every 0.25 s)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _seed_gmv(lake: Path, days: list[date]) -> None:
    """ads.daily_gmv for every day, written as the compiler would (one Delta partition per day), with the columns its
    SQL produces: the engine builds the warehouse's first day over the seed, and an overwrite with other columns
    fails (a seed without ``paying_rate`` failed that run, 60 handoffs in)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from resources.delta_lake import DeltaStore

    table = pa.table(
        {
            "ds": [f"{d:%Y-%m-%d}" for d in days],
            "gmv": pa.array([100_000 + 10 * i for i in range(len(days))], pa.decimal128(18, 2)),
            "paying_users": pa.array([40 + i for i in range(len(days))], pa.int64()),
            "paying_rate": pa.array([0.4 + i / 1000 for i in range(len(days))], pa.float64()),
            "orders": pa.array([90 + i for i in range(len(days))], pa.int64()),
            "dt": [f"{d:%Y-%m-%d}" for d in days],
        }
    )
    uri = str(lake / "ads" / "daily_gmv")
    write_deltalake(uri, table, partition_by=["dt"], configuration=DeltaStore(str(lake)).table_configuration())


def _commit_time(lake: Path, key: list[str], version: int) -> float:
    """Epoch seconds of a Delta commit (its ``timestamp`` in the log)."""
    from deltalake import DeltaTable

    for entry in DeltaTable(str(lake.joinpath(*key))).history(limit=50):
        if entry.get("version") == version:
            return float(entry["timestamp"]) / 1000
    raise SystemExit(f"{'.'.join(key)}: version {version} is not in the last 50 commits")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handoffs", type=int, default=60, help="handoffs in all, half of each kind")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for one handoff")
    parser.add_argument("--scale", type=float, default=0.05, help="the simulated sources' volume (1.0: full)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--settle-minutes",
        type=float,
        default=20,
        help="after the last handoff, how long to wait for the rebuilds the late-data policies made due meanwhile",
    )
    parser.add_argument("--quick", action="store_true", help="4 handoffs (2 of each kind), --settle-minutes 0")
    args = parser.parse_args()
    if args.quick:
        args.handoffs, args.settle_minutes = 4, 0
    calib = calib_ms()

    from dagster import DagsterInstance

    from simulator.cdc import SimulationConfig, simulate
    from simulator.external import marketing_rows, write_marketing
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.engine import SUBMITTED_TAG
    from warehouse_assets.center.late_data import LOOKBACK
    from warehouse_assets.materialize.quality import report_valid

    work = Path(tempfile.mkdtemp(prefix="handoff-"))
    home, lake, landing = work / "dagster_home", work / "lake", work / "landing"
    external = landing / "external"
    home.mkdir(parents=True)
    landing.mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    today = datetime.now(TZ).date()
    n_ext = (args.handoffs + 1) // 2
    # The warehouse starts on the ODS hours' first day, so that day's snapshots need no T-1 and its cascade runs
    # through every layer a first day can build; the ad partner's days follow it and end yesterday. All of it
    # within the dependency center's lookback.
    first = today - timedelta(days=n_ext + 1)
    if (today - first).days >= LOOKBACK.days:
        raise SystemExit(
            f"--handoffs {args.handoffs}: the days would reach past the center's {LOOKBACK.days}-day lookback"
        )
    days = [first + timedelta(days=1 + i) for i in range(n_ext)]
    midnight = datetime(first.year, first.month, first.day, tzinfo=TZ)
    hours = [midnight + timedelta(hours=i) for i in range(args.handoffs - n_ext)]
    config = SimulationConfig(scale=args.scale, tz=str(TZ))
    _seed_gmv(lake, days)
    plan: list[tuple[str, str]] = []
    for i in range(max(len(days), len(hours))):
        plan += [("external", f"{days[i]:%Y-%m-%d}")] if i < len(days) else []
        plan += [("ods", f"{hours[i]:%Y-%m-%d-%H:00}")] if i < len(hours) else []
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ["WAREHOUSE_START"] = f"{first:%Y-%m-%d}"  # for this process and the stack it starts
    catalog = load_catalog()
    with DagsterInstance.from_config(str(home)) as instance:
        for d in days:
            report_valid(instance, catalog[".".join(GMV)], f"{d}", "seeded by the bench")

    port, spark_port = free_port(), free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(lake),
        WAREHOUSE_LANDING_ROOT=str(landing),
        WAREHOUSE_LOG_DIR=str(work),
        WAREHOUSE_SPARK_MODE="connect",
        WAREHOUSE_SPARK_CONNECT_URL=f"sc://127.0.0.1:{spark_port}",
        WAREHOUSE_SPARK_DRIVER_MEMORY=os.environ.get("WAREHOUSE_SPARK_DRIVER_MEMORY", "2g"),
        DAGSTER_TELEMETRY_ENABLED="false",
    )
    settings = {"engine_poll_s": env.get("WAREHOUSE_ENGINE_POLL_SECONDS", "0.1"), "scale": args.scale}
    print(f"[bench] {work}: starting the embedded stack (Spark Connect + dagster dev + engine) …", flush=True)
    log = (work / "terminal.log").open("wb")
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
    day_end: dict[str, float] = {}
    try:
        instance = DagsterInstance.from_config(str(home))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # the landing sensor has ticked and the engine watches
            assert stack.poll() is None, f"the stack exited; see {work / 'dev.log'}"
            if _sensor_ticked(instance, "ods_landing") and _engine_watching(instance):
                break
            time.sleep(2)
        else:
            raise SystemExit(f"the stack did not come up within 300 s; see {work / 'dev.log'}")
        calib_spark = calib_spark_connect_ms(env["WAREHOUSE_SPARK_CONNECT_URL"], work)
        print("[bench] stack is up; one handoff at a time, the kinds alternating", flush=True)
        started_at, timed_run_ids = time.time(), []
        for n, (kind, key) in enumerate(plan, start=1):
            # before the first handoff the engine catches up on what the seeded days make ready (ads.gmv_usd_daily
            # over the seeded ads.daily_gmv, past its rate's deadline): not a handoff, and longer; its run may be
            # submitted a moment after the stack is idle, so the first wait asks for a quiet spell
            if n == 1:
                _wait_until_idle(instance, args.timeout * 3, quiet=20)
            # the previous handoff's cascade (the day's end starts a layer as the one before it finishes) leaves
            # the queue empty for a moment between runs: idle means idle for longer than an engine round
            _wait_until_idle(instance, args.timeout, quiet=IDLE_S)
            time.sleep(random.uniform(0, 3))
            if kind == "external":
                day = date.fromisoformat(key)
                write_marketing(external, f"dt={key}", marketing_rows(7, day), datetime.now(TZ))  # marker last
                t0 = time.time()
                record = _wait_for_run(instance, ROI, key, t0, args.timeout, stack)
                reported = _latest(instance, ["ext", "marketing_spend"], key)
                row = {"detect": reported.timestamp - t0, "ready": reported.timestamp}
            else:
                hour = datetime.strptime(key, "%Y-%m-%d-%H:%M").replace(tzinfo=TZ)
                simulate(
                    landing, midnight.replace(tzinfo=None), (hour + timedelta(hours=1)).replace(tzinfo=None), config
                )
                landed = time.time()
                record = _wait_for_run(instance, HOURLY, key, landed, args.timeout, stack)
                reported = _latest(instance, ODS, key)
                version = reported.asset_materialization.metadata["delta_version"].value
                t0 = _commit_time(lake, ODS, int(version))
                judged = _judged_at(instance, key)
                row = {
                    "chain": reported.timestamp - landed,
                    "ingest": t0 - landed,
                    "detect": reported.timestamp - t0,
                    "checks": judged - reported.timestamp,
                    "ready": judged,
                }
                if hour.hour == 23:  # the day's last hour: when every ODS table has reported it
                    day_end[f"{hour:%Y-%m-%d}"] = _all_reported(instance, catalog, key, args.timeout)
            run = record.dagster_run
            timed_run_ids.append(run.run_id)
            submitted = float(run.tags[SUBMITTED_TAG])
            step = _first_step(instance, run.run_id, args.timeout)  # the run has started: its first step executes
            row.update(
                total=step - t0,
                engine=submitted - row.pop("ready"),
                webserver=record.create_timestamp.timestamp() - submitted,
                launch=step - record.create_timestamp.timestamp(),
            )
            rows.append((kind, row))
            if row["launch"] > SLOW_LAUNCH_S:
                print(f"        slow launch: running when it was created: {_running_at(instance, record)}", flush=True)
            extra = f"landed→committed {row['ingest']:4.1f}s, checks {row['checks']:4.1f}s, " if kind == "ods" else ""
            if "dagster/asset_partition_range_start" in run.tags:  # late changes had rewritten earlier hours too
                extra = f"one run from {run.tags['dagster/asset_partition_range_start']}, " + extra
            print(
                f"[{n:>2}/{len(plan)}] {kind:<8} {key}: run started {row['total']:5.2f}s after t0 ({extra}"
                f"detect {row['detect']:4.2f}s, engine {row['engine']:4.2f}s, webserver {row['webserver']:4.2f}s, "
                f"launch {row['launch']:4.2f}s)",
                flush=True,
            )
        _wait_until_idle(instance, args.timeout, quiet=IDLE_S)
        settled = _settle(instance, args.settle_minutes * 60, args.timeout)
        failed = _failed_runs(instance, started_at)
        if failed:
            raise SystemExit(f"{len(failed)} run(s) failed during the bench: {'; '.join(failed[:5])}")
        timed_runs = [timed for timed in timed_run_ids if timed not in _succeeded(instance, timed_run_ids)]
        if timed_runs:
            raise SystemExit(f"timed run(s) did not succeed: {timed_runs}")
        layers = _day_end_layers(instance, catalog, day_end)
        builds = _builds(instance, catalog, started_at, day_end)
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
        values = [r[name] for k, r in rows if kind in (None, k) and name in r]
        return statistics.median(values), _percentile(values, 0.9), max(values)

    print()
    stages = {
        "external": [
            ("total", "marker → ads.marketing_roi run start"),
            ("detect", "  marker → reported (engine's watcher)"),
        ],
        "ods": [
            ("chain", "segments landed → hour reported (whole chain)"),
            ("ingest", "  landed → committed (landing sensor, launch, merge)"),
            ("total", "commit → dws.order_hourly run start"),
            ("detect", "  commit → reported (readiness in the run)"),
            ("checks", "  reported → judged (checks in the run)"),
        ],
    }
    common = [
        ("engine", "  ready → submitted (engine)"),
        ("webserver", "  submitted → run created (webserver)"),
        ("launch", "  run created → first step started (launch)"),
    ]
    for kind in ("external", "ods"):
        print(f"{kind} ({sum(1 for k, _ in rows if k == kind)} handoffs)")
        for name, label in stages[kind] + common:
            p50, p90, top = figures(name, kind)
            print(f"  {label:<54} P50 {p50:6.2f}s   P90 {p90:6.2f}s   max {top:6.2f}s")
    p50, p90, top = figures("total")
    print(f"  {'all handoffs: ready → run start':<54} P50 {p50:6.2f}s   P90 {p90:6.2f}s   max {top:6.2f}s")
    for day, per_layer in layers.items():
        print(f"day {day}: last ODS hour reported → " + "; ".join(f"{k} {v}" for k, v in per_layer.items()))
    print(
        f"builds: {builds['materializations']} materializations of {builds['partitions']} derived partitions "
        f"(amplification {builds['amplification']:.2f}); the closed day's most-built daily partition "
        f"{builds['closed_day_max_builds']}x ({builds['closed_day_max_table']}); day end → its daily ADS partitions "
        f"first built {builds['cascade_s']:.1f}s; late change reported → ads.gmv_hourly rebuilt with it: "
        f"{builds['late_lags']} measured, P90 {builds['late_lag_p90_s']:.1f}s, {builds['late_unrebuilt']} not rebuilt"
    )
    print(
        "these build counts cover this run's own minutes only: a closed day's late-data rebuilds come due for days "
        "after it (bench/late_horizon.py measures them over the whole lookback)"
    )
    chain_p90 = figures("chain", "ods")[1]
    print(
        f"RESULT handoffs={len(rows)} p50={p50:.2f} p90={p90:.2f} max={top:.2f} "
        f"launch_p90={figures('launch')[1]:.2f} detect_p90={figures('detect')[1]:.2f} "
        f"engine_p90={figures('engine')[1]:.2f} webserver_p90={figures('webserver')[1]:.2f} "
        f"external_p90={figures('total', 'external')[1]:.2f} ods_p90={figures('total', 'ods')[1]:.2f} "
        f"ods_chain_p90={chain_p90:.2f} amplification={builds['amplification']:.2f} "
        f"closed_day_max_builds={builds['closed_day_max_builds']} cascade_s={builds['cascade_s']:.1f} "
        f"late_lag_p90_s={builds['late_lag_p90_s']:.1f} late_unrebuilt={builds['late_unrebuilt']} "
        f"stale_left={settled} "
        + " ".join(f"{k}={v}" for k, v in settings.items())
        + f" calib_ms={calib} calib_spark_ms={calib_spark}"
    )
    return 0


def _latest(instance: object, asset: list[str], key: str) -> object:
    """The latest materialization record of one partition."""
    from dagster import AssetKey, AssetRecordsFilter

    found = instance.fetch_materializations(  # type: ignore[attr-defined]
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[key]), limit=1
    ).records
    if not found:
        raise SystemExit(f"no materialization of {'.'.join(asset)} {key}")
    return found[0]


def _all_reported(instance: object, catalog: object, key: str, timeout: float) -> float:
    """When the last ODS table reported hour ``key`` (the ingestion reports the tables one after the other)."""
    from dagster import AssetKey, AssetRecordsFilter

    deadline = time.monotonic() + timeout
    while True:
        stamps = []
        for table in catalog.ods():  # type: ignore[attr-defined]
            found = instance.fetch_materializations(  # type: ignore[attr-defined]
                AssetRecordsFilter(asset_key=AssetKey(table.key), asset_partitions=[key]), limit=1
            ).records
            stamps.append(found[0].timestamp if found else None)
        if all(s is not None for s in stamps):
            return max(s for s in stamps if s is not None)
        if time.monotonic() > deadline:
            raise SystemExit(f"not every ODS table reported {key} within {timeout:.0f} s")
        time.sleep(0.2)


def _engine_watching(instance: object) -> bool:
    from warehouse_assets.ingest.deliveries import watched_ago

    return watched_ago(instance) is not None  # type: ignore[arg-type]


def _day_end_layers(instance: object, catalog: object, day_end: dict[str, float]) -> dict[str, dict[str, str]]:
    """Per day whose last ODS hour was reported: per layer, seconds from then to its last daily partition (and
    which table it was), and the same over the tables that read no external table, directly or upstream (those
    wait for a producer's delivery, which the bench makes on its own schedule)."""
    from dagster import AssetKey, AssetRecordsFilter

    tables = {t.fqn: t for t in catalog}  # type: ignore[attr-defined]

    def external_upstream(fqn: str, seen: frozenset[str] = frozenset()) -> bool:
        table = tables[fqn]
        if table.layer == "ext":
            return True
        deps = [d.table for d in getattr(table, "deps", ()) if d.table not in seen | {fqn}]  # self-dependencies
        return any(external_upstream(dep, seen | {fqn}) for dep in deps)

    out: dict[str, dict[str, str]] = {}
    for day, reported in day_end.items():
        last: dict[str, tuple[float, str]] = {}
        internal: dict[str, float] = {}
        for table in catalog.derived():  # type: ignore[attr-defined]
            if table.period != "daily":
                continue
            records = instance.fetch_materializations(  # type: ignore[attr-defined]
                AssetRecordsFilter(asset_key=AssetKey(table.key), asset_partitions=[day], after_timestamp=reported),
                limit=1,
            ).records
            if not records:
                continue
            seconds = records[0].timestamp - reported
            if seconds > last.get(table.layer, (-1.0, ""))[0]:
                last[table.layer] = (seconds, table.fqn)
            if not external_upstream(table.fqn):
                internal[table.layer] = max(internal.get(table.layer, 0.0), seconds)
        out[day] = {
            layer: f"{seconds:.1f}s ({fqn})"
            + (
                f", {internal[layer]:.1f}s without external inputs"
                if layer in internal and internal[layer] < seconds
                else ""
            )
            for layer, (seconds, fqn) in sorted(last.items(), key=lambda kv: ["dwd", "dws", "ads"].index(kv[0]))
        }
    return out


def _settle(instance: object, seconds: float, timeout: float) -> int:
    """Wait until no partition is stale with a rebuild due within ``seconds`` (the late-data policies' rebuilds of
    the late changes the handoffs brought) and the runs are done; the stale partitions left (due later, or never)."""
    from warehouse_assets.center.ledger import open_readonly
    from warehouse_assets.center.state_store import default_path

    deadline = time.time() + seconds
    while True:
        ledger = open_readonly(default_path(instance))  # type: ignore[arg-type]
        stale = ledger.all_stale() if ledger is not None else []
        if ledger is not None:
            ledger.close()
        due = [s for s in stale if s.due is not None and s.due <= deadline]
        if not due or time.time() > deadline:
            break
        time.sleep(5)
    _wait_until_idle(instance, timeout, quiet=IDLE_S)
    return len(stale)


def _builds(instance: object, catalog: object, since: float, day_end: dict[str, float]) -> dict[str, object]:
    """What the bench's handoffs cost in builds: materializations per distinct derived partition; the most-built
    daily partition of the first closed day; the day's end (its last ODS hour reported by every table) → each of
    its daily ADS partitions first built after it, the latest of them; and each late change (an ODS hour of
    ``ods.order`` reported again) → the first ``ads.gmv_hourly`` build of that hour after it."""
    from dagster import AssetKey, AssetRecordsFilter

    def records(key: list[str], partition: str | None = None) -> list[object]:
        found: list[object] = []
        cursor = None
        while True:  # the instance serves at most 10,000 records a call
            page = instance.fetch_materializations(  # type: ignore[attr-defined]
                AssetRecordsFilter(
                    asset_key=AssetKey(key),
                    asset_partitions=[partition] if partition else None,
                    after_timestamp=since,
                ),
                limit=10_000,
                cursor=cursor,
                ascending=True,
            )
            found += page.records
            if not page.has_more:
                return found
            cursor = page.cursor

    total, partitions = 0, 0
    closed = min(day_end) if day_end else None
    most = (0, "")
    cascade = 0.0
    for table in catalog.derived():  # type: ignore[attr-defined]
        found = records(table.key)
        total += len(found)
        keys = [r.partition_key for r in found]  # type: ignore[attr-defined]
        partitions += len(set(keys))
        if closed is not None and table.period == "daily":
            most = max(most, (keys.count(closed), table.fqn))
            after = [r.timestamp for r in found if r.partition_key == closed and r.timestamp >= day_end[closed]]  # type: ignore[attr-defined]
            if table.layer == "ads" and after:
                cascade = max(cascade, after[0] - day_end[closed])
    lags: list[float] = []
    unrebuilt = 0
    gmv = records(["ads", "gmv_hourly"])
    for report in records(list(ODS)):
        metadata = report.asset_materialization.metadata  # type: ignore[attr-defined]
        if "late_changes" not in metadata or not metadata["late_changes"].value:
            continue
        hour = report.partition_key  # type: ignore[attr-defined]
        later = [g.timestamp for g in gmv if g.partition_key == hour and g.timestamp > report.timestamp]  # type: ignore[attr-defined]
        if later:
            lags.append(later[0] - report.timestamp)  # type: ignore[attr-defined]
        else:
            unrebuilt += 1
    return {
        "materializations": total,
        "partitions": partitions,
        "amplification": total / partitions if partitions else 0.0,
        "closed_day_max_builds": most[0],
        "closed_day_max_table": most[1],
        "cascade_s": cascade,
        "late_lags": len(lags),
        "late_lag_p90_s": _percentile(lags, 0.9) if lags else float("nan"),
        "late_unrebuilt": unrebuilt,
    }


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
            RunsFilter(tags={"dagster/sensor_name": "dependency_center"}), limit=50
        )
        for record in records:
            run = record.dagster_run
            # a ranged run covers the key too: hours a late change rewrote are built again with the new one
            first = run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start")
            last = run.tags.get("dagster/asset_partition_range_end", first)
            ours = AssetKey(asset) in (run.asset_selection or set()) and first is not None
            covers = ours and first <= key <= last
            if covers and record.start_time and record.create_timestamp.timestamp() >= t0 - 1:
                return record
        time.sleep(0.2)
    raise SystemExit(f"no run of {'/'.join(asset)} {key} started within {timeout:.0f} s")


def _first_step(instance: object, run_id: str, timeout: float) -> float:
    """When the run's first step started (``STEP_START``): the run is doing its work."""
    from dagster import DagsterEventType

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_START, limit=1).records  # type: ignore[attr-defined]
        if records:
            return float(records[0].event_log_entry.timestamp)
        time.sleep(0.05)
    raise SystemExit(f"run {run_id} started no step within {timeout:.0f} s")


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


def _wait_until_idle(instance: object, timeout: float, quiet: float = 0.0) -> None:
    """No run queued or in progress (the previous handoff's downstream runs have finished), for ``quiet`` seconds
    in a row."""
    from dagster import DagsterRunStatus, RunsFilter

    busy = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
    deadline = time.monotonic() + timeout
    idle_since = None
    while time.monotonic() < deadline:
        if instance.get_runs(RunsFilter(statuses=busy), limit=1):  # type: ignore[attr-defined]
            idle_since = None
        else:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= quiet:
                return
        time.sleep(0.5)
    raise SystemExit(f"the stack did not settle: runs still queued or in progress after {timeout:.0f} s")


def _running_at(instance: object, record: object) -> str:
    """The runs that held a slot when ``record``'s run was created: what a slow launch waited behind."""
    from dagster import RunsFilter

    created = record.create_timestamp  # type: ignore[attr-defined]
    earlier = instance.get_run_records(  # type: ignore[attr-defined]
        RunsFilter(created_before=created, created_after=created - timedelta(hours=1))
    )
    t = created.timestamp()
    held = [
        r.dagster_run
        for r in earlier
        if r.start_time is not None and r.start_time <= t and (r.end_time is None or r.end_time > t)
    ]
    return "; ".join(_run_words(run) for run in held) or "nothing"


def _run_words(run: object) -> str:
    from warehouse_assets.center.late_data import LANE_TAG
    from warehouse_assets.center.plans import PARTITIONS_TAG

    tags = run.tags  # type: ignore[attr-defined]
    assets = ",".join(".".join(k.path) for k in (run.asset_selection or []))  # type: ignore[attr-defined]
    lane = tags.get(LANE_TAG) or ("ingest" if "warehouse/ingest" in tags else "first")
    return f"{assets or run.job_name} {tags.get('dagster/partition') or tags.get(PARTITIONS_TAG, '')} ({lane})"  # type: ignore[attr-defined]


def _succeeded(instance: object, run_ids: list[str]) -> set[str]:
    from dagster import DagsterRunStatus, RunsFilter

    records = instance.get_run_records(RunsFilter(run_ids=run_ids))  # type: ignore[attr-defined]
    return {r.dagster_run.run_id for r in records if r.dagster_run.status == DagsterRunStatus.SUCCESS}


def _failed_runs(instance: object, since: float) -> list[str]:
    """The runs created since ``since`` that did not succeed: a timed handoff whose run failed is no handoff."""
    from dagster import DagsterRunStatus, RunsFilter

    records = instance.get_run_records(  # type: ignore[attr-defined]
        RunsFilter(statuses=[DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED])
    )
    return [
        f"{r.dagster_run.run_id} {r.dagster_run.job_name} {r.dagster_run.tags.get('dagster/partition', '')}"
        for r in records
        if r.create_timestamp.timestamp() >= since
    ]


if __name__ == "__main__":
    raise SystemExit(main())
