"""Benchmark: how the compiled catalog scales with the number of tables (issue 3, point 8).

For each N it writes a synthetic catalog of N tables as real declaration files into a temporary directory
(ODS ``.yaml`` files and ``.sql`` files with YAML headers, exactly what ``warehouse_assets/tables/`` holds),
then, in a fresh subprocess per N so the peak memory is that N's alone:

* **load**: ``load_catalog(root)`` (YAML + SQL lineage parsing + graph validation), then the code location's
  own assembly, ``warehouse_assets.definitions.build_definitions`` (assets, their quality and freshness
  checks, the ingest / why / maintenance / Z-order / ODS-check jobs, every sensor, resources) into a
  ``Definitions``, resolved into a repository (what a code server does when it loads the location);
* **downstream**: every downstream partition of one hourly partition of a root table: a walk of the asset
  graph in topological order that applies Dagster's partition mapping of every edge
  (``get_downstream_partitions_for_partitions``) and closes self-dependencies (T-1) to a fixpoint. For
  information, Dagster's own ``AssetGraph.bfs_filter_subsets`` on the same start is timed too; it visits each
  asset once in BFS order and does not follow self-dependencies, so it may find fewer partitions;
* **tick**: one automation evaluation (``dagster.evaluate_automation_conditions``, every asset, the
  project's condition) on an ``instance_for_test()`` at a pinned time at the end of one year of partitions,
  after the root (ODS) hours of the last ``--root-days`` days were reported materialized: first tick (empty
  cursor), then a second tick with the cursor after one more root hour arrived (the steady state);
* **peak memory**: ``ru_maxrss`` of the child process (``os.wait4``).

Synthetic catalogs: a handful of hourly ODS roots (5 + N // 1000); derived tables hourly / daily / weekly /
monthly (12 / 60 / 15 / 13 %), each reading 1-3 earlier tables (mean 1.5) with the seeds' offsets: set 0,
set -1, set -7, range 0-23 hours under a day, range 0-6 days under a week, a month on its days (default),
sliding windows range [-6, 0] and [-29, 0], hourly range [-23, 0]; about 3 % of daily tables are
self-dependent (T-1). Generation is deterministic (``--seed``).

No Spark is started: the assets are never executed (``pyspark`` is imported, no session is created).
A step that runs longer than ``--step-timeout`` seconds is printed as ``timeout``: the parent kills that
N's process, so its later steps show ``not run`` (the steps run in the order load, downstream, seed,
tick1, tick2). Progress goes to stderr, the table to stdout, and the last line of stdout
is one ``RESULT`` line of ``key=value`` figures.

    .venv/bin/python bench/automation_scale.py                          # N = 100, 1000, 5000
    .venv/bin/python bench/automation_scale.py --sizes 100,1000,5000,10000 --step-timeout 600
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from warehouse_assets.partitions import START, periods  # noqa: E402

PERIODS = ("hourly", "daily", "weekly", "monthly")
PERIOD_WEIGHTS = (0.12, 0.60, 0.15, 0.13)
RANK = {p: i for i, p in enumerate(PERIODS)}
DEP_COUNTS = ((1, 0.6), (2, 0.3), (3, 0.1))  # mean 1.5 upstream tables per derived table
SELF_DEP_SHARE = 0.03  # of daily derived tables
# (own period, upstream period) -> offsets in the seeds' vocabulary with their weights (None = default mapping)
OFFSETS: dict[tuple[str, str], list[tuple[dict[str, list[int]] | None, float]]] = {
    ("hourly", "hourly"): [(None, 0.6), ({"set": [0]}, 0.1), ({"set": [-1]}, 0.2), ({"range": [-23, 0]}, 0.1)],
    ("daily", "hourly"): [({"range": [0, 23]}, 0.6), (None, 0.4)],
    ("daily", "daily"): [
        ({"set": [0]}, 0.4),
        ({"set": [-1]}, 0.2),
        ({"set": [-7]}, 0.1),
        ({"range": [-6, 0]}, 0.15),
        ({"range": [-29, 0]}, 0.15),
    ],
    ("weekly", "hourly"): [(None, 1.0)],
    ("weekly", "daily"): [({"range": [0, 6]}, 0.7), (None, 0.3)],
    ("weekly", "weekly"): [({"set": [0]}, 0.6), ({"set": [-1]}, 0.4)],
    ("monthly", "hourly"): [(None, 1.0)],
    ("monthly", "daily"): [(None, 1.0)],  # a month on its days
    ("monthly", "monthly"): [({"set": [0]}, 0.6), ({"set": [-1]}, 0.4)],
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the synthetic catalog ---------------------------------------------------------------------------------


def _pick(rng: random.Random, options: list[tuple[Any, float]]) -> Any:
    return rng.choices([o for o, _ in options], weights=[w for _, w in options])[0]


def generate_catalog(root: Path, n: int, seed: int) -> dict[str, Any]:
    """Write ``n`` table declarations under ``root/<layer>/``; return a summary of what was written."""
    rng = random.Random(seed)
    n_roots = 5 + n // 1000
    tables: list[tuple[str, str]] = []  # (fqn, period) in creation order
    for layer in ("ods", "dwd", "dws", "ads"):
        (root / layer).mkdir(parents=True, exist_ok=True)
    for i in range(n_roots):
        name = f"src_{i:03d}"
        (root / "ods" / f"{name}.yaml").write_text(
            f"table: ods.{name}\n"
            "period: hourly\n"
            f"description: Synthetic ODS root {i} (bench/automation_scale.py).\n"
            "owner: bench\n"
            f'source: {{database: bench_src, tables: "{name}_[0-9]{{2}}"}}\n'
            "primary_key: [id]\n"
            "partition_time: create_time\n"
            "columns:\n  id: bigint\n  user_id: bigint\n  v: double\n  create_time: timestamp\n"
            "  update_time: timestamp\n"
        )
        tables.append((f"ods.{name}", "hourly"))
    edges = self_deps = 0
    by_kind: dict[str, int] = {}
    n_derived = n - n_roots
    for j in range(n_derived):
        period = rng.choices(PERIODS, weights=PERIOD_WEIGHTS)[0]
        frac = j / max(1, n_derived)
        layer = "dwd" if frac < 0.3 else "dws" if frac < 0.7 else "ads"
        name = f"t_{j:05d}"
        fqn = f"{layer}.{name}"
        eligible = [t for t in tables if (period, t[1]) in OFFSETS]
        k = min(len(eligible), _pick(rng, list(DEP_COUNTS)))
        ups = rng.sample(eligible, k)
        declared: dict[str, dict[str, list[int]]] = {}
        for up, up_period in ups:
            offsets = _pick(rng, OFFSETS[(period, up_period)])
            kind = f"{period}<-{up_period} " + (json.dumps(offsets).replace('"', "") if offsets else "default")
            by_kind[kind] = by_kind.get(kind, 0) + 1
            if offsets is not None:
                declared[up] = offsets
        reads = [up for up, _ in ups]
        if period == "daily" and rng.random() < SELF_DEP_SHARE:
            declared[fqn] = {"set": [-1]}
            reads.append(fqn)
            self_deps += 1
        edges += len(reads)
        header = [
            f"table: {fqn}",
            f"period: {period}",
            f"description: Synthetic table {j} (bench/automation_scale.py).",
            "owner: bench",
            "primary_key: [id]",
        ]
        if rng.random() < 0.1:
            header.append("zorder: [user_id]")
        if fqn in declared:  # a self-dependent table declares its output (its first T-1 is empty)
            header.append("columns: {id: bigint, user_id: bigint, n: bigint, ds: string}")
        if declared:
            header.append("depends_on:")
            header += [f"  {up}: {json.dumps(off).replace(chr(34), '')}" for up, off in declared.items()]
        joins = "".join(f"\nLEFT JOIN {up} AS t{a} ON t0.id = t{a}.id" for a, up in enumerate(reads[1:], start=1))
        sql = (
            "/* ---\n" + "\n".join(header) + "\n--- */\n"
            "SELECT t0.id, max(t0.user_id) AS user_id, count(*) AS n, '${ds}' AS ds\n"
            f"FROM {reads[0]} AS t0{joins}\nWHERE t0.id IS NOT NULL\nGROUP BY t0.id\n"
        )
        (root / layer / f"{name}.sql").write_text(sql)
        tables.append((fqn, period))
    periods = {p: sum(1 for _, q in tables if q == p) for p in PERIODS}
    return {"roots": n_roots, "edges": edges, "self_deps": self_deps, "periods": periods, "kinds": by_kind}


# --- one N, in a child process -----------------------------------------------------------------------------


def emit(record: dict[str, Any]) -> None:
    record["maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(record), flush=True)


def run_step(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one timed step; the parent kills this process if the step outlives ``--step-timeout``."""
    log(f"  {name} ...")
    emit({"step": name, "status": "started"})
    started, cpu_started = time.perf_counter(), time.process_time()
    figures = fn()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    log(f"  {name}: {seconds:.2f} s (cpu {cpu:.2f} s) {figures}")
    emit({"step": name, "status": "ok", "seconds": round(seconds, 3), "cpu_s": round(cpu, 3), **figures})
    return figures


