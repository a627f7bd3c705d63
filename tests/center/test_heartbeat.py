"""The dependency center's face in Dagster: the ``dependency_center`` sensor targets the engine-driven tables and its
ticks read the engine's heartbeat; an engine that never ran, stopped or hangs makes the tick fail (the daemon records
an exception raised by a sensor as a failed tick), saying since when."""

from __future__ import annotations

import re
import threading
import time

import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRun,
    DefaultSensorStatus,
    SensorEvaluationContext,
    SensorResult,
)

from sensors.center import build_dependency_center_sensor
from tests.center.test_engine_scale import Recorder
from warehouse_assets.catalog import Catalog, business_time, load_catalog
from warehouse_assets.center import heartbeat
from warehouse_assets.center.engine import assemble_engine
from warehouse_assets.center.heartbeat import SENSOR_NAME, EngineDown, Heartbeat
from warehouse_assets.definitions import build_definitions
from warehouse_assets.materialize.compiler import max_partitions_per_run


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


END = r"\d\d:\d\d:\d\d[+-]\d\d:\d\d"  # where the seconds a tick counted end, in the business zone
WINDOW = rf"\d\d:\d\d:\d\d–{END}"


def _evaluate(
    catalog: Catalog, instance: DagsterInstance, previous_tick: float | None = None, cursor: str | None = None
) -> SensorResult:
    """One tick: ``previous_tick`` and ``cursor`` as the daemon passes them, the previous tick's start and line."""
    context = SensorEvaluationContext(
        instance_ref=None, instance=instance, last_tick_completion_time=previous_tick, cursor=cursor
    )
    result = build_dependency_center_sensor(catalog)(context)
    assert isinstance(result, SensorResult)
    assert not result.run_requests and result.skip_reason is not None  # the engine's runs name it, it requests none
    return result


def _tick(catalog: Catalog, instance: DagsterInstance) -> str:
    return str(_evaluate(catalog, instance).skip_reason.skip_message)  # type: ignore[union-attr]


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
    assert re.match(rf"0 runs launched {WINDOW}; engine alive \(pid ", message), message
    assert "cursor 0 event(s) behind the log; backlog 0 candidate(s); 0 run(s) to submit" in message

    with pytest.raises(EngineDown, match=r"the engine stopped at .*: nothing starts derived partitions"):
        _tick(catalog, instance)


def test_a_heartbeat_gone_quiet_fails_the_tick(catalog: Catalog, consolidated: DagsterInstance) -> None:
    now = time.time()
    heartbeat.beat(consolidated, Heartbeat(at=now - 300, started_at=now - 900, cursor=4))
    with pytest.raises(EngineDown, match=r"no heartbeat from the engine for 30\d s .*: it died or hangs"):
        _tick(catalog, consolidated)


def _engine_run(instance: DagsterInstance) -> None:
    """A run as the engine launches it: "Launched by" its sensor."""
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", tags={"dagster/sensor_name": SENSOR_NAME}))


def test_each_tick_says_in_the_tick_list_what_the_engine_launched_since_the_previous_one(
    catalog: Catalog, consolidated: DagsterInstance
) -> None:
    """The tick list shows a skipped tick as "0 runs requested" (the sensor's own requests) and its cursor in a column
    of its own, up to 95 characters: the cursor is the runs the engine launched in the seconds it names and its
    heartbeat in short, the skip reason (shown when the tick is hovered) and the tick's log the whole heartbeat."""
    instance = consolidated
    now = time.time()
    heartbeat.beat(instance, Heartbeat(at=now - 2, started_at=now - 600, pending=3, submitted=5))
    instance.add_run(DagsterRun(job_name="why_waiting"))  # launched by hand: not the engine's
    for _ in range(2):
        _engine_run(instance)
    _next_second()
    first = _evaluate(catalog, instance)  # the sensor's first tick: since the engine started
    assert first.cursor is not None
    started = business_time(now - 600, "seconds")[11:19]
    assert re.fullmatch(rf"2 runs launched {started}–{END}; engine alive, beat \d+ s ago, 3 to submit", first.cursor)
    message = first.skip_reason.skip_message  # type: ignore[union-attr]
    assert message.startswith(first.cursor.split(";")[0] + "; engine alive (pid "), message
    assert "5 submitted since start" in message

    for _ in range(3):
        _engine_run(instance)
    _next_second()
    later = _evaluate(catalog, instance, time.time() - 60, first.cursor)
    assert later.cursor is not None and re.match(rf"3 runs launched {WINDOW}; engine alive", later.cursor), later.cursor
    # the window starts where the previous one ended
    assert later.cursor.split("launched ")[1][:8] == first.cursor.split("–")[1][:8]
    assert len(later.cursor) <= 95
    quiet = _evaluate(catalog, instance, time.time(), later.cursor)
    assert quiet.cursor is not None and quiet.cursor.startswith("0 runs launched ")

    heartbeat.beat(instance, Heartbeat(at=time.time(), started_at=now - 600, failing="the webserver refuses: 502"))
    failing = _evaluate(catalog, instance, time.time(), quiet.cursor)
    assert failing.cursor is not None and len(failing.cursor) <= 95
    assert re.fullmatch(
        rf"0 runs launched {WINDOW}; engine FAILING \(hover\), beat \d+ s ago, 0 to submit", failing.cursor
    )
    assert "failing: the webserver refuses: 502" in failing.skip_reason.skip_message  # type: ignore[union-attr]


def test_a_run_launched_while_a_tick_is_evaluated_is_counted_by_one_tick_only(
    catalog: Catalog, consolidated: DagsterInstance
) -> None:
    """The daemon tells a tick when the previous one started, before it was evaluated; a run the engine launched in
    between is counted by the tick that read it, and by no other: the ticks' counts add up to the runs launched."""
    instance = consolidated
    heartbeat.beat(instance, Heartbeat(at=time.time(), started_at=time.time() - 600))
    ticks: list[SensorResult] = []
    previous_start: float | None = None
    for launched in (2, 0, 3):
        start = time.time()  # the daemon starts the tick; the engine launches runs a second later; it is evaluated
        _next_second()
        for _ in range(launched):
            _engine_run(instance)
        ticks.append(_evaluate(catalog, instance, previous_start, ticks[-1].cursor if ticks else None))
        previous_start = start
    _next_second()
    ticks.append(_evaluate(catalog, instance, previous_start, ticks[-1].cursor))  # the runs of the tick's own second
    counted = [int(str(t.cursor).split(" ")[0]) for t in ticks]
    assert sum(counted) == 5, [t.cursor for t in ticks]


def _next_second() -> None:
    """Wait into the next whole second: the ticks count whole seconds, a run launched in a tick's own second is counted
    by the next one."""
    time.sleep(1.0 - time.time() % 1.0 + 0.01)


def test_a_beat_written_just_after_the_tick_read_its_clock_is_zero_seconds_old(consolidated: DagsterInstance) -> None:
    now = time.time()
    heartbeat.beat(consolidated, Heartbeat(at=now + 0.004, started_at=now - 600, pending=1))
    tick = heartbeat.tick_text(consolidated, None, now=now)
    assert re.fullmatch(rf"0 runs launched {WINDOW}; engine alive, beat 0 s ago, 1 to submit", tick.line)
    assert "last beat 0 s ago" in heartbeat.engine_status(consolidated, now)
