"""A Dagster run launcher that forks each run from a warm, pre-imported worker instead of a fresh interpreter.

Dagster's default launcher asks the code server to *spawn* a Python per run, which imports Dagster, PySpark and the
code location again: 5-9 s per run on two cores. :class:`WarmRunLauncher` keeps one "zygote" process per
code location, started lazily by whichever process holds the launcher (the daemon with the QueuedRunCoordinator).
The zygote imports Dagster, the ``preload_modules`` and the code location, and opens no gRPC channel, thread, Spark
session or JVM, so that forking it is safe. Per run it forks a child that re-opens the instance
(``DagsterInstance.from_ref``) and executes the run through the same code path as ``dagster api execute_run``
(``Started process for run (pid: …)``, the cancellation and metrics threads, ``core_execute_run``).

- Stale code: the zygote is retired and a new one started when a file of the code location's working directory
  (its top-level ``.py`` files and packages, SQL and YAML included) changed since the zygote imported it, or a file
  under a folder named by one of the ``watch_env`` variables (the code location reads declarations from there).
- Crashes: the zygote reports each child's exit; a child that exits before its run finished (killed, crashed) fails
  the run with its exit status. A dead zygote is restarted at the next launch; its orphaned children are watched by
  PID. Runs do not depend on the zygote once forked.
- Stopping: SIGINT or SIGTERM reaching a run worker (Ctrl-C of the stack reaches its whole process group) cancels its
  run, as the UI's Terminate does: the run is marked canceling before Dagster's interrupt handler raises, so Dagster
  ends it CANCELED instead of "interrupted unexpectedly" (FAILURE), the run is tagged ``warehouse/stopped_by`` (the
  engine submits it again at its next start), and the worker prints one line, then nothing more: it falls silent and
  stops the processes that echo the step's captured output to the terminal (Dagster's compute log capture tails the
  step's log files from processes of their own), so the interrupted step's traceback stays in the step's compute log
  and the run's event log. A signal to the whole process group reaches those echo processes too (Dagster's orphan
  watcher then prints a KeyboardInterrupt traceback): ``warehouse dev`` therefore signals each run worker first
  (:func:`run_workers`) and stops Dagster's group once their echoes have ended.
- Run monitoring and ``terminate`` find the child by the PID recorded in the run's ``warehouse/run_worker`` tag (host,
  PID and process start time, so a reused PID is not mistaken for the worker), from any process on the same host.
  A run the product executes in its own process (the CLI's ``execute_in_process`` and ``materialize``: ``warehouse
  reingest``, ``taint --apply``, ``materialize``) names that process the same way (:func:`this_process_as_worker`):
  the daemon's run monitoring asks this launcher about every started run, whoever started it, and a run without the
  tag is UNKNOWN to it, which Dagster fails while it runs.
- A launch that cannot be served (the code location fails to import, the zygote does not answer) raises
  ``DagsterLaunchFailedError`` with the reason: Dagster fails the run with that message.

Configured in ``dagster_home/dagster.yaml``::

    run_launcher:
      module: warehouse_assets.instance.warm_launcher
      class: WarmRunLauncher
      config:
        preload_modules: [pyspark.sql, delta]
        watch_env: [WAREHOUSE_CATALOG_DIR]
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from queue import Empty, Queue
from typing import Any, Self

from dagster import DagsterEvent, DagsterRun, DagsterRunStatus
from dagster._config.config_schema import UserConfigSchema
from dagster._core.errors import DagsterLaunchFailedError
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._core.origin import RepositoryPythonOrigin
from dagster._serdes import ConfigurableClass, ConfigurableClassData, deserialize_value, serialize_value

from warehouse_assets.instance.pools import Pool, place_run, pools_from_env
from warehouse_assets.instance.processes import all_pids, command_line, process_stat

WORKER_TAG = "warehouse/run_worker"  # "host:pid:start ticks" of the forked run worker
STOPPED_TAG = "warehouse/stopped_by"  # the signal that stopped the run's worker (its run was canceled by it)
CANCEL_TIMEOUT_S = 10.0  # how long a stopping worker waits for its run to be marked canceling
STARTUP_TIMEOUT_S = 600  # the zygote imports the code location: ~10 s quiet, a minute on a loaded 2-core machine
FORK_TIMEOUT_S = 30  # a fork answers in milliseconds: longer means the zygote hangs
ORPHAN_POLL_S = 0.5
log = logging.getLogger(__name__)


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Launches each run in a child forked from a warm process that imported the run's code location."""

    def __init__(
        self,
        preload_modules: Sequence[str] = (),
        startup_timeout_seconds: int = STARTUP_TIMEOUT_S,
        watch_env: Sequence[str] = (),
        inst_data: ConfigurableClassData | None = None,
    ):
        self._inst_data = inst_data
        self.preload_modules = list(preload_modules)
        self.watch_env = list(watch_env)
        self.startup_timeout_seconds = startup_timeout_seconds
        self._zygotes: dict[str, _Zygote] = {}
        self._lock = threading.Lock()
        self._pools: tuple[Pool, ...] = pools_from_env()  # several Spark endpoints: each run placed on one
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        from dagster import Array, Field, IntSource, StringSource

        return {
            "preload_modules": Field(
                Array(StringSource),
                is_required=False,
                default_value=[],
                description="Modules the warm worker imports besides the code location (e.g. pyspark.sql).",
            ),
            "startup_timeout_seconds": Field(
                IntSource,
                is_required=False,
                default_value=STARTUP_TIMEOUT_S,
                description="How long the warm worker may take to import the code location.",
            ),
            "watch_env": Field(
                Array(str),
                is_required=False,
                default_value=[],
                description=(
                    "Environment variables naming folders the code location reads when it loads (table declarations "
                    "kept outside its working directory): a change of a file there restarts the warm worker too."
                ),
            ),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data, **config_value)

    # -- launching ---------------------------------------------------------------------------------------------

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if origin is None:
            raise DagsterLaunchFailedError(
                f"WarmRunLauncher: run {run.run_id} has no code origin (job_code_origin): cannot tell which code "
                "location to execute it in"
            )
        if self._pools and not self._placed(run, context.workspace):
            return
        worker = self._fork(origin.repository_origin, run.run_id)
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: worker.tag()})

    def _placed(self, run: DagsterRun, workspace: Any) -> bool:
        """Place ``run`` on a compute pool (its tags then name it); when every eligible pool is full or offline, put
        it back in Dagster's queue with the reason, as the daemon re-queues a run whose code server is away."""
        try:
            placement = place_run(self._instance, run, self._pools, workspace=workspace)
        except ValueError as exc:  # no pool has the labels it requires: it could never start
            raise DagsterLaunchFailedError(f"WarmRunLauncher: run {run.run_id}: {exc}") from None
        if placement.pool is not None:
            return True
        self._instance.report_engine_event(placement.message, run)
        self._instance.report_dagster_event(DagsterEvent.job_enqueue(run), run_id=run.run_id)
        return False

    def _fork(self, origin: RepositoryPythonOrigin, run_id: str) -> _Worker:
        key = serialize_value(origin)
        for attempt in (1, 2):  # a zygote that died since the last launch is restarted once
            zygote = self._zygote(key, origin)
            try:
                return zygote.fork(run_id, self._instance.get_ref())
            except _ZygoteGone as gone:
                if attempt == 2:
                    raise DagsterLaunchFailedError(
                        f"WarmRunLauncher: the warm worker of {_describe(origin)} stopped while forking run "
                        f"{run_id}: {gone}"
                    ) from None
        raise AssertionError("unreachable")

    def _zygote(self, key: str, origin: RepositoryPythonOrigin) -> _Zygote:
        with self._lock:
            zygote = self._zygotes.get(key)
            if zygote is None or not zygote.alive or zygote.stale():
                if zygote is not None:
                    zygote.retire()
                zygote = _Zygote(self, origin, self.preload_modules, self.watch_env)
                self._zygotes[key] = zygote
        zygote.wait_ready(self.startup_timeout_seconds)  # raises with the zygote's error; at once when it is ready
        return zygote

    def worker_exited(self, run_id: str, pid: int, status: str) -> None:
        """Called when a forked run worker ended: fail its run if the worker did not finish it."""
        if not self.has_instance:
            return
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        message = f"Run worker (pid {pid}, forked by the warm run launcher) {status} before the run finished."
        if run.status == DagsterRunStatus.CANCELING:  # terminated: the worker died of the interrupt it was sent
            self._instance.report_run_canceled(run, message)
        else:
            self._instance.report_run_failed(run, message)

    # -- monitoring and termination ----------------------------------------------------------------------------

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        worker = _Worker.from_tag(run.tags.get(WORKER_TAG))
        if worker is None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"run has no {WORKER_TAG} tag")
        if worker.host != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"run worker is on host {worker.host}")
        if worker.alive():
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(worker.pid))
        if run.status == DagsterRunStatus.SUCCESS:
            return CheckRunHealthResult(WorkerStatus.SUCCESS, run_worker_id=str(worker.pid))
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {worker.pid} is gone", run_worker_id=None)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        worker = _Worker.from_tag(run.tags.get(WORKER_TAG))
        if worker is None or worker.host != socket.gethostname() or not worker.alive():
            self._instance.report_engine_event(
                f"WarmRunLauncher: no live run worker to terminate ({run.tags.get(WORKER_TAG) or 'no worker tag'}).",
                run,
                cls=self.__class__,
            )
            return False
        self._instance.report_run_canceling(run)
        os.kill(worker.pid, signal.SIGINT)  # what `dagster api execute_run` turns into an interrupted run
        return True

    def dispose(self) -> None:
        with self._lock:
            for zygote in self._zygotes.values():
                zygote.retire()
            self._zygotes.clear()


