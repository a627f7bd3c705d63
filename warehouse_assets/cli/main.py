"""``warehouse`` — the command line of the warehouse.

    warehouse simulate --days 3                 generate simulated CDC sources into the landing area
    warehouse ingest                            apply pending landing segments to the ODS tables
    warehouse materialize --start D --end D     ingest, report ready ODS hours, build every derived table
                                                for [start, end) in dependency order (headless path)
    warehouse why dwd.order_detail 2026-03-02   why a partition waits: its upstream partitions and the root causes
    warehouse spark-server                      run the embedded Spark Connect server in the foreground
    warehouse capture --source mysql://U@H:P    real sources: a MySQL/MariaDB binlog into the landing area
    warehouse dev                               what `make dev` runs: data, Spark Connect, dagster dev

Every command runs against the Dagster instance in ``$DAGSTER_HOME`` (default ``./dagster_home``), so runs
and materializations show in the UI exactly as if the daemon had made them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

if TYPE_CHECKING:
    from resources.settings import Settings

ROOT = Path(__file__).resolve().parents[2]  # the repository: warehouse_assets/cli/main.py


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


def _say(message: str) -> None:
    print(message, flush=True)


# --- ingest / readiness ------------------------------------------------------------------------------------


def run_ingest(instance: Any, resources: dict[str, Any], tables: Sequence[str] = ()) -> dict[str, Any]:
    """Run the ``ods_ingest`` job in this process against ``instance``; returns its summary."""
    from warehouse_assets.build.hour_checks import judge_hours
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.ingest.job import build_ingest_job

    result = build_ingest_job(load_catalog(), judge_hours).execute_in_process(
        instance=instance,
        resources=resources,
        run_config={"ops": {"ingest_ods": {"config": {"tables": list(tables)}}}},
    )
    summary: dict[str, Any] = result.output_for_node("ingest_ods")
    return summary


def report_ready_hours(
    instance: Any, resources: dict[str, Any], tables: Sequence[str] | None = None, until: datetime | None = None
) -> int:
    """Report complete ODS hours not yet materialized (what the readiness sensor does).

    ``tables`` limits it to some ODS tables and ``until`` to the hours ending by then (default: all).
    """
    from dagster import AssetKey

    from warehouse_assets.catalog import Catalog, hourly, load_catalog
    from warehouse_assets.ingest.readiness import readiness_events

    catalog = load_catalog()
    store, landing = resources["lake"].store(), resources["landing"].landing()
    selected = Catalog({t.fqn: t for t in catalog.ods() if tables is None or t.fqn in tables})
    cursor: dict[str, str] = {}
    reported = 0
    while True:  # the sensor's function reports at most MAX_EVENTS_PER_TICK hours per call
        events, advanced = readiness_events(
            store, landing, selected, cursor, lambda t: set(instance.get_materialized_partitions(AssetKey(t.key)))
        )
        for event in events:
            if until is None or hourly.time_window_for_partition_key(str(event.partition)).end <= until:
                instance.report_runless_asset_event(event)
                reported += 1
        if advanced == cursor:
            return reported
        cursor = advanced


def report_external_deliveries(instance: Any, resources: dict[str, Any]) -> int:
    """Report every external partition that has arrived and is not reported yet (what their sensors do)."""
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.ingest.deliveries import Cursor, evaluate, external_source, last_reported, now_in_business_tz

    reported = 0
    for table in load_catalog().externals():
        source = external_source(resources["external"], table)
        tick, _ = evaluate(source, Cursor(), now_in_business_tz(), last_reported(instance, table.key))
        for line in tick.rejected:
            _say(f"[ext   ] {line}")
        for event in tick.events:
            instance.report_runless_asset_event(event)
        reported += len(tick.events)
    return reported


def _external_missing(catalog: Any, instance: Any, table: Any, keys: list[str]) -> dict[str, list[str]]:
    """Partition key -> external upstream partitions it needs that have not arrived, as the gate judges them."""
    from warehouse_assets.build.gate import InstanceStates, decide

    states = InstanceStates(instance)
    missing: dict[str, list[str]] = {}
    for key in keys:
        for edge in decide(catalog, table, key, states).edges:
            if catalog[edge.dep.table].is_external and edge.missing:
                missing.setdefault(key, []).extend(f"{edge.dep.table} {k}" for k in edge.missing)
    return missing


def _contiguous(keys: list[str], skip: set[str]) -> list[list[str]]:
    """Runs of consecutive keys not in ``skip`` (each becomes one ranged run)."""
    runs: list[list[str]] = [[]]
    for key in keys:
        if key in skip:
            runs.append([])
        else:
            runs[-1].append(key)
    return [run for run in runs if run]


def _materialize_keys(
    instance: Any, resources: dict[str, Any], all_assets: list[Any], table: Any, keys: list[str], step: str
) -> bool:
    from dagster import AssetKey, materialize

    label = keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]}"
    _say(f"{step} {table.fqn} {label} ({len(keys)} partition(s)) …")
    t0 = time.monotonic()
    result = materialize(
        all_assets,
        instance=instance,
        resources=resources,
        selection=[AssetKey(table.key)],
        tags={"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
        raise_on_error=False,
    )
    if not result.success:
        failure = next((e for e in result.all_events if e.is_step_failure), None)
        error = failure.step_failure_data.error if failure and failure.step_failure_data else None
        message = error.message.strip() if error else "see the run in the UI"
        _say(f"{step} {table.fqn} FAILED: {message}")
        return False
    events = result.get_asset_materialization_events()
    rows = events[0].materialization.metadata["rows"].value if events else 0  # one result covers the range
    _say(f"{step} {table.fqn} done in {time.monotonic() - t0:.1f}s, {rows} rows written")
    return True


def materialize_range(
    instance: Any,
    resources: dict[str, Any],
    start: datetime,
    end: datetime,
    tables: Sequence[str] = (),
    ingest: bool = True,
) -> bool:
    """The headless path: ingest, report ready hours, then build each derived table over the range."""
    from warehouse_assets.build.compiler import build_assets, topological
    from warehouse_assets.build.gate import backfill_partitions, nonexistent_upstream, partitions_in_range
    from warehouse_assets.catalog import load_catalog

    catalog = load_catalog()
    begun = time.monotonic()
    summary: dict[str, Any] = {}
    if ingest:
        _say("[ingest] applying pending CDC segments to the ODS tables …")
        summary = run_ingest(instance, resources)
        for fqn, numbers in summary.items():
            _say(
                f"[ingest]   {fqn:<16} {numbers['segments']:>6} segments  {numbers['rows_applied']:>8} applied  "
                f"{numbers['rows_quarantined']:>5} quarantined  {numbers['rows_duplicate']:>5} duplicates"
            )
    plan = [t for t in topological(catalog) if not tables or t.fqn in tables]
    sources = sorted({d.table for t in plan for d in t.deps if catalog[d.table].is_ods})
    # the ingestion run reported the hours its commits completed; this reports the rest (source counts that
    # arrived after the segments were applied, or a run without ingestion)
    reported = report_ready_hours(instance, resources, sources, until=end)
    by_run = sum(numbers.get("hours_reported", 0) for numbers in summary.values())
    _say(
        f"[ready ] {by_run + reported} ODS hour partition(s) reported ready ({by_run} by the ingestion run, "
        f"{reported} of {', '.join(sources) or 'no table'} after it)"
    )
    arrived = report_external_deliveries(instance, resources)
    _say(f"[ext   ] {arrived} external partition(s) reported arrived")
    all_assets = build_assets(catalog)
    now = min(end, datetime.now(UTC))  # existence judged as the backfill plan judges it
    buildable = backfill_partitions(catalog, start, end, current_time=now)
    for index, table in enumerate(plan, start=1):
        keys = buildable.get(table.fqn, [])
        unbuildable = [k for k in partitions_in_range(table.period, start, end) if k not in keys]
        if unbuildable:
            _say(
                f"[{index}/{len(plan)}] {table.fqn}: {len(unbuildable)} partition(s) skipped ({unbuildable[0]} .. "
                f"{unbuildable[-1]}): they need partitions of "
                f"{', '.join(nonexistent_upstream(catalog, table, unbuildable[0], now))} "
                "before its first partition"
            )
        if not keys:
            _say(f"[{index}/{len(plan)}] {table.fqn}: no whole {table.period} partition in the range, skipped")
            continue
        waiting = _external_missing(catalog, instance, table, keys)
        for key, lacking in waiting.items():
            _say(f"[{index}/{len(plan)}] {table.fqn} {key}: external not arrived ({', '.join(lacking)}), skipped")
        for run_keys in _contiguous(keys, set(waiting)):
            if not _materialize_keys(instance, resources, all_assets, table, run_keys, f"[{index}/{len(plan)}]"):
                return False
    _say(f"[done  ] {len(plan)} table(s) in {time.monotonic() - begun:.1f}s")
    return True


# --- dev ---------------------------------------------------------------------------------------------------


def simulate_externals(landing: Path, external_root: Path) -> None:
    """Let the simulated external producers deliver what is due by the CDC simulation's clock."""
    from simulator.external import simulate_external_for_landing

    delivered = simulate_external_for_landing(landing, external_root)
    _say(f"[sim] external producers: {len(delivered)} new deliveries under {external_root}")


