"""Benchmark: the reverse index of the exact mappings at 1,000 and 10,000 tables.

For each N it writes ``bench/automation_scale.py``'s synthetic catalog of N tables (same generator, same
seed), loads it (``load_catalog``), builds ``ReverseIndex.build`` on it, then times ``downstream_of`` for
``--events`` random events: a table drawn uniformly, one of its partitions drawn uniformly from one year of
partitions, looked up at the end of that year. Per-lookup P50 / P99 / max in microseconds, the fan-out
(downstream tables and partitions per event), and the build time. Every partition a lookup names is checked against
the catalog's own mappings (``unsound``: those that do not read the event; the bench exits 1 if any). No Spark, no
Dagster instance. The ``RESULT`` line carries the machine's ``calib_ms`` (``bench/calibration.py``).

    .venv/bin/python bench/reverse_index.py                      # N = 1000, 10000
    .venv/bin/python bench/reverse_index.py --sizes 1000 --events 2000
    .venv/bin/python bench/reverse_index.py --quick                # N = 300, 200 lookups: seconds
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from automation_scale import generate_catalog

from bench.calibration import calib_ms
from warehouse_assets.catalog import (
    START,
    WHOLE,
    Catalog,
    DerivedTable,
    Table,
    load_catalog,
    periods,
    upstream_partitions,
)
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.materialize.gate import table_partitions_in_range


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run(n: int, events: int, seed: int) -> dict[str, float]:
    start = datetime.fromisoformat(START).replace(tzinfo=ZoneInfo(periods().timezone))
    now = start + timedelta(days=365)
    with tempfile.TemporaryDirectory(prefix=f"reverse_index_{n}_") as tmp:
        summary = generate_catalog(Path(tmp), n, seed)
        t0 = time.perf_counter()
        catalog = load_catalog(Path(tmp))
        t1 = time.perf_counter()
        index = ReverseIndex.build(catalog, current_time=now)
        t2 = time.perf_counter()
    rng = random.Random(seed)
    tables = list(catalog)
    keys: dict[str, list[str]] = {}  # a table's year of partitions, shared by the tables of one calendar

    def partitions_of(table: Table) -> list[str]:
        """The table's partitions as the product enumerates them: a static table's one, :data:`WHOLE` (whose
        event unblocks every partition of its readers); a table with regions, each region's days; else its
        period's."""
        if table.is_static:
            return [WHOLE]
        calendar = table.fqn if isinstance(table, DerivedTable) and table.is_regional else table.period
        if calendar not in keys:
            keys[calendar] = table_partitions_in_range(table, start, now)
        return keys[calendar]

    static_events = unsound = 0
    micros: list[float] = []
    fan_tables: list[int] = []
    fan_partitions: list[int] = []
    for _ in range(events):
        table = rng.choice(tables)
        key = rng.choice(partitions_of(table))
        static_events += table.is_static
        started = time.perf_counter()
        found = index.downstream_of(table.fqn, key, current_time=now)
        micros.append((time.perf_counter() - started) * 1e6)
        fan_tables.append(len(found))
        fan_partitions.append(sum(len(v) for v in found.values()))
        unsound += not_reading(catalog, table.fqn, key, found, now)
    micros.sort()
    return {
        "n": n,
        "edges": summary["edges"],
        "load_s": t1 - t0,
        "build_ms": (t2 - t1) * 1e3,
        "p50_us": percentile(micros, 0.50),
        "p99_us": percentile(micros, 0.99),
        "max_us": micros[-1],
        "fan_tables_mean": sum(fan_tables) / events,
        "fan_tables_max": max(fan_tables),
        "fan_partitions_max": max(fan_partitions),
        "static_events": static_events,
        "unsound": unsound,
    }


def not_reading(catalog: Catalog, source: str, key: str, found: dict[str, list[str]], now: datetime) -> int:
    """Of the partitions ``downstream_of`` found for ``key`` of ``source``, how many do not read it, by the catalog's
    own mappings (``upstream_partitions``, what the gate asks), not by the index: the lookup's answer checked
    against an independent path, so that a fast but wrong index cannot pass for a fast one."""
    if catalog[source].is_static:  # read whole by every partition of the tables that reference it
        readers = {t.fqn for t in catalog.referencing(source)}
        return sum(len(keys) for fqn, keys in found.items() if fqn not in readers)
    wrong = 0
    for fqn, keys in found.items():
        table = catalog[fqn]
        deps = [d for d in table.deps if d.table == source]
        wrong += sum(
            not any(key in upstream_partitions(catalog, table, d, k, current_time=now).keys for d in deps) for k in keys
        )
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated numbers of tables")
    parser.add_argument("--events", type=int, default=5000, help="random lookups per N")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="N = 300 and 200 lookups: seconds")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.events = "300", 200
    calib = calib_ms()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        print(f"N={n}: generating, loading, building, {args.events} lookups ...", file=sys.stderr, flush=True)
        rows.append(run(n, args.events, args.seed))
    header = (
        f"{'N':>6} {'edges':>6} {'load s':>7} {'build ms':>9} {'P50 us':>8} {'P99 us':>8} {'max us':>8} "
        f"{'fan-out tables mean/max':>24} {'partitions max':>15}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        fan = f"{r['fan_tables_mean']:.1f}/{r['fan_tables_max']}"
        print(
            f"{r['n']:>6} {r['edges']:>6} {r['load_s']:>7.2f} {r['build_ms']:>9.1f} {r['p50_us']:>8.0f} "
            f"{r['p99_us']:>8.0f} {r['max_us']:>8.0f} {fan:>24} {r['fan_partitions_max']:>15}"
        )
    figures = [f"n{r['n']}_{k}={round(v, 3) if isinstance(v, float) else v}" for r in rows for k, v in r.items()]
    print("RESULT " + " ".join(figure for figure in figures if "_n=" not in figure) + f" calib_ms={calib}")
    # a lookup that names a partition not reading the event is a wrong answer, however fast
    return 1 if any(r["unsound"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
