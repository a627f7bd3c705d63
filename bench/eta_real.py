"""Real-stack ETA accuracy: the predicted finishes the running product recorded, scored against its own runs.

The embedded stack runs as the soak starts it (``warehouse spark-server``, ``dagster-webserver``, ``dagster-daemon
run``, ``warehouse engine`` on a temporary ``DAGSTER_HOME`` with the instance's ``dagster.yaml``: the lanes, the real
Spark runs and their run-time noise, ranged runs and retries), on simulated sources in real time: the day before and
today up to now are simulated at the start (the stack catches up on them), then the bench extends the sources every
20 s to the current 5-minute batch, as the live simulation of ``warehouse dev`` does. Orders re-dated after their
hour was reported (``unplaced_move_rate``) are late data: ``dws.order_hourly`` and ``ads.gmv_hourly`` are rebuilt by
their late-data policy (every 15 minutes) in the rebuild lane.

A late source: one ``ods.order`` shard holds back the segments of the hour whose SLA deadline (its end + 1 h 15 min)
is the first at least 30 minutes after the stack is up (after the start's catch-up, see below), and delivers them
3 minutes after that deadline, so the hour (and what reads it) misses its SLA. The run lasts ``--minutes``, at
least until 10 minutes after that deadline, and never ends in the first 10 minutes of an hour (the hour just ended
is still being built: its finishes would be cut off).

The stack starts behind: its first ingestion takes in a day and more of landed segments at once (the catch-up, over
once every ODS hour that ended before the stack was up is reported, ods.order's from the held-back hour on excepted:
``caught_up_min`` after it was up). The figures are scored from the end of the catch-up, and no earlier than 10
minutes after the stack was up (:func:`score_run`): a fresh instance has learned no delay and no run time yet, the
hours due in its first minutes wait on a backlog it cannot time, and a deadline sooner than 10 minutes after the start
cannot be warned 10 minutes ahead by any stack. What those deadlines gave is printed apart (``catchup_*``);
predictions made before the span count for the finishes in it.

**The bench's catalog** is the example warehouse's, with more hourly SLAs than it declares (in a copy, given to the
stack as ``WAREHOUSE_CATALOG_DIR``): its two derived hourly tables (``dws.order_hourly``, ``ads.gmv_hourly``) and, per
ODS table, an hourly row count (``dws.<table>_hour_rows``, one Spark run an hour each) promise their hour by its end
+ 1 h 15 min, as the ODS hours do (so the late hour makes its readers miss too). Only the partitions of SLA tables
are predicted, and only those finishing within the run can be scored; the example's five ODS hours alone give five
1 h samples per hour of run past the first, so a P90 that its one late hour does not set by itself (ten samples or
more) would take a run of three hours. With twelve SLA tables an hour of run past the first gives about twelve, the
ODS hours' and the derived ones' (which wait on their input and their own Spark run: harder to predict, not easier).

Meanwhile the ``sla_forecast`` sensor records its predictions (every 30 s here) as it does in production. At the end,
the figures are those of ``warehouse eta --accuracy --since <that start>`` (:mod:`warehouse_assets.explain.accuracy`)
on the bench's instance: the error 1 h before the finish (P50, P90, and P90 as a share of the time looked ahead),
P90 3 h and 10 min before, the same 1 h figures over the partitions that met their SLA (``_on_time``: the late hour
and its readers apart, see :mod:`warehouse_assets.explain.accuracy`), the SLA misses, those warned (and the least
lead) and the false warnings. A finish has a 1 h sample when a prediction was made between 2 h and 1 h before it, so
only the finishes an hour or more after the stack was up have one: each hour of the run past its first gives about
twelve (the catalog's hourly SLA tables).

    flock /tmp/bench.lock .venv/bin/python bench/eta_real.py [--minutes 75]
    .venv/bin/python bench/eta_real.py --quick    # no late source, until the first checks hold: a smoke test

Prints ``RESULT real_eta_err_p50_s= real_eta_err_p90_s= real_eta_err_p90_share= real_eta_samples_1h=
real_eta_err_p90_s_3h= real_eta_err_p90_s_10m= real_eta_samples_1h_on_time= real_eta_err_p90_s_on_time=
real_eta_err_p90_share_on_time= real_misses= real_warned= real_warned_lead_min_s=
real_false_warnings= real_predictions= caught_up_min= catchup_deadlines= catchup_misses= catchup_false_warnings=
runs= failed_runs= retried_runs= rebuilds= minutes= calib_ms= calib_spark_ms=`` (the machine's calibration,
``bench/calibration.py``; the Spark one on the stack's Spark Connect server). Exits 1 when the forecast recorded no
prediction or a run failed for good (``failed_runs``; a failed run that the daemon's retry then built, as the first
runs of a stack whose Spark Connect server is not up yet, is ``retried_runs``).

``--quick`` ends as soon as what it checks can be judged (:func:`smoke_judged`: the forecast recorded a prediction, a
run succeeded, and no failed run waits for its retry), at most 4 minutes after the stack is up; its error figures are
``nan`` (no deadline or 1 h sample falls in so short a run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.calibration import calib_ms, calib_spark_connect_ms
from bench.handoff_latency import _engine_watching, _sensor_ticked
from bench.processes import LEFTOVER_GRACE_S, free_port
from bench.soak import SilentShard, Supervisor
from resources.settings import Settings

if TYPE_CHECKING:
    from dagster import DagsterInstance

    from warehouse_assets.catalog import Catalog

TZ = ZoneInfo(Settings.from_env().timezone)
BATCH = timedelta(minutes=5)  # the simulated source's batch: it is extended to the last whole one
LATE_STREAM = "edu_trade/order_03"
LATE_AFTER_DEADLINE = timedelta(minutes=3)  # the late hour's segments arrive this long after its deadline
LATE_LEAD = timedelta(minutes=30)  # the late hour's deadline at least this long after the stack is up
AFTER_LATE = timedelta(minutes=10)  # the run lasts at least this long after the late hour's deadline
HOUR_SETTLES = timedelta(minutes=10)  # an hour's ODS partitions and their hourly readers, built after its end
WARN_LEAD = timedelta(minutes=10)  # how early a miss must be warned: no deadline sooner after the start is scored
QUICK_MINUTES = 4  # the longest a quick run waits, once the stack is up, for its checks to be judged
# the quick run's sensor intervals (seconds): the landing sensor's (the product's 15) and the forecast's (the full
# run's 30): its checks wait for an ingestion and a recorded prediction, not for the sensors' fixed pauses
QUICK_ODS_INTERVAL, QUICK_FORECAST_INTERVAL = 2, 5


def say(text: str) -> None:
    print(f"[eta_real {datetime.now():%H:%M:%S}] {text}", flush=True)


def floor_batch(moment: datetime) -> datetime:
    return moment.replace(minute=moment.minute - moment.minute % 5, second=0, microsecond=0)


def late_hour(up: datetime, sla: timedelta) -> datetime:
    """The start of the hour (naive, business time) whose deadline (its end + ``sla``) is the first at least
    :data:`LATE_LEAD` after ``up``."""
    end = up.replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    while end + sla < up + LATE_LEAD:
        end += timedelta(hours=1)
    return (end - timedelta(hours=1)).replace(tzinfo=None)


# the example's hourly tables given an SLA in the bench's catalog, and the hourly row counts added to it, one per ODS
# table: an hour materialized by its end + within + grace
HOURLY_SLA = "sla: {within: 1h, grace: 15m}"  # as the ODS hours: the late hour makes them all miss
SLA_ADDED_TO = ("dws/order_hourly.sql", "ads/gmv_hourly.sql")


def bench_catalog(work: Path) -> Path:
    """The bench's table declarations under ``work``: the example warehouse's, with :data:`HOURLY_SLA` declared by
    its derived hourly tables and by an hourly row count of each ODS table (``dws.<table>_hour_rows``)."""
    from warehouse_assets.catalog.loader import TABLES_DIR

    tables = work / "tables"
    shutil.copytree(TABLES_DIR, tables)
    for path in SLA_ADDED_TO:
        declared = (tables / path).read_text()
        if "\nsla:" in declared or "\nperiod: hourly\n" not in declared:
            raise SystemExit(f"{path}: expected an hourly table without an SLA; the bench's catalog needs a look")
        (tables / path).write_text(declared.replace("\nperiod: hourly\n", f"\nperiod: hourly\n{HOURLY_SLA}\n", 1))
    for ods in sorted((tables / "ods").glob("*.yaml")):
        name = ods.stem
        (tables / "dws" / f"{name}_hour_rows.sql").write_text(
            f"/* ---\ntable: dws.{name}_hour_rows\nperiod: hourly\n{HOURLY_SLA}\n"
            f"description: Rows of ods.{name} created in the hour (the ETA bench's hourly SLA table).\n"
            f"owner: bench\nprimary_key: [hour_start]\ndepends_on:\n  ods.{name}: {{set: [0]}}\n--- */\n"
            f"SELECT '${{start}}' AS hour_start, count(*) AS hour_rows FROM ods.{name}\n"
        )
    return tables


def caught_up(
    instance: DagsterInstance, catalog: Catalog, start: datetime, up: datetime, held: datetime | None
) -> bool:
    """Whether every ODS hour from ``start`` (naive, business time) that ended by ``up`` is reported, ods.order's
    from ``held`` on excepted (the late shard holds them back)."""
    from dagster import AssetKey

    hours = []
    hour = start
    while hour + timedelta(hours=1) <= up.replace(tzinfo=None):
        hours.append(hour)
        hour += timedelta(hours=1)
    for table in catalog:
        if not table.is_ods:
            continue
        wanted = {f"{h:%Y-%m-%d-%H}:00" for h in hours if not (table.fqn == "ods.order" and held and h >= held)}
        if not wanted <= instance.get_materialized_partitions(AssetKey(table.key)):
            return False
    return True


class RunCounts(NamedTuple):
    runs: int
    succeeded: int
    failed: int  # for good: no retry of it succeeded
    retried: int  # failed, then built by the daemon's retry
    rebuilds: int


def count_runs(instance: DagsterInstance) -> RunCounts:
    """The runs of the bench's own instance (its runs since the stack started), by outcome."""
    from dagster import DagsterRunStatus

    from warehouse_assets.instance.lanes import LANE_TAG, REBUILD_LANE

    records = instance.get_run_records()
    succeeded = [r.dagster_run for r in records if r.dagster_run.status == DagsterRunStatus.SUCCESS]
    roots = {run.tags.get("dagster/root_run_id", run.run_id) for run in succeeded}
    failures = [r.dagster_run for r in records if r.dagster_run.status == DagsterRunStatus.FAILURE]
    retried = sum(1 for run in failures if run.tags.get("dagster/root_run_id", run.run_id) in roots)
    rebuilds = sum(1 for r in records if r.dagster_run.tags.get(LANE_TAG) == REBUILD_LANE)
    return RunCounts(len(records), len(succeeded), len(failures) - retried, retried, rebuilds)


