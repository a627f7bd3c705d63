"""The long-running processes of the ``warehouse`` command: the ``warehouse dev`` supervisor (simulated data,
Spark Connect, ``dagster dev`` and the engine, stopped together) and the commands that run in the foreground
(``engine``, ``spark-server``, ``capture``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from resources.settings import Settings
from warehouse_assets.cli.common import ROOT, adopt_warehouse_start, load_settings, say

DEV_MARK = "WAREHOUSE_DEV_SESSION"  # in the environment of every process `warehouse dev` starts


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


def run_dev(args: argparse.Namespace) -> int:
    """Simulated sources, Spark Connect, ``dagster dev`` and the engine, until SIGINT or SIGTERM stops them all."""
    # Both signals stop everything, however this process was started: one started in the background by a shell
    # or a script inherits SIGINT as ignored, and Python then leaves it ignored (Ctrl-C in a terminal works only
    # because the terminal's process is in the foreground)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    os.chdir(ROOT)
    # every process started from here carries this mark, however deep: what outlives its parent is found by it
    os.environ[DEV_MARK] = uuid.uuid4().hex
    started: list[tuple[subprocess.Popen[bytes], int, float]] = []  # process group leaders, how to stop each
    try:
        return _run_dev(args, started)
    except KeyboardInterrupt:
        say("[dev] stopping the engine, Dagster and Spark …")
        return 0
    finally:
        # a second Ctrl-C must not interrupt the stopping half-way and leave processes behind
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for proc, sig, timeout in reversed(started):
            _stop_group(proc, sig, timeout)
        left = stop_marked(os.environ[DEV_MARK])
        if left:
            say(f"[dev] stopped {left} process(es) left behind by Dagster (run workers, a code server)")


def _run_dev(args: argparse.Namespace, started: list[tuple[subprocess.Popen[bytes], int, float]]) -> int:
    from resources.spark import port_open

    begun = time.monotonic()
    env = os.environ
    env.setdefault("DAGSTER_HOME", str(ROOT / "dagster_home"))
    env.setdefault("WAREHOUSE_SPARK_MODE", "connect")
    env.setdefault("WAREHOUSE_SIMULATE_LIVE", "1" if args.simulate else "0")
    env.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")
    settings = load_settings(env)
    landing = Path(settings.landing_root)
    tz = settings.timezone
    if args.simulate:
        _ensure_simulated(landing, args.days, args.scale, tz, Path(settings.external_dir))
    start = adopt_warehouse_start(env)  # a bad start fails here, naming the variable
    if start is not None:
        settings = load_settings(env)
        say(f"[dev] the warehouse starts on {start} (WAREHOUSE_START): the first partition of every table")
    if settings.spark_mode == "connect":
        host, port = settings.spark_connect_url.removeprefix("sc://").split("/")[0].split(":")
        log_path = Path(settings.log_dir) / "spark-connect.log"
        say(f"[dev] starting the Spark Connect server on {host}:{port} (log: {log_path}, {settings.spark_log_level})")
        server = _start_server_with_token(settings, host=host, port=int(port), log_path=log_path)
        if server is None:
            say("[dev] a Spark Connect server already listens there; using it (and its token, if it left one)")
        else:
            started.append((server, signal.SIGTERM, 15))
    _prepare_instance(Path(env["DAGSTER_HOME"]))
    command = [sys.executable, "-m", "dagster", "dev", "-h", args.host, "-p", str(args.port), "-w", "workspace.yaml"]
    command += ["--log-level", args.dagster_log_level]
    say(f"[dev] starting Dagster (webserver, daemon, code server; log level {args.dagster_log_level})")
    dagster = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_default_signals)
    started.append((dagster, signal.SIGINT, 30))
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
    started.append((engine, signal.SIGTERM, 15))
    announced = False
    while dagster.poll() is None:
        if not announced and port_open(args.host, args.port):
            announced = True
            say(
                f"[dev] the UI is up: http://{args.host}:{args.port} ({time.monotonic() - begun:.0f} s; "
                'Ctrl-C stops everything). What to expect minute by minute: README.md, "What you will see"'
            )
        time.sleep(0.5)
    say(f"[dev] Dagster exited with status {dagster.returncode}: stopping the rest")
    return dagster.returncode or 1


def run_engine(args: argparse.Namespace) -> int:
    """The dependency center's engine in the foreground, beside a running webserver (``--url``) and daemon."""
    import logging
    import threading

    from dagster import DagsterInstance

    from resources.external import ExternalResource
    from warehouse_assets.build.compiler import max_partitions_per_run
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.engine import GraphQLSubmitter, assemble_engine, own_checks
    from warehouse_assets.ingest.deliveries import ExternalWatcher, now_in_business_tz

    settings = load_settings(os.environ)
    # the engine's own lines only: Dagster's storage layers log every schema check at INFO
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s [engine] %(message)s", stream=sys.stdout)
    logging.getLogger("warehouse.engine").setLevel(logging.INFO)
    catalog = load_catalog()
    # each run evaluates the table's own checks; the freshness check is its sensor's, at the deadline
    submitter = GraphQLSubmitter(args.url or settings.webserver_url, settings.code_location, own_checks(catalog))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
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
    """SIGINT or SIGTERM, whatever disposition this process inherited: the ``finally`` blocks stop what it started."""
    raise KeyboardInterrupt