def _ensure_simulated(landing: Path, days: int, scale: float, tz: str, external_root: Path) -> None:
    from simulator.cdc import SimulationConfig, append, simulate

    now = datetime.now(ZoneInfo(tz))
    step = 5
    end = now.replace(second=0, microsecond=0, minute=now.minute - now.minute % step)
    if (landing / "simulation.json").exists():
        summary = append(landing, end.replace(tzinfo=None))
        _say(f"[dev] simulated source extended to {summary.end}")
        simulate_externals(landing, external_root)
        return
    start = (now - timedelta(days=days)).replace(hour=0, minute=0, second=0, microsecond=0)
    _say(f"[dev] generating simulated CDC sources {start:%Y-%m-%d} .. now (scale {scale}) into {landing}")
    simulate(landing, start.replace(tzinfo=None), end.replace(tzinfo=None), SimulationConfig(scale=scale, tz=tz))
    simulate_externals(landing, external_root)


def warehouse_start(env: dict[str, str], landing: Path) -> str | None:
    """``WAREHOUSE_START`` for ``warehouse dev``: the user's value, else the first simulated day.

    The simulated landing area records where it starts (``simulation.json``) and keeps it when it is
    extended, so the partitions start on the same day across restarts. Without a simulation and without
    a value, the default of ``warehouse_assets.catalog`` applies (None).
    """
    from simulator.cdc import read_simulation

    if env.get("WAREHOUSE_START"):
        return env["WAREHOUSE_START"]
    simulated = read_simulation(landing)
    if simulated is None:
        return None
    _, first, _ = simulated
    return first.strftime("%Y-%m-%d")


