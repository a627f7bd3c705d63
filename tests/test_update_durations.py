"""The worker order of ``make test`` comes from measured seconds: ``tests/support/update_durations.py`` sums each
module's setup, call and teardown from pytest's own reports (JUnit XML or ``--durations=0``), and the suite starts the
longest groups first (after those not measured yet): a module is a worker's unit of its own, but for the modules
sharing the example warehouse, one unit whose seconds count together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tests.conftest as suite
from tests.conftest import DURATIONS, group_of
from tests.support import update_durations
from tests.support.warehouse import GROUP

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


def test_the_suite_orders_its_groups_by_the_recorded_seconds(request: pytest.FixtureRequest) -> None:
    recorded = json.loads(DURATIONS.read_text())["modules"]
    assert recorded, "tests/durations.json lists no module"
    root = request.config.rootpath
    modules = [item.path.relative_to(root).as_posix() for item in request.session.items]
    groups = [group_of(module) for module in modules]
    runs = [g for n, g in enumerate(groups) if n == 0 or groups[n - 1] != g]
    assert len(runs) == len(set(runs)), "a group's tests are split"
    seconds: dict[str, float] = {}
    for module in set(modules):
        seconds[group_of(module)] = seconds.get(group_of(module), 0.0) + recorded.get(module, float("inf"))
    known = [g for g in runs if seconds[g] != float("inf")]
    assert [seconds[g] for g in known] == sorted((seconds[g] for g in known), reverse=True)
    # a group the file does not know yet runs before every one it knows
    assert runs[len(runs) - len(known) :] == known


class _Item:
    """What the suite's ordering reads of a collected test."""

    def __init__(self, path: Path) -> None:
        self.path, self.fixturenames = path, ()


def test_a_group_runs_together_its_modules_seconds_added(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = request.config.rootpath
    seconds = {"tests/test_long.py": 500.0, "tests/test_a.py": 300.0, "tests/test_b.py": 250.0, "tests/test_c.py": 9.0}
    monkeypatch.setattr(suite, "module_seconds", lambda: seconds)
    monkeypatch.setattr(suite, "GROUPS", {"tests/test_a.py": "shared", "tests/test_b.py": "shared"})
    c, a1, long, b, a2, new = (_Item(root / f"tests/test_{name}.py") for name in ("c", "a", "long", "b", "a", "new"))
    items = [c, a1, long, b, a2, new]
    suite.pytest_collection_modifyitems(request.config, items)  # type: ignore[arg-type]
    # the module not measured first, then the shared group (550 s in all, its longer module first), then 500 s, 9 s
    assert items == [new, a1, a2, b, long, c]


def test_a_worker_runs_a_module_at_once_and_the_example_warehouses_modules_together(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(request.config.option, "dist", "loadfile")
    monkeypatch.setattr(request.config.option, "tx", ["2*popen"], raising=False)
    scheduler = suite.pytest_xdist_make_scheduler(request.config, None)
    units = {
        nodeid: scheduler._split_scope(nodeid)
        for nodeid in (
            "tests/test_end_to_end.py::test_tables_are_valid_delta",
            "tests/test_taint_end_to_end.py::test_apply_marked_exactly_what_was_built_from_the_hour",
            "tests/test_backfill.py::test_each_table_runs_its_range_in_one_run",
            "tests/center/test_why.py::TestGrouped::test_d[x]",
        )
    }
    assert list(units.values()) == [GROUP, GROUP, GROUP, "tests/center/test_why.py"]
    monkeypatch.setattr(request.config.option, "dist", "load")
    assert suite.pytest_xdist_make_scheduler(request.config, None) is None  # xdist's own
