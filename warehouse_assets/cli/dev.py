"""``warehouse dev``, the embedded warehouse's supervisor: simulated data, Spark Connect, ``dagster dev`` and the
engine, started together and stopped together, with nothing left behind. The production processes it starts run the
commands of ``warehouse_assets.cli.services``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from warehouse_assets.cli.common import ROOT, adopt_warehouse_start, load_settings, say
from warehouse_assets.cli.dev_log import DevLog
from warehouse_assets.cli.services import interrupt, start_server_with_token, stop_group
from warehouse_assets.instance.processes import all_pids, command_line, environment_holds, process_stat

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from resources.settings import Settings

DEV_MARK = "WAREHOUSE_DEV_SESSION"  # in the environment of every process `warehouse dev` starts


def simulate_externals(landing: Path, external_root: Path) -> None:
    """Let the simulated external producers deliver what is due by the CDC simulation's clock."""
    from simulator.external import bad_cases, simulate_external_for_landing

    delivered = simulate_external_for_landing(landing, external_root)
    say(f"[sim] external producers: {len(delivered)} new deliveries under {external_root}")
    for case in bad_cases(delivered):  # the warnings they cause in the engine's log are these, not a fault
        say(f"[sim] a bad delivery on purpose, which the warehouse must handle: {case}")


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
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    os.chdir(ROOT)
    # every process started from here carries this mark, however deep: what outlives its parent is found by it
    os.environ[DEV_MARK] = uuid.uuid4().hex
    # the children's Python prints reach the log's pipe line by line, as they would reach a terminal
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    log = DevLog(Path(load_settings(os.environ).log_dir) / "dev.log")
    log.start()
    say(f"[dev] what this terminal shows is also in {log.path} (without colour codes)")
    started: list[tuple[subprocess.Popen[bytes], int, float]] = []  # process group leaders, how to stop each
    warm_up = SparkWarmUp()
    try:
        return _run_dev(args, started, warm_up)
    except KeyboardInterrupt:
        say("[dev] stopping the engine, Dagster and Spark …")
        return 0
    finally:
        # a second Ctrl-C must not interrupt the stopping half-way and leave processes behind
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        warm_up.abandon()  # before its server stops
        for proc, sig, timeout in reversed(started):
            if sig == signal.SIGINT:  # Dagster's group, after the engine (which would submit the runs again)
                stop_run_workers(os.environ[DEV_MARK])
                stop_dagster(proc, timeout)
            stop_group(proc, sig, timeout)
        left = stop_marked(os.environ[DEV_MARK])
        if left:
            say(f"[dev] stopped {left} process(es) left behind by Dagster (run workers, a code server)")
        log.stop()


def _run_dev(
    args: argparse.Namespace, started: list[tuple[subprocess.Popen[bytes], int, float]], spark_warm_up: SparkWarmUp
) -> int:
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
    # one zone in all the stack prints: Dagster's and the engine's log lines and Spark's log take the local time,
    # which is the business timezone's, as the partition keys and the product's own times are
    env["TZ"] = tz
    time.tzset()
    if args.simulate:
        _ensure_simulated(landing, args.days, args.scale, tz, Path(settings.external_dir))
    start = adopt_warehouse_start(env)  # a bad start fails here, naming the variable
    if start is not None:
        settings = load_settings(env)
        say(f"[dev] the warehouse starts on {start} (WAREHOUSE_START): the first partition of every table")
    warm_up = False
    if settings.spark_mode == "connect":
        host, port = settings.spark_connect_url.removeprefix("sc://").split("/")[0].split(":")
        log_path = Path(settings.log_dir) / "spark-connect.log"
        say(f"[dev] starting the Spark Connect server on {host}:{port} (log: {log_path}, {settings.spark_log_level})")
        server = start_server_with_token(settings, host=host, port=int(port), log_path=log_path)
        if server is None:
            say("[dev] a Spark Connect server already listens there; using it (and its token, if it left one)")
        else:
            started.append((server, signal.SIGTERM, 15))
            warm_up = settings.spark_master.startswith("local")
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
    if warm_up:  # beside Dagster's start (half a minute before its first run), so the UI comes up no later
        spark_warm_up.start(settings)
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