def this_process_as_worker() -> dict[str, str]:
    """The ``warehouse/run_worker`` tag naming this process, for a run it executes itself rather than one the launcher
    forks: run monitoring then finds the run's worker alive while it runs, and fails the run if this process dies."""
    stat = process_stat(os.getpid())
    if stat is None:  # no /proc: nothing a health check could find either
        return {}
    return {WORKER_TAG: _Worker(socket.gethostname(), os.getpid(), stat.start).tag()}


def _describe(origin: RepositoryPythonOrigin) -> str:
    return f"the code location `{origin.code_pointer.describe()}`"


class _ZygoteGone(Exception):
    pass


class _Worker:
    """A forked run worker: host, PID and the process's start time (so that a reused PID is not mistaken for it)."""

    def __init__(self, host: str, pid: int, start: int):
        self.host, self.pid, self.start = host, pid, start

    def tag(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"

    @classmethod
    def from_tag(cls, value: str | None) -> _Worker | None:
        try:
            host, pid, start = (value or "").rsplit(":", 2)
            return cls(host, int(pid), int(start))
        except ValueError:
            return None

    def alive(self) -> bool:
        stat = process_stat(self.pid)
        return stat is not None and stat.running and stat.start == self.start


def source_roots(working_directory: str, watch_env: Sequence[str] = ()) -> list[Path]:
    """What a code location imports from its working directory (top-level .py files and packages), and the folders
    the ``watch_env`` variables name in this process's environment (unset or empty: none)."""
    root = Path(working_directory)
    found = sorted(p for p in root.iterdir() if (p.suffix == ".py" and p.is_file()) or (p / "__init__.py").is_file())
    watched = [Path(os.environ[name]).expanduser() for name in watch_env if os.environ.get(name, "").strip()]
    return found + [folder.resolve() for folder in watched]


def source_signature(roots: Sequence[Path]) -> tuple[tuple[str, int, int], ...]:
    """Path, mtime and size of every file under ``roots`` (bytecode caches aside): changes when any is edited."""
    files: list[tuple[str, int, int]] = []
    for root in roots:
        paths = [root] if root.is_file() else (p for p in root.rglob("*") if "__pycache__" not in p.parts)
        for path in paths:
            try:
                stat = path.stat()
            except OSError:
                continue  # removed while walking: the next signature sees it gone
            if path.is_file():
                files.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(sorted(files))


class _Zygote:
    """The launcher's handle on one warm process: requests on its stdin, answers on a pipe read by a thread."""

    def __init__(
        self,
        launcher: WarmRunLauncher,
        origin: RepositoryPythonOrigin,
        preload: Sequence[str],
        watch_env: Sequence[str],
    ):
        self.launcher, self.origin = launcher, origin
        working_directory = getattr(origin.code_pointer, "working_directory", None) or os.getcwd()
        self.roots = source_roots(working_directory, watch_env)
        self.signature = source_signature(self.roots)  # before the import: an edit during it restarts next time
        executable = origin.executable_path or sys.executable
        if not os.path.exists(executable):
            raise DagsterLaunchFailedError(
                f"WarmRunLauncher: the Python of {_describe(origin)} does not exist: {executable}"
            )
        answers_r, answers_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [executable, "-m", __name__, str(answers_w)],
                stdin=subprocess.PIPE,
                cwd=working_directory,
                pass_fds=(answers_w,),
                start_new_session=False,
            )
        finally:
            os.close(answers_w)
        assert self.proc.stdin is not None
        self._stdin = self.proc.stdin
        self._send({"origin": serialize_value(origin), "preload": list(preload)})
        self.alive = True
        self.error: str | None = None
        self._ready = threading.Event()
        self._forked: Queue[dict[str, Any] | None] = Queue()
        self._fork_lock = threading.Lock()
        self._children: dict[int, tuple[str, int]] = {}  # pid → run id, start ticks
        self._reader = threading.Thread(
            target=self._read, args=(os.fdopen(answers_r, "rb"),), name=f"warm-zygote-{self.proc.pid}", daemon=True
        )
        self._reader.start()

    def _send(self, message: Mapping[str, Any]) -> None:
        try:
            self._stdin.write(json.dumps(message).encode() + b"\n")
            self._stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise _ZygoteGone(f"its input is closed ({exc})") from None

    def wait_ready(self, timeout: float) -> None:
        if not self._ready.wait(timeout):
            self.retire(kill=True)
            raise DagsterLaunchFailedError(
                f"WarmRunLauncher: the warm worker of {_describe(self.origin)} did not load it within {timeout:.0f} s"
            )
        if self.error is not None:
            raise DagsterLaunchFailedError(
                f"WarmRunLauncher: the warm worker could not load {_describe(self.origin)}:\n{self.error}"
            )

    def stale(self) -> bool:
        return source_signature(self.roots) != self.signature

    def fork(self, run_id: str, instance_ref: Any) -> _Worker:
        with self._fork_lock:
            self._send({"run_id": run_id, "instance_ref": serialize_value(instance_ref)})
            try:
                answer = self._forked.get(timeout=FORK_TIMEOUT_S)
            except Empty:
                self.retire(kill=True)
                raise DagsterLaunchFailedError(
                    f"WarmRunLauncher: the warm worker did not fork run {run_id} within {FORK_TIMEOUT_S} s"
                ) from None
        if answer is None:
            raise _ZygoteGone(f"exit status {self.proc.poll()}")
        if answer["event"] == "refused":
            raise DagsterLaunchFailedError(
                f"WarmRunLauncher: the warm worker could not fork run {run_id}: {answer['message']}"
            )
        return _Worker(socket.gethostname(), answer["pid"], answer["start"])

    def retire(self, kill: bool = False) -> None:
        """Stop taking runs. The zygote exits once its running children have (their exits are still reported)."""
        self.alive = False
        with contextlib.suppress(OSError):
            self._stdin.close()
        if kill:
            self.proc.kill()

    def _read(self, answers: Any) -> None:
        for line in answers:
            message = json.loads(line)
            event = message["event"]
            if event == "ready":
                self._ready.set()
            elif event == "error":
                self.error = message["message"]
                self._ready.set()
            elif event == "forked":
                self._children[message["pid"]] = (message["run_id"], message["start"])
                self._forked.put(message)
            elif event == "refused":
                self._forked.put(message)
            elif event == "exited":
                self._children.pop(message["pid"], None)
                self._worker_exited(message["run_id"], message["pid"], message["status"])
        # the zygote is gone: answer a waiting fork, then watch the children it left behind by PID
        self.alive = False
        self.proc.wait()
        if not self._ready.is_set():
            self.error = f"it exited with status {self.proc.returncode} while loading"
            self._ready.set()
        self._forked.put(None)
        orphans = dict(self._children)
        while orphans:
            for pid, (run_id, start) in list(orphans.items()):
                if not _Worker("", pid, start).alive():
                    del orphans[pid]
                    self._worker_exited(run_id, pid, "ended after its warm worker died")
            time.sleep(ORPHAN_POLL_S)

    def _worker_exited(self, run_id: str, pid: int, status: str) -> None:
        try:
            self.launcher.worker_exited(run_id, pid, status)
        except Exception:  # the storage unreachable: log it, keep reading (run monitoring can still fail the run)
            log.exception("WarmRunLauncher: could not record the end of run worker %s (run %s)", pid, run_id)


