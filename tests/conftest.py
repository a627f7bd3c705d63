"""Shared fixtures: one Spark session for the whole test session, temporary lakes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, instance_for_test
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources import spark as spark_resources
from resources.delta_lake import DeltaStore
from resources.spark import stop_session
from tests.support.instances import memory_backed_dir, one_event_log
from tests.support.jvm import SESSION_JIT
from tests.support.warehouse import GROUP as WAREHOUSE_GROUP
from tests.support.warehouse import MODULES as WAREHOUSE_MODULES
from tests.support.warehouse import example_warehouse  # noqa: F401 - the session's example warehouse, once

os.environ.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")
# the Spark sessions Python starts here and in the processes tests start (each worker's, shared by every Spark test,
# and the headless runs' drivers) are compiled by C1 alone (tests/support/jvm.py: a tenth less CPU for the same
# tests). PySpark's launcher reads this variable, java does not: a Spark Connect server or cluster JVM a test starts
# keeps its own options
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-java-options '{SESSION_JIT}' pyspark-shell")
# tests are written for the default warehouse start (2026-01-01); a developer's own value must not leak in
os.environ.pop("WAREHOUSE_START", None)


@pytest.fixture(autouse=True)
def _warehouse_start_kept() -> Iterator[None]:
    """A command run in process adopts the start of its simulated landing area into this process's environment, as
    it does for the processes it starts: undone after each test, so that a later module's stack, started by the same
    worker, does not inherit another test's start."""
    before = os.environ.get("WAREHOUSE_START")
    yield
    if before is None:
        os.environ.pop("WAREHOUSE_START", None)
    else:
        os.environ["WAREHOUSE_START"] = before


# `make test` runs two xdist workers, a module per worker at a time (`--dist loadfile`), but for the modules that
# share a session fixture too costly to build twice: those run on one worker, one after the other (the scheduler
# below). xdist's own `--dist loadgroup` would do it from `xdist_group` marks, but pytest 9.2's node ids no longer
# carry the group it appends to them (pytest-dev/pytest-xdist#1386): every test is then scheduled on its own.
# The longest groups start first so that the two workers finish together. The seconds are measured, not guessed:
# tests/durations.json, written from a whole run's timing report by tests/support/update_durations.py. A module it
# does not know yet runs first: of unknown length, it is safer at the start than at the end, where a long one would
# keep one worker going alone.
DURATIONS = Path(__file__).with_name("durations.json")
# module -> its group, for the modules sharing the example warehouse of tests/support/warehouse.py
GROUPS = {module: WAREHOUSE_GROUP for module in WAREHOUSE_MODULES}


def module_seconds() -> dict[str, float]:
    if not DURATIONS.is_file():
        return {}
    return {module: float(s) for module, s in json.loads(DURATIONS.read_text())["modules"].items()}


def group_of(module: str) -> str:
    """The unit a worker runs at once that ``module`` (its path from the root) belongs to: its group, else itself."""
    return GROUPS.get(module, module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, a group of modules being one file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(super()._split_scope(nodeid))

    return GroupedFiles(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a test that asks for the Spark session is in the `spark` tier however its module is marked
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    seconds = module_seconds()
    root = config.rootpath
    modules = {item: item.path.relative_to(root).as_posix() for item in items}
    group_seconds: dict[str, float] = {}
    for module in set(modules.values()):
        group_seconds[group_of(module)] = group_seconds.get(group_of(module), 0.0) + seconds.get(module, float("inf"))

    def longest_first(item: pytest.Item) -> tuple[float, str, float]:
        # a group's modules together, the longest group first, and in it the longest module first
        module = modules[item]
        return -group_seconds[group_of(module)], group_of(module), -seconds.get(module, float("inf"))

    items.sort(key=longest_first)  # stable: a module's tests keep their order


@pytest.fixture(autouse=True)
def _pure_tests_start_no_spark(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unmarked tier is what `make test-fast` runs: a test that starts Spark there fails, naming its marker."""
    if request.node.get_closest_marker("spark") or request.node.get_closest_marker("stack"):
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{request.node.nodeid} starts Spark: mark it `@pytest.mark.spark`")

    monkeypatch.setattr(spark_resources, "get_session", refuse)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # the same configuration the resources use, so assets materialized in tests share this session
    session = resources_from_env({})["spark"].session()
    yield session
    stop_session()


@pytest.fixture
def store(tmp_path: Path) -> DeltaStore:
    return DeltaStore(str(tmp_path / "lake"))


@pytest.fixture
def consolidated() -> Iterator[DagsterInstance]:
    """A test instance with one SQLite event log, in memory-backed storage (tests/support/instances.py): the same
    reads, without a database created per run or a disk sync per commit, so that long histories stay quick to
    write."""
    with (
        memory_backed_dir("instance-") as home,
        instance_for_test(temp_dir=str(home), overrides=one_event_log(home)) as instance,
    ):
        yield instance
