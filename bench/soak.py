"""Soak: the running stack on a simulated source faster than real time, its processes SIGKILLed at seeded random
moments, then every table checked against the independent oracle.

The processes are those of a production deployment (docs/operations.md, "Which process runs where"), each started by
its documented command with the settings the embedded stack uses (a temporary ``DAGSTER_HOME`` with the instance's
``dagster.yaml``, lake, landing area; Spark Connect): ``warehouse spark-server``, ``dagster-webserver``,
``dagster-daemon run``, ``warehouse engine``. The bench is their supervisor: whatever exits is started again by the
same command within a second, as systemd's ``Restart=always`` would (``warehouse dev`` cannot serve here: ``dagster
dev`` stops everything when its webserver or daemon dies). The code server, the warm launcher's zygote and the run
workers are not supervised: Dagster and the launcher start them again themselves.

The source: ``--days`` simulated days (sources at ``--scale``, duplicated messages, and orders re-dated by updates
whose ``old`` lacks the previous ``create_time``) land one simulated hour every ``--hour-seconds``. Faults, at
times drawn from ``--seed`` over the feed: SIGKILL of the engine, the daemon, the webserver, the daemon's code
server, the Spark Connect server (its JVM), the warm launcher's zygote, the worker of an ODS ingestion run in
progress (its batches: preparation, bookkeeping, merge) and the worker of a derived partition's run in progress
(its overwrite); each kind once per simulated day. And on the source's side, once per run: a burst of 10x the change
rate for a simulated hour, and a shard that goes silent for three simulated hours (its segments held back, its source
counts still published) and then delivers them all at once, the first one re-sending the last segment delivered
before the silence, as a producer resuming from its last acknowledged position does.

The engine's time rules (late-data intervals and grace, look-again timers, window ends, deadlines) run on the
source's clock (``WAREHOUSE_CLOCK``: the first hour's end at the feed's start, an hour every ``--hour-seconds``),
so a late change is judged as it would be live, and a 60-minute interval lasts a simulated hour, not the whole run.

Then the bench waits for the warehouse to settle (no run queued or in progress, none created for a while). Settled
is not up to date: partitions whose late data waits for its policy (a rebuild due later, a daily hour, beyond the
lookback) are *stale*, not wrong. The bench lists them with their due times (``stale_before_catch_up``), runs
``warehouse rebuild --stale`` against the stack, as a month-end close would, waits to settle again, counts what is
still stale (``stale_after_catch_up``, must be 0), stops the stack and checks:

* ODS: every partition's live keys and their latest image (``update_time``) equal to the oracle's replay of the
  landing area; no key live twice; ``lost`` counts keys of the replay missing from the table; a snapshot's change
  stream (``ods.course``): the newest change of each key equal to the replay's row;
* derived tables the oracle computes (``dwd.order_detail``, ``ads.daily_gmv``, ``ads.gmv_hourly``,
  ``ads.attendance_rate_daily``): every partition of the simulated days materialized (``missing`` otherwise) and
  equal to the replay (``mismatched_partitions`` otherwise);
* every DWD, DWS and ADS table (and each static table): the stack stopped, the same landing area is built again
  from scratch, without faults, by the headless path (``warehouse materialize`` on a home and lake of its own);
  each partition of the simulated days it built must be materialized by the soak with the same rows, and the
  soak must have built none it could not (the ODS checks above tie both to the replay);
* exactly once: no engine request with more than one successful run (``duplicated``), and ingestion reconciled over
  the whole run: the changes each shard stream took in (``ops.ingested_counts``) equal the row images of the replay's
  distinct, well-formed messages of that stream;
* no run left queued or in progress (``stuck_runs``); no process of the stack left after its stop (``orphans``);
* recovery: per fault, the time from the kill to the end of the first successful run started after it.

    flock /tmp/bench.lock .venv/bin/python bench/soak.py [--days 2] [--seed 1] [--postgres]
    .venv/bin/python bench/soak.py --quick    # 1 day, a simulated hour every 3 s, 30 s quiet: still minutes

Prints one ``RESULT`` line: ``faults= lost= duplicated= missing= mismatched_partitions= stuck_runs= orphans=
stale_before_catch_up= stale_after_catch_up= recover_p50_s= recover_p90_s= recover_max_s= recover_start_p90_s=
(kill to the recovering run's start) ... calib_ms= calib_spark_ms=`` (the machine's calibration,
``bench/calibration.py``; the Spark one on the stack's Spark Connect server once it is up, before the feed). Exits 1
when any of those counts but ``stale_before_catch_up`` is not 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.calibration import calib_ms, calib_spark_connect_ms
from bench.handoff_latency import _engine_watching, _percentile, _sensor_ticked
from bench.processes import free_port
from resources.settings import Settings

TZ = ZoneInfo(Settings.from_env().timezone)
KINDS = (
    "engine",
    "daemon",
    "webserver",
    "code_server",
    "spark_connect",
    "warm_launcher",
    "worker_merge",
    "worker_overwrite",
)
BUSY = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED")
BURST_FACTOR = 10.0  # the change rate during the source's burst hour
SILENT_HOURS = 3  # how long the silent shard holds its segments back


def say(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- processes ---------------------------------------------------------------------------------------------------


def _ppid_and_cmdline(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (-1, cmd) if fields[0] == "Z" else (int(fields[1]), cmd)


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process below ``pid``."""
    children: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for entry in Path("/proc").glob("[0-9]*"):
        found = _ppid_and_cmdline(int(entry.name))
        if found is not None:
            children[found[0]].append((int(entry.name), found[1]))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