# -- the zygote process (`python -m warehouse_assets.instance.warm_launcher FD`) ------------------------------------


def _zygote_main(answers_fd: int) -> None:
    answers = os.fdopen(answers_fd, "w", buffering=1)

    def answer(**message: Any) -> None:
        with contextlib.suppress(BrokenPipeError):  # the launcher is gone: the children run on, unreported
            answers.write(json.dumps(message) + "\n")

    stdin = sys.stdin.fileno()
    pending = b""  # read unbuffered: a run request may follow the setup line in the same read
    while b"\n" not in pending:
        chunk = os.read(stdin, 65536)
        if not chunk:
            return
        pending += chunk
    setup_line, pending = pending.split(b"\n", 1)
    setup = json.loads(setup_line)
    try:
        import importlib

        from dagster._utils.hosted_user_process import recon_repository_from_origin

        for module in setup["preload"]:
            importlib.import_module(module)
        origin = deserialize_value(setup["origin"], RepositoryPythonOrigin)
        recon_repository_from_origin(origin).get_definition()
        if threading.active_count() > 1:
            names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
            raise RuntimeError(f"loading the code location started threads ({names}): forking them is unsafe")
    except Exception:
        answer(event="error", message=traceback.format_exc())
        return
    # Ctrl-C of the dev stack reaches the whole process group: the zygote ends with its launcher (stdin closed)
    # instead, and its children get the default handler back, as the runs of the default launcher have
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answer(event="ready", pid=os.getpid())

    children: dict[int, str] = {}
    selector = selectors.DefaultSelector()
    selector.register(stdin, selectors.EVENT_READ)
    open_ = True
    while open_ or children:
        if open_ and b"\n" not in pending and selector.select(timeout=0.1):
            chunk = os.read(stdin, 65536)
            if not chunk:
                open_ = False  # the launcher retired us: finish reporting the children, take no more runs
                selector.unregister(stdin)
            pending += chunk
        elif not open_:
            time.sleep(0.1)
        while b"\n" in pending:  # requests read before the launcher retired us are still served
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            try:
                pid = os.fork()
            except OSError as exc:  # out of processes or memory: this run fails, the zygote stays
                answer(event="refused", run_id=request["run_id"], message=str(exc))
                continue
            if pid == 0:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                selector.close()
                answers.close()
                _child(request["run_id"], request["instance_ref"])
            stat = process_stat(pid)
            children[pid] = request["run_id"]
            answer(event="forked", run_id=request["run_id"], pid=pid, start=stat.start if stat else 0)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            run_id = children.pop(pid, None)
            if run_id is not None:
                answer(event="exited", run_id=run_id, pid=pid, status=_exit_status(status))


