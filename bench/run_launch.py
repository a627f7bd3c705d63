"""Run launch latency: the product's launch path against Dagster's default ones.

Each pass starts the product's code location (workspace.yaml) under ``dagster dev`` on a fresh SQLite instance and
submits ``--runs`` runs of the ``why_waiting`` job one after the other through GraphQL ``launchRun``, as the engine
and the UI do; each run is awaited before the next. Per run: run created → run started (``RUN_START``) and → its
first step started (``STEP_START``). Passes, all on this machine in this invocation:

- ``product``: the run launcher and run coordinator of dagster_home/dagster.yaml as they are (the warm launcher
  behind the ImmediateRunCoordinator, which launches a run that fits in the call that submits it);
- ``default_launcher``: the baseline, launcher against launcher: Dagster's DefaultRunLauncher (the code server
  spawns a fresh Python per run) behind the product's ImmediateRunCoordinator, so the warm launcher's gain stands
  alone;
- ``dagster_defaults``: Dagster 1.13 with nothing configured: the DefaultRunLauncher behind the default
  QueuedRunCoordinator, whose daemon dequeues every 5 s (most of this pass's time is that wait);
- ``queued_N`` for each ``--dequeue N``: the warm launcher behind Dagster's QueuedRunCoordinator with
  ``dequeue_interval_seconds: N`` (the daemon's hop added), with the CPU seconds the daemon used during the pass.

The RSS of the warm worker (zygote) and of the webserver (which holds the launcher on the product's path) is read
after the first run and after the last: over hundreds of runs (``--runs 300``) they should stay flat.

    .venv/bin/python bench/run_launch.py [--runs 30] [--default-runs 30] [--dequeue 1]
    .venv/bin/python bench/run_launch.py --quick    # the product's pass alone, 3 runs: a smoke test

``--quick`` serves the code location with ``dagster-webserver`` alone, no daemon: the product's coordinator
launches each of its runs in the call that submits it, so the daemon would only tick the sensors meanwhile.

Last line: ``RESULT launch_p50= launch_p90= default_launcher_p90= ratio= dagster_defaults_p90= rss_mb=
webserver_rss_mb= runs= failed= calib_ms=`` (run created → first step, seconds; ``ratio`` = default_launcher_p90 /
launch_p90, the warm launcher's own gain, ``nan`` without that pass; RSS of the product pass after its last run;
``calib_ms``: the machine's calibration, ``bench/calibration.py``). Target: launch_p90 ≤ 1 s. The bench exits 1
when a run of the product's pass failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dagster import DagsterInstance, DagsterRun
from dagster_graphql import DagsterGraphQLClient

from bench.calibration import calib_ms
from bench.processes import free_port, kill_stragglers
from resources.spark import port_open

WARM = """
run_launcher:
  module: warehouse_assets.instance.warm_launcher
  class: WarmRunLauncher
  config:
    preload_modules: [pyspark.sql, pyspark.sql.connect.session, delta, deltalake]
"""


def product_yaml(sections: tuple[str, ...] = ("run_launcher", "run_coordinator")) -> str:
    """Sections of dagster_home/dagster.yaml, as the product runs them."""
    import yaml

    settings = yaml.safe_load((ROOT / "dagster_home" / "dagster.yaml").read_text())
    return yaml.safe_dump({k: settings[k] for k in sections})


QUEUED = """
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: 2
    dequeue_interval_seconds: {interval}