def build_definitions(catalog: Any) -> Any:
    """The product's own assembly (``warehouse_assets.definitions.build_definitions``) of another catalog."""
    from warehouse_assets.definitions import build_definitions as assemble

    return assemble(catalog)


def downstream_closure(asset_graph: Any, start: Any, subset: Any) -> dict[Any, Any]:
    """Every downstream partition of ``subset`` of ``start``: topological order, one mapping per edge."""
    descendants = {start}
    queue = deque([start])
    while queue:
        for child in asset_graph.get(queue.popleft()).child_keys:
            if child not in descendants:
                descendants.add(child)
                queue.append(child)
    indegree = {
        key: sum(1 for p in asset_graph.get(key).parent_keys if p in descendants and p != key) for key in descendants
    }
    ready = deque([start])
    found: dict[Any, Any] = {start: subset}
    while ready:
        key = ready.popleft()
        node = asset_graph.get(key)
        current = found.get(key)
        if current is not None and key in node.child_keys:  # self-dependency: close to a fixpoint
            mapping = asset_graph.get_partition_mapping(key, key)
            frontier = current
            while len(frontier):
                step = mapping.get_downstream_partitions_for_partitions(
                    frontier, node.partitions_def, downstream_partitions_def=node.partitions_def
                )
                frontier = step - current
                current = current | frontier
            found[key] = current
        for child in node.child_keys:
            if child == key:
                continue
            if current is not None and len(current):
                child_def = asset_graph.get(child).partitions_def
                mapped = asset_graph.get_partition_mapping(child, key).get_downstream_partitions_for_partitions(
                    current, node.partitions_def, downstream_partitions_def=child_def
                )
                if len(mapped):
                    found[child] = found[child] | mapped if child in found else mapped
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return {k: v for k, v in found.items() if len(v)}