class Supervisor:
    """Starts each process of the stack by its documented command and starts it again when it exits."""

    def __init__(self, env: dict[str, str], work: Path, port: int, spark_port: int) -> None:
        bin_dir = Path(sys.executable).parent
        self.env, self.work = env, work
        cli = [sys.executable, "-m", "warehouse_assets.cli"]
        self.commands = {
            "spark_connect": [*cli, "spark-server", "--port", str(spark_port)],
            "webserver": [
                str(bin_dir / "dagster-webserver"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-w",
                "workspace.yaml",
            ],
            "daemon": [str(bin_dir / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            "engine": [*cli, "engine", "--url", f"http://127.0.0.1:{port}"],
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: list[tuple[str, float]] = []

    def start(self, name: str) -> None:
        log = (self.work / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            self.commands[name], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def ensure(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                say(f"{name} exited ({proc.returncode}): starting it again")
                self.restarts.append((name, time.time()))
                self.start(name)

    def stop(self) -> None:
        """Signal every process (engine, daemon, webserver, Spark), then wait for them: they wind down side by side,
        not one after the other. One still running 60 s after its signal is killed."""
        stopping = []
        for name in ("engine", "daemon", "webserver", "spark_connect"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM if name != "daemon" else signal.SIGINT)
                stopping.append(proc)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 60
        for proc in stopping:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# --- faults ------------------------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    at: float  # planned, seconds after the feed started
    killed_at: float | None = None
    pid: int | None = None
    note: str = ""


def _running_worker(instance: Any, derived: bool) -> tuple[int, str] | None:
    """(pid, run id) of a run in progress: an ODS ingestion, or a run of a derived partition (the engine's)."""
    from dagster import DagsterRunStatus, RunsFilter

    from warehouse_assets.instance.warm_launcher import WORKER_TAG

    for record in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTED]), limit=20):
        run = record.dagster_run
        is_engine = run.tags.get("dagster/sensor_name") == "dependency_center"
        is_ingest = "warehouse/ingest" in run.tags  # the ingestion job's concurrency tag
        if (derived and is_engine and not is_ingest) or (not derived and is_ingest):
            worker = run.tags.get(WORKER_TAG, "")
            parts = worker.split(":")
            if len(parts) == 3 and parts[1].isdigit():
                return int(parts[1]), run.run_id
    return None


def inject(fault: Fault, supervisor: Supervisor, instance: Any) -> bool:
    """SIGKILL the fault's process; False when there is none to kill yet (retried later)."""
    target: int | None = None
    if fault.kind in ("engine", "daemon", "webserver"):
        target = supervisor.procs[fault.kind].pid
    elif fault.kind == "code_server":
        found = [p for p, cmd in descendants(supervisor.procs["daemon"].pid) if "grpc" in cmd or "code-server" in cmd]
        target = found[0] if found else None
    elif fault.kind == "spark_connect":
        found = [p for p, cmd in descendants(supervisor.procs["spark_connect"].pid) if "SparkConnectServer" in cmd]
        target = found[0] if found else None
    elif fault.kind == "warm_launcher":
        found = [
            p
            for owner in ("daemon", "webserver")
            for p, cmd in descendants(supervisor.procs[owner].pid)
            # the zygote's own command; a code server's carries the module too, inside its --instance-ref
            if cmd.split()[1:3] == ["-m", "warehouse_assets.instance.warm_launcher"]
        ]
        target = found[0] if found else None
    else:
        worker = _running_worker(instance, derived=fault.kind == "worker_overwrite")
        if worker is not None:
            target, fault.note = worker[0], f"run {worker[1][:8]}"
    if target is None:
        return False
    try:
        os.kill(target, signal.SIGKILL)
    except ProcessLookupError:
        return False
    fault.killed_at, fault.pid = time.time(), target
    say(f"SIGKILL {fault.kind} (pid {target}{', ' + fault.note if fault.note else ''})")
    return True


class SilentShard:
    """One shard stream whose segments stop reaching the landing area in [start, end) of simulated time, then arrive
    all at once, the first re-sending the lines of the last non-empty segment delivered before the silence."""

    def __init__(self, landing: Path, hold: Path, stream: str, start: datetime, end: datetime) -> None:
        self.folder, self.hold = landing / "binlog" / stream, hold
        self.stream, self.start, self.end = stream, start, end
        self.held: list[Path] = []
        self.released = False
        self.resent_lines = 0  # lines delivered a second time (0 when the shard had sent nothing before)

    @staticmethod
    def _time(path: Path) -> datetime:
        return datetime.strptime(path.stem.split("-", 1)[1], "%Y%m%dT%H%M")  # 000358-20261027T0545.jsonl

    def after_feed(self, fed_until: datetime) -> None:
        """Called after each feed: hold back the silent window's new segments, or deliver them once it is over."""
        if self.released or fed_until <= self.start:
            return
        self.hold.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.folder.glob("*.jsonl")):
            if self.start <= self._time(path) < self.end:
                held = self.hold / path.name
                path.rename(held)  # same file system: the landing never shows a partial file
                self.held.append(held)
        if fed_until < self.end or not self.held:
            return
        delivered = sorted(p for p in self.folder.glob("*.jsonl") if self._time(p) < self.start and p.stat().st_size)
        first = min(self.held)
        if delivered:  # the producer re-sends from its last acknowledged position: the last segment's lines again
            again = delivered[-1].read_bytes()
            first.write_bytes(again + first.read_bytes())
            self.resent_lines = again.count(b"\n")
        for held in sorted(self.held):
            held.rename(self.folder / held.name)
        say(
            f"silent shard {self.stream}: {len(self.held)} segment(s) of {self.start:%H:%M}-{self.end:%H:%M} "
            f"delivered, the first re-sending {delivered[-1].name if delivered else 'nothing'}"
        )
        self.released = True


# --- checks ------------------------------------------------------------------------------------------------------


@dataclass
class Findings:
    lost: int = 0
    duplicated: int = 0
    missing: int = 0
    mismatched: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _local(value: Any) -> str | None:
    if value is None:
        return None
    return value.astimezone(TZ).strftime("%Y-%m-%d %H:%M:%S")


def _live_rows(lake: Path, key: list[str], columns: list[str]) -> list[dict[str, Any]]:
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    path = lake.joinpath(*key)
    if not (path / "_delta_log").is_dir():
        return []
    table = DeltaTable(str(path))
    names = "*" if columns == ["*"] else ", ".join(f'"{c}"' for c in columns)
    # DataFusion's reader: Spark's merges leave deletion vectors, which delta-rs's pyarrow path refuses
    return pa.table(QueryBuilder().register("t", table).execute(f"SELECT {names} FROM t").read_all()).to_pylist()


def check_ods(lake: Path, truth: dict[str, dict[int, dict[str, Any]]], catalog: Any, found: Findings) -> None:
    for table in catalog.ods():
        name = table.key[-1]
        if table.changelog:
            check_changelog(lake, table, truth[name], found)
            continue
        rows = _live_rows(lake, list(table.key), ["id", "update_time", "_deleted", "dt", "hh"])
        live: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            if not row["_deleted"]:
                live[row["id"]].append(row)
        twice = [k for k, places in live.items() if len(places) > 1]
        found.duplicated += len(twice)
        if twice:
            found.notes.append(f"ods.{name}: {len(twice)} keys live twice, e.g. {twice[:3]}")
        expected: dict[tuple[str, str], dict[int, str]] = defaultdict(dict)
        for key, row in truth[name].items():
            at = row[table.partition_time]
            expected[(at[:10], at[11:13])][key] = row["update_time"]
        actual: dict[tuple[str, str], dict[int, str | None]] = defaultdict(dict)
        for key, places in live.items():
            for row in places:
                actual[(row["dt"], row["hh"])][key] = _local(row["update_time"])
        lost = set(truth[name]) - set(live)
        found.lost += len(lost)
        if lost:
            found.notes.append(f"ods.{name}: {len(lost)} keys of the replay missing, e.g. {sorted(lost)[:3]}")
        for part in sorted(set(expected) | set(actual)):
            if expected.get(part, {}) != actual.get(part, {}):
                found.mismatched.append(f"ods.{name} {part[0]}-{part[1]}")


def check_changelog(lake: Path, table: Any, truth: dict[int, dict[str, Any]], found: Findings) -> None:
    """A snapshot's change stream: the newest change of each key is the replay's row (a DELETE: no row)."""
    rows = _live_rows(lake, list(table.key), ["id", "update_time", "_deleted", "_es", "_pos"])
    newest: dict[int, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["_es"], r["_pos"])):
        newest[row["id"]] = row
    live = {key: _local(row["update_time"]) for key, row in newest.items() if not row["_deleted"]}
    expected = {key: row["update_time"] for key, row in truth.items()}
    lost = set(expected) - set(live)
    found.lost += len(lost)
    if lost:
        found.notes.append(f"{table.fqn}: {len(lost)} keys of the replay have no change, e.g. {sorted(lost)[:3]}")
    if live != expected:
        found.mismatched.append(f"{table.fqn} (the newest change of each key)")


def check_derived(
    lake: Path, truth: dict[str, dict[int, dict[str, Any]]], days: list[date], instance: Any, found: Findings
) -> None:
    from dagster import AssetKey

    from tests.support import oracle

    wanted_days = [f"{d:%Y-%m-%d}" for d in days]
    wanted_hours = [f"{d} {h:02d}" for d in wanted_days for h in range(24)]

    def materialized(fqn: str) -> set[str]:
        return instance.get_materialized_partitions(AssetKey(fqn.split(".")))

    def require(fqn: str, keys: list[str]) -> None:
        have = materialized(fqn)
        absent = [k for k in keys if k not in have]
        found.missing += len(absent)
        if absent:
            found.notes.append(f"{fqn}: {len(absent)} partitions never materialized, e.g. {absent[:3]}")

    require("dwd.order_detail", wanted_days)
    require("ads.daily_gmv", wanted_days)
    require("ads.attendance_rate_daily", wanted_days)
    require("ads.gmv_hourly", [f"{h[:10]}-{h[11:]}:00" for h in wanted_hours])

    detail = defaultdict(set)
    for row in _live_rows(lake, ["dwd", "order_detail"], ["order_id", "dt"]):
        detail[row["dt"]].add(row["order_id"])
    for day in wanted_days:
        expected = {k for k, r in truth["order"].items() if r["create_time"][:10] == day}
        if detail.get(day, set()) != expected:
            found.mismatched.append(f"dwd.order_detail {day}")
    gmv = {row["dt"]: row["gmv"] for row in _live_rows(lake, ["ads", "daily_gmv"], ["dt", "gmv"])}
    expected_gmv = oracle.daily_gmv(truth["order"], str(TZ))
    for day, d in zip(wanted_days, days, strict=True):
        if day in gmv and gmv[day] != expected_gmv.get(d, Decimal("0")):
            found.mismatched.append(f"ads.daily_gmv {day}")
    hourly = {(r["dt"], r["hh"]): r for r in _live_rows(lake, ["ads", "gmv_hourly"], ["*"]) if "dt" in r}
    for hour in wanted_hours:
        row = hourly.get((hour[:10], hour[11:]))
        expected = oracle.gmv_hourly(truth, hour)
        if row is not None and {k: row[k] for k in expected} != expected:
            found.mismatched.append(f"ads.gmv_hourly {hour}")
    rates = {r["dt"]: r for r in _live_rows(lake, ["ads", "attendance_rate_daily"], ["*"])}
    for day in wanted_days:
        row = rates.get(day)
        expected = oracle.attendance_rate(truth, day)
        if row is None:
            continue
        same = all(
            abs(row[k] - v) < 1e-9 if isinstance(v, float) and row[k] is not None else row[k] == v
            for k, v in expected.items()
        )
        if not same:
            found.mismatched.append(f"ads.attendance_rate_daily {day}")


def build_reference(work: Path, landing: Path, env: dict[str, str], first: date, days: int) -> tuple[Path, Path]:
    """The warehouse built again from scratch, without faults: a copy of the landing area ingested and every table
    built over the simulated days by the headless path (``warehouse materialize``), with a home and lake of its
    own and a local Spark. Returns its (home, lake)."""
    ref = work / "reference"
    home, lake, ref_landing = ref / "dagster_home", ref / "lake", ref / "landing"
    home.mkdir(parents=True)
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")  # SQLite: a throwaway instance
    shutil.copytree(landing, ref_landing)
    ref_env = dict(
        env,
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(lake),
        WAREHOUSE_LANDING_ROOT=str(ref_landing),
        WAREHOUSE_LOG_DIR=str(ref),
        WAREHOUSE_SPARK_MODE="local",
    )
    end = first + timedelta(days=days)
    command = [sys.executable, "-m", "warehouse_assets.cli", "materialize", "--start", f"{first}", "--end", f"{end}"]
    t0 = time.monotonic()
    with (ref / "materialize.log").open("wb") as log:
        code = subprocess.run(command, cwd=ROOT, env=ref_env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"the reference build failed ({code}); its log: {ref / 'materialize.log'}")
    say(f"reference built from scratch in {time.monotonic() - t0:.0f} s")
    return home, lake


def _canonical(value: Any) -> Any:
    """A cell as both builds must agree on it: floats to 9 significant digits (Spark's aggregation order is not
    fixed), timestamps in the business timezone."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, datetime):
        return _local(value)
    return value


def _rows_by_partition(lake: Path, table: Any) -> dict[tuple[str, ...], list[tuple[Any, ...]]]:
    rows = _live_rows(lake, list(table.key), ["*"])
    by = table.partition_by
    out: dict[tuple[str, ...], list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        cells = tuple((k, _canonical(v)) for k, v in sorted(row.items()) if k not in by)
        out[tuple(str(row[c]) for c in by)].append(cells)
    return {part: sorted(cells, key=repr) for part, cells in out.items()}


@contextlib.contextmanager
def instance_at(home: Path) -> Iterator[Any]:
    """The instance of ``home``: its dagster.yaml takes its storage's base_dir from DAGSTER_HOME, which in this
    process names the soak's home, so it is set to ``home`` while the instance is made."""
    from dagster import DagsterInstance

    saved = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        instance = DagsterInstance.from_config(str(home))
    finally:
        if saved is None:
            os.environ.pop("DAGSTER_HOME")
        else:
            os.environ["DAGSTER_HOME"] = saved
    with instance:
        yield instance


def check_against_reference(
    lake: Path, instance: Any, ref_lake: Path, ref_instance: Any, catalog: Any, first: date, days: int, found: Findings
) -> int:
    """Every derived partition of the simulated days (DWD, DWS, ADS, static tables) the reference built is
    materialized by the soak (``missing`` otherwise) with the same rows (``mismatched_partitions`` otherwise), and
    the soak built none the reference could not. Returns how many partitions were compared."""
    from dagster import AssetKey

    from warehouse_assets.catalog import WHOLE, partition_values_of, partition_window

    begin = datetime(first.year, first.month, first.day, tzinfo=TZ)
    end = begin + timedelta(days=days)

    def in_days(table: Any, key: str) -> bool:
        window = partition_window(table, key)
        return begin <= window.start and window.end <= end

    compared = 0
    for table in [*catalog.statics(), *catalog.derived()]:
        asset = AssetKey(list(table.key))
        if table.is_static:
            built = {WHOLE} if ref_instance.get_latest_materialization_event(asset) else set()
            have = {WHOLE} if instance.get_latest_materialization_event(asset) else set()
        else:
            built = {k for k in ref_instance.get_materialized_partitions(asset) if in_days(table, k)}
            have = {k for k in instance.get_materialized_partitions(asset) if in_days(table, k)}
        absent = sorted(built - have)
        found.missing += len(absent)
        if absent:
            found.notes.append(f"{table.fqn}: {len(absent)} partitions never materialized, e.g. {absent[:3]}")
        for key in sorted(have - built):
            found.mismatched.append(f"{table.fqn} {key} (built by the soak, not buildable from scratch)")
        if not built & have:
            continue
        ours, theirs = _rows_by_partition(lake, table), _rows_by_partition(ref_lake, table)
        for key in sorted(built & have):
            spec = () if table.is_static else tuple(partition_values_of(table, key).values())
            compared += 1
            if ours.get(spec, []) != theirs.get(spec, []):
                found.mismatched.append(
                    f"{table.fqn} {key}: {len(ours.get(spec, []))} rows, {len(theirs.get(spec, []))} from scratch"
                )
    return compared


def check_runs(instance: Any, found: Findings) -> list[Any]:
    """Runs per engine request (at most one success each) and none left queued or in progress; all run records."""
    from dagster import DagsterRunStatus

    from warehouse_assets.center.plans import REQUEST_TAG

    records = list(instance.get_run_records())
    successes: dict[str, int] = defaultdict(int)
    for record in records:
        run = record.dagster_run
        if run.status.value in BUSY:
            found.stuck.append(f"{run.run_id[:8]} {run.job_name} {run.status.value}")
        request = run.tags.get(REQUEST_TAG)
        if request and run.status == DagsterRunStatus.SUCCESS:
            successes[request] += 1
    twice = [r for r, n in successes.items() if n > 1]
    found.duplicated += len(twice)
    if twice:
        found.notes.append(f"{len(twice)} engine requests with more than one successful run")
    return records


def check_ingestion(lake: Path, landing: Path, catalog: Any, found: Findings) -> None:
    from resources.delta_lake import DeltaStore
    from tests.support import oracle
    from warehouse_assets.ingest.merge import ingested_counts

    replayed = oracle.replay_detailed(landing)
    store = DeltaStore(str(lake))
    for table in catalog.ods():
        counts, _ = ingested_counts(store, table)
        for stream, hours in counts.rows.items():
            taken = sum(hours.values())
            source = replayed.rows_by_stream.get(stream, 0)
            if taken != source:
                found.mismatched.append(f"ingested {stream}: {taken} changes taken in, the replay has {source}")


def recovery_seconds(faults: list[Fault], records: list[Any]) -> list[tuple[float, float]]:
    """Per fault: (kill to the end of the first successful run started after it, kill to that run's start): where
    the recovery's time goes, waiting for a run to start (restarts, the queue) or the run itself."""
    from dagster import DagsterRunStatus

    done = sorted(
        (r.start_time, r.end_time)
        for r in records
        if r.dagster_run.status == DagsterRunStatus.SUCCESS and r.start_time and r.end_time
    )
    out = []
    for fault in faults:
        if fault.killed_at is None:
            continue
        after = [(end, start) for start, end in done if start >= fault.killed_at]
        if after:
            end, start = min(after)
            out.append((end - fault.killed_at, start - fault.killed_at))
    return out


# --- main --------------------------------------------------------------------------------------------------------


def settle(instance: Any, supervisor: Supervisor, timeout: float, quiet_seconds: float) -> bool:
    """Wait until no run is queued or in progress and none was created for ``quiet_seconds``; False at ``timeout``."""
    from dagster import DagsterRunStatus, RunsFilter

    deadline, quiet_since = time.monotonic() + timeout, time.monotonic()
    while time.monotonic() < deadline:
        supervisor.ensure()
        busy = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus[s] for s in BUSY]), limit=1)
        latest = instance.get_run_records(limit=1)
        newest = latest[0].create_timestamp.timestamp() if latest else 0
        if busy or time.time() - newest < quiet_seconds:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 10:
            return True
        time.sleep(5)
    return False


