"""The worker order of ``make test`` comes from measured seconds: ``tests/support/update_durations.py`` sums each
module's setup, call and teardown from pytest's own reports (JUnit XML or ``--durations=0``), and the suite starts the
longest modules first (after those not measured yet)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import DURATIONS
from tests.support import update_durations

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
 <testcase classname="tests.test_end_to_end" name="test_a" time="480.5"/>
 <testcase classname="tests.test_end_to_end" name="test_b[order]" time="2.5"/>
 <testcase classname="tests.center.test_why" name="test_c" time="10.0"><skipped message="x"/></testcase>
 <testcase classname="tests.center.test_why.TestGrouped" name="test_d" time="5.0"/>
</testsuite></testsuites>
"""
DURATIONS_TEXT = """============================= slowest durations ==============================
480.50s setup    tests/test_end_to_end.py::test_a
2.50s call     tests/test_end_to_end.py::test_b[order]
10.00s call     tests/center/test_why.py::test_c
5.00s teardown tests/center/test_why.py::TestGrouped::test_d
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
"""
EXPECTED = {"tests/test_end_to_end.py": 483.0, "tests/center/test_why.py": 15.0}


def test_both_reports_give_each_modules_seconds(tmp_path: Path) -> None:
    (tmp_path / "junit.xml").write_text(JUNIT)
    (tmp_path / "durations.txt").write_text(DURATIONS_TEXT)
    assert update_durations.read_report(tmp_path / "junit.xml") == EXPECTED
    assert update_durations.read_report(tmp_path / "durations.txt") == EXPECTED


def test_the_file_lists_modules_longest_first(tmp_path: Path) -> None:
    (tmp_path / "junit.xml").write_text(JUNIT)
    output = tmp_path / "durations.json"
    assert update_durations.main([str(tmp_path / "junit.xml"), "--note", "test", "--output", str(output)]) == 0
    document = json.loads(output.read_text())
    assert list(document["modules"].items()) == [
        ("tests/test_end_to_end.py", 483.0),
        ("tests/center/test_why.py", 15.0),
    ]
    assert document["total_seconds"] == 498.0

    (tmp_path / "why.txt").write_text("20.00s call     tests/center/test_why.py::test_c\n")
    update_durations.main([str(tmp_path / "junit.xml"), str(tmp_path / "why.txt"), "--output", str(output)])
    assert json.loads(output.read_text())["modules"]["tests/center/test_why.py"] == 20.0  # the later report's


def test_a_report_without_timings_is_refused_by_name(tmp_path: Path) -> None:
    empty = tmp_path / "pytest.log"
    empty.write_text("no tests ran\n")
    with pytest.raises(SystemExit, match="pytest.log holds no test timings"):
        update_durations.read_report(empty)
    with pytest.raises(SystemExit, match="no pytest report at"):
        update_durations.read_report(tmp_path / "absent.xml")


def test_the_suite_orders_its_modules_by_the_recorded_seconds(request: pytest.FixtureRequest) -> None:
    recorded = json.loads(DURATIONS.read_text())["modules"]
    assert recorded, "tests/durations.json lists no module"
    root = request.config.rootpath
    order = list(dict.fromkeys(item.path.relative_to(root).as_posix() for item in request.session.items))
    known = [module for module in order if module in recorded]
    assert [recorded[m] for m in known] == sorted((recorded[m] for m in known), reverse=True)
    # a module the file does not know yet runs before every one it knows
    assert order[len(order) - len(known) :] == known
