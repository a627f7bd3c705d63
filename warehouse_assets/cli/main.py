"""``warehouse`` — the command line of the warehouse.

    warehouse simulate --days 3                 generate simulated CDC sources into the landing area
    warehouse ingest                            apply pending landing segments to the ODS tables
    warehouse materialize --start D --end D     ingest, report ready ODS hours, build every derived table
                                                for [start, end) in dependency order (headless path)
    warehouse why dwd.order_detail 2026-03-02   why a partition waits: its upstream partitions and the root causes
    warehouse taint ods.order S E --reason R    what partitions S..E taint downstream; --apply marks and repairs
    warehouse status dwd.order_detail           each partition: materialized, valid or tainted, checks
    warehouse spark-server                      run the embedded Spark Connect server in the foreground
    warehouse capture --source mysql://U@H:P    real sources: a MySQL/MariaDB binlog into the landing area
    warehouse dev                               what `make dev` runs: data, Spark Connect, dagster dev

Every command runs against the Dagster instance in ``$DAGSTER_HOME`` (default ``./dagster_home``), so runs
and materializations show in the UI exactly as if the daemon had made them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from warehouse_assets.cli.common import ROOT, load_settings, say
from warehouse_assets.cli.dev import run_capture, run_dev, run_engine, run_spark_server, simulate_externals
from warehouse_assets.cli.headless import materialize_range, run_ingest
from warehouse_assets.cli.repair import add_parsers, status_command, taint_command


def _instance(dagster_home: str | None) -> Any:
    from dagster import DagsterInstance

    home = Path(dagster_home or os.environ.get("DAGSTER_HOME") or ROOT / "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    return DagsterInstance.get()


def _parse_day(value: str, tz: str) -> datetime:
    try:
        return datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=ZoneInfo(tz))
    except ValueError as exc:
        raise SystemExit(f"error: {value!r} is not a date (YYYY-MM-DD)") from exc


# --- commands ----------------------------------------------------------------------------------------------


def simulate_command(args: argparse.Namespace) -> int:
    """The simulated CDC sources, then the external producers' deliveries due by their clock."""
    from simulator import cdc as simulator

    status = simulator.run(args)
    if status == 0:
        external = load_settings({**os.environ, "WAREHOUSE_LANDING_ROOT": str(args.landing)}).external_dir
        simulate_externals(args.landing, Path(external))
    return status


def why_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    # the catalog alone, not the code location (warehouse_assets.definitions): building every asset, check
    # and sensor took seconds, and `why` needs only the tables, their windows and the instance's state
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.why import explain

    try:
        report = explain(
            instance,
            load_catalog(),
            resources["lake"].store(),
            resources["landing"].landing(),
            args.table,
            args.partition,
            resources["external"],
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0


def ingest_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    summary = run_ingest(instance, resources, args.tables)
    for fqn, numbers in summary.items():
        say(f"{fqn:<16} " + "  ".join(f"{k}={v}" for k, v in numbers.items()))
    return 0


def materialize_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    tz = resources["spark"].timezone
    ok = materialize_range(
        instance, resources, _parse_day(args.start, tz), _parse_day(args.end, tz), args.tables, not args.no_ingest
    )
    return 0 if ok else 1


# --- entry point -------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warehouse", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    from simulator import cdc as simulator

    sim = sub.add_parser("simulate", help="generate simulated CDC sources (Canal flat messages)")
    simulator.add_arguments(sim)

    ing = sub.add_parser("ingest", help="apply pending landing segments to the ODS tables")
    ing.add_argument("--tables", nargs="*", default=[], help="ODS tables, e.g. ods.order (default: all)")
    ing.add_argument("--dagster-home", default=None)

    mat = sub.add_parser("materialize", help="headless: ingest and build every table for a date range")
    mat.add_argument("--start", required=True, help="first day, YYYY-MM-DD (business timezone)")
    mat.add_argument("--end", required=True, help="day after the last one, YYYY-MM-DD (exclusive)")
    mat.add_argument("--tables", nargs="*", default=[], help="derived tables to build (default: all)")
    mat.add_argument("--no-ingest", action="store_true", help="skip applying landing segments first")
    mat.add_argument("--dagster-home", default=None)

    why = sub.add_parser("why", help="why is a table partition waiting? (upstream partitions, root causes)")
    why.add_argument("table", help="e.g. dwd.order_detail")
    why.add_argument("partition", help="e.g. 2026-03-02 (hourly: 2026-03-02-13:00)")
    why.add_argument("--dagster-home", default=None)

    add_parsers(sub)  # taint, status

    dev = sub.add_parser("dev", help="the embedded warehouse: simulated data, Spark Connect, dagster dev")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=3000)
    dev.add_argument("--days", type=int, default=3, help="days of history to simulate on first start")
    dev.add_argument("--scale", type=float, default=0.2, help="simulated volume (1.0 ≈ 3,000 orders a day)")
    dev.add_argument(
        "--no-simulate", dest="simulate", action="store_false", help="use the landing area as it is (real sources)"
    )

    eng = sub.add_parser("engine", help="the dependency center: starts each partition's run once its upstream is ready")
    eng.add_argument("--url", default=None, help="the Dagster webserver (default: WAREHOUSE_WEBSERVER_URL)")
    srv = sub.add_parser("spark-server", help="run the Spark Connect server in the foreground")
    srv.add_argument("--port", type=int, default=15002)

    cap = sub.add_parser("capture", help="real sources: read a MySQL/MariaDB binlog into the landing area")
    cap.add_argument(
        "--source",
        help="mysql://USER@HOST:PORT (default $WAREHOUSE_CAPTURE_SOURCE; password: $WAREHOUSE_CAPTURE_PASSWORD)",
    )
    cap.add_argument("--server-id", type=int, default=5401, help="replica id, unique among the source's replicas")
    cap.add_argument(
        "--start", choices=("earliest", "current"), default="current", help="first start: binlog position to read from"
    )
    cap.add_argument("--heartbeat-seconds", type=float, default=60.0, help="heartbeat table update interval (0: none)")

    args = parser.parse_args(argv)
    if args.command == "simulate":
        return simulate_command(args)
    if args.command == "dev":
        return run_dev(args)
    if args.command == "spark-server":
        return run_spark_server(args)
    if args.command == "engine":
        return run_engine(args)
    if args.command == "capture":
        return run_capture(args)

    from resources import resources_from_env

    resources = resources_from_env()
    instance = _instance(args.dagster_home)
    if args.command == "why":
        return why_command(args, instance, resources)
    if args.command == "taint":
        return taint_command(args, instance)
    if args.command == "status":
        return status_command(args, instance)
    if args.command == "ingest":
        return ingest_command(args, instance, resources)
    return materialize_command(args, instance, resources)
