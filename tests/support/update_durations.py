"""Write ``tests/durations.json``, the seconds each test module took, from pytest's own timing report of a whole run.

    .venv/bin/python -m tests.support.update_durations .test-reports/junit.xml [more reports] [--note "CI, quiet"]

The report is either the JUnit XML that ``make test`` keeps (``--junitxml``: each test's setup, call and teardown)
or the text of ``--durations=0``. A module's figure is the sum over its tests, its module fixtures included (they are
timed in the setup of its first test): the worker-time it occupies. ``tests/conftest.py`` starts the longest modules
first so that the two workers of ``make test`` finish together; a module missing from the file runs first.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
# one line of `--durations=0`: "12.34s setup    tests/test_x.py::test_y[param]"
DURATION_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(?:setup|call|teardown)\s+(\S+?\.py)::")


def from_junit(path: Path) -> dict[str, float]:
    """Module → seconds from a JUnit XML report; a test case's ``classname`` is its module's dotted path."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        classname, time = case.get("classname", ""), case.get("time")
        if not classname or time is None:
            continue
        parts = classname.split(".")
        # a test in a class has the class as the last part: keep the dotted path up to the module (test_*)
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        if parts:
            seconds["/".join(parts) + ".py"] += float(time)
    return dict(seconds)


def from_durations(text: str) -> dict[str, float]:
    """Module → seconds from the text of ``pytest --durations=0``."""
    seconds: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if match := DURATION_LINE.match(line):
            seconds[match.group(2)] += float(match.group(1))
    return dict(seconds)


def read_report(path: Path) -> dict[str, float]:
    if not path.is_file():
        raise SystemExit(f"error: no pytest report at {path}")
    seconds = from_junit(path) if path.suffix == ".xml" else from_durations(path.read_text())
    if not seconds:
        raise SystemExit(f"error: {path} holds no test timings (run pytest with --junitxml or --durations=0)")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "reports",
        type=Path,
        nargs="+",
        help="JUnit XML reports (.xml) or texts of --durations=0; a module in several takes the last one's figure",
    )
    parser.add_argument("--note", default="", help="where and how it was measured (machine, quiet or shared)")
    parser.add_argument("--output", type=Path, default=DURATIONS)
    args = parser.parse_args(argv)
    seconds: dict[str, float] = {}
    for report in args.reports:
        seconds.update(read_report(report))
    modules = dict(sorted(((m, round(s, 1)) for m, s in seconds.items()), key=lambda item: (-item[1], item[0])))
    document = {
        "measured": f"{datetime.now(UTC):%Y-%m-%d}" + (f", {args.note}" if args.note else ""),
        "total_seconds": round(sum(seconds.values()), 1),
        "modules": modules,
    }
    args.output.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{args.output}: {len(modules)} modules, {document['total_seconds']:.0f} s of worker-time", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
