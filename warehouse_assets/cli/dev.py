"""The long-running processes of the ``warehouse`` command: the ``warehouse dev`` supervisor (simulated data,
Spark Connect, ``dagster dev`` and the engine, stopped together) and the commands that run in the foreground
(``engine``, ``spark-server``, ``capture``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from warehouse_assets.cli.common import ROOT, load_settings, say


def simulate_externals(landing: Path, external_root: Path) -> None:
    """Let the simulated external producers deliver what is due by the CDC simulation's clock."""
    from simulator.external import simulate_external_for_landing

    delivered = simulate_external_for_landing(landing, external_root)
    say(f"[sim] external producers: {len(delivered)} new deliveries under {external_root}")


def _ensure_simulated(landing: Path, days: int, scale: float, tz: str, external_root: Path) -> None:
    from simulator.cdc import SimulationConfig, append, simulate

    now = datetime.now(ZoneInfo(tz))
    step = 5
    end = now.replace(second=0, microsecond=0, minute=now.minute - now.minute % step)
    if (landing / "simulation.json").exists():
        summary = append(landing, end.replace(tzinfo=None))
        say(f"[dev] simulated source extended to {summary.end}")
        simulate_externals(landing, external_root)
        return
    start = (now - timedelta(days=days)).replace(hour=0, minute=0, second=0, microsecond=0)
    say(f"[dev] generating simulated CDC sources {start:%Y-%m-%d} .. now (scale {scale}) into {landing}")
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


def run_dev(args: argparse.Namespace) -> int:
    from resources.spark import start_connect_server

    os.chdir(ROOT)
    env = dict(os.environ)
    env.setdefault("DAGSTER_HOME", str(ROOT / "dagster_home"))
    env.setdefault("WAREHOUSE_SPARK_MODE", "connect")
    env.setdefault("WAREHOUSE_SIMULATE_LIVE", "1" if args.simulate else "0")
    env.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")
    os.environ.update(env)
    settings = load_settings(env)
    landing = Path(settings.landing_root)
    tz = settings.timezone
    if args.simulate:
        _ensure_simulated(landing, args.days, args.scale, tz, Path(settings.external_dir))
    start = warehouse_start(env, landing)
    if start is not None:
        settings = load_settings({**env, "WAREHOUSE_START": start})  # a bad start fails here, naming the variable
        # set for the processes it starts (dagster dev, its code server, daemon and runs)
        env["WAREHOUSE_START"] = os.environ["WAREHOUSE_START"] = start
        say(f"[dev] the warehouse starts on {start} (WAREHOUSE_START): the first partition of every table")
    server = None
    if settings.spark_mode == "connect":
        host, port = settings.spark_connect_url.removeprefix("sc://").split("/")[0].split(":")
        log_path = Path(settings.log_dir) / "spark-connect.log"
        say(f"[dev] starting the Spark Connect server on {host}:{port} (log: {log_path})")
        server = start_connect_server(
            host=host, port=int(port), master=settings.spark_master, timezone=tz, log_path=log_path
        )
        if server is None:
            say("[dev] a Spark Connect server already listens there; using it")
    _prepare_instance(Path(env["DAGSTER_HOME"]))
    command = [sys.executable, "-m", "dagster", "dev", "-h", args.host, "-p", str(args.port), "-w", "workspace.yaml"]
    say(f"[dev] starting Dagster: http://{args.host}:{args.port}  (Ctrl-C stops everything)")
    dagster = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_default_signals)
    engine_command = [
        sys.executable,
        "-m",
        "warehouse_assets.cli",
        "engine",
        "--url",
        f"http://{args.host}:{args.port}",
    ]
    say("[dev] starting the engine (the dependency center: starts each partition once its upstream is ready)")
    engine = subprocess.Popen(engine_command, env=env, start_new_session=True, preexec_fn=_default_signals)

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return dagster.wait()
    except KeyboardInterrupt:
        say("[dev] stopping the engine, Dagster and Spark …")
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

    settings = load_settings(os.environ)
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

    settings = load_settings(os.environ)
    # in front of a cluster when WAREHOUSE_SPARK_MASTER names one: the server is the cluster's driver
    server = start_connect_server(
        port=args.port,
        master=settings.spark_master,
        timezone=settings.timezone,
        log_path=Path(settings.log_dir) / "spark-connect.log",
    )
    if server is None:
        say(f"a server already listens on 127.0.0.1:{args.port}")
        return 0
    say(f"Spark Connect listening on sc://127.0.0.1:{args.port}, master {settings.spark_master} (Ctrl-C stops it)")
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

    settings = load_settings(os.environ)
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
        capture.run_capture(source, config, say=say)
    except KeyboardInterrupt:
        say("capture stopped")
    return 0
