"""Benchmark: replication lag of a day of hourly partitions to a second lake (resources/delta_replica.py).

Two lake roots in a temporary folder. Each hour of one day is committed at site 1 (delta-rs writes the hour's rows,
``ROWS`` per hour in ``FILES`` files, one commit, as a build's overwrite commits one partition), and replicated at
once: its files copied to site 2, published as one commit there and verified (file sizes, rows by the log and by a
count). Then a ranged rewrite replaces six hours in one commit and those are replicated again (their old files
removed on the replica). The lag of each publication is source commit (its log entry's time) -> replica published.
What this leaves out: in the product the ``replication`` sensor finds the build first (it ticks every 5 s at most)
and the replica run starts through Dagster's launcher; both add to the lag measured here, which is replication's own.

``lag_p50_s``/``lag_p90_s``/``lag_max_s``: over every publication; ``partitions``: publications; ``commits``: replica
commits (one per publication); ``mb``: bytes copied; ``equal``: 1 when site 2 reads the same rows as site 1 at the end.
The ``RESULT`` line carries ``calib_ms`` (``bench/calibration.py``).

    .venv/bin/python bench/replication.py            # 24 hours of 200,000 rows, 4 files each
    .venv/bin/python bench/replication.py --quick    # 24 hours of 2,000 rows: seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from bench.calibration import calib_ms
from resources.delta_read import DeltaReader
from resources.delta_replica import Replicated, replicate_partition

KEY = ["dwd", "order_detail"]
DAY = "2026-03-01"


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


def run(rows: int, files: int) -> dict[str, object]:
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
            "lag_p50_s": round(statistics.median(lags), 3),
            "lag_p90_s": round(statistics.quantiles(lags, n=10)[-1], 3),
            "lag_max_s": round(lags[-1], 3),
            "partitions": len(done),
            "commits": commits,
            "removed": sum(d.files_removed for d in done),
            "mb": round(sum(d.bytes_copied for d in done) / 2**20, 1),
            "equal": int(a.equals(b) and a.num_rows == 24 * rows),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="24 hours of 2,000 rows")
    parser.add_argument("--rows", type=int, default=200_000, help="rows per hour")
    parser.add_argument("--files", type=int, default=4, help="files per hour")
    args = parser.parse_args()
    rows = 2_000 if args.quick else args.rows
    figures = run(rows, args.files)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()) + f" calib_ms={calib_ms()}")
    return 0 if figures["equal"] == 1 and figures["commits"] == figures["partitions"] else 1


if __name__ == "__main__":
    sys.exit(main())
