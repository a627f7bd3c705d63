"""Why is this waiting, from the state store: the time ``warehouse why`` takes per partition, after its imports.

The example warehouse on a SQLite instance with ``--days`` of history reported as the product reports it (runless
materializations of every ODS hour and derived partition, as the readiness sensor and the runs write them), except the
last ODS hour of ``ods.order``: every partition downstream of that day waits for it. The lake and the landing area
hold that history too (built as ``bench/readiness_history.py`` builds it: ``ods.order`` with two shard streams, a
segment per shard and day, the source's counts, ``ops.ingested_counts`` and the stream positions committed in the ODS
table), except the last day's data, so the root-cause step of the waiting hour does what it does on a real lake: reads
the streams' positions from the Delta log, lists the segments and reads the counts. The engine's partition state store
is brought up to date once (as the engine keeps it). Then ``explain()`` (what ``warehouse why`` and the
``why_waiting`` job call, with the CLI's arguments) answers for a set of partitions, waiting ones (their chain walked
to the root cause) and materialized ones: P50 / P90 / max per call, with the store up to date, and with a tail of
events the engine has not applied yet (``--tail``), which the view applies in memory.

    .venv/bin/python bench/why_latency.py [--days 60] [--repeat 20] [--tail 300]
    .venv/bin/python bench/why_latency.py --quick      # 6 days, 16 partitions once, 20 events behind: a minute

Last line: ``RESULT why_p50_ms= why_p90_ms= why_max_ms= tail_p90_ms= partitions= days= calib_ms=`` (the machine's
calibration, ``bench/calibration.py``). Target: under 100 ms per partition. The bench fails (an assertion) when an
answer has no upstream or the waiting hour's root cause did not come from the lake and the landing area.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import date, datetime, timedelta
from datetime import time as dt_time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dagster import AssetKey, AssetMaterialization, instance_for_test

from bench.calibration import calib_ms
from bench.readiness_history import build_history
from resources.external import ExternalResource
from warehouse_assets.catalog import BY_PERIOD, WHOLE, Table, business_zone, load_catalog, regional_keys_between
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.explain.why import explain
from warehouse_assets.materialize.gate import table_partitions_in_range


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def keys_between(table: Table, first: date, last: date) -> list[str]:
    """The partitions of ``table`` from the warehouse start whose windows end by the end of ``last``, as the product
    enumerates them: a static table's one (:data:`WHOLE`, built before the history), a table with regions each
    region's days, else its period's."""
    if table.is_static:
        return [WHOLE]
    zone = business_zone()
    start, end = (datetime.combine(d, dt_time.min, zone) for d in (first, last + timedelta(days=1)))
    return table_partitions_in_range(table, start, end)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--tail", type=int, default=300, help="events reported after the store's last update")
    # 6 days: the materialized samples are 5 days before the last, and must be partitions of the warehouse
    parser.add_argument(
        "--sample", type=int, default=None, help="at most this many waiting and this many materialized partitions"
    )
    parser.add_argument("--quick", action="store_true", help="6 days, --repeat 1, --tail 20, --sample 8")
    args = parser.parse_args()
    if args.quick:
        args.days, args.repeat, args.tail, args.sample = 6, 1, 20, 8
    calib = calib_ms()
    catalog = load_catalog()
    first = BY_PERIOD["daily"].get_first_partition_window().start.date()
    last = first + timedelta(days=args.days - 1)
    hole = (AssetKey(["ods", "order"]), f"{last:%Y-%m-%d}-23:00")
    # the quick run's instance on memory-backed storage where there is one: it stores the same events without a disk
    # sync per commit (its times are not figures)
    shm = Path("/dev/shm") if args.quick and Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp, instance_for_test(temp_dir=tmp) as instance:
        started = time.perf_counter()
        reported = 0
        derived_last: list[tuple[str, str]] = []
        for table in catalog:
            key = AssetKey(table.key)
            for partition in keys_between(table, first, last):
                if (key, partition) == hole:
                    continue
                if not table.is_ods and not table.is_external and partition.startswith(f"{last:%Y-%m-%d}"):
                    derived_last.append((table.fqn, partition))  # left for the chain to wait on
                    continue
                instance.report_runless_asset_event(AssetMaterialization(key, partition=partition))
                reported += 1
        print(
            f"[bench] {reported:,} partitions reported over {args.days} days in {time.perf_counter() - started:.0f} s"
        )
        store = PartitionStateStore(instance)
        started = time.perf_counter()
        store.update()
        print(f"[bench] state store built from the log in {time.perf_counter() - started:.2f} s")
        started = time.perf_counter()
        end = datetime.combine(last, dt_time.min, BY_PERIOD["hourly"].get_first_partition_window().start.tzinfo)
        history = build_history(Path(tmp) / "history", args.days - 1, end)  # every day but the last
        lake, landing = history.store, history.landing
        external = ExternalResource(root=str(Path(tmp) / "external"))
        print(f"[bench] lake and landing area of ods.order built in {time.perf_counter() - started:.0f} s")
        # one materialized partition per daily table, five days back: the day itself, or for a table with regions
        # its first region's day (a bare date names none of its partitions)
        back = f"{last - timedelta(days=5):%Y-%m-%d}"
        materialized = [
            (t.fqn, regional_keys_between(t, back, back)[0] if t.is_regional else back)
            for t in catalog.derived()
            if t.period == "daily"
        ]
        samples = derived_last[: args.sample] + materialized[: args.sample]

        def timed() -> list[float]:
            times = []
            for _ in range(args.repeat):
                for fqn, partition in samples:
                    t0 = time.perf_counter()
                    report = explain(instance, catalog, lake, landing, fqn, partition, external)
                    times.append((time.perf_counter() - t0) * 1000)
                    assert report.upstream is not None
            return times

        explain(instance, catalog, lake, landing, *samples[0], external)  # warm: first-call imports and caches
        fresh = timed()
        waiting = explain(instance, catalog, lake, landing, "ads.daily_gmv", f"{last:%Y-%m-%d}", external)
        print(
            f"[bench] e.g. ads.daily_gmv {last:%Y-%m-%d}: {waiting.verdict}; root causes "
            f"{[(c.table, c.partition, c.state, c.detail) for c in waiting.root_causes]}"
        )
        # the root cause must come from the lake and the landing area, not from their absence
        assert any("shard stream" in c.detail and "no shard stream" not in c.detail for c in waiting.root_causes), (
            "the waiting hour's root cause did not read the lake and the landing area"
        )
        for n in range(args.tail):  # events the engine has not applied yet
            day = first + timedelta(days=n % args.days)
            instance.report_runless_asset_event(
                AssetMaterialization(AssetKey(["ods", "user"]), partition=f"{day:%Y-%m-%d}-05:00")
            )
        tail = timed()
        store.close()
    p50, p90, top = statistics.median(fresh), percentile(fresh, 0.9), max(fresh)
    print(f"{'store up to date':<28} P50 {p50:6.1f} ms  P90 {p90:6.1f} ms  max {top:6.1f} ms  ({len(fresh)} calls)")
    t50, t90, tmax = statistics.median(tail), percentile(tail, 0.9), max(tail)
    print(f"{f'{args.tail} events not applied':<28} P50 {t50:6.1f} ms  P90 {t90:6.1f} ms  max {tmax:6.1f} ms")
    print(
        f"RESULT why_p50_ms={p50:.1f} why_p90_ms={p90:.1f} why_max_ms={top:.1f} tail_p90_ms={t90:.1f} "
        f"partitions={len(samples)} days={args.days} calib_ms={calib}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
