"""The machine's calibration, printed beside every bench's figures (``calib_ms=``, ``calib_spark_ms=``).

A bench's seconds are the machine's as much as the code's: the same commit ran 2.5-3x slower on the shared
2-core machine than on the one the suite's 25-minute runs came from. Each bench therefore measures two fixed
workloads at its start and prints them in its ``RESULT`` line, so that a figure read later says what machine
made it, and two figures from two machines compare after dividing each by its own calibration
(docs/benchmarks.md, "Comparing across machines").

- ``calib_ms()``: a fixed pure-Python workload shaped like the dependency center's work, dict lookups keyed by
  partition-key strings, string formatting and splitting, set membership. It never changes: a new workload
  would make every earlier figure incomparable. A process that starts several benches within minutes (the suite)
  measures it once and hands it to them in ``WAREHOUSE_BENCH_CALIB_MS``; ``calibration.py`` itself always measures.
- ``calib_spark_ms(spark)``: a fixed small Spark job (2M rows, a group-by, a count) on the bench's own session,
  for benches whose figures are Spark's. It times the JVM and the session's configuration, not Python.
  ``calib_spark_connect_ms(url)`` runs it on a stack's Spark Connect server.

Both return the median of a few repeats (a shared machine has bursts of others' work; the median ignores one).
Import it as ``from calibration import calib_ms`` from a bench run as ``python bench/x.py`` (its folder is on
``sys.path``), or as ``from bench.calibration import calib_ms`` with the repository on ``sys.path``.

    .venv/bin/python bench/calibration.py --quick   # RESULT calib_ms= (no Spark), as the suite runs it
    .venv/bin/python bench/calibration.py           # RESULT calib_ms= calib_spark_ms= (a local Spark session)
"""

from __future__ import annotations

import os
import statistics
import time
import weakref
from pathlib import Path
from typing import Any

# The workload's size. Fixed: changing it changes every calib_ms ever printed (about 145 ms on the shared 2-core
# machine the figures of docs/benchmarks.md came from, in November 2026).
TABLES = 200
HOURS = 24 * 28
REPEATS = 5
WORK_RESULT = 110_923  # what one pass returns: a pass that returns anything else is another workload
SPARK_ROWS = 2_000_000
SPARK_REPEATS = 3

# a calib_ms measured by the caller on this machine moments ago, handed to the benches it starts: the suite's quick
# runs, a minute apart on the same machine, need not each spend seconds on the same workload
CALIB_MS_ENV = "WAREHOUSE_BENCH_CALIB_MS"
# each session's figure, once measured: the Spark benches run together on one session (tests/bench/one_jvm.py) ask
# for it each, and one calibration describes that session for all of them
_SPARK_MS: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _resolver_like_work() -> int:
    """One pass of dict-and-string work like the resolver's: build each table's partition keys, record their states
    in nested dicts, then ask, for every downstream partition, whether its upstream keys are all present. Returns how
    many were ready, checked against :data:`WORK_RESULT`, so that an edit that changes the workload fails loudly
    instead of silently making every later calib_ms incomparable with the earlier ones."""
    states: dict[str, dict[str, str]] = {}
    for t in range(TABLES):
        table = f"dwd.table_{t:03d}"
        keys: dict[str, str] = {}
        for h in range(HOURS):
            day, hour = divmod(h, 24)
            keys[f"2026-03-{day + 1:02d}-{hour:02d}:00"] = "ok" if (t * 31 + h * 7) % 11 else "failed"
        states[table] = keys
    ready = 0
    for t in range(1, TABLES):
        upstream = states[f"dwd.table_{t - 1:03d}"]
        for key in states[f"dwd.table_{t:03d}"]:
            day_part, hour_part = key.rsplit("-", 1)
            # the hour itself and its day's first hour: two lookups per key, as a mapped window asks
            wanted = {f"{day_part}-{hour_part}", f"{day_part}-00:00"}
            if all(upstream.get(k) == "ok" for k in wanted):
                ready += 1
    return ready


def calib_ms() -> float:
    """The machine's ``calib_ms``: the figure in :data:`CALIB_MS_ENV` when the process that started this one measured
    it moments ago (the suite, once for all its quick runs), else :func:`measure_calib_ms`."""
    given = os.environ.get(CALIB_MS_ENV)
    return float(given) if given else measure_calib_ms()


def measure_calib_ms() -> float:
    """The median time of the fixed pure-Python workload, in milliseconds (lower: a faster machine)."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = _resolver_like_work()
        times.append((time.perf_counter() - start) * 1000)
        if result != WORK_RESULT:
            raise RuntimeError(f"the calibration workload changed: {result} ready, not {WORK_RESULT}")
    return round(statistics.median(times), 1)


def calib_spark_ms(spark: Any) -> float:
    """The median time of a fixed small job on ``spark`` (a classic or a Spark Connect session), in milliseconds.

    One run first, untimed: the first job of a session pays for class loading and code generation, which a bench's
    own figures (taken after its warm-up) do not. A session calibrated before in this process answers that figure."""
    known = _SPARK_MS.get(spark)
    if known is not None:
        return known

    def job() -> int:
        rows = spark.range(SPARK_ROWS).selectExpr("id % 1000 AS k").groupBy("k").count().collect()
        return len(rows)

    if job() != 1000:
        raise RuntimeError("the calibration job returned a wrong number of groups")
    times = []
    for _ in range(SPARK_REPEATS):
        start = time.perf_counter()
        job()
        times.append((time.perf_counter() - start) * 1000)
    _SPARK_MS[spark] = round(statistics.median(times), 1)
    return _SPARK_MS[spark]


def calib_spark_connect_ms(url: str, log_dir: str | Path) -> float:
    """:func:`calib_spark_ms` on a running Spark Connect server (a stack's, ``sc://127.0.0.1:15002``), through a client
    session of this process, stopped after: for benches whose Spark is the stack's, not their own. The product's
    server refuses a client without its token, which its starter writes in the stack's log dir (``log_dir``) once the
    server listens: waited for, since a stack's other processes can be up before its Spark is."""
    from pyspark.sql import SparkSession

    from resources.spark import connect_client_url, connect_token_file, read_connect_token

    deadline = time.monotonic() + 300
    while (token := read_connect_token(connect_token_file(log_dir))) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no Spark Connect token in {log_dir} after 300 s: is the stack's Spark up?")
        time.sleep(1)
    session = SparkSession.builder.remote(connect_client_url(url, token)).getOrCreate()
    try:
        return calib_spark_ms(session)
    finally:
        session.stop()


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="The machine's calibration: calib_ms (and calib_spark_ms).")
    parser.add_argument("--quick", action="store_true", help="the pure-Python workload only: no Spark session")
    args = parser.parse_args(argv)
    figures = {"calib_ms": measure_calib_ms()}  # the workload itself, whatever a caller measured
    if not args.quick:
        from pyspark.sql import SparkSession

        # a plain local session: the job times the JVM, the same on every machine's default configuration
        spark = SparkSession.builder.master("local[2]").appName("calibration").getOrCreate()
        try:
            figures["calib_spark_ms"] = calib_spark_ms(spark)
        finally:
            spark.stop()
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