def _settings(env: Mapping[str, str]) -> Settings:
    """The settings ``env`` gives; a bad value is a clear error naming its variable."""
    from resources.settings import Settings

    try:
        return Settings.from_env(env)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def run_dev(args: argparse.Namespace) -> int:
    from resources.spark import start_connect_server

    os.chdir(ROOT)
    env = dict(os.environ)
    env.setdefault("DAGSTER_HOME", str(ROOT / "dagster_home"))
    env.setdefault("WAREHOUSE_SPARK_MODE", "connect")
    env.setdefault("WAREHOUSE_SIMULATE_LIVE", "1" if args.simulate else "0")
    env.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")
    os.environ.update(env)
    settings = _settings(env)
    landing = Path(settings.landing_root)
    tz = settings.timezone
    if args.simulate:
        _ensure_simulated(landing, args.days, args.scale, tz, Path(settings.external_dir))
    start = warehouse_start(env, landing)
    if start is not None:
        settings = _settings({**env, "WAREHOUSE_START": start})  # a bad start fails here, naming the variable
        # set for the processes it starts (dagster dev, its code server, daemon and runs)
        env["WAREHOUSE_START"] = os.environ["WAREHOUSE_START"] = start
        _say(f"[dev] the warehouse starts on {start} (WAREHOUSE_START): the first partition of every table")
    server = None
    if settings.spark_mode == "connect":
        host, port = settings.spark_connect_url.removeprefix("sc://").split("/")[0].split(":")
        log_path = Path(settings.log_dir) / "spark-connect.log"
        _say(f"[dev] starting the Spark Connect server on {host}:{port} (log: {log_path})")
        server = start_connect_server(
            host=host, port=int(port), master=settings.spark_master, timezone=tz, log_path=log_path
        )
        if server is None:
            _say("[dev] a Spark Connect server already listens there; using it")
    _prepare_instance(Path(env["DAGSTER_HOME"]))
    command = [sys.executable, "-m", "dagster", "dev", "-h", args.host, "-p", str(args.port), "-w", "workspace.yaml"]
    _say(f"[dev] starting Dagster: http://{args.host}:{args.port}  (Ctrl-C stops everything)")
    dagster = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_default_signals)
    engine_command = [
        sys.executable,
        "-m",
        "warehouse_assets.cli",
        "engine",
        "--url",
        f"http://{args.host}:{args.port}",
    ]
    _say("[dev] starting the engine (the dependency center: starts each partition once its upstream is ready)")
    engine = subprocess.Popen(engine_command, env=env, start_new_session=True, preexec_fn=_default_signals)

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return dagster.wait()
    except KeyboardInterrupt:
        _say("[dev] stopping the engine, Dagster and Spark …")
        _stop_group(engine, signal.SIGTERM, timeout=15)
        _stop_group(dagster, signal.SIGINT, timeout=30)
        return 0
    finally:
        _stop_group(engine, signal.SIGTERM, timeout=15)
        if server is not None:
            _stop_group(server, signal.SIGTERM, timeout=15)


