"""Benchmark: one readiness tick at 30 and at 300 days of ingestion history (a tick should cost about the same
however long the history grows).

Builds, per history length, the state a readiness tick reads: ``ods.order`` with two shard streams (one
segment per shard and day, its position committed in the ODS table), the source's counts per hour and
``ops.ingested_counts`` written the way the ingestion writes it (one exactly-once append per daily batch,
through the Delta layer, no Spark). Both histories end on the same day, and the tick's cursor stands three
hours before the end, so it reports the same two hours. It times ``readiness_events`` (``--ticks`` times) and
prints the median tick at each length and their ratio, then one ``RESULT`` line with the machine's ``calib_ms``
(``bench/calibration.py``). Both lengths must report the same hours (``reported``, the count): the bench exits 1 if
they do not, for then the ticks did different work and their times do not compare.

    .venv/bin/python bench/readiness_history.py
    .venv/bin/python bench/readiness_history.py --days 30 300 --ticks 20
    .venv/bin/python bench/readiness_history.py --quick        # 3 and 30 days, 3 ticks: seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calibration import calib_ms
from resources.delta_lake import DeltaStore
from resources.landing import Landing
from warehouse_assets.catalog import (
    Catalog,
    Table,
    hourly,
    load_catalog,
)
from warehouse_assets.ingest.merge import counts_app_id, journal_positions, ods_arrow_schema
from warehouse_assets.ingest.ops_tables import INGESTED_COUNTS
from warehouse_assets.ingest.readiness import hour_key, readiness_events

END = datetime(2026, 11, 1, tzinfo=ZoneInfo(hourly.timezone))
STREAMS = ("edu_trade.order_00", "edu_trade.order_01")
ROWS_PER_HOUR = 10


@dataclass
class History:
    store: DeltaStore
    landing: Landing
    catalog: Catalog  # ods.order only
    cursor: dict[str, object]  # the tick's cursor: three hours before the end reported, every count seen


def build_history(root: Path, days: int, end: datetime = END) -> History:
    """``days`` days of daily batches of ``ods.order`` ending at ``end`` (a local midnight), under ``root``."""
    table: Table = load_catalog()["ods.order"]
    landing = Landing(root / "landing", hourly.timezone, segment_minutes=24 * 60)
    store = DeltaStore(str(root / "lake"))
    # the table holds no rows here, only the positions its merges would commit: delta-rs creates it without a JVM
    store.create_table(table.key, ods_arrow_schema(table), table.partition_by)
    first = end - timedelta(days=days)
    source: dict[str, list[str]] = {s: [] for s in STREAMS}
    for seq in range(1, days + 1):
        day = first + timedelta(days=seq - 1)
        entries: list[dict[str, object]] = []
        for stream in STREAMS:
            directory = landing.stream_dir(stream)
            directory.mkdir(parents=True, exist_ok=True)
            landing.segment_path(stream, seq, day).touch()
            for h in range(24):
                hour = f"{day:%Y-%m-%d}T{h:02d}"
                source[stream].append(json.dumps({"hour": hour, "rows": ROWS_PER_HOUR}))
                entries.append(
                    {"table": table.fqn, "stream": stream, "hour": hour, "rows": ROWS_PER_HOUR, "seq_to": seq}
                    | {"date": hour[:10]}
                )
        store.append(
            INGESTED_COUNTS.key,
            INGESTED_COUNTS.rows(entries),
            INGESTED_COUNTS.partition_by,
            app_transactions={counts_app_id(table, s): seq for s in STREAMS},
        )
    store.commit_app_transactions(table.key, dict([journal_positions(store, table, {s: days for s in STREAMS})]))
    for stream, lines in source.items():
        path = landing.counts_path(stream)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    cursor = {table.fqn: {"last": hour_key(end - timedelta(hours=3)), "seen": dict.fromkeys(STREAMS, days)}}
    return History(store, landing, Catalog({table.fqn: table}), cursor)


def tick(history: History) -> list[str]:
    events, _ = readiness_events(history.store, history.landing, history.catalog, history.cursor)
    return [str(e.partition) for e in events]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, nargs=2, default=[30, 300])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 and 30 days, 3 ticks")
    args = parser.parse_args()
    if args.quick:
        args.days, args.ticks = [3, 30], 3
    calib = calib_ms()
    medians = []
    reports: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for days in args.days:
            started = time.monotonic()
            history = build_history(Path(tmp) / f"d{days}", days)
            built = time.monotonic() - started
            reported = tick(history)  # warm-up
            reports.append(reported)
            times = []
            for _ in range(args.ticks):
                t0 = time.perf_counter()
                tick(history)
                times.append(time.perf_counter() - t0)
            medians.append(statistics.median(times))
            print(
                f"{days:>4} days: built in {built:.1f} s; tick median {medians[-1] * 1000:.1f} ms "
                f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}) over {args.ticks} ticks; "
                f"reports {reported}"
            )
    ratio = medians[1] / medians[0]
    print(f"ratio {args.days[1]} / {args.days[0]} days: {ratio:.2f}")
    same = bool(reports[0]) and reports[0] == reports[1]
    if not same:
        print(f"the two histories reported different hours: {reports[0]} and {reports[1]}")
    print(
        f"RESULT days={args.days[0]},{args.days[1]} ticks={args.ticks} "
        f"median_ms={medians[0] * 1000:.1f},{medians[1] * 1000:.1f} ratio={ratio:.2f} "
        f"reported={len(reports[0])} calib_ms={calib}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
