"""Every bench in ``bench/`` runs in its ``--quick`` mode, so that a change that breaks one fails the suite the day it
lands, not the day someone wants its figure.

Each test runs ``python bench/<name>.py --quick`` as a user does (a subprocess from the repository root) and asserts
what the bench promises, never how fast it was: it exits 0, its last ``RESULT`` line carries every key its docstring
names (``calib_ms`` among them, and ``calib_spark_ms`` where it runs Spark), and its own correctness figures hold
(nothing missed, nothing unsound, the same hours reported...). A bench whose checks stop it with a message (a
``SystemExit`` or an assertion) is covered by its exit status; the figures it only prints are asserted here.

The Spark benches are marked ``spark`` and the ones starting Dagster's servers ``stack``, so that ``make test-fast``
stays pure. The Spark benches that start their own local session run one after the other in one process
(``tests/bench/one_jvm.py``, each bench's ``main(["--quick"])``), so that they pay for one JVM start, not four; each
keeps its own test, read from what it printed there. ``soak`` and ``handoff_latency`` are not here: even at their
smallest they run for minutes (the stack's start, its settling, the soak's build from scratch); docs/benchmarks.md
says how to run them.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.calibration import CALIB_MS_ENV, measure_calib_ms
from tests.support.jvm import QUICK_JIT

ROOT = Path(__file__).resolve().parents[2]

Figures = dict[str, str]


@dataclass(frozen=True)
class Bench:
    name: str
    keys: tuple[str, ...]  # what its RESULT line promises (its docstring's), calibration included
    equal: dict[str, str] = field(default_factory=dict)  # figures that must have exactly this value
    check: Callable[[Figures], None] | None = None  # the rest of its correctness figures
    marks: tuple[pytest.MarkDecorator, ...] = ()
    seconds: int = 300  # the test's timeout: about ten times the quick run on the shared 2-core machine
    one_jvm: bool = False  # run with the other Spark benches in one process (tests/bench/one_jvm.py)


def eta_checks(r: Figures) -> None:
    # the quick replay measures both late sources' days: their partitions miss the SLA, and each miss is warned of
    # before its deadline (the predictor's purpose), with no warning about a partition that was on time. The replay
    # is a pure function of its seed, so these counts move only when the predictor or the catalog does
    assert int(r["misses"]) >= 1
    assert int(r["warned"]) == int(r["misses"])
    assert int(r["false_warnings"]) == 0


def at_least(key: str, least: int, what: str) -> Callable[[Figures], None]:
    def check(r: Figures) -> None:
        assert int(r[key]) >= least, what

    return check


def zorder_checks(r: Figures) -> None:
    at_least("lookup_rows", 1, "the lookup of a pair taken from the table found no row")(r)
    # the quick day must Z-order into several files, or there is nothing for a lookup to skip
    assert int(r["files"]) >= 2, f"Z-order wrote {r['files']} file(s): nothing for a lookup to skip"
    assert float(r["skipped"]) > 0, "the lookups of the Z-ordered table skipped no file"
    assert float(r["timed_skipped"]) > 0, "the timed lookup of the Z-ordered table skipped no file"


def day_checks(r: Figures) -> None:
    for row in ("n100", "resolver300"):
        assert int(r[f"{row}_built"]) == int(r[f"{row}_expected"]) > 0


def suite_cost_checks(r: Figures) -> None:
    # both commits' quick module ran and was read from its report: the same tests, each with a time
    assert int(r["base_tests"]) == int(r["head_tests"]) > 0, "the quick module's tests were not read from both reports"
    assert float(r["base_worker_s"]) > 0 and float(r["head_worker_s"]) > 0


SPARK = (pytest.mark.spark,)
PER_N = ("missed", "built_twice", "unexpected", "exit")
BENCHES = [
    Bench("calibration", ("calib_ms",), seconds=120),  # its workload checks its own result at every pass
    Bench(
        "automation_scale",
        (
            "event_p99_ms",
            "day_s",
            "load_s",
            "peak_mb",
            "n",
            "n100_event_p99_ms",
            "n100_day_s",
            "n100_load_s",
            "n100_closure_s",
            "n100_plan_s",
            "resolver300_day_s",
            "resolver300_event_p99_ms",
            "calib_ms",
        ),
        equal={f"{row}_{k}": "0" for row in ("n100", "resolver300") for k in PER_N},
        check=day_checks,
    ),
    Bench(
        "column_lineage",
        ("n", "load_s", "eager_s", "ratio", "build_p50_ms", "impact_s", "unresolved", "impact_tables", "calib_ms"),
        equal={"n": "300", "unresolved": "0"},
        check=at_least("impact_tables", 1, "the column taint reached no table"),
    ),
    Bench(
        "eta_accuracy",
        (
            "eta_err_p50_s",
            "eta_err_p90_s",
            "misses",
            "warned",
            "warned_lead_p50_s",
            "false_warnings",
            "predict_p99_ms",
            "calib_ms",
        ),
        check=eta_checks,
    ),
    Bench(
        "readiness_history",
        ("days", "ticks", "median_ms", "ratio", "reported", "calib_ms"),
        equal={"days": "3,30", "reported": "2"},  # the two hours after the tick's cursor, at both lengths
    ),
    Bench(
        "reverse_index",
        tuple(
            f"n300_{k}"
            for k in ("edges", "build_ms", "p50_us", "p99_us", "max_us", "fan_tables_max", "static_events", "unsound")
        )
        + ("calib_ms",),
        equal={"n300_unsound": "0"},
        check=at_least("n300_fan_tables_max", 1, "no lookup found a downstream partition"),
    ),
    Bench(
        "placement",  # the bench exits 1 itself when a run was placed against the rule
        ("place_p50_ms", "place_p90_ms", "limits_p50_ms", "placements", "history", "wrong", "calib_ms"),
        equal={"placements": "30", "wrong": "0"},
        seconds=300,
    ),
    Bench(
        "replication",  # exits 1 itself when an hour's replica differs, a run failed or status shows no lag
        ("lag_p50_s", "lag_p90_s", "lag_max_s", "hours", "published", "publications", "verified")
        + ("report_p50_s", "sensor_p50_s", "sensor_p90_s", "launch_p50_s", "copy_p50_s", "runs", "failed_runs")
        + ("status_lag", "own_lag_p50_s", "own_lag_p90_s", "own_partitions", "own_commits", "own_equal")
        + ("calib_ms", "calib_spark_ms"),
        # the quick run's two hours on the stack, each published and verified; the direct path's 30 publications
        equal={"hours": "2", "published": "2", "verified": "2", "failed_runs": "0", "status_lag": "1"}
        | {"own_partitions": "30", "own_commits": "30", "own_equal": "1"},
        marks=(pytest.mark.stack,),
        seconds=900,
    ),
    Bench(
        "why_latency",
        ("why_p50_ms", "why_p90_ms", "why_max_ms", "tail_p90_ms", "partitions", "days", "calib_ms"),
        equal={"partitions": "16", "days": "6"},
        seconds=600,
    ),
    Bench(
        "late_horizon",  # the bench exits 1 itself when a partition is missed or a late change not absorbed
        ("n", "policy", "amplification", "late_lag_p90_s", "missed", "unabsorbed", "calib_ms"),
        equal={"missed": "0"},
        seconds=600,
    ),
    Bench(
        "zorder_skipping",
        ("ratio", "skipped", "timed_skipped", "files", "files_unordered", "unordered_s", "zordered_s", "lookup_rows")
        + ("calib_ms", "calib_spark_ms"),
        check=zorder_checks,
        marks=SPARK,
        seconds=600,
        one_jvm=True,
    ),
    Bench(
        "sql_lookup",
        ("lookup_p50_s", "cold_cli_s", "ratio_datafusion", "ratio_spark", "lookup_rows", "calib_ms", "calib_spark_ms"),
        check=at_least("lookup_rows", 1, "the lookup of a pair taken from the table found no row"),
        marks=SPARK,
        seconds=600,
        one_jvm=True,
    ),
    Bench(
        "merge_pruning",
        (
            "dv_merge_speedup",
            "pruned_growth",
            "e2e_ratio_0.3m",
            "pruned_s_0.3m",
            "unpruned_s_0.3m",
            "merge_dv_s_0.3m",
            "model_ratio_20b_from_0.3m",
            "calib_ms",
            "calib_spark_ms",
        ),
        equal={"sizes": "0.3m", "batch_changes": "2000"},
        marks=SPARK,
        seconds=900,
        one_jvm=True,
    ),
    Bench(
        "key_scoped_rebuild",  # the bench exits 1 itself when a late-data rebuild was not key-scoped or not one commit
        ("scoped_dwd_s", "whole_dwd_s", "ratio_dwd", "scoped_dws_s", "whole_dws_s", "ratio_dws")
        + ("rows_equal", "commits", "keys_dwd", "calib_ms", "calib_spark_ms"),
        equal={"rows_equal": "yes", "commits": "1", "keys_dwd": "100"},  # the 100 orders of its late change
        marks=SPARK,
        seconds=600,
        one_jvm=True,
    ),
    Bench(
        "ranged_run",  # the bench exits 1 itself when a run failed or a ranged verdict or row count differs
        ("ranged_jobs_pp", "single_jobs_pp", "jobs_ratio", "ranged_checks_jobs_pp", "single_checks_jobs_pp")
        + ("ranged_s_pp", "single_s_pp", "s_ratio", "partitions", "runs", "verdicts_equal", "rows_equal")
        + ("calib_ms", "calib_spark_ms"),
        # the quick run's 4 tables x 2 days: one ranged run per table, one single run per partition
        equal={"verdicts_equal": "yes", "rows_equal": "yes", "partitions": "8", "runs": "4,8"},
        marks=SPARK,
        seconds=600,
        one_jvm=True,
    ),
    Bench(
        "eta_real",  # the bench exits 1 itself when the forecast recorded nothing or a run failed
        (
            "real_eta_err_p50_s",
            "real_eta_err_p90_s",
            "real_eta_err_p90_s_on_time",
            "real_misses",
            "real_warned",
            "real_false_warnings",
            "real_predictions",
            "runs",
            "failed_runs",
            "calib_ms",
            "calib_spark_ms",
        ),
        equal={"failed_runs": "0"},
        check=at_least("real_predictions", 1, "the forecast sensor recorded no prediction"),
        marks=(pytest.mark.stack,),
        seconds=1200,
    ),
    Bench(
        "ui_scale",  # each of the five pages drawn in Chromium (a page given up is not counted)
        ("n", "domains", "groups", "largest_group", "load_s", "code_server_mb", "webserver_mb")
        + tuple(f"{page}_{k}" for page in ("group", "asset", "runs", "global", "again") for k in ("s", "kb", "gql_s"))
        + ("workspace_assets_kb", "asset_live_kb", "description_share", "lineage_share", "rendered", "calib_ms"),
        equal={"n": "300", "domains": "yes", "rendered": "5"},
        marks=(pytest.mark.stack,),
        seconds=600,
    ),
    Bench(
        "run_launch",
        ("launch_p50", "launch_p90", "rss_mb", "webserver_rss_mb", "runs", "failed", "calib_ms"),
        equal={"runs": "3", "failed": "0"},
        marks=(pytest.mark.stack,),
        seconds=600,
    ),
    Bench(
        "suite_cost",  # quick: one pure module of two commits, each in its own fresh clone
        (
            "base",
            "head",
            "base_worker_s",
            "head_worker_s",
            "ratio",
            "base_tests",
            "head_tests",
            "head_bench_s",
            "bench_share",
            "failed",
            "base_wall_s",
            "head_wall_s",
            "calib_ms",
        ),
        equal={"failed": "0", "bench_share": "0.000"},
        check=suite_cost_checks,
        seconds=180,
    ),
]


def result_of(stdout: str) -> Figures:
    """The figures of the last ``RESULT key=value ...`` line."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, "no RESULT line"
    return dict(item.split("=", 1) for item in lines[-1].removeprefix("RESULT ").split())


