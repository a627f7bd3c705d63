"""Benchmark: what a ranged run costs per small partition, in Spark jobs and seconds, against one run per partition.

A daily table of a small warehouse holds a few hundred rows a day: its build costs a handful of Spark jobs per
partition whatever its rows, each a good fraction of a second. A ranged run (a backfill, the headless build, the
example warehouse every end-to-end test module builds) plans every partition of the range and writes them in one
Delta commit; what it still pays partition by partition (each input's read, each partition's branch of the query, the
checks) is what this measures.

**The product's real path.** The example warehouse's catalog, ``build_assets(catalog)``, ``dagster.materialize`` of a
partition range in process (the tags ``warehouse_assets.cli.headless`` gives a range, as tests/support/warehouse.py
builds the example warehouse) on a Dagster test instance, local Spark from ``resources_from_env`` on a temporary lake.
``ods.order`` holds ``--orders`` orders a day (300, about the example warehouse's; ``--quick`` 30) over ``--days`` days
(11, the example warehouse's; ``--quick`` 2: a day and the one after it, which reads it) from 2026-01-01, written as
the ingestion leaves it and its hours reported with their checks passed (as bench/key_scoped_rebuild.py seeds it).
The tables: the order chain, each with its own kinds of checks: ``dwd.order_detail`` (the 24 hours of ``ods.order`` a
day; ``row_count`` against them), ``dws.user_order_daily`` (``references``), ``ads.daily_gmv`` (``row_count``,
``anomaly``: its trailing week read back), ``ads.gmv_week_to_date`` (self-dependent: the day before's rows); each
built once over the days before the rounds.

**The rounds.** ``--rounds`` (3; ``--quick`` 1) rounds, each: the *ranged* rebuild, one run of each table over all the
days; then the *single* rebuild, one run of each day and table (one run per partition), as partitions arriving one at
a time are run. Spark jobs are
counted by their ids (Spark numbers its jobs in order; PySpark's ``StatusTracker``), and split at the table's last
Delta commit into those before it (reads, query, write) and after it (the checks on the written partitions, Delta's
work after a commit) by a thread noting the last job id every 50 ms. Seconds are the Dagster runs' own (their run
records' start to end). Per partition (``pp``): divided by
tables x days. Ratios single/ranged in the same run; medians of the rounds.

**Checked** (kept in ``--quick``; the bench exits 1 otherwise): every run succeeded; every partition's check verdicts
of the ranged rebuild (passed, and the description with its numbers) equal those of the single rebuild, and so do the
rows each partition was written with. No time is asserted. Progress on stderr. The last line of stdout is ``RESULT
ranged_jobs_pp= single_jobs_pp= jobs_ratio= ranged_checks_jobs_pp= single_checks_jobs_pp= ranged_s_pp= single_s_pp=
s_ratio= partitions= runs= verdicts_equal= rows_equal= calib_ms= calib_spark_ms=`` (``bench/calibration.py``, the
latter on the bench's own Spark session).

    .venv/bin/python bench/ranged_run.py             # 11 days of 4 tables, 3 rounds
    .venv/bin/python bench/ranged_run.py --quick     # 2 days of 30 orders, 1 round: a smoke test
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

BENCH = Path(__file__).resolve().parent
for path in (BENCH, BENCH.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench.calibration import calib_ms, calib_spark_ms  # noqa: E402
from bench.synthetic_orders import order_rows  # noqa: E402

TZ = ZoneInfo("Asia/Shanghai")  # the example warehouse's business time zone
FIRST = date(2026, 1, 1)  # the warehouse's first partition
ODS = ("ods", "order")
TABLES = ("dwd.order_detail", "dws.user_order_daily", "ads.daily_gmv", "ads.gmv_week_to_date")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def at(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=TZ)


@dataclass
class Side:
    """One side's figures over a round: Spark jobs (before the commit, after it), run seconds, runs, and what the
    partitions were written with and judged."""

    jobs: int = 0
    checks_jobs: int = 0
    seconds: float = 0.0
    runs: int = 0
    verdicts: dict[tuple[str, str, str], tuple[bool, str]] = field(default_factory=dict)
    rows: dict[tuple[str, str], int] = field(default_factory=dict)


class JobClock:
    """When each Spark job had started, to within ``every`` seconds: PySpark's status tracker gives a job's id, not
    its time, so a thread notes the last job id every ``every`` seconds."""

    def __init__(self, last_job: Callable[[], int], every: float = 0.05):
        self.last_job, self.every = last_job, every
        self.seen: list[tuple[float, int]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="job-clock", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopped.wait(self.every):
            self.seen.append((time.time(), self.last_job()))

    def last_job_at(self, at: float) -> int:
        """The last job started by ``at`` (epoch seconds), as last noted before it."""
        index = bisect.bisect_right(self.seen, (at, float("inf"))) - 1
        return self.seen[index][1] if index >= 0 else -1

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


class Bench:
    def __init__(self, root: Path, instance: Any, days: list[date]):
        from resources import resources_from_env
        from resources.delta_lake import DeltaStore
        from warehouse_assets.catalog import load_catalog
        from warehouse_assets.materialize.compiler import build_assets

        self.instance, self.days = instance, days
        (root / "landing").mkdir(parents=True, exist_ok=True)
        self.resources = resources_from_env(
            {"WAREHOUSE_LAKE_ROOT": str(root / "lake"), "WAREHOUSE_LANDING_ROOT": str(root / "landing")}
        )
        self.spark = self.resources["spark"].session()
        self.store = DeltaStore(str(root / "lake"))
        self.catalog = load_catalog()
        self.assets = build_assets(self.catalog)
        self.tracker = self.spark.sparkContext.statusTracker()
        self.clock = JobClock(self.last_job)

    # ods.order, as the ingestion leaves it ------------------------------------------------------------------------
    def seed(self, orders: int) -> None:
        """``orders`` orders a day over the days, ids increasing with ``create_time``, each order's user drawn by hash
        from ten times as many users, 50 courses, 80 % paid, 10 % created (unpaid), 10 % refunded."""
        from warehouse_assets.ingest.merge import ods_arrow_schema

        self.store.create_table(ODS, ods_arrow_schema(self.catalog["ods.order"]), ["dt", "hh"])
        self.store.enable_deletion_vectors(self.spark, ODS)  # deletion vectors and the change data feed
        start_us = int(at(self.days[0]).timestamp() * 1_000_000)
        step_us = 86_400_000_000 // orders
        df = order_rows(
            self.spark, orders * len(self.days), start_us, step_us, users=10 * orders, courses=50, streams=8
        )
        df.repartition("dt", "hh").write.format("delta").mode("append").partitionBy("dt", "hh").save(
            self.store.spark_path(ODS)
        )
        for day in self.days:
            for hour in range(24):
                self.report_hour(f"{day.isoformat()}-{hour:02d}:00")

    def report_hour(self, hour: str) -> None:
        """An ODS hour reported and its blocking checks passed on that report, as the ingestion run does."""
        from dagster import AssetKey, AssetMaterialization

        from warehouse_assets.materialize.quality import Outcome, evaluation, latest_materialization

        table = self.catalog["ods.order"]
        self.instance.report_runless_asset_event(AssetMaterialization(AssetKey(list(ODS)), partition=hour))
        record = latest_materialization(self.instance, table, hour)
        for check in table.checks:
            outcome = Outcome(check, hour, True, {}, "seeded")
            self.instance.report_runless_asset_event(evaluation(self.instance, table, outcome, record))

    # a run -----------------------------------------------------------------------------------------------------------
    def last_job(self) -> int:
        """The id of the last Spark job started (-1: none); Spark numbers its jobs in order."""
        return max([*self.tracker.getJobIdsForGroup(), *self.tracker.getActiveJobsIds()], default=-1)

    def build(self, table: str, first: date, last: date, side: Side) -> None:
        """One run of ``table`` over ``first`` .. ``last``, as the headless path runs a range: its jobs, seconds and
        verdicts added to ``side``."""
        from dagster import AssetKey, materialize

        from warehouse_assets.cli.headless import in_process_run_tags
        from warehouse_assets.instance.lanes import USER_LANE

        span = {
            "dagster/asset_partition_range_start": first.isoformat(),
            "dagster/asset_partition_range_end": last.isoformat(),
        }
        job_before = self.last_job()
        result = materialize(
            self.assets,
            instance=self.instance,
            resources=self.resources,
            selection=[AssetKey(table.split("."))],
            tags={**in_process_run_tags(USER_LANE), **span},
            raise_on_error=False,
        )
        if not result.success:
            raise SystemExit(f"the run of {table} {first} .. {last} failed")
        job_after = self.last_job()
        side.jobs += job_after - job_before
        # the jobs started after the table's commit: its checks, Delta's work after a commit
        side.checks_jobs += job_after - self.clock.last_job_at(self.last_commit_ms(table) / 1000)
        record = self.instance.get_run_record_by_id(result.run_id)
        side.runs += 1
        side.seconds += float(record.end_time) - float(record.start_time)
        for verdict in result.get_asset_check_evaluations():
            key = (table, str(verdict.partition), verdict.check_name)
            side.verdicts[key] = (verdict.passed, verdict.description or "")
        for event in result.get_asset_materialization_events():
            for written in event.materialization.metadata["partitions"].value:
                side.rows[table, written["partition"]] = int(written["rows"])

    def last_commit_ms(self, table: str) -> int:
        [commit] = self.store.history(table.split("."), 1)
        return int(commit["timestamp"])

    def ranged(self) -> Side:
        side = Side()
        for table in TABLES:
            self.build(table, self.days[0], self.days[-1], side)
        return side

    def single(self) -> Side:
        side = Side()
        for day in self.days:
            for table in TABLES:
                self.build(table, day, day, side)
        return side


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=11, help="daily partitions per table (default 11)")
    parser.add_argument("--orders", type=int, default=300, help="orders a day (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="ranged then single rebuilds, this many times")
    parser.add_argument("--quick", action="store_true", help="2 days of 30 orders, 1 round: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:  # two days: the second reads the first (the week to date, the anomaly's trailing days)
        args.days, args.orders, args.rounds = 2, 30, 1
    days = [FIRST + timedelta(days=n) for n in range(args.days)]

    from dagster import instance_for_test

    # one SQLite event log for every run, on the memory-backed file system where there is one (as
    # tests/support/instances.py's): the instance's bookkeeping is the same on both sides, and small
    shm = Path("/dev/shm")
    events = {"module": "dagster._core.storage.event_log", "class": "ConsolidatedSqliteEventLogStorage"}
    with (
        tempfile.TemporaryDirectory(prefix="ranged-run-") as tmp,
        tempfile.TemporaryDirectory(prefix="ranged-run-home-", dir=shm if shm.is_dir() else None) as home,
    ):
        overrides = {"event_log_storage": {**events, "config": {"base_dir": str(Path(home) / "events")}}}
        with instance_for_test(temp_dir=home, overrides=overrides) as instance:
            bench = Bench(Path(tmp), instance, days)
            calib = calib_ms()
            calib_spark = calib_spark_ms(bench.spark)
            log(f"calib_ms={calib} calib_spark_ms={calib_spark}; seeding {args.days} days of {args.orders} orders")
            started = time.perf_counter()
            bench.seed(args.orders)
            first = Side()
            for table in TABLES:
                bench.build(table, days[0], days[-1], first)
            log(f"seeded and built once in {time.perf_counter() - started:.1f}s")
            ranged, single = [], []
            for r in range(args.rounds):
                ranged.append(bench.ranged())
                single.append(bench.single())
                log(f"round {r + 1}: ranged {describe(ranged[-1])}; single {describe(single[-1])}")
            bench.clock.stop()
            result, failures = summarize(ranged, single, len(TABLES) * len(days))
    result |= {"calib_ms": str(calib), "calib_spark_ms": str(calib_spark)}
    for failure in failures:
        print(f"FAILED: {failure}")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()), flush=True)
    return 1 if failures else 0


def describe(side: Side) -> str:
    return f"{side.runs} runs, {side.jobs} Spark jobs ({side.checks_jobs} after the commits), {side.seconds:.1f}s"


def summarize(ranged: list[Side], single: list[Side], partitions: int) -> tuple[dict[str, str], list[str]]:
    """The medians per partition, and what differed between the sides."""

    def per_partition(sides: list[Side], figure: str) -> float:
        return statistics.median(getattr(s, figure) for s in sides) / partitions

    failures = []
    verdicts_equal = rows_equal = True
    for r, (a, b) in enumerate(zip(ranged, single, strict=True), start=1):
        differing = sorted(k for k in a.verdicts.keys() | b.verdicts.keys() if a.verdicts.get(k) != b.verdicts.get(k))
        verdicts_equal = verdicts_equal and not differing and bool(a.verdicts)
        for key in differing[:5]:
            failures.append(f"round {r}: {key}: ranged {a.verdicts.get(key)}, single {b.verdicts.get(key)}")
        if not a.verdicts:
            failures.append(f"round {r}: no check verdict read")
        if a.rows != b.rows:
            rows_equal = False
            failures.append(f"round {r}: rows differ: ranged {a.rows}, single {b.rows}")
        if len(a.rows) != partitions:
            failures.append(f"round {r}: {len(a.rows)} partitions written, not {partitions}")
    figures = {name: per_partition(ranged, name) for name in ("jobs", "checks_jobs", "seconds")}
    alone = {name: per_partition(single, name) for name in ("jobs", "checks_jobs", "seconds")}
    result = {
        "ranged_jobs_pp": f"{figures['jobs']:.2f}",
        "single_jobs_pp": f"{alone['jobs']:.2f}",
        "jobs_ratio": f"{alone['jobs'] / figures['jobs']:.2f}",
        "ranged_checks_jobs_pp": f"{figures['checks_jobs']:.2f}",
        "single_checks_jobs_pp": f"{alone['checks_jobs']:.2f}",
        "ranged_s_pp": f"{figures['seconds']:.3f}",
        "single_s_pp": f"{alone['seconds']:.3f}",
        "s_ratio": f"{alone['seconds'] / figures['seconds']:.2f}",
        "partitions": str(partitions),
        "runs": f"{ranged[-1].runs},{single[-1].runs}",
        "verdicts_equal": "yes" if verdicts_equal else "no",
        "rows_equal": "yes" if rows_equal else "no",
    }
    print(f"ranged run of {partitions} partitions (medians of {len(ranged)} rounds), per partition:")
    print(
        f"  ranged: {figures['jobs']:.2f} Spark jobs ({figures['checks_jobs']:.2f} after the commit), "
        f"{figures['seconds']:.3f} s"
    )
    print(
        f"  single: {alone['jobs']:.2f} Spark jobs ({alone['checks_jobs']:.2f} after the commit), "
        f"{alone['seconds']:.3f} s"
    )
    return result, failures


if __name__ == "__main__":
    sys.exit(main())
