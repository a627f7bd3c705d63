"""Benchmark: an analyst's queries through ``warehouse sql`` on a Z-ordered table, on both of its engines.

The table and its layouts are zorder_skipping.py's: ``dwd.attendance_detail`` as the catalog declares it, ``--days``
days of ``--rows-per-day`` attendances appended in time order (``unordered``), then laid out by the shipped
``zorder_partitions`` job with the table's declared ``zorder.by`` columns and file size (``zordered``). On each
layout, through ``LakeSql.run`` (what ``warehouse sql`` runs):

* a point lookup by the Z-order columns (``user_id = X AND course_id = Y``) on one day;
* a one-day filtered aggregate (``count(*), sum(duration_sec) WHERE dt = D AND user_id BETWEEN …``);

each on the JVM-free engine (``--engine datafusion``: delta-rs's DataFusion in this process, warm) and on Spark
(``--engine spark``: a local session, warm), one warm-up then ``--repeat`` timed runs, medians (``--quick``: no
warm-up; its times are not figures). Files read are the engines' own figures: the files DataFusion's physical plan
scans, and Spark's ``number of files read`` scan metric. Both engines must return the same rows on both layouts
(checked). Finally a cold ``warehouse sql`` command end to end (a fresh process: imports, planning, the lookup,
printing) ``--cold`` times on the Z-ordered layout.

The last line is one ``RESULT`` line: ``lookup_p50_s`` (warm JVM-free point lookup, Z-ordered), ``cold_cli_s``
(median cold command), ``ratio_datafusion`` and ``ratio_spark`` (unordered / Z-ordered median lookup time),
``lookup_rows`` (the rows the lookup found: at least one, its pair is taken from the table), and the machine's
``calib_ms`` and ``calib_spark_ms`` (``bench/calibration.py``, the latter on the bench's own Spark session).

    flock /tmp/bench.lock .venv/bin/python bench/sql_lookup.py --rows-per-day 2000000
    .venv/bin/python bench/sql_lookup.py --quick      # 150,000 rows, one run each, one cold command
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calibration import calib_ms, calib_spark_ms  # noqa: E402
from bench.zorder_skipping import KEY, MIB, TABLE, Attendance, build_table, log, zorder_job  # noqa: E402
from resources.delta_lake import DeltaStore  # noqa: E402
from resources.lake_sql import Answer, LakeSql  # noqa: E402
from resources.spark import engine_label, get_session  # noqa: E402

NAME = ".".join(KEY)


def spark_files_read(spark: Any, sql: str) -> int:
    """Spark's own count of the files its scans read for ``sql``: the ``number of files read`` metric of each scan
    in the executed plan (inside adaptive execution's final plan and its query stages)."""
    df = spark.sql(sql)
    df.collect()
    total, nodes = 0, [df._jdf.queryExecution().executedPlan()]
    while nodes:
        node = nodes.pop()
        kind = node.getClass().getSimpleName()
        if kind == "AdaptiveSparkPlanExec":
            nodes.append(node.executedPlan())
            continue
        if kind.endswith("QueryStageExec"):
            nodes.append(node.plan())
            continue
        metric = node.metrics().get("numFiles")
        if metric.isDefined():
            total += int(metric.get().value())
        children = node.children()
        nodes += [children.apply(i) for i in range(children.size())]
    return total


def timed(run: Any, repeat: int, warm_up: bool) -> tuple[float, Answer]:
    if warm_up:
        run()
    times, answer = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        answer = run()
        times.append(time.perf_counter() - started)
    assert answer is not None
    return statistics.median(times), answer


def rows_of(answer: Answer) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in answer.rows.to_pylist())