def _exit_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        return f"was killed by signal {number} ({signal.Signals(number).name})"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def _child(run_id: str, serialized_ref: str) -> None:
    """The forked run worker: what `dagster api execute_run` does, on the instance re-opened from its ref."""
    code = 1
    stop = _StopSignals(run_id, serialized_ref)
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        from dagster import DagsterInstance
        from dagster._cli.api import _execute_run_command_body
        from dagster._core.instance import InstanceRef
        from dagster._utils.interrupts import capture_interrupts

        stop.install()
        with capture_interrupts(), DagsterInstance.from_ref(deserialize_value(serialized_ref, InstanceRef)) as instance:
            code = _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=False)
    except BaseException:
        if stop.received is None:  # a stop's interrupt is the cancellation it asked for, already said in one line
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _StopSignals:
    """SIGINT and SIGTERM in a run worker cancel its run, as the UI's Terminate does.

    Dagster's interrupt handler (installed and replaced around each step) raises at once, and the run then ends CANCELED
    only if it is already marked canceling, FAILURE otherwise ("interrupted unexpectedly"). So every handler set for
    those signals in this process is wrapped: the first stop signal marks the run canceling (from a thread of its own,
    with a timeout: the interrupted code may hold the storage's lock), tags it with the signal, says so in one line and
    sends what the run prints afterwards (the interrupted step's traceback, also in the run's event log) to /dev/null,
    the step's echo included; then Dagster's handler interrupts the run. Later stop signals are swallowed: they would
    interrupt the cancellation itself."""

    def __init__(self, run_id: str, serialized_ref: str):
        self.run_id, self.serialized_ref = run_id, serialized_ref
        self.received: str | None = None
        self._set_handler = signal.signal
        # where the worker's output goes (the stack's terminal): Dagster's compute log capture points fds 1 and 2 at a
        # file during a step and back at copies of these afterwards, so silencing means every fd open on them
        self._stderr = (os.fstat(2).st_dev, os.fstat(2).st_ino)
        self._outputs = {(os.fstat(1).st_dev, os.fstat(1).st_ino), self._stderr}

    def install(self) -> None:
        def set_handler(signalnum: Any, handler: Any) -> Any:
            if signalnum in (signal.SIGINT, signal.SIGTERM) and callable(handler):
                handler = self._wrap(handler)
            return self._set_handler(signalnum, handler)

        signal.signal = set_handler  # type: ignore[assignment]
        set_handler(signal.SIGINT, signal.default_int_handler)
        set_handler(signal.SIGTERM, signal.default_int_handler)

    def _wrap(self, handler: Any) -> Any:
        if getattr(handler, "_stops_the_run", False):
            return handler

        def on_signal(signum: int, frame: Any) -> Any:
            if self.received is not None:
                return None  # the run is being canceled: a second Ctrl-C must not interrupt that
            self.received = signal.Signals(signum).name
            _stop_echoes()  # at once: a supervisor stopping the stack waits for them, not for the cancellation
            self._cancel()
            return handler(signum, frame)

        on_signal._stops_the_run = True  # type: ignore[attr-defined]
        return on_signal

    def _cancel(self) -> None:
        said: list[str] = []

        def mark() -> None:
            from dagster import DagsterInstance
            from dagster._core.instance import InstanceRef

            with DagsterInstance.from_ref(deserialize_value(self.serialized_ref, InstanceRef)) as instance:
                run = instance.get_run_by_id(self.run_id)
                if run is None or run.is_finished:
                    return
                what = _run_label(run)
                if run.status == DagsterRunStatus.CANCELING:  # Terminate asked first: its interrupt is this signal
                    said.append(f"run {self.run_id[:8]} {what} canceled (terminated)")
                    return
                instance.add_run_tags(self.run_id, {STOPPED_TAG: str(self.received)})
                instance.report_run_canceling(
                    run, message=f"The run worker received {self.received}: canceling the run."
                )
                said.append(f"run {self.run_id[:8]} {what} canceled: its worker received {self.received}")

        marking = threading.Thread(target=mark, name="cancel-on-stop", daemon=True)
        marking.start()
        marking.join(CANCEL_TIMEOUT_S)
        line = said[0] if said else f"run {self.run_id[:8]} interrupted by {self.received}"
        sys.stdout.flush()
        sys.stderr.flush()
        self._say_and_fall_silent(line)

    def _say_and_fall_silent(self, line: str) -> None:
        """Write ``line`` where the worker's output goes, then point every fd open there at /dev/null."""
        fds, stderr = [], 2
        for entry in Path("/proc/self/fd").iterdir():
            with contextlib.suppress(OSError, ValueError):
                fd = int(entry.name)
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) in self._outputs:
                    fds.append(fd)
                    if (st.st_dev, st.st_ino) == self._stderr:
                        stderr = fd
        with contextlib.suppress(OSError):
            # straight to the terminal, even during a step (whose compute log echoes what it captures a moment later,
            # by a tailing process the run's end may stop before it has)
            os.write(stderr, (line + "\n").encode())
            quiet = os.open(os.devnull, os.O_WRONLY)
            for fd in fds:
                os.dup2(quiet, fd)
            os.close(quiet)