class SparkWarmUp:
    """The new server's first Delta merge, paid here before anything runs rather than by the first ingestion run,
    which would slow what starts beside it (:func:`resources.delta_lake.warm_up`). A local server only: its scratch
    directory is on this machine. It runs in a thread beside Dagster's start; a stop while it runs abandons it."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._session: SparkSession | None = None
        self._abandoned = False
        self._lock = threading.Lock()

    def start(self, settings: Settings) -> None:
        self._thread = threading.Thread(target=self._run, args=(settings,), name="spark-warm-up", daemon=True)
        self._thread.start()

    def abandon(self) -> None:
        """Close the warm-up's connection if it still runs, without releasing its session (its server stops next).
        Left open, its call and PySpark's exit hook would each retry against the stopped server for minutes, and
        the process would not end."""
        with self._lock:
            self._abandoned = True
            session = self._session
        if session is not None:
            _close_connection(session)

    def _run(self, settings: Settings) -> None:
        from resources.delta_lake import warm_up
        from resources.spark import get_session, stop_session

        scratch = tempfile.mkdtemp(prefix="warehouse-warm-up-")
        try:
            session = get_session(mode="connect", connect_url=settings.spark_connect_url, timezone=settings.timezone)
            with self._lock:
                if self._abandoned:
                    _close_connection(session)
                    return
                self._session = session
            seconds = warm_up(session, scratch)
        except Exception as exc:  # the stack still starts: its runs will say what Spark refuses
            if not self._abandoned:
                failure = f"{type(exc).__name__}: {exc}"
                say(f"[dev] warning: warming up Spark failed ({failure}); the first runs will be slower")
            return
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            with self._lock:
                if not self._abandoned:
                    stop_session()
                    self._session = None
        say(f"[dev] Spark warmed up: a Delta merge ran in {seconds:.0f} s, so the first ingestion does not pay for it")


def _close_connection(session: SparkSession) -> None:
    with contextlib.suppress(Exception):
        session.client.close()  # type: ignore[attr-defined]  # a Spark Connect session's


def _prepare_instance(home: Path) -> None:
    """Create and migrate the instance's storage (SQLite or PostgreSQL) once, before the webserver, daemon and code
    server start: three processes initializing a fresh database at once can race (alembic sees two heads)."""
    from dagster import DagsterInstance

    home.mkdir(parents=True, exist_ok=True)
    with DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()


def _default_signals() -> None:
    """Children handle Ctrl-C / SIGTERM even when this process was started with them ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def marked_processes(mark: str) -> list[int]:
    """The processes whose environment carries ``DEV_MARK=mark`` (Linux: read from /proc), this one excluded."""
    return [pid for pid in all_pids() if pid != os.getpid() and environment_holds(pid, f"{DEV_MARK}={mark}")]


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


def stop_run_workers(mark: str, grace: float = 3.0) -> None:
    """SIGTERM to every run worker carrying ``mark``, each on its own, and a wait (``grace`` seconds at most) until the
    processes echoing their steps' output have ended. Each worker cancels its run in one line and stops its step's
    echo; a SIGINT to Dagster's whole process group reaches that echo too, whose watcher prints a traceback. The
    cancellations go on while Dagster stops."""
    from warehouse_assets.instance.warm_launcher import echo_processes, run_workers

    for pid in run_workers(marked_processes(mark)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while echo_processes(marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)


def stop_dagster(dagster: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGINT to ``dagster dev``'s processes but its code servers, and a wait (``timeout`` seconds at most) until it has
    ended. ``dagster dev`` stops its code servers itself once its webserver and daemon have stopped; a SIGINT to the
    whole group stops them at once, and each sensor tick the daemon still had in flight failed against them with a
    gRPC ``DagsterUserCodeUnreachableError`` traceback. What is left is stopped with the group after this."""
    for pid in _group(dagster.pid):
        if not _code_server(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        dagster.wait(timeout=timeout)


def _group(pgid: int) -> list[int]:
    """The processes of the process group ``pgid`` (Linux: read from /proc)."""
    return [pid for pid in all_pids() if (stat := process_stat(pid)) is not None and stat.group == pgid]


def _code_server(pid: int) -> bool:
    """Whether ``pid`` is a Dagster code server (``dagster code-server start``, or the ``dagster api grpc`` it runs)."""
    argv = command_line(pid)
    return any(argv[i : i + 2] in ([b"code-server", b"start"], [b"api", b"grpc"]) for i in range(len(argv)))


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its parent counts as gone)."""
    stat = process_stat(pid)
    return stat is not None and stat.running