def past_the_hours_finishes(end: datetime) -> datetime:
    """``end``, or later when it falls just after an hour's end: the ODS hours land about a minute after it and their
    readers build minutes later, so a run ending then would stop before the hour's finishes (the ones its 1 h
    samples come from) and score none of them."""
    hour = end.replace(minute=0, second=0, microsecond=0)
    return max(end, hour + HOUR_SETTLES)


def smoke_judged(instance: DagsterInstance, since: datetime) -> bool:
    """Whether a quick run's checks can be judged now: the forecast recorded a prediction since ``since``, a run
    succeeded, and every failed run was built by a retry (a failure whose retry is still running would count as one
    for good if the run stopped now)."""
    from warehouse_assets.explain.prediction_log import PredictionLog

    counts = count_runs(instance)
    if not counts.succeeded or counts.failed:
        return False
    with PredictionLog.of(instance) as log:
        return bool(log.read(since.timestamp()))


def score_run(
    instance: DagsterInstance, catalog: Catalog, up: datetime, caught: datetime | None, finished: datetime
) -> dict[str, str]:
    """The figures of ``warehouse eta --accuracy`` from the scored span's start to ``finished``, and the catch-up's
    deadlines apart.

    The span starts once the stack has ``caught`` up and at least :data:`WARN_LEAD` after it was ``up``: a deadline
    sooner than that after the start could not be warned that long ahead by a stack that was not running yet, and
    the hours due in the catch-up wait on a backlog a fresh instance (no delay, no run time learned) cannot time.
    Never caught up: the span starts at ``up`` + :data:`WARN_LEAD`, the catch-up in it."""
    from warehouse_assets.explain.accuracy import instance_accuracy

    scored = max(caught or up, up + WARN_LEAD)
    accuracy = instance_accuracy(instance, catalog, scored, finished)
    say(f"warehouse eta --accuracy --since {scored.isoformat(timespec='seconds')} on the bench's instance:")
    for line in accuracy.lines(TZ):
        say(line)
    figures = accuracy.figures()
    # the catch-up's own deadlines, apart: those between the stack's start and the scored span's
    whole = instance_accuracy(instance, catalog, up, finished)
    before = scored.timestamp()
    figures["caught_up_min"] = f"{(caught - up).total_seconds() / 60:.1f}" if caught else "nan"
    figures["catchup_deadlines"] = str(whole.deadlines - accuracy.deadlines)
    figures["catchup_misses"] = str(sum(1 for m in whole.misses if m.deadline < before))
    figures["catchup_false_warnings"] = str(sum(1 for m in whole.false_warnings if m.deadline < before))
    for kind, found in (("missed", whole.misses), ("false warning", whole.false_warnings)):
        for m in (m for m in found if m.deadline < before):
            lead = "NOT warned" if m.lead_s is None else f"warned {m.lead_s / 60:.0f} min ahead"
            due = datetime.fromtimestamp(m.deadline, TZ)
            say(f"catch-up {kind}: {m.table} {m.partition} due {due:%H:%M}, {lead}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=45, help="minutes the stack runs once it is up")
    parser.add_argument("--seed", type=int, default=5, help="the simulated source's seed")
    parser.add_argument("--scale", type=float, default=0.03, help="the simulated sources' volume (1.0: full)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--quick", action="store_true", help="until its checks hold, no late source: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.minutes = QUICK_MINUTES
    calib = calib_ms()
    calib_spark = float("nan")

    from dagster import DagsterInstance

    from simulator.cdc import SimulationConfig, simulate
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.cli.dev import DEV_MARK, stop_marked
    from warehouse_assets.materialize.freshness import deadline

    work = Path(tempfile.mkdtemp(prefix="eta-real-"))
    tables = bench_catalog(work)
    catalog = load_catalog(tables)
    say(f"{sum(1 for t in catalog if t.sla is not None and t.period == 'hourly')} hourly SLA tables")
    home, lake, landing = work / "dagster_home", work / "lake", work / "landing"
    home.mkdir(parents=True)
    landing.mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    now = datetime.now(TZ)
    first = now.date() - timedelta(days=1)
    start = datetime(first.year, first.month, first.day)
    config = SimulationConfig(seed=args.seed, scale=args.scale, tz=str(TZ), dup_rate=0.01, unplaced_move_rate=0.05)
    mark = uuid.uuid4().hex
    port, spark_port = free_port(), free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_START=f"{first:%Y-%m-%d}",
        WAREHOUSE_CATALOG_DIR=str(tables),
        WAREHOUSE_LAKE_ROOT=str(lake),
        WAREHOUSE_LANDING_ROOT=str(landing),
        WAREHOUSE_LOG_DIR=str(work),
        WAREHOUSE_SPARK_MODE="connect",
        WAREHOUSE_SPARK_CONNECT_URL=f"sc://127.0.0.1:{spark_port}",
        WAREHOUSE_SPARK_DRIVER_MEMORY=os.environ.get("WAREHOUSE_SPARK_DRIVER_MEMORY", "2g"),
        WAREHOUSE_SIMULATE_LIVE="0",  # the bench is the source: it holds the late shard back
        WAREHOUSE_FRESHNESS_SENSOR_INTERVAL=str(QUICK_FORECAST_INTERVAL if args.quick else 30),
        **({"WAREHOUSE_ODS_SENSOR_INTERVAL": str(QUICK_ODS_INTERVAL)} if args.quick else {}),
        DAGSTER_TELEMETRY_ENABLED="false",
        **{DEV_MARK: mark},
    )
    os.environ.update({k: env[k] for k in ("DAGSTER_HOME", "WAREHOUSE_START")})
    # the late hour is chosen from when the stack is expected up (a few minutes), and held back from the first feed
    order = catalog["ods.order"]
    sla = deadline(order, f"{first:%Y-%m-%d}-00:00") - datetime(first.year, first.month, first.day, 1, tzinfo=TZ)
    late: SilentShard | None = None
    late_due: datetime | None = None
    hour: datetime | None = None
    if not args.quick:
        hour = late_hour(now + timedelta(minutes=4), sla)
        late = SilentShard(landing, work / "held", LATE_STREAM, hour, hour + timedelta(hours=1))
        late_due = deadline(order, f"{hour:%Y-%m-%d-%H}:00")
        say(f"late source: {LATE_STREAM} holds {hour:%Y-%m-%d %H:00} back until {late_due + LATE_AFTER_DEADLINE:%H:%M}")
    fed_until = floor_batch(now.replace(tzinfo=None))
    say(f"{work}: simulating {start:%Y-%m-%d %H:%M} .. {fed_until:%H:%M} at scale {args.scale}")
    simulate(landing, start, fed_until, config)
    if late is not None:
        late.after_feed(min(fed_until, late.end - BATCH))

    with DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()  # storage created once, before three processes race to create it
    supervisor = Supervisor(env, work, port, spark_port)
    figures: dict[str, str] = {}
    counts = RunCounts(0, 0, 0, 0, 0)
    minutes = 0.0
    caught: datetime | None = None
    try:
        # the quick run starts the daemon, whose sensors launch the first runs, once Spark listens: those runs then
        # do not fail on a server not up yet, and its checks need not wait for the daemon's retries of them
        for name in ("spark_connect", "webserver", *(() if args.quick else ("daemon",)), "engine"):
            supervisor.start(name)
        if args.quick:
            calib_spark = calib_spark_connect_ms(env["WAREHOUSE_SPARK_CONNECT_URL"], work)
            supervisor.start("daemon")
        instance = DagsterInstance.from_config(str(home))
        limit = time.monotonic() + 600
        while not (_sensor_ticked(instance, "ods_landing") and _engine_watching(instance)):
            supervisor.ensure()
            if time.monotonic() > limit:
                raise SystemExit(f"the stack did not come up within 600 s; logs in {work}")
            time.sleep(2)
        if not args.quick:
            calib_spark = calib_spark_connect_ms(env["WAREHOUSE_SPARK_CONNECT_URL"], work)
        up = datetime.now(TZ)
        end = up + timedelta(minutes=args.minutes)
        if late_due is not None:
            end = max(end, late_due + AFTER_LATE)
        if not args.quick:
            end = past_the_hours_finishes(end)
        say(f"the stack is up at {up:%H:%M:%S}; feeding the sources in real time until {end:%H:%M}")
        while datetime.now(TZ) < end:
            supervisor.ensure()
            if args.quick and smoke_judged(instance, now):
                break
            if caught is None and caught_up(instance, catalog, start, up, hour):
                caught = datetime.now(TZ)
                say(f"caught up at {caught:%H:%M:%S}")
            current = floor_batch(datetime.now(TZ).replace(tzinfo=None))
            if current > fed_until:
                fed_until = current
                simulate(landing, start, fed_until, config)
            if late is not None and late_due is not None:
                released = datetime.now(TZ) >= late_due + LATE_AFTER_DEADLINE
                late.after_feed(fed_until if released else min(fed_until, late.end - BATCH))
            time.sleep(2 if args.quick else 20)
        finished = datetime.now(TZ)
        figures = score_run(instance, catalog, up, caught, finished)
        counts = count_runs(instance)
        minutes = (finished - up).total_seconds() / 60
    finally:
        supervisor.stop()
        # what Dagster's stop left (a code server, the warm launcher): signalled now, waited for by polling
        stop_marked(mark, grace=LEFTOVER_GRACE_S)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        "RESULT "
        + " ".join(f"{k}={v}" for k, v in figures.items())
        + f" runs={counts.runs} failed_runs={counts.failed} retried_runs={counts.retried} rebuilds={counts.rebuilds}"
        + f" minutes={minutes:.0f} calib_ms={calib} calib_spark_ms={calib_spark}"
    )
    return 1 if counts.failed or figures.get("real_predictions", "0") == "0" else 0


if __name__ == "__main__":
    raise SystemExit(main())