def test_result_lines_are_read_as_their_key_value_figures() -> None:
    assert result_of("progress\nRESULT a=1 b=x,y\nRESULT a=2 c=0.5\n") == {"a": "2", "c": "0.5"}


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


@functools.cache
def suite_calib_ms() -> float:
    """The machine's calibration, measured once for every quick run of the module (they run minutes apart)."""
    return measure_calib_ms()


def quick_env() -> dict[str, str]:
    """The quick runs' environment: the JVMs they start (the one-JVM group's driver, a stack's Spark Connect server)
    live a few minutes at most, so C1 only (tests/support/jvm.py); the benches' full runs keep the JVM's defaults.
    Each bench prints the calibration the module measured once (bench/calibration.py's ``calibration`` alone
    measures its own)."""
    inherited = os.environ.get("JAVA_TOOL_OPTIONS", "")
    return {
        **os.environ,
        "JAVA_TOOL_OPTIONS": f"{inherited} {QUICK_JIT}".strip(),
        CALIB_MS_ENV: str(suite_calib_ms()),
    }


def test_the_quick_runs_start_their_jvms_with_c1_only() -> None:
    assert QUICK_JIT in quick_env()["JAVA_TOOL_OPTIONS"].split()


def test_the_quick_runs_are_handed_one_calibration_measured_once() -> None:
    assert float(quick_env()[CALIB_MS_ENV]) == float(quick_env()[CALIB_MS_ENV]) > 0
    assert suite_calib_ms.cache_info().misses == 1


