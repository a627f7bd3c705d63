"""Benchmark: what column lineage adds to the code location's load, and what it costs where it is computed.

For each N it writes ``bench/automation_scale.py``'s synthetic catalog of N tables (same generator, same seed: each
derived table joins its 1-3 inputs, filters and groups) and, in one process:

* **load**: ``load_catalog`` then ``warehouse_assets.definitions.build_definitions`` resolved into a repository, as
  ``automation_scale``'s load figure. Column lineage is computed lazily (``warehouse_assets/catalog/lineage.py``), so
  this is the load *with* lineage as the product ships it;
* **eager**: every table's lineage computed at once (``WarehouseLineage.all``): what computing it at load would add.
  The ratio ``(load + eager) / load`` is the load with eager lineage against the load without any;
* **per build**: one table's lineage from a fresh ``WarehouseLineage``, as a build computes it for its
  materialization's ``dagster/column_lineage`` (with what it needs upstream to name its inputs' columns), for
  ``--sample`` tables drawn at random: P50 and max;
* **column taint**: ``WarehouseLineage.impact`` of one value column (``user_id``) of the first ODS root, as
  ``warehouse taint --columns`` plans it (the tables downstream parsed, their lineage followed).

No Spark, no Dagster instance. The figures of a shared or loaded machine are not benchmarks: run it alone. The
``RESULT`` line carries the machine's ``calib_ms`` (``bench/calibration.py``); ``unresolved`` counts the output columns
whose source the lineage could not name (0 on the generator's SQL).

    .venv/bin/python bench/column_lineage.py                 # N = 10,000
    .venv/bin/python bench/column_lineage.py --quick         # N = 300: seconds
"""

from __future__ import annotations

import argparse
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


def measure(n: int, seed: int, sample: int) -> dict[str, float | int]:
    from warehouse_assets import definitions
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.catalog.lineage import WarehouseLineage

    with tempfile.TemporaryDirectory(prefix=f"column_lineage_{n}_") as tmp:
        root = Path(tmp) / "tables"
        generate_catalog(root, n, seed)
        started = time.perf_counter()
        catalog = load_catalog(root)
        defs = definitions.build_definitions(catalog)
        defs.get_repository_def().asset_graph.get_all_asset_keys()
        load_s = time.perf_counter() - started
        del defs

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
    parser.add_argument("--quick", action="store_true", help="N = 300 only")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sample", type=int, default=50, help="tables whose lineage is timed as a build's")
    args = parser.parse_args()
    sizes = [300] if args.quick else args.sizes
    calib = calib_ms()
    print(
        f"{'N':>6} {'load s':>8} {'eager s':>8} {'with/without':>12} {'unresolved':>10} "
        f"{'build p50 ms':>12} {'build max ms':>12} {'taint s':>8} {'tables':>7}"
    )
    rows = []
    for n in sizes:
        r = measure(n, args.seed, args.sample)
        rows.append(r)
        print(
            f"{r['n']:>6} {r['load_s']:>8.2f} {r['eager_s']:>8.2f} {r['ratio']:>12.3f} {r['unresolved']:>10} "
            f"{r['build_p50_ms']:>12.1f} {r['build_max_ms']:>12.1f} {r['impact_s']:>8.2f} {r['impact_tables']:>7}"
        )
    print(
        "load s: load_catalog + build_definitions + repository, lineage lazy (as shipped: the load computes none); "
        "eager s: every table's lineage at once; with/without: (load + eager) / load, what computing it at load "
        "would cost; build: one table's lineage as its materialization computes it; taint: the impact of one ODS "
        "column as `warehouse taint --columns` plans it (tables: those it reaches)"
    )
    last = rows[-1]
    keys = ("n", "load_s", "eager_s", "ratio", "build_p50_ms", "impact_s", "unresolved", "impact_tables")
    figures = [f"{k}={last[k]:.3f}" if isinstance(last[k], float) else f"{k}={last[k]}" for k in keys]
    print("RESULT " + " ".join(figures) + f" calib_ms={calib}")


if __name__ == "__main__":
    main()
