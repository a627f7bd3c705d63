"""The dependency center's face in Dagster: the ``dependency_center`` sensor targets the engine-driven tables and its
ticks read the engine's heartbeat; an engine that never ran, stopped or hangs makes the tick fail (the daemon records
an exception raised by a sensor as a failed tick), saying since when."""

from __future__ import annotations

import threading
import time

import pytest
from dagster import AssetKey, DagsterInstance, DefaultSensorStatus, SkipReason, build_sensor_context

from sensors.center import build_dependency_center_sensor
from tests.center.test_engine_scale import Recorder
from warehouse_assets.build.compiler import max_partitions_per_run
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.center import heartbeat
from warehouse_assets.center.engine import assemble_engine
from warehouse_assets.center.heartbeat import SENSOR_NAME, EngineDown, Heartbeat
from warehouse_assets.definitions import build_definitions


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def _tick(catalog: Catalog, instance: DagsterInstance) -> str:
    result = build_dependency_center_sensor(catalog)(build_sensor_context(instance=instance))
    assert isinstance(result, SkipReason)  # it never requests a run itself: the engine's runs name it
    return str(result.skip_message)


def test_the_sensor_targets_every_table_the_engine_builds(catalog: Catalog) -> None:
    """So that each engine-driven asset's Automation tab names it."""
    defs = build_definitions(catalog)
    sensor = defs.resolve_sensor_def(SENSOR_NAME)  # in the code location, running by default like the others
    assert sensor.default_status == DefaultSensorStatus.RUNNING
    assert sensor.asset_selection is not None
    selected = sensor.asset_selection.resolve(defs.resolve_asset_graph())
    assert selected == {AssetKey(t.key) for t in catalog.derived()}


def test_the_ticks_show_a_running_engine_and_fail_once_it_stopped(
    catalog: Catalog, consolidated: DagsterInstance
) -> None:
    instance = consolidated
    with pytest.raises(EngineDown, match="has never run against this instance"):
        _tick(catalog, instance)

    stop = threading.Event()

    def engine() -> None:  # its state store is SQLite: made, run and closed in one thread, as `warehouse engine`
        running = assemble_engine(instance, catalog, Recorder(), max_partitions_per_run)
        try:
            running.run(stop, 0.05)
        finally:
            running.close()

    loop = threading.Thread(target=engine)
    loop.start()
    try:
        deadline = time.monotonic() + 60
        while heartbeat.read(instance) is None:
            assert loop.is_alive(), "the engine stopped"
            assert time.monotonic() < deadline, "the engine wrote no heartbeat"
            time.sleep(0.05)
        message = _tick(catalog, instance)
    finally:
        stop.set()
        loop.join()
    assert message.startswith("engine alive (pid "), message
    assert "cursor 0 event(s) behind the log; backlog 0 candidate(s); 0 run(s) to submit" in message

    with pytest.raises(EngineDown, match=r"the engine stopped at .*: nothing starts derived partitions"):
        _tick(catalog, instance)


def test_a_heartbeat_gone_quiet_fails_the_tick(catalog: Catalog, consolidated: DagsterInstance) -> None:
    now = time.time()
    heartbeat.beat(consolidated, Heartbeat(at=now - 300, started_at=now - 900, cursor=4))
    with pytest.raises(EngineDown, match=r"no heartbeat from the engine for 30\d s .*: it died or hangs"):
        _tick(catalog, consolidated)