def one_jvm_seconds() -> int:
    """The timeout of each test of the benches run in one process: whichever runs first waits for them all."""
    return sum(b.seconds for b in BENCHES if b.one_jvm)


def selected_benches(request: pytest.FixtureRequest) -> list[str]:
    """The benches of this session's tests in this module (after ``-k`` and ``-m``), in their order."""
    names = []
    for item in request.session.items:
        bench = getattr(item, "callspec", None) and item.callspec.params.get("bench")
        if item.module is request.module and isinstance(bench, Bench):
            names.append(bench.name)
    return names


@pytest.fixture(scope="module")
def one_jvm_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Done]:
    """The selected one-JVM benches' quick runs, all in one process: each one's exit status and output."""
    wanted = set(selected_benches(request))
    names = [b.name for b in BENCHES if b.one_jvm and b.name in wanted]
    out = tmp_path_factory.mktemp("one-jvm")
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.one_jvm", str(out), *names],
        cwd=ROOT,
        env=quick_env(),
        capture_output=True,
        text=True,
        timeout=one_jvm_seconds() - 10,
    )
    runs = {}
    for name in names:
        rc = out / f"{name}.rc"
        if not rc.is_file():  # the process died before the bench ended (the JVM, a signal)
            runs[name] = Done(-1, done.stdout, done.stderr)
            continue
        stdout, stderr = ((out / f"{name}.{kind}").read_text() for kind in ("out", "err"))
        runs[name] = Done(int(rc.read_text()), stdout, stderr + done.stdout[-3000:])
    return runs