def _default_signals() -> None:
    """Children handle Ctrl-C / SIGTERM even when this process was started with them ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def marked_processes(mark: str) -> list[int]:
    """The processes whose environment carries ``DEV_MARK=mark`` (Linux: read from /proc), this one excluded."""
    needle = f"{DEV_MARK}={mark}".encode() + b"\0"
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int(entry.name) != os.getpid() and needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return found


def stop_marked(mark: str, grace: float = 10.0) -> int:
    """Stop every process still carrying ``mark``: SIGTERM, then SIGKILL after ``grace`` seconds. Dagster's own
    stop leaves some behind when it is quick about it (a code server, the warm launcher's worker, a run's process);
    how many there were."""
    pids = marked_processes(mark)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its parent counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stop_group(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _start_server_with_token(
    settings: Settings, *, host: str, port: int, log_path: Path, analysts: bool = False
) -> subprocess.Popen[bytes] | None:
    """The product's Spark Connect server, which refuses clients without a token generated here: this process's
    children get it in ``$SPARK_CONNECT_AUTHENTICATE_TOKEN``, tools started later from the token file in the log
    dir (its owner's alone). When a server already listens there, its token file (if any) is adopted instead."""
    from resources.spark import (
        CONNECT_TOKEN_VARIABLE,
        connect_token_file,
        new_connect_token,
        read_connect_token,
        start_connect_server,
        write_connect_token,
    )

    token_file = connect_token_file(settings.log_dir, analysts=analysts)
    token = new_connect_token()
    # in front of a cluster when WAREHOUSE_SPARK_MASTER names one: the server is the cluster's driver
    server = start_connect_server(
        host=host,
        port=port,
        master=settings.spark_master,
        timezone=settings.timezone,
        log_path=log_path,
        log_level=settings.spark_log_level,
        token=token,
        lake_root=settings.lake_root,
        confined=analysts,
    )
    if server is None:
        adopted = read_connect_token(token_file)
        if adopted and not analysts:
            os.environ[CONNECT_TOKEN_VARIABLE] = adopted
        return None
    write_connect_token(token_file, token)
    if not analysts:  # the product's own processes talk to the product's server only
        os.environ[CONNECT_TOKEN_VARIABLE] = token
    return server


def run_spark_server(args: argparse.Namespace) -> int:
    settings = load_settings(os.environ)
    name = "spark-connect-analysts" if args.analysts else "spark-connect"
    server = _start_server_with_token(
        settings,
        host="127.0.0.1",
        port=args.port,
        log_path=Path(settings.log_dir) / f"{name}.log",
        analysts=args.analysts,
    )
    if server is None:
        say(f"a server already listens on 127.0.0.1:{args.port}")
        return 0
    say(
        f"Spark Connect listening on sc://127.0.0.1:{args.port}, master {settings.spark_master} (Ctrl-C stops it); "
        f"clients need the token in {Path(settings.log_dir) / (name + '.token')}"
        + (
            " (analysts': read-only, the lake's tables by name; docs/operations.md says what it refuses)"
            if args.analysts
            else ""
        )
    )
    # a supervisor's stop (the server runs in a process group of its own), and Ctrl-C even when started in the
    # background, where SIGINT comes ignored
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
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

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # ignored when started in the background: stop on it all the same
    try:
        capture.run_capture(source, config, say=say)
    except KeyboardInterrupt:
        say("capture stopped")
    return 0
