"""The production processes the ``warehouse`` command runs in the foreground, one per service (docs/operations.md,
"Which process runs where"): ``engine``, ``spark-server`` and ``capture``; and the process handling ``warehouse dev``
shares with them (the Spark Connect server with its token, stopping a process group, stopping on a signal).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from resources.settings import Settings
from warehouse_assets.cli.common import load_settings, say

LOG_TIME = "%Y-%m-%d %H:%M:%S %z"  # as Dagster's console lines: 2026-11-29 21:29:23 +0800
# the engine's own lines in Dagster's form, the zone named: the partition keys beside them are the business timezone's
ENGINE_LOG_LINE = "%(asctime)s [engine] %(message)s"


def engine_log_handler(stream: TextIO) -> logging.Handler:
    """Where the engine's lines go, in Dagster's form with the zone named: the partition keys beside them are the
    business timezone's, the zone the stack's processes run in."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(ENGINE_LOG_LINE, LOG_TIME))
    return handler


def run_engine(args: argparse.Namespace) -> int:
    """The dependency center's engine in the foreground, beside a running webserver (``--url``) and daemon."""
    import threading

    from dagster import DagsterInstance

    from resources.delta_lake import DeltaLakeResource
    from resources.external import ExternalResource
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.engine import GraphQLSubmitter, assemble_engine, own_checks, own_compute
    from warehouse_assets.center.reconcile import Reconciler
    from warehouse_assets.ingest.deliveries import ExternalWatcher, now_in_business_tz
    from warehouse_assets.instance.pools import pools_from_env
    from warehouse_assets.materialize.compiler import max_partitions_per_run

    settings = load_settings(os.environ)
    # the engine's own lines only: Dagster's storage layers log every schema check at INFO
    logging.basicConfig(level=logging.WARNING, handlers=[engine_log_handler(sys.stdout)])
    logging.getLogger("warehouse.engine").setLevel(logging.INFO)
    if settings.center_clock.simulated:
        logging.getLogger("warehouse.engine").info("time rules on the clock %s", settings.center_clock.describe())
    catalog = load_catalog()
    # each run evaluates the table's own checks; the freshness check is its sensor's, at the deadline
    submitter = GraphQLSubmitter(
        args.url or settings.webserver_url,
        settings.code_location,
        own_checks(catalog),
        own_compute(catalog, pools_from_env()),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with DagsterInstance.get() as instance:
        watcher = ExternalWatcher(instance, catalog, ExternalResource(root=settings.external_dir), now_in_business_tz)
        # the lake's files compared with the partitions' states on a cadence (delta-rs: the log, no data, no JVM)
        lake = DeltaLakeResource(root=settings.lake_root).store()
        reconciler = Reconciler(instance, lake, settings.reconcile_seconds)
        engine = assemble_engine(
            instance, catalog, submitter, max_partitions_per_run, watchers=[watcher], reconciler=reconciler
        )
        try:
            engine.run(stop, settings.engine_poll_seconds)
        finally:
            engine.close()
    return 0


def interrupt(*_: object) -> None:
    """SIGINT or SIGTERM, whatever disposition this process inherited: the ``finally`` blocks stop what it started."""
    raise KeyboardInterrupt


def stop_group(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_server_with_token(
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
        nice=settings.spark_server_nice,
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
    server = start_server_with_token(
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
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(server, signal.SIGTERM, timeout=15)


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

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)  # ignored when started in the background: stop on it all the same
    try:
        capture.run_capture(source, config, say=say)
    except KeyboardInterrupt:
        say("capture stopped")
    return 0
