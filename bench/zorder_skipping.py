"""Benchmark: Z-order data skipping for a selective two-column lookup, as the product ships it.

The table is declared as the product's are: ``dwd.attendance_detail`` of the catalog, daily partitions (``dt``),
Z-ordered by its declared ``zorder.by`` columns into files of its declared ``zorder.file_size``. The bench builds
``--days`` days of lesson attendance (default one day of 2,000,000 rows, about 50 MiB of Parquet: a day of the
example's company at scale) with ``write_deltalake``, one append per micro-batch in small files, as rows arrive in
time order; ``user_id`` and ``course_id`` are hashes of the row number, uncorrelated with it. Then it runs the
analyst's lookup "this learner's attendance of this course that day" through the product's read path,
``DeltaStore.read(spark, key, partitions=[day], predicates=[user_id = X, course_id = Y])`` and ``collect()``, on
three layouts of the same table:

* ``unordered``  - as ingested;
* ``compacted``  - the control: ``DeltaStore.optimize`` to files of the declared size, same order;
* ``zordered``   - after the shipped ``zorder_partitions`` job (what the ``zorder_complete_partitions`` sensor
  launches), run in process on the bench's lake: Spark's ``OPTIMIZE ... WHERE dt = ... ZORDER BY (...)`` with the
  declared file size.

Every layout is timed the same way: one warm-up run (none in ``--quick``, whose times are not figures), then the
best of ``--repeat`` runs of each lookup. The lookups must return the same rows on every layout (checked). Skipping
is also measured for ``--sample`` more lookups without reading data: the read path's own pruning (each live file's
min/max, as ``DeltaStore.live_files`` applies it) over one listing of the partition's files.

The last line is one ``RESULT`` line of ``key=value`` figures: ``ratio`` = unordered time / Z-ordered time,
``skipped`` = mean fraction of the partition's files a lookup skips after Z-order, ``lookup_rows`` = the rows the
timed lookups found (of pairs taken from the table: at least one each), and the machine's ``calib_ms`` and
``calib_spark_ms`` (``bench/calibration.py``, the latter on the bench's own Spark session).

    .venv/bin/python bench/zorder_skipping.py                         # one day of 2,000,000 rows
    .venv/bin/python bench/zorder_skipping.py --rows-per-day 500000 --keep --workdir /tmp/zbench
    .venv/bin/python bench/zorder_skipping.py --skew 0.2          # 5 hot learners hold 20 % of the rows
    .venv/bin/python bench/zorder_skipping.py --file-mib 8        # the table declared with 8 MiB files
    .venv/bin/python bench/zorder_skipping.py --quick             # 150,000 rows, one run each: a smoke test

``--quick``'s day is about 3.5 MiB of Parquet: in the declared 4 MiB files it would be one file after Z-order, and a
lookup would skip nothing. So the quick run declares the table's ``zorder.file_size`` as 1 MiB (the smallest a table
may declare): Z-order writes several files, and the lookups skip some of them. The compaction control then has
nothing to merge (the appends' files are about 1 MiB already): it still answers the same rows.

With ``--skew`` the result also has ``hot_skipped``: the skipping of the sampled lookups of hot learners.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dagster import DagsterInstance

from bench.calibration import calib_ms, calib_spark_ms
from resources import resources_from_env
from resources.delta_lake import DeltaStore, Predicate, ReadStats
from resources.spark import engine_label, get_session
from warehouse_assets.catalog import START, Catalog, Table, load_catalog, periods
from warehouse_assets.materialize.zorder import build_zorder_job

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CATALOG = load_catalog()
TABLE = CATALOG["dwd.attendance_detail"]  # declared as the product declares it: the columns and the file size
KEY = tuple(TABLE.key)
ZORDER = TABLE.zorder
MIB = 1024 * 1024
QUICK_FILE_MIB = 1  # several files of the quick run's small day (the smallest size a table may declare)
M64 = 0xFFFFFFFFFFFFFFFF
PLATFORMS = ("android", "ios", "web", "pc", "pad")
PLATFORM_CUTS = (450, 750, 880, 970)  # per mille: android 45 %, ios 30 %, web 13 %, pc 9 %, pad 3 %
APP_VERSIONS = tuple(f"7.{minor}.{patch}" for minor in range(8, 14) for patch in range(5))
USER_BASE = 100_000_000  # 9-digit user ids, as the source's
COURSE_BASE = 200_000
COURSES_PER_USER = 4
LESSONS_PER_COURSE = 48
ATTENDANCES_PER_USER = 25  # per month: about one lesson a day for an active learner
DAYS_PER_MONTH = 30
HEARTBEAT_S = 15.0


def log(message: str = "") -> None:
    print(message, flush=True)


def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64 of ``x``: a cheap, reproducible hash (uint64 arithmetic wraps on purpose)."""
    z = x.astype(np.uint64) + np.uint64((0x9E3779B97F4A7C15 * (salt + 1)) & M64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


# --- the table's rows, a pure function of the row number ---------------------------------------------------


@dataclasses.dataclass
class Attendance:
    """Row ``r`` is the ``r``-th attendance in time order, ``rows_per_day`` a day.

    Every learner attends lessons of up to ``COURSES_PER_USER`` courses; which learner and which course a row
    belongs to is a hash of ``r``, so neither column says anything about the insertion order.
    """

    rows_per_day: int
    days: int
    skew: float = 0.0  # the fraction of rows held by the few hot learners (a skewed build)
    hot_users: int = 5

    def __post_init__(self) -> None:
        first = date.fromisoformat(START)
        self.rows = self.rows_per_day * self.days
        tz = ZoneInfo(periods().timezone)
        self.day_dates = [first + timedelta(days=d) for d in range(self.days)]
        self.day_epoch = [int(datetime.combine(d, datetime.min.time(), tz).timestamp()) for d in self.day_dates]
        self.day_first = np.array([self.rows * d // self.days for d in range(self.days + 1)], dtype=np.int64)
        # a month's active learners, of whom a day sees a share
        self.users = max(1_000, self.rows_per_day * DAYS_PER_MONTH // ATTENDANCES_PER_USER)
        self.courses = 20_000

    @property
    def partitions(self) -> list[dict[str, str]]:
        return [{"dt": d.isoformat()} for d in self.day_dates]

    def user_course(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = _mix(r, 0)
        user = (h % np.uint64(self.users)).astype(np.int64)
        if self.skew:  # a few hot learners (the first user ids) hold ``skew`` of the rows
            hot = _mix(r, 3) % np.uint64(10_000) < np.uint64(round(self.skew * 10_000))
            user = np.where(hot, (_mix(r, 4) % np.uint64(self.hot_users)).astype(np.int64), user)
        k = (h >> np.uint64(59)) % np.uint64(COURSES_PER_USER)
        course = _mix(user.astype(np.uint64) * np.uint64(COURSES_PER_USER) + k, 1) % np.uint64(self.courses)
        return user + USER_BASE, course.astype(np.int64) + COURSE_BASE

    def day(self, d: int) -> pa.Table:
        """The attendances of day ``d`` (in time order) as an Arrow table with its day partition column."""
        r = np.arange(self.day_first[d], self.day_first[d + 1], dtype=np.int64)
        n = len(r)
        user, course = self.user_course(r)
        h = _mix(r, 2)
        second = ((r - self.day_first[d]) * 86_400) // max(1, n)
        join = self.day_epoch[d] + second + (h % np.uint64(60)).astype(np.int64)
        duration = (60 + (h >> np.uint64(8)) % np.uint64(5_340)).astype(np.int64)
        platform = np.searchsorted(np.array(PLATFORM_CUTS), ((h >> np.uint64(24)) % np.uint64(1000)).astype(np.int64))
        version = ((h >> np.uint64(36)) % np.uint64(len(APP_VERSIONS))).astype(np.int32)
        lesson = course * 100 + ((h >> np.uint64(48)) % np.uint64(LESSONS_PER_COURSE)).astype(np.int64)
        ts = pa.timestamp("us", tz="UTC")
        day = self.day_dates[d].isoformat()
        return pa.table(
            {
                "id": pa.array(r + 1),
                "user_id": pa.array(user),
                "course_id": pa.array(course),
                "lesson_id": pa.array(lesson),
                "join_time": pa.array(join * 1_000_000, ts),
                "duration_sec": pa.array(duration.astype(np.int32)),
                "platform": _strings(platform, PLATFORMS),
                "app_version": _strings(version, APP_VERSIONS),
                "dt": pa.array([day] * n, pa.string()),
            }
        )

    def lookups(self, count: int, seed: int) -> list[tuple[int, int]]:
        """``count`` (user, course) pairs that exist in the table, taken from random rows."""
        r = np.random.default_rng(seed).integers(0, self.rows, size=count, dtype=np.int64)
        user, course = self.user_course(r)
        return [(int(u), int(c)) for u, c in zip(user, course, strict=True)]


def _strings(indices: np.ndarray, values: tuple[str, ...]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), pa.array(values)).cast(pa.string())


# --- building and optimizing -------------------------------------------------------------------------------


def build_table(store: DeltaStore, gen: Attendance, ingest_file_bytes: int, batches_per_day: int) -> dict[str, Any]:
    """``batches_per_day`` ``write_deltalake`` appends a day (the day's micro-batches, in time order), files
    rolled at ``ingest_file_bytes``."""
    uri = store.table_uri(KEY)
    started = last = time.monotonic()
    for d in range(gen.days):
        rows = gen.day(d)
        step = -(-rows.num_rows // batches_per_day)
        for b in range(batches_per_day):
            write_deltalake(
                uri,
                rows.slice(b * step, step),
                mode="append",
                partition_by=["dt"],
                target_file_size=ingest_file_bytes,
                configuration=store.table_configuration() if d == b == 0 else None,
            )
        now = time.monotonic()
        if now - last >= 10 or d == gen.days - 1:
            log(f"  build: {d + 1}/{gen.days} days, {int(gen.day_first[d + 1]):,} rows, {now - started:.0f}s")
            last = now
    return {"seconds": time.monotonic() - started, **table_files(store, KEY)}


def table_files(store: DeltaStore, key: tuple[str, ...]) -> dict[str, Any]:
    _, stats = store.live_files(key)
    return {"files": stats.files_read, "bytes": stats.bytes_read}


def with_heartbeat(label: str, directory: Path, work: Callable[[], Any]) -> Any:
    """Run ``work`` in a thread; every ``HEARTBEAT_S`` print how many new parquet files it has written."""
    started, wall = time.monotonic(), time.time()
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name=label, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(HEARTBEAT_S)
        if thread.is_alive():
            count, size = _new_files(directory, wall)
            log(f"  {label}: {time.monotonic() - started:.0f}s, {count} new files ({size / MIB:.0f} MiB) so far")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _new_files(directory: Path, since: float) -> tuple[int, int]:
    count = size = 0
    for folder, _, names in os.walk(directory):
        if "_delta_log" in folder:
            continue
        for name in names:
            if name.endswith(".parquet"):
                st = os.stat(os.path.join(folder, name))
                if st.st_mtime >= since:
                    count, size = count + 1, size + st.st_size
    return count, size


def compact(store: DeltaStore, gen: Attendance, target_size: int | None, spark: SparkSession) -> dict[str, Any]:
    """The control: ``DeltaStore.optimize`` of each day to files of the declared size, without Z-order."""
    started = time.monotonic()
    for spec in gen.partitions:
        m = with_heartbeat(
            f"compaction dt={spec['dt']}",
            Path(store.table_uri(KEY)),
            lambda spec=spec: store.optimize(KEY, partitions=[spec], target_size=target_size, spark=spark),
        )
        log(
            f"  compaction dt={spec['dt']}: {m['numFilesRemoved']} files -> {m['numFilesAdded']} files "
            f"in {m['duration_s']:.1f}s"
        )
    return {"seconds": time.monotonic() - started, **table_files(store, KEY)}


def declare_table(file_mib: float | None) -> Table:
    """The bench's table: the catalog's, with its ``zorder.file_size`` declared as ``file_mib`` MiB if given."""
    return TABLE if file_mib is None else dataclasses.replace(TABLE, zorder_file_size=round(file_mib * MIB))


def zorder_job(store: DeltaStore, gen: Attendance, table: Table) -> dict[str, Any]:
    """The shipped ``zorder_partitions`` job over the bench's days, in process, on the bench's lake: what the
    ``zorder_complete_partitions`` sensor launches once a day's partition is complete. It is built from the
    catalog with the bench's declaration of the table, as the product builds it from its own catalog."""
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": store.root})
    days = [spec["dt"] for spec in gen.partitions]
    started = time.monotonic()
    with DagsterInstance.ephemeral() as instance:
        result = with_heartbeat(
            f"zorder_partitions {days[0]}..{days[-1]}",
            Path(store.table_uri(KEY)),
            lambda: build_zorder_job(Catalog({**CATALOG.tables, table.fqn: table})).execute_in_process(
                run_config={"ops": {"zorder_partition_files": {"config": {"table": table.fqn, "partitions": days}}}},
                instance=instance,
                resources={"lake": resources["lake"], "spark": resources["spark"]},
            ),
        )
    if not result.success:
        raise SystemExit("the zorder_partitions job failed")
    for numbers in result.output_for_node("zorder_partition_files"):
        log(f"  zorder_partitions: {numbers}")
    return {"seconds": time.monotonic() - started, **table_files(store, KEY)}


# --- querying ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Lookup:
    user: int
    course: int
    times: list[float]
    ids: list[int]
    stats: ReadStats

    @property
    def best(self) -> float:
        return min(self.times)


def _predicates(user: int, course: int) -> list[Predicate]:
    return [Predicate("user_id", "=", user), Predicate("course_id", "=", course)]


def run_lookup(
    spark: Any, store: DeltaStore, key: tuple[str, ...], gen: Attendance, user: int, course: int
) -> tuple[float, list[Any], ReadStats]:
    """The analyst's lookup through the product's read path: prune files, then Spark reads and filters."""
    started = time.perf_counter()
    df, stats = store.read(spark, key, partitions=gen.partitions, predicates=_predicates(user, course))
    rows = df.collect()
    seconds = time.perf_counter() - started
    stats.files_read = _files_matching(store.live_files(key, gen.partitions)[0], user, course)
    return seconds, rows, stats


@dataclasses.dataclass
class Layout:
    name: str
    lookups: list[Lookup]
    sample_skipped: float
    sample_files_read: float
    hot_skipped: float | None = None  # the sample's lookups of hot learners only (with --skew)

    @property
    def seconds(self) -> float:
        return statistics.fmean(q.best for q in self.lookups)

    @property
    def skipped(self) -> float:
        return statistics.fmean(_skipped(q.stats) for q in self.lookups)


def _skipped(stats: ReadStats) -> float:
    scope = stats.files_after_partition_pruning
    return (stats.files_after_partition_pruning - stats.files_read) / scope if scope else 0.0


def measure(
    name: str,
    spark: Any,
    store: DeltaStore,
    key: tuple[str, ...],
    gen: Attendance,
    timed: list[tuple[int, int]],
    sample: list[tuple[int, int]],
    repeat: int,
    warm_up: bool = True,
) -> Layout:
    if warm_up:
        warm, _, _ = run_lookup(spark, store, key, gen, *timed[0])
        log(f"  {name}: warm-up {warm:.2f}s")
    lookups = []
    for user, course in timed:
        times = []
        for _ in range(repeat):
            seconds, rows, stats = run_lookup(spark, store, key, gen, user, course)
            times.append(seconds)
        q = Lookup(user, course, times, sorted(int(row["id"]) for row in rows), stats)
        lookups.append(q)
        log(
            f"  {name}: user_id={user} AND course_id={course}: best {q.best:.3f}s of "
            f"[{', '.join(f'{t:.2f}' for t in times)}], {len(q.ids)} rows; files read {stats.files_read} of "
            f"{stats.files_after_partition_pruning}, skipped "
            f"{stats.files_after_partition_pruning - stats.files_read} "
            f"({_skipped(stats):.1%}), {stats.bytes_read / MIB:.1f} MiB"
        )
    # The sample applies data skipping's rule (each live file's min/max in the log) on one listing of the
    # partition's files, without reading any data.
    actions, scope = store.live_files(key, gen.partitions)
    for q in lookups:
        assert _files_matching(actions, q.user, q.course) == q.stats.files_read
    reads = [_files_matching(actions, user, course) for user, course in sample]
    total = scope.files_after_partition_pruning
    fractions = [(total - n) / total for n in reads]
    hot = [f for f, (user, _) in zip(fractions, sample, strict=True) if user - USER_BASE < gen.hot_users]
    layout = Layout(
        name,
        lookups,
        statistics.fmean(fractions),
        statistics.fmean(reads),
        statistics.fmean(hot) if gen.skew and hot else None,
    )
    log(
        f"  {name}: {len(sample)} more lookups (file pruning only): {layout.sample_files_read:.1f} files read "
        f"on average, {layout.sample_skipped:.1%} skipped, worst {max(reads)} files"
        + (f"; {len(hot)} of hot learners: {layout.hot_skipped:.1%} skipped" if layout.hot_skipped is not None else "")
    )
    return layout


def _files_matching(actions: list[dict[str, Any]], user: int, course: int) -> int:
    """Files whose min/max in the log admit the lookup: those Delta's data skipping keeps."""
    wanted = {"user_id": user, "course_id": course}

    def admits(a: dict[str, Any], column: str) -> bool:
        lo, hi = a.get(f"min.{column}"), a.get(f"max.{column}")
        return lo is None or hi is None or lo <= wanted[column] <= hi

    return sum(all(admits(a, c) for c in wanted) for a in actions)


def check_same_rows(reference: Layout, other: Layout) -> None:
    for a, b in zip(reference.lookups, other.lookups, strict=True):
        if a.ids != b.ids:
            raise SystemExit(f"{other.name}: user_id={a.user} course_id={a.course} returned other rows")


# --- main --------------------------------------------------------------------------------------------------


def explain(gen: Attendance, table: Table, built: dict[str, Any], zordered: dict[str, Any]) -> list[str]:
    files = zordered["files"] / len(gen.partitions)
    part_mib = zordered["bytes"] / len(gen.partitions) / MIB
    size = table.zorder_file_size
    declared = f"{size / MIB:g} MiB" if size else "Delta's default (1 GiB)"
    return [
        "What a user of the product gets:",
        f"  {table.fqn} is declared with zorder.by = {', '.join(ZORDER)} and zorder.file_size = {declared}. "
        f"A day of {gen.rows_per_day:,} attendances ({gen.users:,} learners a month) is {part_mib:.0f} MiB of "
        f"Parquet; the shipped job Z-orders it into {files:.0f} file(s) of "
        f"{zordered['bytes'] / max(1, zordered['files']) / MIB:.1f} MiB.",
        f"  As ingested, the day is {built['files'] / len(gen.partitions):.0f} files of "
        f"{built['bytes'] / max(1, built['files']) / MIB:.1f} MiB, each spanning the whole id range: a lookup reads "
        "them all.",
        "  What a lookup can skip is bounded by the number of files in its partition, not by their size: with "
        "Delta's default 1 GiB a day this size is one file and nothing is skipped. A table sets zorder.file_size "
        "so that its partitions split into tens of files or more.",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows-per-day", type=int, default=2_000_000, help="rows a day (default 2,000,000)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the lake goes (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--days", type=int, default=1, help="daily partitions (default 1)")
    parser.add_argument("--ingest-mib", type=float, default=2.0, help="file roll size of the appends (default 2)")
    parser.add_argument("--batches", type=int, default=24, help="appends a day, in time order (default 24)")
    parser.add_argument("--lookups", type=int, default=1, help="timed (user, course) lookups (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per lookup, the best counts (default 3)")
    parser.add_argument("--sample", type=int, default=200, help="lookups measured by file pruning only")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--skew", type=float, default=0.0, help="fraction of rows held by a few hot learners (e.g. 0.2; default 0)"
    )
    parser.add_argument("--hot-users", type=int, default=5, help="how many hot learners --skew makes (default 5)")
    parser.add_argument(
        "--file-mib", type=float, default=None, help="the table's zorder.file_size in MiB (default: the catalog's)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"150,000 rows in 4 appends, {QUICK_FILE_MIB} MiB files, one run each, 20 sampled",
    )
    args = parser.parse_args(argv)
    if args.quick:  # files small enough that the small day Z-orders into several and the lookup skips some
        args.rows_per_day, args.batches, args.repeat, args.sample = 150_000, 4, 1, 20
        args.file_mib = args.file_mib or QUICK_FILE_MIB
    warm_up = not args.quick  # the quick run checks rows and pruning, which a warm-up run does not change
    calib = calib_ms()

    t0 = time.monotonic()
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="zorder-bench-")) if temporary else args.workdir
    try:
        lake = workdir / "lake"
        if lake.exists():
            shutil.rmtree(lake)
        store = DeltaStore(str(lake))
        gen = Attendance(args.rows_per_day, args.days, args.skew, args.hot_users)
        table = declare_table(args.file_mib)
        target = table.zorder_file_size
        log(
            f"table {table.fqn}: {gen.rows:,} rows, {gen.users:,} learners, {gen.courses:,} courses, "
            f"{gen.days} daily partition(s); declared zorder.by={list(ZORDER)} file_size={target}; lake {lake}"
            + (f"; {gen.hot_users} hot learners hold {gen.skew:.0%} of the rows" if gen.skew else "")
        )
        log(f"building ({args.batches} appends a day) ...")
        built = build_table(store, gen, int(args.ingest_mib * MIB), args.batches)
        log(f"built: {built['files']} files, {built['bytes'] / MIB:.0f} MiB in {built['seconds']:.1f}s")

        spark = get_session()
        calib_spark = calib_spark_ms(spark)
        timed = gen.lookups(args.lookups, args.seed)
        sample = gen.lookups(args.sample, args.seed + 1)
        log(f"timed lookups: {'; '.join(f'user_id={u} AND course_id={c}' for u, c in timed)} in {gen.partitions}")

        layouts = {"unordered": measure("unordered", spark, store, KEY, gen, timed, sample, args.repeat, warm_up)}
        log(f"compacting (DeltaStore.optimize, target_size={target}) ... [{time.monotonic() - t0:.0f}s]")
        compacted = compact(store, gen, target, spark)
        log(f"compacted: {compacted['files']} files, {compacted['bytes'] / MIB:.0f} MiB in {compacted['seconds']:.0f}s")
        layouts["compacted"] = measure("compacted", spark, store, KEY, gen, timed, sample, args.repeat, warm_up)
        log(
            f"the zorder_partitions job (by {', '.join(ZORDER)}, declared file size) ... [{time.monotonic() - t0:.0f}s]"
        )
        zordered = zorder_job(store, gen, table)
        log(f"Z-ordered: {zordered['files']} files, {zordered['bytes'] / MIB:.0f} MiB in {zordered['seconds']:.0f}s")
        layouts["zordered"] = measure("zordered", spark, store, KEY, gen, timed, sample, args.repeat, warm_up)
        for name, layout in layouts.items():
            if name != "unordered":
                check_same_rows(layouts["unordered"], layout)

        u, c, z = layouts["unordered"], layouts["compacted"], layouts["zordered"]
        log()
        for line in explain(gen, table, built, zordered):
            log(line)
        log()
        fields: dict[str, Any] = {
            "engine": engine_label(spark),
            "rows": gen.rows,
            "rows_per_day": gen.rows_per_day,
            "partitions": len(gen.partitions),
            "files": zordered["files"],
            "files_unordered": built["files"],
            "files_compacted": compacted["files"],
            "file_size_mib": round(target / MIB, 1) if target else "default",
            "mib_zordered": round(zordered["bytes"] / MIB),
            "build_s": round(built["seconds"], 1),
            "compact_s": round(compacted["seconds"], 1),
            "zorder_s": round(zordered["seconds"], 1),
            "zorder_s_per_gib": round(zordered["seconds"] / (compacted["bytes"] / 2**30), 1),
            "lookups": len(timed),
            "unordered_s": round(u.seconds, 3),
            "compacted_s": round(c.seconds, 3),
            "zordered_s": round(z.seconds, 3),
            "ratio": round(u.seconds / z.seconds, 1),
            "ratio_vs_compacted": round(c.seconds / z.seconds, 1),
            "skipped": round(z.sample_skipped, 4),
            "files_read": round(z.sample_files_read, 1),
            "timed_skipped": round(z.skipped, 4),
            "compacted_skipped": round(c.sample_skipped, 4),
            "unordered_skipped": round(u.sample_skipped, 4),
            "sample": len(sample),
            "skew": args.skew,
        }
        if z.hot_skipped is not None:
            fields["hot_skipped"] = round(z.hot_skipped, 4)
        fields["lookup_rows"] = sum(len(q.ids) for q in z.lookups)
        fields["total_s"] = round(time.monotonic() - t0, 1)
        fields["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)
        fields["calib_ms"], fields["calib_spark_ms"] = calib, calib_spark
        log("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))
    finally:
        if temporary and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
