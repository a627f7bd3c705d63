"""What the test suite costs, one commit against another, on this machine: worker-seconds from each run's JUnit report.

Each commit is cloned fresh from this repository and runs what CI runs (``CI=true bash .ci/run``: lint, typecheck,
``make test`` with its own install), one after the other, never together: two suites at once on two cores would
measure each other. A run's cost is its worker-seconds, the sum of its tests' times in the JUnit report (each
test's setup, call and teardown, fixtures included): what the two xdist workers spent, which the wall clock halves
and the scheduler's luck moves. The benches' ``--quick`` runs (``tests/bench/``) are counted apart, as their share
of the head's suite.

    .venv/bin/python bench/suite_cost.py --base 6877fb7 --head HEAD   # two whole suites: 1.5-2 h on 2 cores
    .venv/bin/python bench/suite_cost.py --quick                      # one small module of each, the same way

``--quick`` runs one pure module of each commit with this checkout's virtualenv instead of a whole CI run: it checks
the clone, the run and the report's parsing, not the suite's cost.

RESULT keys: ``base``, ``head`` (the commits), ``base_worker_s``, ``head_worker_s``, ``ratio`` (head's worker-seconds
without its benches' quick runs over base's without its own), ``base_tests``, ``head_tests``, ``head_bench_s``,
``bench_share`` (the head's benches over its whole suite), ``failed`` (tests failed or in error, both runs),
``base_wall_s``, ``head_wall_s``, ``calib_ms`` (the machine, before the first run and after the last: their mean).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.calibration import calib_ms  # noqa: E402 - the repository on the path first

REPORT = Path(".test-reports/junit.xml")  # where `make test` leaves its JUnit report in a checkout
BENCH_CLASSES = "tests.bench."  # the benches' quick runs, counted apart
# pure (no Spark, no servers), in both commits the quick run compares, and short (one test, under a second): the
# quick run checks the clone, the run and the report, which a longer module would only make slower
QUICK_MODULE = "tests/cli/test_commands.py"


@dataclass(frozen=True)
class SuiteCost:
    commit: str
    worker_s: float  # every test's time, summed
    bench_s: float  # of which the benches' quick runs
    tests: int
    failed: int  # failures and errors
    wall_s: float

    @property
    def without_benches(self) -> float:
        return self.worker_s - self.bench_s


def cost_of(report: Path, commit: str, wall_s: float) -> SuiteCost:
    """A run's cost from its JUnit report."""
    root = ET.parse(report).getroot()
    worker = bench = 0.0
    tests = failed = 0
    for case in root.iter("testcase"):
        seconds = float(case.get("time", 0) or 0)
        worker += seconds
        tests += 1
        if (case.get("classname") or "").startswith(BENCH_CLASSES):
            bench += seconds
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
    if tests == 0:
        raise SystemExit(f"{report}: the report of {commit} holds no test")
    # to the millisecond, as the report has it: the quick module's one test takes a few hundredths of a second
    return SuiteCost(commit, round(worker, 3), round(bench, 3), tests, failed, round(wall_s, 1))


def clone(commit: str, into: Path) -> str:
    """A fresh clone of this repository at ``commit``; its full hash."""
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(into)], check=True)
    subprocess.run(["git", "-C", str(into), "checkout", "-q", commit], check=True)
    return subprocess.run(
        ["git", "-C", str(into), "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def has_commit(rev: str) -> bool:
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], capture_output=True
    )
    return found.returncode == 0


def run_suite(role: str, commit: str, work: Path, quick: bool) -> SuiteCost:
    checkout = work / role  # base and head may name the same commit
    short = clone(commit, checkout)
    log = work / f"{role}-{short}.log"
    if quick:  # one pure module, with this checkout's virtualenv: the clone's own install takes minutes
        (checkout / ".venv").symlink_to(ROOT / ".venv")
        command = [".venv/bin/pytest", "-q", "-p", "no:cacheprovider", QUICK_MODULE, f"--junitxml={REPORT}"]
    else:
        command = ["bash", ".ci/run"]
    print(f"[{short}] {' '.join(command)} (log: {log})", flush=True)
    began = time.monotonic()
    with log.open("w") as out:
        # its own process group, so that an interrupted comparison stops the suite and what it started
        proc = subprocess.Popen(
            command,
            cwd=checkout,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CI": "true"},
            start_new_session=True,
        )
        try:
            code = proc.wait()
        except BaseException:
            os.killpg(proc.pid, 15)
            raise
    wall = time.monotonic() - began
    report = checkout / REPORT
    if not report.is_file():
        raise SystemExit(f"[{short}] exited {code} with no JUnit report: see {log}")
    cost = cost_of(report, short, wall)
    print(
        f"[{short}] exit {code}: {cost.tests} tests, {cost.failed} failed, {cost.worker_s:.0f} worker-s "
        f"({cost.bench_s:.0f} of them the benches'), {wall:.0f} s wall",
        flush=True,
    )
    return cost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="6877fb7", help="the commit compared against (default: %(default)s)")
    parser.add_argument("--head", default="HEAD", help="the commit measured (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="one small module of each, not the whole suites")
    parser.add_argument("--keep", action="store_true", help="keep the clones and their logs")
    parser.add_argument("--head-first", action="store_true", help="run the head's suite before the base's")
    args = parser.parse_args(argv)
    if args.quick and args.base == parser.get_default("base"):
        args.base = "HEAD~1" if has_commit("HEAD~1") else "HEAD"  # a shallow clone has no earlier commit
    work = Path(tempfile.mkdtemp(prefix="suite-cost-"))
    try:
        calib_before = calib_ms()
        if args.head_first:  # e.g. when the head's run is also the check a change must pass before it lands
            head = run_suite("head", args.head, work, args.quick)
            base = run_suite("base", args.base, work, args.quick)
        else:
            base = run_suite("base", args.base, work, args.quick)
            head = run_suite("head", args.head, work, args.quick)
        calib = round((calib_before + calib_ms()) / 2, 1)
    finally:
        if args.keep:
            print(f"clones and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    ratio = head.without_benches / base.without_benches if base.without_benches else float("nan")
    share = head.bench_s / head.worker_s if head.worker_s else 0.0
    print(
        f"RESULT base={base.commit} head={head.commit} base_worker_s={base.worker_s:.3f} "
        f"head_worker_s={head.worker_s:.3f} ratio={ratio:.3f} base_tests={base.tests} head_tests={head.tests} "
        f"head_bench_s={head.bench_s:.0f} bench_share={share:.3f} failed={base.failed + head.failed} "
        f"base_wall_s={base.wall_s:.0f} head_wall_s={head.wall_s:.0f} calib_ms={calib}"
    )
    return 1 if base.failed or head.failed else 0


if __name__ == "__main__":
    sys.exit(main())