def child_main(args: argparse.Namespace) -> None:
    n = args.child
    tz = ZoneInfo(periods().timezone)
    # 00:30 after one year of partitions: the hour reported between the two ticks completes the last day
    eval_time = datetime.fromisoformat(START).replace(tzinfo=tz) + timedelta(days=365, minutes=30)
    probe_hour = eval_time - timedelta(days=args.probe_days_back)
    probe_key = probe_hour.strftime("%Y-%m-%d-%H:00")
    with tempfile.TemporaryDirectory(prefix=f"automation_scale_{n}_") as tmp:
        root = Path(tmp) / "tables"
        log(f"N={n}: writing the synthetic catalog to {root}")
        summary = generate_catalog(root, n, args.seed)
        emit({"step": "generate", "status": "ok", **{k: v for k, v in summary.items() if k != "kinds"}})
        log(f"  catalog: {summary['periods']}, {summary['edges']} dependencies, {summary['self_deps']} self")

        # imported here so that the import cost is not part of the load figure (the code location's module
        # also silences Dagster's beta and preview warnings)
        import dagster
        from dagster import AssetKey, AssetMaterialization, instance_for_test, partition_loading_context
        from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset

        from warehouse_assets import definitions as _product_definitions  # noqa: F401  (the real location)
        from warehouse_assets.catalog import load_catalog
        from warehouse_assets.partitions import hourly

        state: dict[str, Any] = {}

        def load() -> dict[str, Any]:
            t0 = time.perf_counter()
            catalog = load_catalog(root)
            t1 = time.perf_counter()
            defs = build_definitions(catalog)
            t2 = time.perf_counter()
            repo = defs.get_repository_def()
            t3 = time.perf_counter()
            state["defs"] = defs
            state["roots"] = sorted(t.fqn for t in catalog.ods())
            return {
                "tables": len(catalog.tables),
                "assets": len(repo.asset_graph.get_all_asset_keys()),
                "catalog_s": round(t1 - t0, 3),
                "build_s": round(t2 - t1, 3),
                "resolve_s": round(t3 - t2, 3),
            }

        def downstream() -> dict[str, Any]:
            graph = state["defs"].resolve_asset_graph()
            start = AssetKey(state["roots"][0].split("."))
            with partition_loading_context(effective_dt=eval_time):
                subset = hourly.empty_subset().with_partition_keys([probe_key])
                t0 = time.perf_counter()
                closure = downstream_closure(graph, start, subset)
                t1 = time.perf_counter()
                bfs = graph.bfs_filter_subsets(
                    lambda key, s: True, AssetGraphSubset(partitions_subsets_by_asset_key={start: subset})
                )
                t2 = time.perf_counter()
            return {
                "root": state["roots"][0],
                "partition": probe_key,
                "assets": len(closure) - 1,
                "partitions": sum(len(s) for k, s in closure.items() if k != start),
                "walk_s": round(t1 - t0, 3),
                "bfs_s": round(t2 - t1, 3),
                "bfs_partitions": bfs.num_partitions_and_non_partitioned_assets - 1,
            }

        stack = ExitStack()
        instance = stack.enter_context(instance_for_test())
        state["instance"] = instance
        last_hour = eval_time.replace(minute=0) - timedelta(hours=1)  # the newest complete root hour

        def seed() -> dict[str, Any]:
            hours = [last_hour - timedelta(hours=h) for h in range(1, args.root_days * 24 + 1)]
            for fqn in state["roots"]:
                for hour in hours:
                    instance.report_runless_asset_event(
                        AssetMaterialization(AssetKey(fqn.split(".")), partition=hour.strftime("%Y-%m-%d-%H:00"))
                    )
            return {"events": len(hours) * len(state["roots"])}

        def arrive() -> None:
            """One more root hour (the last of the year, completing its day) arrives between the ticks."""
            for fqn in state["roots"]:
                instance.report_runless_asset_event(
                    AssetMaterialization(AssetKey(fqn.split(".")), partition=last_hour.strftime("%Y-%m-%d-%H:00"))
                )

        def tick(first: bool) -> Callable[[], dict[str, Any]]:
            def run() -> dict[str, Any]:
                when = eval_time if first else eval_time + timedelta(minutes=1)
                result = dagster.evaluate_automation_conditions(
                    defs=state["defs"], instance=instance, evaluation_time=when, cursor=state.get("cursor")
                )
                state["cursor"] = result.cursor
                return {"requested": result.total_requested}

            return run

        try:
            run_step("load", load)
            run_step("downstream", downstream)
            run_step("seed", seed)
            run_step("tick1", tick(True))
            arrive()
            run_step("tick2", tick(False))
        finally:
            stack.close()


