"""Benchmark: what column lineage adds to the code location's load, and what it costs where it is computed.

For each N it writes ``bench/automation_scale.py``'s synthetic catalog of N tables (same generator, same seed: each
derived table joins its 1-3 inputs, filters and groups) and, in one process:

* **load**: ``load_catalog`` then ``warehouse_assets.definitions.build_definitions`` resolved into a repository, as
  ``automation_scale``'s load figure, three ways: without lineage (``WAREHOUSE_LINEAGE_AT_LOAD=0``), with a cold
  lineage cache (every table's lineage computed from its SQL and stored, ``warehouse_assets/catalog/lineage_cache.py``)
  and with a warm one (read, no SQL parsed), as the product ships it. Without and warm alternate ``--rounds`` times,
  the fastest of each kept: ``warm_ratio`` = warm / without (target: within 1.10). A loaded machine's loads vary more
  than that: ``part_s`` times the warm lineage's own part alone (the cache read and every table's Markdown), and
  ``part_ratio`` = (without + part) / without;
* **eager**: every table's lineage computed at once without a cache (``WarehouseLineage.all``). The ratio
  ``(load + eager) / load`` is what a load computing it every time would cost;
* **per build**: one table's lineage from a fresh ``WarehouseLineage``, as a build computes it for its
  materialization's ``dagster/column_lineage`` (with what it needs upstream to name its inputs' columns), for
  ``--sample`` tables drawn at random: P50 and max;
* **column taint**: ``WarehouseLineage.impact`` of one value column (``user_id``) of the first ODS root, as
  ``warehouse taint --columns`` plans it (the tables downstream parsed, their lineage followed).

No Spark, no Dagster instance. The figures of a shared or loaded machine are not benchmarks: run it alone. The
``RESULT`` line carries the machine's ``calib_ms`` (``bench/calibration.py``); ``unresolved`` counts the output columns
whose source the lineage could not name (0 on the generator's SQL).

    .venv/bin/python bench/column_lineage.py                 # N = 10,000
    .venv/bin/python bench/column_lineage.py --quick         # N = 300, one round of loads: seconds
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from automation_scale import generate_catalog

from bench.calibration import calib_ms
from resources.settings import Settings, current


def timed_load(root: Path, settings: Settings) -> float:
    """Seconds to load the catalog at ``root`` into a resolved repository under ``settings``."""
    from warehouse_assets import definitions
    from warehouse_assets.catalog import load_catalog

    gc.collect()
    started = time.perf_counter()
    catalog = load_catalog(root)
    defs = definitions.build_definitions(catalog, settings)
    defs.get_repository_def().asset_graph.get_all_asset_keys()
    took = time.perf_counter() - started
    del defs, catalog
    return took


def measure(n: int, seed: int, sample: int, rounds: int = 2) -> dict[str, float | int]:
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.catalog.lineage import WarehouseLineage
    from warehouse_assets.catalog.lineage_cache import lineage_at_load
    from warehouse_assets.catalog.lineage_markdown import lineage_metadata

    with tempfile.TemporaryDirectory(prefix=f"column_lineage_{n}_") as tmp:
        root = Path(tmp) / "tables"
        generate_catalog(root, n, seed)
        base = current()
        off = base.model_copy(update={"lineage_at_load": False})
        on = base.model_copy(update={"lineage_at_load": True, "lineage_cache_dir": str(Path(tmp) / "home")})
        without = [timed_load(root, off)]  # first: the imports and the generator's files warmed for every figure
        cold_s = timed_load(root, on)
        warm = []
        for _ in range(rounds):
            warm.append(timed_load(root, on))
            without.append(timed_load(root, off))
        load_s, warm_s = min(without), min(warm)
        catalog = load_catalog(root)
        # the warm lineage's own part of a load, alone: the cache read and the Markdown of every table
        started = time.perf_counter()
        lineage, _ = lineage_at_load(catalog, on.lineage_cache_dir)
        for table in catalog.derived():
            lineage_metadata(lineage.of(table.fqn))
        part_s = time.perf_counter() - started

        started = time.perf_counter()
        every = WarehouseLineage(catalog).all()
        eager_s = time.perf_counter() - started
        unresolved = sum(len(t.unresolved) for t in every)

        rng = random.Random(seed)
        derived = sorted(t.fqn for t in catalog.derived())
        builds = []
        for fqn in rng.sample(derived, min(sample, len(derived))):
            started = time.perf_counter()
            WarehouseLineage(catalog).of(fqn)
            builds.append(time.perf_counter() - started)
        builds.sort()

        root_table = sorted(t.fqn for t in catalog.ods())[0]
        column = "user_id"  # a value column its readers aggregate (their join key, id, would reach everything)
        started = time.perf_counter()
        impact = WarehouseLineage(catalog).impact(root_table, [column])
        impact_s = time.perf_counter() - started
    return {
        "n": n,
        "load_s": load_s,
        "cold_s": cold_s,
        "warm_s": warm_s,
        "warm_ratio": warm_s / load_s,
        "part_s": part_s,
        "part_ratio": (load_s + part_s) / load_s,
        "eager_s": eager_s,
        "ratio": (load_s + eager_s) / load_s,
        "unresolved": unresolved,
        "build_p50_ms": 1000 * builds[len(builds) // 2],
        "build_max_ms": 1000 * builds[-1],
        "impact_s": impact_s,
        "impact_tables": len(impact.tables),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000], help="catalog sizes (default 10000)")
    parser.add_argument("--quick", action="store_true", help="N = 300 only, --rounds 1")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sample", type=int, default=50, help="tables whose lineage is timed as a build's")
    parser.add_argument("--rounds", type=int, default=2, help="loads without lineage and warm, alternated")
    args = parser.parse_args()
    sizes = [300] if args.quick else args.sizes
    if args.quick:  # every load still runs (without, cold, warm); its times are not figures, so one round of them
        args.rounds = 1
    calib = calib_ms()
    print(
        f"{'N':>6} {'load s':>8} {'cold s':>8} {'warm s':>8} {'warm/without':>12} {'part s':>7} {'eager s':>8} "
        f"{'uncached':>9} "
        f"{'unresolved':>10} {'build p50 ms':>12} {'build max ms':>12} {'taint s':>8} {'tables':>7}"
    )
    rows = []
    for n in sizes:
        r = measure(n, args.seed, args.sample, args.rounds)
        rows.append(r)
        print(
            f"{r['n']:>6} {r['load_s']:>8.2f} {r['cold_s']:>8.2f} {r['warm_s']:>8.2f} {r['warm_ratio']:>12.3f} "
            f"{r['part_s']:>7.2f} {r['eager_s']:>8.2f} {r['ratio']:>9.3f} {r['unresolved']:>10} "
            f"{r['build_p50_ms']:>12.1f} "
            f"{r['build_max_ms']:>12.1f} {r['impact_s']:>8.2f} {r['impact_tables']:>7}"
        )
    print(
        "load s: load_catalog + build_definitions + repository without lineage (WAREHOUSE_LINEAGE_AT_LOAD=0); "
        "cold s / warm s: the same with every table's lineage on its asset, the cache empty / filled (as shipped); "
        "warm/without: the lineage's cost at load (target 1.10); part s: the warm lineage's part of a load alone; "
        "eager s: every table's lineage computed without a "
        "cache; uncached: (load + eager) / load; build: one table's lineage as its materialization computes it; "
        "taint: the impact of one ODS column as `warehouse taint --columns` plans it (tables: those it reaches)"
    )
    last = rows[-1]
    keys = ("n", "load_s", "cold_s", "warm_s", "warm_ratio", "part_s", "part_ratio", "eager_s", "ratio")
    keys += ("build_p50_ms", "impact_s")
    keys += ("unresolved", "impact_tables")
    figures = [f"{k}={last[k]:.3f}" if isinstance(last[k], float) else f"{k}={last[k]}" for k in keys]
    print("RESULT " + " ".join(figures) + f" calib_ms={calib}")


if __name__ == "__main__":
    main()