ECHO_STOP_TIMEOUT_S = 1.0  # `tail` and Dagster's orphan watcher end at once on SIGTERM


def _processes() -> dict[int, tuple[int, list[bytes]]]:
    """Every process of this machine: PID → (parent PID, command line)."""
    found: dict[int, tuple[int, list[bytes]]] = {}
    for pid in all_pids():
        if (stat := process_stat(pid)) is not None:
            found[pid] = (stat.parent, command_line(pid))
    return found


def _stop_echoes() -> None:
    """Stop the processes echoing this worker's captured step output to the terminal, before the interrupt writes the
    step's traceback into that capture.

    During a step, Dagster's ``LocalComputeLogManager`` points fds 1 and 2 at the step's log files and echoes each
    file to the terminal by a ``tail -F`` child, watched by a Python process that ends it if this worker dies; its
    ``capture_logs`` keeps those PIDs to itself, so they are found among this process's descendants. SIGTERM ends
    both silently (a SIGINT makes the watcher print a KeyboardInterrupt traceback). Dagster's own clean-up at the
    step's end then finds them ended. The step's output stays complete in its log files (the UI's stdout/stderr)."""
    processes = _processes()
    descendants: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {pid for pid, (parent, _) in processes.items() if parent in frontier} - descendants
        descendants |= frontier
    echoes = []
    for pid in descendants:
        if _echoes(processes[pid][1]):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
                echoes.append(pid)
    deadline = time.monotonic() + ECHO_STOP_TIMEOUT_S
    while echoes and time.monotonic() < deadline:  # ended (a zombie until Dagster reaps it) or gone
        echoes = [pid for pid in echoes if (stat := process_stat(pid)) is not None and stat.running]
        if echoes:
            time.sleep(0.01)