"""
WHY_CONFIG = {"ops": {"explain_partition": {"config": {"table": "ads.daily_gmv", "partition": "2026-11-20"}}}}
TAG = "bench/run_launch"


@dataclass
class Pass:
    name: str
    instance_yaml: str
    runs: int
    daemon: bool = True  # served by `dagster dev` (webserver and daemon); False: the webserver alone
    created_to_started: list[float] = field(default_factory=list)
    created_to_step: list[float] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=dict)  # stage → seconds per run
    failed: int = 0
    rss_first_mb: float = 0.0
    rss_last_mb: float = 0.0
    webserver_rss_mb: tuple[float, float] = (0.0, 0.0)
    rss_series: list[tuple[int, float, float]] = field(default_factory=list)  # (runs done, zygote MB, webserver MB)
    daemon_cpu_s: float | None = None


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def processes_of(home: Path) -> dict[int, str]:
    """PID → command line of the processes started for the Dagster home ``home`` (found by their environment)."""
    needle = f"DAGSTER_HOME={home}".encode() + b"\0"
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes():
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def zygote(home: Path) -> int | None:
    return next(
        (pid for pid, cmd in processes_of(home).items() if "warehouse_assets.instance.warm_launcher" in cmd), None
    )


def daemon(home: Path) -> int | None:
    return next((pid for pid, cmd in processes_of(home).items() if "dagster._daemon run" in cmd), None)


def webserver(home: Path) -> int | None:
    return next((pid for pid, cmd in processes_of(home).items() if "dagster_webserver" in cmd), None)


def measure(run_pass: Pass, tmp: Path) -> None:
    home = tmp / run_pass.name
    home.mkdir()
    (home / "dagster.yaml").write_text(
        f"storage:\n  sqlite:\n    base_dir: {home}\ntelemetry:\n  enabled: false\n" + run_pass.instance_yaml
    )
    port = free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(tmp / "lake"),
        WAREHOUSE_LANDING_ROOT=str(tmp / "landing"),
        WAREHOUSE_LOG_DIR=str(tmp),
    )
    dev_log = (tmp / f"{run_pass.name}.log").open("wb")
    workspace = ["-w", str(ROOT / "workspace.yaml")]
    if run_pass.daemon:
        command = [sys.executable, "-m", "dagster", "dev", *workspace, "-p", str(port)]
    else:
        # as `dagster dev` starts it (a module), so that webserver() finds it by the same command
        command = [sys.executable, "-m", "dagster_webserver", *workspace, "-h", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=dev_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        while not port_open("127.0.0.1", port):
            if proc.poll() is not None:
                raise SystemExit(f"dagster dev exited: see {tmp / run_pass.name}.log")
            time.sleep(1)
        client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=300)
        instance = DagsterInstance.from_config(str(home))
        daemon_cpu_before = None
        for i in range(run_pass.runs):
            run_id = client.submit_job_execution(
                "why_waiting", "warehouse", "__repository__", run_config=WHY_CONFIG, tags={TAG: run_pass.name}
            )
            run = wait_finished(instance, run_id)
            record = instance.get_run_record_by_id(run_id)
            assert record is not None
            created = record.create_timestamp.timestamp()
            marks = stage_marks(instance, run_id)
            step = marks.get("first step")
            if run.status.value != "SUCCESS" or record.start_time is None or step is None:
                run_pass.failed += 1
                log(f"  {run_pass.name} run {i + 1}: {run.status.value}")
                continue
            run_pass.created_to_started.append(record.start_time - created)
            run_pass.created_to_step.append(step - created)
            previous = created
            for stage, at in marks.items():
                run_pass.stages.setdefault(stage, []).append(at - previous)
                previous = at
            log(
                f"  {run_pass.name} run {i + 1}/{run_pass.runs}: started {record.start_time - created:.2f} s, "
                f"first step {step - created:.2f} s"
            )
            pid, web = zygote(home), webserver(home)
            if i == 0 or (i + 1) % max(1, run_pass.runs // 6) == 0 or i == run_pass.runs - 1:
                # a few readings along the pass: growth that levels off is a cache, growth that does not, a leak
                run_pass.rss_series.append((i + 1, rss_mb(pid) if pid else 0.0, rss_mb(web) if web else 0.0))
            if i == 0:
                run_pass.rss_first_mb = rss_mb(pid) if pid else 0.0
                run_pass.webserver_rss_mb = (rss_mb(web) if web else 0.0, 0.0)
                daemon_pid = daemon(home)
                daemon_cpu_before = (daemon_pid, cpu_seconds(daemon_pid)) if daemon_pid else None
            if i == run_pass.runs - 1:
                run_pass.rss_last_mb = rss_mb(pid) if pid else 0.0
                run_pass.webserver_rss_mb = (run_pass.webserver_rss_mb[0], rss_mb(web) if web else 0.0)
        if daemon_cpu_before is not None and run_pass.instance_yaml.count("QueuedRunCoordinator"):
            daemon_pid, before = daemon_cpu_before
            run_pass.daemon_cpu_s = cpu_seconds(daemon_pid) - before
        instance.dispose()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_stragglers(f"DAGSTER_HOME={home}")
        dev_log.close()


def stage_marks(instance: DagsterInstance, run_id: str) -> dict[str, float]:
    """When the run reached each stage of its launch, in order: the coordinator handed it to the launcher
    (``STARTING``), its worker process started, the run started, its first step started."""
    marks: dict[str, float] = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type_value == "PIPELINE_STARTING":
            stage = "launch call"
        elif event.event_type_value == "ENGINE_EVENT" and entry.message.startswith("Started process for run"):
            stage = "worker started"
        elif event.event_type_value == "PIPELINE_START":
            stage = "run started"
        elif event.is_step_start:
            stage = "first step"
        else:
            continue
        marks.setdefault(stage, entry.timestamp)
    return marks


def wait_finished(instance: DagsterInstance, run_id: str) -> DagsterRun:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.is_finished:
            return run
        time.sleep(0.1)
    raise SystemExit(f"run {run_id} did not finish in 600 s")


def summary(run_pass: Pass) -> str:
    if not run_pass.created_to_step:
        return f"{run_pass.name:10} no successful run ({run_pass.failed} failed)"
    started, step = sorted(run_pass.created_to_started), sorted(run_pass.created_to_step)
    line = (
        f"{run_pass.name:10} n={len(step):3} failed={run_pass.failed}  created→started P50 "
        f"{percentile(started, 0.5):5.2f} s P90 {percentile(started, 0.9):5.2f} s   created→first step P50 "
        f"{percentile(step, 0.5):5.2f} s P90 {percentile(step, 0.9):5.2f} s"
    )
    if run_pass.rss_first_mb:
        line += f"   zygote RSS {run_pass.rss_first_mb:.0f} → {run_pass.rss_last_mb:.0f} MB"
    first, last = run_pass.webserver_rss_mb
    line += f"   webserver RSS {first:.0f} → {last:.0f} MB"
    if run_pass.daemon_cpu_s is not None:
        line += f"   daemon CPU {run_pass.daemon_cpu_s:.1f} s"
    stages = ", ".join(f"→ {stage} {statistics.median(seconds):.2f} s" for stage, seconds in run_pass.stages.items())
    line += f"\n{'':10} median per stage: run created {stages}"
    if len(run_pass.rss_series) > 2:
        readings = ", ".join(f"{n}: {z:.0f}/{w:.0f}" for n, z, w in run_pass.rss_series)
        line += f"\n{'':10} RSS MB (zygote/webserver) after N runs: {readings}"
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="runs of the product's pass")
    parser.add_argument(
        "--default-runs", type=int, default=30, help="runs of each baseline pass: default launcher, Dagster defaults"
    )
    parser.add_argument("--queued-runs", type=int, default=30, help="runs per QueuedRunCoordinator pass")
    parser.add_argument("--dequeue", type=int, nargs="*", default=[1], help="QueuedRunCoordinator intervals")
    parser.add_argument("--quick", action="store_true", help="the product's pass alone, 3 runs")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.default_runs, args.dequeue = 3, 0, []
    calib = calib_ms()
    passes = [
        # the quick pass alone needs no daemon: the product's coordinator launches a run in the call that submits it
        Pass("product", product_yaml(), args.runs, daemon=not args.quick),
        *(
            [Pass("default_launcher", product_yaml(("run_coordinator",)), args.default_runs)]
            if args.default_runs
            else []
        ),
        *([Pass("dagster_defaults", "", args.default_runs)] if args.default_runs else []),
        *(Pass(f"queued_{n}", WARM + QUEUED.format(interval=n), args.queued_runs) for n in args.dequeue),
    ]
    load = os.getloadavg()
    log(f"load average {load[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="run_launch_") as tmp:
        for run_pass in passes:
            log(f"pass {run_pass.name}: {run_pass.runs} runs")
            measure(run_pass, Path(tmp))
    print(f"load average at start {load[0]:.1f} on {os.cpu_count()} cores; end {os.getloadavg()[0]:.1f}")
    for run_pass in passes:
        print(summary(run_pass))
    product = sorted(passes[0].created_to_step)
    if not product:
        raise SystemExit(f"no run of the product's pass succeeded ({passes[0].failed} failed)")

    def p90(name: str) -> float:
        runs = next((sorted(p.created_to_step) for p in passes if p.name == name), [])
        return percentile(runs, 0.9) if runs else float("nan")

    launch_p90 = percentile(product, 0.9)
    print(
        f"RESULT launch_p50={percentile(product, 0.5):.2f} launch_p90={launch_p90:.2f} "
        f"default_launcher_p90={p90('default_launcher'):.2f} ratio={p90('default_launcher') / launch_p90:.1f} "
        f"dagster_defaults_p90={p90('dagster_defaults'):.2f} rss_mb={passes[0].rss_last_mb:.0f} "
        f"webserver_rss_mb={passes[0].webserver_rss_mb[1]:.0f} runs={len(product)} failed={passes[0].failed} "
        f"calib_ms={calib}"
    )
    return 1 if passes[0].failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
