"""Shared fixtures: one Spark session for the whole test session, temporary lakes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance, instance_for_test
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources import spark as spark_resources
from resources.delta_lake import DeltaStore
from resources.spark import stop_session

os.environ.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")
# tests are written for the default warehouse start (2026-01-01); a developer's own value must not leak in
os.environ.pop("WAREHOUSE_START", None)


# `make test` runs two xdist workers, a module per worker at a time (--dist loadfile): the longest modules start
# first so that the two finish together (their setup is most of the suite's time; durations from CI).
LONGEST_FIRST = (
    "test_end_to_end.py",  # ~470 s: a simulated January through every table
    "test_embedded_stack.py",  # ~380 s: `warehouse dev` and the browser
    "test_backfill.py",  # ~350 s
    "test_taint_end_to_end.py",  # ~270 s: eight simulated days built, one bad hour tainted and repaired
    "test_postgres.py",  # ~210 s
    "test_spark_cluster.py",  # ~190 s
    "test_warm_launcher.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a test that asks for the Spark session is in the `spark` tier however its module is marked
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


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
def consolidated(tmp_path: Path) -> Iterator[DagsterInstance]:
    """A test instance with one SQLite event log: the same reads, without a database created per run (about 1 s
    each on a loaded 2-core machine), so that long histories stay quick to write."""
    (tmp_path / "home").mkdir()
    storage = {"module": "dagster._core.storage.event_log", "class": "ConsolidatedSqliteEventLogStorage"}
    overrides = {"event_log_storage": {**storage, "config": {"base_dir": str(tmp_path / "home" / "events")}}}
    with instance_for_test(temp_dir=str(tmp_path / "home"), overrides=overrides) as instance:
        yield instance