def _echoes(argv: list[bytes]) -> bool:
    """Whether a command line is one of the compute log capture's echo processes: ``tail -F`` or its watcher."""
    tail = bool(argv) and os.path.basename(argv[0]) == b"tail" and b"-F" in argv
    return tail or any(arg.endswith(b"watch_orphans.py") for arg in argv)


def echo_processes(candidates: Sequence[int]) -> list[int]:
    """Of ``candidates``, the processes echoing a step's captured output (gone once their run worker was stopped)."""
    processes = _processes()
    return [pid for pid in candidates if pid in processes and _echoes(processes[pid][1])]


def run_workers(candidates: Sequence[int]) -> list[int]:
    """Of ``candidates``, the run workers: processes forked by a warm worker (its command line, its child).

    A supervisor stopping the stack signals them first, one by one: each cancels its run in one line and stops its
    step's echo, which a signal to the whole process group would reach at the same moment."""
    processes = _processes()

    def warm(pid: int) -> bool:
        argv = processes.get(pid, (0, []))[1]
        return len(argv) > 2 and argv[1:3] == [b"-m", __name__.encode()]

    return [pid for pid in candidates if warm(pid) and warm(processes[pid][0])]


def _run_label(run: DagsterRun) -> str:
    """``(ods.order 2026-01-05)``: the run's assets and partitions, or its job."""
    assets = ", ".join(".".join(k.path) for k in sorted(run.asset_selection or [], key=lambda k: k.path))
    tags = run.tags
    first, last = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    partition = tags.get("dagster/partition") or (f"{first} .. {last}" if first and last else "")
    return f"({' '.join(p for p in (assets or run.job_name, partition) if p)})"


if __name__ == "__main__":
    _zygote_main(int(sys.argv[1]))