def measure(
    layout: str, sql: LakeSql, spark: Any, queries: dict[str, str], repeat: int, warm_up: bool
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, query in queries.items():
        df_s, df_answer = timed(lambda query=query: sql.run(query, engine="datafusion"), repeat, warm_up)
        sp_s, sp_answer = timed(lambda query=query: sql.run(query, engine="spark"), repeat, warm_up)
        if rows_of(df_answer) != rows_of(sp_answer):
            raise SystemExit(f"{layout} {name}: the engines disagree: {rows_of(df_answer)} vs {rows_of(sp_answer)}")
        assert df_answer.plan is not None
        spark_files = spark_files_read(spark, df_answer_sql(query))
        figures[name] = {
            "datafusion_s": df_s,
            "spark_s": sp_s,
            "datafusion_files": df_answer.plan.files_read,
            "spark_files": spark_files,
            "files_total": df_answer.plan.files_total,
            "rows": rows_of(df_answer),
        }
        log(
            f"  {layout:9s} {name:9s}: datafusion {df_s * 1000:8.1f} ms ({df_answer.plan.files_read} of "
            f"{df_answer.plan.files_total} files), spark {sp_s * 1000:8.1f} ms ({spark_files} files read)"
        )
    return figures


def df_answer_sql(query: str) -> str:
    from resources.lake_sql import parse_query

    return parse_query(query).tree.sql(dialect="spark")


def cold_cli(lake: Path, query: str, times: int) -> float:
    env = dict(os.environ, WAREHOUSE_LAKE_ROOT=str(lake), WAREHOUSE_SPARK_MODE="local")
    runs = []
    for _ in range(times):
        started = time.perf_counter()
        done = subprocess.run(
            [str(Path(sys.executable).parent / "warehouse"), "sql", "--engine", "datafusion", query],
            env=env,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        runs.append(time.perf_counter() - started)
        if done.returncode != 0 or "on datafusion" not in done.stdout:
            raise SystemExit(f"warehouse sql failed: {done.stderr[-2000:]}")
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows-per-day", type=int, default=2_000_000)
    parser.add_argument("--days", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per query and engine (median)")
    parser.add_argument("--cold", type=int, default=5, help="cold `warehouse sql` commands (median)")
    parser.add_argument("--ingest-mib", type=float, default=2.0)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="150,000 rows in 4 appends, --repeat 1, --cold 1")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows_per_day, args.batches, args.repeat, args.cold = 150_000, 4, 1, 1
    warm_up = not args.quick  # the quick run checks the engines' rows and files read, which a warm-up does not change
    calib = calib_ms()

    t0 = time.monotonic()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sql-bench-"))
    try:
        lake = workdir / "lake"
        shutil.rmtree(lake, ignore_errors=True)
        store = DeltaStore(str(lake))
        gen = Attendance(args.rows_per_day, args.days)
        log(f"{NAME}: {gen.rows:,} rows, {gen.days} day(s); declared zorder.by={TABLE.zorder}; lake {lake}")
        built = build_table(store, gen, int(args.ingest_mib * MIB), args.batches)
        log(f"built: {built['files']} files, {built['bytes'] / MIB:.0f} MiB in {built['seconds']:.1f}s")
        (user, course), day = gen.lookups(1, args.seed)[0], gen.partitions[0]["dt"]
        queries = {
            "lookup": f"SELECT id, lesson_id, duration_sec FROM {NAME} "
            f"WHERE dt = '{day}' AND user_id = {user} AND course_id = {course}",
            "aggregate": f"SELECT count(*) AS n, sum(duration_sec) AS seconds FROM {NAME} "
            f"WHERE dt = '{day}' AND user_id BETWEEN {user} AND {user + 50}",
        }
        # the names (`dwd.attendance_detail`) resolve in the bench's lake: Spark's own count of files read plans them
        # on this session, not on LakeSql's read-only one
        spark = get_session(lake_root=str(lake))
        calib_spark = calib_spark_ms(spark)
        sql = LakeSql(str(lake), spark=lambda: (spark, "local"))
        unordered = measure("unordered", sql, spark, queries, args.repeat, warm_up)
        zordered_files = zorder_job(store, gen, TABLE)
        log(f"Z-ordered: {zordered_files['files']} files in {zordered_files['seconds']:.0f}s")
        zordered = measure("zordered", sql, spark, queries, args.repeat, warm_up)
        for name in queries:
            if unordered[name]["rows"] != zordered[name]["rows"]:
                raise SystemExit(f"{name}: the layouts disagree")
        cold = cold_cli(lake, queries["lookup"], args.cold)
        log(f"cold `warehouse sql` (lookup, datafusion): median {cold:.2f}s of {args.cold}")
        fields = {
            "engine": engine_label(spark) + "+delta-rs-datafusion",
            "rows": gen.rows,
            "files_unordered": built["files"],
            "files_zordered": zordered_files["files"],
            "lookup_p50_s": round(zordered["lookup"]["datafusion_s"], 4),
            "cold_cli_s": round(cold, 2),
            "ratio_datafusion": round(unordered["lookup"]["datafusion_s"] / zordered["lookup"]["datafusion_s"], 1),
            "ratio_spark": round(unordered["lookup"]["spark_s"] / zordered["lookup"]["spark_s"], 1),
            "agg_ratio_datafusion": round(
                unordered["aggregate"]["datafusion_s"] / zordered["aggregate"]["datafusion_s"], 1
            ),
            "agg_ratio_spark": round(unordered["aggregate"]["spark_s"] / zordered["aggregate"]["spark_s"], 1),
            "lookup_spark_s": round(zordered["lookup"]["spark_s"], 3),
            "files_read_datafusion": "{}->{}".format(*(f["lookup"]["datafusion_files"] for f in (unordered, zordered))),
            "files_read_spark": "{}->{}".format(*(f["lookup"]["spark_files"] for f in (unordered, zordered))),
            "repeat": args.repeat,
            "lookup_rows": len(zordered["lookup"]["rows"]),
            "total_s": round(time.monotonic() - t0, 1),
            "calib_ms": calib,
            "calib_spark_ms": calib_spark,
        }
        log("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