def run_engine(args: argparse.Namespace) -> int:
    """The dependency center's engine in the foreground, beside a running webserver (``--url``) and daemon."""
    import logging
    import threading

    from dagster import DagsterInstance

    from resources.external import ExternalResource
    from warehouse_assets.build.compiler import max_partitions_per_run
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.engine import GraphQLSubmitter, assemble_engine
    from warehouse_assets.ingest.deliveries import ExternalWatcher, now_in_business_tz

    settings = _settings(os.environ)
    # the engine's own lines only: Dagster's storage layers log every schema check at INFO
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s [engine] %(message)s", stream=sys.stdout)
    logging.getLogger("warehouse.engine").setLevel(logging.INFO)
    submitter = GraphQLSubmitter(args.url or settings.webserver_url, settings.code_location)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    catalog = load_catalog()
    with DagsterInstance.get() as instance:
        watcher = ExternalWatcher(instance, catalog, ExternalResource(root=settings.external_dir), now_in_business_tz)
        engine = assemble_engine(instance, catalog, submitter, max_partitions_per_run, watchers=[watcher])
        try:
            engine.run(stop, settings.engine_poll_seconds)
        finally:
            engine.close()
    return 0


def _prepare_instance(home: Path) -> None:
    """Create and migrate the instance's storage (SQLite or PostgreSQL) once, before the webserver, daemon and code
    server start: three processes initializing a fresh database at once can race (alembic sees two heads)."""
    from dagster import DagsterInstance

    home.mkdir(parents=True, exist_ok=True)
    with DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()


def _interrupt(*_: object) -> None:
    """SIGTERM handled as Ctrl-C: the ``finally`` blocks stop the process groups this command started."""
    raise KeyboardInterrupt


def _default_signals() -> None:
    """Children handle Ctrl-C / SIGTERM even when this process was started with them ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop_group(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_spark_server(args: argparse.Namespace) -> int:
    from resources.spark import start_connect_server

    settings = _settings(os.environ)
    # in front of a cluster when WAREHOUSE_SPARK_MASTER names one: the server is the cluster's driver
    server = start_connect_server(
        port=args.port,
        master=settings.spark_master,
        timezone=settings.timezone,
        log_path=Path(settings.log_dir) / "spark-connect.log",
    )
    if server is None:
        _say(f"a server already listens on 127.0.0.1:{args.port}")
        return 0
    _say(f"Spark Connect listening on sc://127.0.0.1:{args.port}, master {settings.spark_master} (Ctrl-C stops it)")
    signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's stop: the server runs in a process group of its own
    try:
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        _stop_group(server, signal.SIGTERM, timeout=15)


def run_capture(args: argparse.Namespace) -> int:
    from resources.landing import Landing
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.ingest import capture

    settings = _settings(os.environ)
    url = args.source or settings.capture_source
    if not url:
        raise SystemExit("error: give --source mysql://USER@HOST:PORT (or set WAREHOUSE_CAPTURE_SOURCE)")
    try:
        source = capture.Source.parse(url, settings.capture_password.get_secret_value())
        config = capture.CaptureConfig(
            Landing(Path(settings.landing_root).resolve(), settings.timezone),
            capture.capture_targets(load_catalog()),
            server_id=args.server_id,
            start=args.start,
            heartbeat_seconds=args.heartbeat_seconds,
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        capture.run_capture(source, config, say=_say)
    except KeyboardInterrupt:
        _say("capture stopped")
    return 0


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
        status = simulator.run(args)
        if status == 0:
            external = _settings({**os.environ, "WAREHOUSE_LANDING_ROOT": str(args.landing)}).external_dir
            simulate_externals(args.landing, Path(external))
        return status
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
    if args.command == "ingest":
        summary = run_ingest(instance, resources, args.tables)
        for fqn, numbers in summary.items():
            _say(f"{fqn:<16} " + "  ".join(f"{k}={v}" for k, v in numbers.items()))
        return 0
    tz = resources["spark"].timezone
    ok = materialize_range(
        instance, resources, _parse_day(args.start, tz), _parse_day(args.end, tz), args.tables, not args.no_ingest
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
