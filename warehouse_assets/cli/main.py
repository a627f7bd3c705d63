"""``warehouse`` — the command line of the warehouse.

    warehouse simulate --days 3                 generate simulated CDC sources into the landing area
    warehouse ingest                            apply pending landing segments to the ODS tables
    warehouse materialize --start D --end D     ingest, report ready ODS hours, build every derived table
                                                for [start, end) in dependency order (headless path)
    warehouse why ads.daily_gmv 2026-11-24      why a partition waits: its upstream partitions and the root causes
    warehouse eta --accuracy [--since T]        the recorded predicted finishes scored against the actual ones
    warehouse taint ods.order S E --reason R    what partitions S..E taint downstream; --apply marks and repairs
                                                (--columns amount: only the tables reading those columns)
    warehouse lineage ads.daily_gmv.gmv         the columns a column is computed from (--up) or reaches (--down)
    warehouse lineage --keys                    each table's late-data rebuilds: by key, or whole and why
    warehouse reingest ods.order S [E]          re-ingest ODS hours from the landing area, report them again
    warehouse release ods.order S [E] --reason R   accept tainted partitions as they are
    warehouse status                            the engine's heartbeat, the runs queued and running, the start
    warehouse status dwd.order_detail           each partition: materialized, valid or tainted, checks
    warehouse status dwd.order_detail --as-of 2026-11-20T09:00   the same as it was then, from the event log
    warehouse rebuild --stale [--dry-run]       every stale partition's late-data rebuild now (month-end close)
    warehouse reconcile [TABLE]                 partitions gone from the lake: found, marked missing, rebuilt
    warehouse upgrade-lake                      turn deletion vectors on for an existing lake's ODS tables (in place)
    warehouse sql "SELECT … FROM dwd.t"         read-only SQL over the tables by name (a prompt without a query)
    warehouse spark-server                      run the embedded Spark Connect server in the foreground
    warehouse capture --source mysql://U@H:P    real sources: a MySQL/MariaDB binlog into the landing area
    warehouse dev                               what `make dev` runs: data, Spark Connect, dagster dev

Every command runs against the Dagster instance in ``$DAGSTER_HOME`` (default ``./dagster_home``), so runs
and materializations show in the UI exactly as if the daemon had made them, and works from the same warehouse start
as ``warehouse dev``: ``WAREHOUSE_START``, else the first day of the simulated landing area.
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

from warehouse_assets.cli.common import ROOT, adopt_warehouse_start, load_settings, say
from warehouse_assets.cli.dev import run_dev, simulate_externals
from warehouse_assets.cli.eta import add_eta_parser, eta_command
from warehouse_assets.cli.headless import materialize_range, run_ingest
from warehouse_assets.cli.lineage import add_lineage_parser, run_lineage
from warehouse_assets.cli.rebuild import add_rebuild_parser, rebuild_stale_command
from warehouse_assets.cli.repair import (
    add_taint_parser,
    reconcile_command,
    reingest_command,
    release_command,
    table_status_command,
    taint_command,
)
from warehouse_assets.cli.services import run_capture, run_engine, run_spark_server
from warehouse_assets.cli.sql import add_sql_parser, run_sql


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
    from warehouse_assets.explain.why import explain

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
    except ValueError as exc:  # an unknown table, a key that is not one of the table's: said exactly
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0


def status_command(args: argparse.Namespace, instance: Any) -> int:
    """The warehouse start, the engine's heartbeat (as the ``dependency_center`` sensor's ticks show it), the runs
    queued and in progress, the compute pools' load and the replication sites' lag; exit status 1 when the engine is
    not running."""
    from dagster import DagsterRunStatus, RunsFilter

    from resources.settings import current
    from warehouse_assets.center.heartbeat import EngineDown, engine_status
    from warehouse_assets.instance.pools import load_lines, pools_from_env

    print(f"warehouse start: {current().start} (the first partition of every table; WAREHOUSE_START)")
    try:
        print(engine_status(instance))
        alive = True
    except EngineDown as exc:
        print(f"engine NOT RUNNING: {exc}")
        alive = False
    for label, statuses in (
        ("in progress", [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]),
        ("queued", [DagsterRunStatus.QUEUED]),
    ):
        records = instance.get_run_records(RunsFilter(statuses=statuses))
        print(f"runs {label}: {len(records)}")
        for record in records[: args.runs]:
            print(f"  {_run_line(record)}")
        if len(records) > args.runs:
            print(f"  … and {len(records) - args.runs} more")
    pools = pools_from_env()
    if pools:  # several Spark endpoints: each one's runs over its capacity, and the ones offline
        print("compute pools:")
        print("\n".join(f"  {line}" for line in load_lines(instance, pools)))
    if current().site_roots:  # replication sites: each one's lag, source commit -> replica published
        from warehouse_assets.catalog import load_catalog
        from warehouse_assets.explain.replication import replication_lines

        print("replication sites (source commit -> replica published):")
        print("\n".join(f"  {line}" for line in replication_lines(instance, load_catalog(), current().site_roots)))
    return 0 if alive else 1


def _run_line(record: Any) -> str:
    from warehouse_assets.catalog import business_time

    run = record.dagster_run
    what = run.job_name
    if run.asset_selection:
        what = ", ".join(sorted(k.to_user_string().replace("/", ".") for k in run.asset_selection))
    tags = run.tags
    partition = tags.get("warehouse/partitions") or tags.get("dagster/partition", "")
    by = tags.get("dagster/sensor_name") or ("backfill" if "dagster/backfill" in tags else "manual")
    return f"{run.run_id[:8]} {what} {partition} (by {by}, created {business_time(record.create_timestamp, 'seconds')})"


def _check_tables(names: Sequence[str]) -> None:
    """Refuse a table name the catalog does not know, suggesting the closest ones."""
    from warehouse_assets.catalog import load_catalog

    catalog = load_catalog()
    for name in names:
        try:
            catalog.lookup(name)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None


def ingest_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    _check_tables(args.tables)
    summary = run_ingest(instance, resources, args.tables)
    for fqn, numbers in summary.items():
        say(f"{fqn:<16} " + "  ".join(f"{k}={v}" for k, v in numbers.items()))
    return 0


def materialize_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    _check_tables(args.tables)
    tz = resources["spark"].timezone
    ok = materialize_range(
        instance, resources, _parse_day(args.start, tz), _parse_day(args.end, tz), args.tables, not args.no_ingest
    )
    return 0 if ok else 1


def upgrade_lake_command(resources: dict[str, Any]) -> int:
    """Deletion vectors for every ODS table of an existing lake, in place: a table property change and the protocol
    feature it needs, one commit per table; no data file is rewritten and earlier versions stay readable."""
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.ingest.maintenance import upgrade_to_deletion_vectors

    store = resources["lake"].store()
    upgraded = upgrade_to_deletion_vectors(store, load_catalog(), resources["spark"].session())
    for fqn, now in sorted(upgraded.items()):
        say(f"{fqn:<16} {'deletion vectors enabled' if now else 'already has deletion vectors'}")
    if not upgraded:
        say(f"no ODS table under {store.root} yet: tables are created with deletion vectors")
    return 0


# --- entry point -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warehouse", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    home_help = "the Dagster instance's directory (default: $DAGSTER_HOME, else ./dagster_home)"

    from simulator import cdc as simulator

    sim = sub.add_parser("simulate", help="generate simulated CDC sources (Canal flat messages)")
    simulator.add_arguments(sim)

    ing = sub.add_parser("ingest", help="apply pending landing segments to the ODS tables")
    ing.add_argument("--tables", nargs="*", default=[], help="ODS tables, e.g. ods.order (default: all)")
    ing.add_argument("--dagster-home", default=None, help=home_help)

    mat = sub.add_parser("materialize", help="headless: ingest and build every table for a date range")
    mat.add_argument("--start", required=True, help="first day, YYYY-MM-DD (business timezone)")
    mat.add_argument("--end", required=True, help="day after the last one, YYYY-MM-DD (exclusive)")
    mat.add_argument("--tables", nargs="*", default=[], help="derived tables to build (default: all)")
    mat.add_argument("--no-ingest", action="store_true", help="skip applying landing segments first")
    mat.add_argument("--dagster-home", default=None, help=home_help)

    why = sub.add_parser("why", help="why is a table partition waiting? (upstream partitions, root causes)")
    why.add_argument("table", help="layer.table, e.g. ads.daily_gmv")
    why.add_argument("partition", help="e.g. 2026-11-24 (hourly: 2026-11-24-13:00; weekly: its Monday)")
    why.add_argument("--dagster-home", default=None, help=home_help)

    st = sub.add_parser(
        "status", help="the engine's heartbeat and the runs queued and running; with a table, each partition's state"
    )
    st.add_argument("table", nargs="?", help="a table, e.g. dwd.order_detail: its partitions, valid or tainted, checks")
    st.add_argument(
        "--range", nargs=2, metavar=("START", "END"), help="the table's partitions shown (default: the last 3 days)"
    )
    st.add_argument(
        "--as-of",
        metavar="TIME",
        help="the table's partitions as they were at TIME (e.g. 2026-11-20T09:00, business time zone), replayed from "
        "the event log, with the Delta version to read them with `warehouse sql --as-of`",
    )
    st.add_argument("--runs", type=int, default=10, help="runs listed per status (default 10)")
    st.add_argument("--dagster-home", default=None, help=home_help)

    add_eta_parser(sub)
    add_taint_parser(sub)
    add_rebuild_parser(sub)
    add_lineage_parser(sub)
    add_sql_parser(sub)

    dev = sub.add_parser("dev", help="the embedded warehouse: simulated data, Spark Connect, dagster dev")
    dev.add_argument("--host", default="127.0.0.1", help="the webserver's address (default 127.0.0.1)")
    dev.add_argument("--port", type=int, default=3000, help="the webserver's port (default 3000)")
    dev.add_argument("--days", type=int, default=3, help="days of history to simulate on first start")
    dev.add_argument("--scale", type=float, default=0.2, help="simulated volume (1.0 ≈ 3,000 orders a day)")
    dev.add_argument(
        "--no-simulate", dest="simulate", action="store_false", help="use the landing area as it is (real sources)"
    )
    dev.add_argument(
        "--dagster-log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug"),
        help="what the webserver and daemon print (default warning; info adds a line per sensor tick and queue pass)",
    )

    eng = sub.add_parser("engine", help="the dependency center: starts each partition's run once its upstream is ready")
    eng.add_argument("--url", default=None, help="the Dagster webserver (default: WAREHOUSE_WEBSERVER_URL)")
    sub.add_parser(
        "upgrade-lake",
        help="turn deletion vectors on for the ODS tables of an existing lake (a table property; no data rewritten)",
    )
    srv = sub.add_parser("spark-server", help="run the Spark Connect server in the foreground")
    srv.add_argument("--port", type=int, default=None, help="the port it listens on (default 15002; analysts' 15003)")
    srv.add_argument(
        "--analysts",
        action="store_true",
        help="the analysts' server, read-only: reads of the lake's tables by name; no writes, paths, code, settings",
    )

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
    return parser


def _sql_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warehouse")
    add_sql_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sql"]:
        # an analyst's command, started cold each time: parsed alone, without the other commands' options, whose
        # modules (the simulator's) import Dagster, most of a second
        return run_sql(_sql_parser().parse_args(argv))
    args = build_parser().parse_args(argv)
    if args.command == "simulate":
        return simulate_command(args)
    if args.command == "sql":
        return run_sql(args)
    if args.command == "dev":
        return run_dev(args)  # resolves the start once its simulated sources exist
    if args.command == "lineage":
        return run_lineage(args)  # the catalog alone: no instance, no lake
    # the same warehouse start as `warehouse dev`, before anything reads the settings
    adopt_warehouse_start()
    if args.command == "spark-server":
        args.port = args.port or (15003 if args.analysts else 15002)
        return run_spark_server(args)
    if args.command == "engine":
        return run_engine(args)
    if args.command == "capture":
        return run_capture(args)

    from resources import resources_from_env

    resources = resources_from_env()
    if args.command == "upgrade-lake":
        return upgrade_lake_command(resources)
    if args.command == "rebuild":
        home = Path(args.dagster_home or os.environ.get("DAGSTER_HOME") or ROOT / "dagster_home")
        if not (home / "dagster.yaml").exists() and not (home / "storage").exists():
            print(f"error: no Dagster instance at {home.resolve()} (--dagster-home or $DAGSTER_HOME)", file=sys.stderr)
            return 2
        return rebuild_stale_command(args, _instance(args.dagster_home))
    instance = _instance(args.dagster_home)
    if args.command == "why":
        return why_command(args, instance, resources)
    if args.command == "eta":
        return eta_command(args, instance)
    if args.command == "taint":
        return taint_command(args, instance, resources)
    if args.command == "reingest":
        return reingest_command(args, instance, resources)
    if args.command == "release":
        return release_command(args, instance, resources)
    if args.command == "reconcile":
        return reconcile_command(args, instance, resources)
    if args.command == "status":
        if args.as_of and not args.table:
            print("error: --as-of shows a table's partitions as they were: name the table", file=sys.stderr)
            return 2
        if args.table:
            return table_status_command(args, instance, resources["landing"].landing())
        return status_command(args, instance)
    if args.command == "ingest":
        return ingest_command(args, instance, resources)
    return materialize_command(args, instance, resources)