def _wait_for(ready: Any, supervisor: Supervisor, work: Path, what: str) -> None:
    deadline = time.monotonic() + 600
    while not ready():
        supervisor.ensure()
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not come up within 600 s; logs in {work}")
        time.sleep(2)


def stale_partitions(instance: Any) -> list[Any]:
    """The dependency center's stale partitions (late data waiting for its policy, or for a repair), oldest first."""
    from warehouse_assets.center.ledger import open_readonly
    from warehouse_assets.center.state_store import default_path

    ledger = open_readonly(default_path(instance))
    if ledger is None:
        return []
    try:
        return ledger.all_stale()
    finally:
        ledger.close()


def catch_up(env: dict[str, str], port: int, work: Path) -> None:
    """``warehouse rebuild --stale`` against the soak's instance and webserver, as a user runs it; its output in
    ``catch_up.log``, its last line said."""
    command = [sys.executable, "-m", "warehouse_assets.cli", "rebuild", "--stale", "--url", f"http://127.0.0.1:{port}"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    (work / "catch_up.log").write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    say(
        f"warehouse rebuild --stale: exit {done.returncode}: {last}"
        + (f"; {done.stderr.strip()}" if done.stderr else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=2, help="simulated days (each fault kind once per day)")
    parser.add_argument("--seed", type=int, default=1, help="the fault schedule's and the source's seed")
    parser.add_argument("--hour-seconds", type=float, default=15, help="wall seconds per simulated hour")
    parser.add_argument("--scale", type=float, default=0.03, help="the simulated sources' volume (1.0: full)")
    parser.add_argument("--settle-timeout", type=float, default=900, help="seconds to wait for the stack to settle")
    parser.add_argument("--quiet-seconds", type=float, default=90, help="no run created for this long: settled")
    parser.add_argument("--postgres", action="store_true", help="the instance of dagster_home/postgres (DAGSTER_PG_*)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--quick", action="store_true", help="1 day, --hour-seconds 3, --quiet-seconds 30 (each fault kind once)"
    )
    args = parser.parse_args()
    if args.quick:
        args.days, args.hour_seconds, args.quiet_seconds = 1, 3, 30
    calib = calib_ms()
    calib_spark = float("nan")  # until the stack's Spark is up

    from dagster import DagsterInstance, DagsterRunStatus

    from simulator.cdc import SimulationConfig, simulate
    from tests.support import oracle
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.late_data import LOOKBACK
    from warehouse_assets.cli.dev import DEV_MARK, marked_processes, stop_marked

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    home, lake, landing = work / "dagster_home", work / "lake", work / "landing"
    home.mkdir(parents=True)
    landing.mkdir()
    source_home = ROOT / "dagster_home" / ("postgres" if args.postgres else "")
    shutil.copy(source_home / "dagster.yaml", home / "dagster.yaml")
    if args.postgres and not all(os.environ.get(v) for v in ("DAGSTER_PG_HOST", "DAGSTER_PG_DB", "DAGSTER_PG_USER")):
        raise SystemExit(
            "--postgres: set DAGSTER_PG_HOST, DAGSTER_PG_PORT, DAGSTER_PG_USER, DAGSTER_PG_PASSWORD, DAGSTER_PG_DB"
        )
    today = datetime.now(TZ).date()
    first = today - timedelta(days=args.days + 1)
    if (today - first).days >= LOOKBACK.days:
        raise SystemExit(f"--days {args.days}: the days would reach past the center's {LOOKBACK.days}-day lookback")
    days = [first + timedelta(days=i) for i in range(args.days)]
    start = datetime(first.year, first.month, first.day)
    end = start + timedelta(days=args.days, hours=1)  # the next day's first hour: the last day's hours complete
    # No malformed lines: their rows are counted at the source and never ingested, so their hour stays incomplete
    # (not ready) until the source sends them again, by design, and its downstream partitions are never built
    source_rng = random.Random(f"{args.seed}-source")  # the source's faults, apart from the kills' schedule
    burst_at = start + timedelta(hours=source_rng.randrange(2, 24 * args.days - 2))
    # from 10:00 on, when the shard has delivered orders, so its re-send carries lines
    silent_at = start + timedelta(hours=source_rng.randrange(10, 24 * args.days - 4))
    silent_stream = f"edu_trade/order_{source_rng.randrange(8):02d}"
    config = SimulationConfig(
        seed=args.seed,
        scale=args.scale,
        tz=str(TZ),
        dup_rate=0.01,
        unplaced_move_rate=0.05,
        bursts=((burst_at, burst_at + timedelta(hours=1), BURST_FACTOR),),
    )
    mark = uuid.uuid4().hex
    port, spark_port = free_port(), free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_START=f"{first:%Y-%m-%d}",
        WAREHOUSE_LAKE_ROOT=str(lake),
        WAREHOUSE_LANDING_ROOT=str(landing),
        WAREHOUSE_LOG_DIR=str(work),
        WAREHOUSE_SPARK_MODE="connect",
        WAREHOUSE_SPARK_CONNECT_URL=f"sc://127.0.0.1:{spark_port}",
        WAREHOUSE_SPARK_DRIVER_MEMORY=os.environ.get("WAREHOUSE_SPARK_DRIVER_MEMORY", "2g"),
        WAREHOUSE_SIMULATE_LIVE="0",
        DAGSTER_TELEMETRY_ENABLED="false",
        **{DEV_MARK: mark},
    )
    os.environ.update({k: env[k] for k in ("DAGSTER_HOME", "WAREHOUSE_START")})
    rng = random.Random(args.seed)
    feed_s = 24 * args.days * args.hour_seconds
    faults = sorted(
        (Fault(kind, rng.uniform(0.1, 0.95) * feed_s) for _ in range(args.days) for kind in KINDS), key=lambda f: f.at
    )
    say(f"{work}: {args.days} day(s) from {first} at scale {args.scale}, one simulated hour every {args.hour_seconds}s")
    say("fault schedule (s after the feed starts): " + ", ".join(f"{f.kind}@{f.at:.0f}" for f in faults))
    silent = SilentShard(landing, work / "held", silent_stream, silent_at, silent_at + timedelta(hours=SILENT_HOURS))
    say(
        f"source: x{BURST_FACTOR:g} burst {burst_at:%Y-%m-%d %H:00}; {silent_stream} silent "
        f"{silent_at:%Y-%m-%d %H:00} .. {silent.end:%H:00}, then re-sending its last segment"
    )

    with DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()  # storage created once, before three processes race to create it
    supervisor = Supervisor(env, work, port, spark_port)
    catalog = load_catalog()
    found = Findings()
    began = time.time()
    records: list[Any] = []
    orphans = compared = 0
    stale_before: list[Any] = []
    stale_after: list[Any] = []
    try:
        for name in ("spark_connect", "webserver", "daemon"):
            supervisor.start(name)
        instance = DagsterInstance.from_config(str(home))
        _wait_for(lambda: _sensor_ticked(instance, "ods_landing"), supervisor, work, "the stack")
        calib_spark = calib_spark_connect_ms(env["WAREHOUSE_SPARK_CONNECT_URL"], work)
        # the engine's time rules run on the source's clock, an hour every --hour-seconds (every process started from
        # here on, the engine's restarts included, reads it). Each feed delivers its hour whole, so the clock reads
        # that hour's end: a source never delivers data from the future, and a window the engine is told is ready has
        # ended by its clock (one that had not ended would not be a partition yet to it)
        anchor = time.time()
        clock_start = (start + timedelta(hours=1)).replace(tzinfo=TZ)
        env["WAREHOUSE_CLOCK"] = f"{clock_start.isoformat()}@{anchor:.3f}*{3600 / args.hour_seconds:g}"
        supervisor.start("engine")
        _wait_for(lambda: _engine_watching(instance), supervisor, work, "the engine")
        say(f"the stack is up ({time.time() - began:.0f} s); feeding the source and injecting faults")
        fed_until = start
        pending = list(faults)
        while fed_until < end or pending:
            supervisor.ensure()
            elapsed = time.time() - anchor
            due = start + timedelta(hours=int(elapsed / args.hour_seconds) + 1)
            if fed_until < min(due, end):
                fed_until = min(due, end)
                simulate(landing, start, fed_until, config)
                silent.after_feed(fed_until)
            for fault in [f for f in pending if f.at <= elapsed]:
                if inject(fault, supervisor, instance) or elapsed > fault.at + 300:
                    pending.remove(fault)
                    if fault.killed_at is None:
                        say(f"{fault.kind}: nothing to kill within 300 s of {fault.at:.0f}; skipped")
            time.sleep(1)
        say("source fed, faults injected; waiting for the warehouse to settle")
        if not settle(instance, supervisor, args.settle_timeout, args.quiet_seconds):
            found.notes.append(f"not settled within {args.settle_timeout:.0f} s")
        settled = time.time() - began
        # settled means no run for a while, not nothing owed: partitions whose late data waits for its policy (a
        # daily hour not reached yet, beyond the lookback, a rebuild due later) are stale, not wrong. Listed with their
        # due times, then their rebuilds brought due now by the user's command, and the compare after
        stale_before = stale_partitions(instance)
        stale_keys = {f"{e.table} {e.partition}" for e in stale_before}
        for entry in stale_before[:30]:
            say(f"stale before the catch-up: {entry.table} {entry.partition}: {entry.describe(TZ)}")
        catch_up(env, port, work)  # run as a close would, whatever is stale ("nothing stale" is its answer then)
        if stale_before and not settle(instance, supervisor, args.settle_timeout, args.quiet_seconds):
            found.notes.append(f"not settled within {args.settle_timeout:.0f} s after the catch-up")
        stale_after = stale_partitions(instance)
        for entry in stale_after:
            found.notes.append(f"stale after the catch-up: {entry.table} {entry.partition}: {entry.describe(TZ)}")
        records = check_runs(instance, found)
        truth = oracle.replay(landing)
        check_ods(lake, truth, catalog, found)
        check_derived(lake, truth, days, instance, found)
        check_ingestion(lake, landing, catalog, found)
        failed = [r for r in records if r.dagster_run.status == DagsterRunStatus.FAILURE]
        say(f"settled after {settled:.0f} s: {len(records)} runs, {len(failed)} failed (the killed ones among them)")
        supervisor.stop()  # the stack's Spark gives way to the reference build's
        ref_home, ref_lake = build_reference(work, landing, env, first, args.days)
        with instance_at(ref_home) as ref_instance:
            compared = check_against_reference(lake, instance, ref_lake, ref_instance, catalog, first, args.days, found)
        found.mismatched = [
            f"{m} (stale before the catch-up)" if m.split(":")[0].split(" (")[0] in stale_keys else m
            for m in found.mismatched
        ]
        say(f"{compared} derived partitions compared with the build from scratch")
    finally:
        supervisor.stop()
        time.sleep(5)
        orphans = len(marked_processes(mark))
        stop_marked(mark)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    recovery = recovery_seconds(faults, records)
    injected = [f for f in faults if f.killed_at is not None]
    for note in found.notes:
        say(note)
    for line in found.mismatched[:20]:
        say(f"mismatch: {line}")
    for line in found.stuck[:20]:
        say(f"stuck: {line}")
    if orphans:
        say(f"{orphans} process(es) of the stack still running after its stop")
    totals, waits = [r[0] for r in recovery], [r[1] for r in recovery]
    p50 = statistics.median(totals) if totals else float("nan")
    p90 = _percentile(totals, 0.9) if totals else float("nan")
    top = max(totals) if totals else float("nan")
    wait_p90 = _percentile(waits, 0.9) if waits else float("nan")
    by_kind = json.dumps({k: sum(1 for f in injected if f.kind == k) for k in KINDS}, separators=(",", ":"))
    say(f"faults injected per kind: {by_kind}; restarts by the supervisor: {len(supervisor.restarts)}")
    print(
        f"RESULT faults={len(injected)} lost={found.lost} duplicated={found.duplicated} missing={found.missing} "
        f"mismatched_partitions={len(found.mismatched)} compared_partitions={compared} "
        f"stuck_runs={len(found.stuck)} orphans={orphans} "
        f"stale_before_catch_up={len(stale_before)} stale_after_catch_up={len(stale_after)} "
        f"recover_p50_s={p50:.1f} recover_p90_s={p90:.1f} recover_max_s={top:.1f} recover_start_p90_s={wait_p90:.1f} "
        f"days={args.days} seed={args.seed} "
        f"storage={'postgres' if args.postgres else 'sqlite'} burst={burst_at:%Y-%m-%dT%H} "
        f"silent={silent_stream}@{silent_at:%Y-%m-%dT%H}+{SILENT_HOURS}h resent_lines={silent.resent_lines} "
        f"calib_ms={calib} calib_spark_ms={calib_spark}"
    )
    bad = found.lost or found.duplicated or found.missing or found.mismatched or found.stuck or orphans or stale_after
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