# --- the parent: one child per N, the table ----------------------------------------------------------------


def run_child(n: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(n),
        "--seed",
        str(args.seed),
        "--step-timeout",
        str(args.step_timeout),
        "--root-days",
        str(args.root_days),
        "--probe-days-back",
        str(args.probe_days_back),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    records: dict[str, dict[str, Any]] = {}
    started = step_started = time.perf_counter()
    step = "start"  # the child's imports and the catalog generation count against the first timeout too
    killed = False
    try:
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                record = json.loads(line)
                step_started = time.perf_counter()
                if record["status"] == "started":
                    step = record["step"]
                else:
                    records[record["step"]] = record
                    step = f"after {record['step']}"
            if time.perf_counter() - step_started > args.step_timeout:
                log(f"N={n}: step {step} exceeded {args.step_timeout:.0f} s: timeout, killing pid {proc.pid}")
                proc.kill()
                killed = True
                records[step] = {"step": step, "status": "timeout", "seconds": args.step_timeout}
                break
    except BaseException:  # the parent is interrupted: never leave the child behind
        proc.kill()
        raise
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "n": n,
        "records": records,
        "maxrss_mb": round(usage.ru_maxrss / 1024, 1),
        "exit": proc.returncode,
        "killed": killed,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _cell(record: dict[str, Any] | None, key: str = "seconds", fmt: str = "{:.2f}") -> str:
    if record is None:
        return "not run"
    if record.get("status") == "timeout":
        return f"timeout>{record['seconds']:.0f}s"
    return fmt.format(record[key])


def _wall_cpu(record: dict[str, Any] | None) -> str:
    if record is None or record.get("status") != "ok":
        return _cell(record)
    return f"{record['seconds']:.2f} ({record['cpu_s']:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,5000", help="comma-separated numbers of tables")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--step-timeout", type=float, default=600.0, help="seconds per step before 'timeout'")
    parser.add_argument("--root-days", type=int, default=3, help="days of root hours reported before the tick")
    parser.add_argument(
        "--probe-days-back", type=int, default=30, help="the probed root hour lies this many days before the tick"
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child_main(args)
        return

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"interrupted by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        log(f"N={n}: starting a fresh process")
        results.append(run_child(n, args))
        log(f"N={n}: done in {results[-1]['wall_s']} s, peak RSS {results[-1]['maxrss_mb']} MB")

    header = (
        f"{'N':>6} {'deps':>6} {'load s (cpu)':>15} {'tick1 s (cpu)':>16} {'tick2 s (cpu)':>16} "
        f"{'requested':>9} {'peak MB':>8} {'downstream s':>13} {'assets':>7} {'partitions':>10}"
    )
    print(header)
    print("-" * len(header))
    result_line = []
    for res in results:
        r = res["records"]
        gen, load, down = r.get("generate"), r.get("load"), r.get("downstream")
        t1, t2 = r.get("tick1"), r.get("tick2")
        ok_down = down is not None and down.get("status") == "ok"
        requested = "/".join(_cell(t, "requested", "{}") for t in (t1, t2))
        print(
            f"{res['n']:>6} {gen['edges'] if gen else '?':>6} {_wall_cpu(load):>15} {_wall_cpu(t1):>16} "
            f"{_wall_cpu(t2):>16} {requested:>9} {res['maxrss_mb']:>8.0f} "
            f"{_cell(down, 'walk_s'):>13} {_cell(down, 'assets', '{}'):>7} {_cell(down, 'partitions', '{}'):>10}"
        )
        n = res["n"]
        figures: dict[str, Any] = {"exit": res["exit"], "peak_mb": res["maxrss_mb"]}
        if gen:
            figures.update(edges=gen["edges"], self_deps=gen["self_deps"], roots=gen["roots"])
        for name, rec in (("load", load), ("tick1", t1), ("tick2", t2), ("seed", r.get("seed"))):
            figures[f"{name}_s"] = "timeout" if rec and rec["status"] == "timeout" else rec["seconds"] if rec else "na"
            if rec and rec["status"] == "ok":
                figures[f"{name}_cpu_s"] = rec["cpu_s"]
        if load and load["status"] == "ok":
            figures.update(catalog_s=load["catalog_s"], build_s=load["build_s"], resolve_s=load["resolve_s"])
        for name, rec in (("tick1", t1), ("tick2", t2)):
            if rec and rec["status"] == "ok":
                figures[f"{name}_requested"] = rec["requested"]
        if ok_down:
            figures.update(
                downstream_s=down["walk_s"],
                downstream_assets=down["assets"],
                downstream_partitions=down["partitions"],
                bfs_s=down["bfs_s"],
                bfs_partitions=down["bfs_partitions"],
            )
        result_line += [f"n{n}_{k}={v}" for k, v in figures.items()]
    first = next((res["records"].get("downstream") for res in results if res["records"].get("downstream")), None)
    if first and first["status"] == "ok":
        print(
            f"\ndownstream of {first['root']} {first['partition']} ({args.probe_days_back} days before the tick); "
            f"tick at {START} + 365 d 00:30 {periods().timezone}, "
            f"root hours of the last {args.root_days} days reported; "
            "'bfs' = Dagster's bfs_filter_subsets for comparison (no self-dependency closure), in RESULT"
        )
    for res in results:
        for rec in res["records"].values():
            if rec["status"] == "timeout":
                print(f"N={res['n']}: step '{rec['step']}' timed out after {rec['seconds']:.0f} s; later steps not run")
    print("RESULT " + " ".join(result_line))


if __name__ == "__main__":
    main()