def quick_run(bench: Bench, request: pytest.FixtureRequest) -> Done:
    if bench.one_jvm:
        runs: dict[str, Done] = request.getfixturevalue("one_jvm_runs")
        return runs[bench.name]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{bench.name}.py"), "--quick"],
        cwd=ROOT,
        env=quick_env(),
        capture_output=True,
        text=True,
        timeout=bench.seconds - 10,
    )
    return Done(done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize(
    "bench",
    [
        pytest.param(b, id=b.name, marks=[*b.marks, pytest.mark.timeout(one_jvm_seconds() if b.one_jvm else b.seconds)])
        for b in BENCHES
    ],
)
def test_the_quick_run_exits_0_with_every_promised_figure_and_its_checks_holding(
    bench: Bench, request: pytest.FixtureRequest
) -> None:
    done = quick_run(bench, request)
    tail = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, tail
    figures = result_of(done.stdout)
    missing = [k for k in bench.keys if k not in figures]
    assert not missing, f"RESULT lacks {missing}:\n{tail}"
    assert float(figures["calib_ms"]) > 0
    if "calib_spark_ms" in bench.keys:
        assert float(figures["calib_spark_ms"]) > 0
    assert {k: figures.get(k) for k in bench.equal} == bench.equal, tail
    if bench.check is not None:
        bench.check(figures)


def test_every_bench_script_has_its_quick_test() -> None:
    # the helpers are imported by the benches, and the stack benches too long for the suite are listed by name
    helpers, too_long = {"processes", "synthetic_orders"}, {"soak", "handoff_latency"}
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - helpers - too_long
    assert scripts <= {b.name for b in BENCHES}, "a bench without a quick test: add it to BENCHES"
