"""Freshness SLAs per partition: the ``freshness_slas`` sensor judges each partition once its deadline passes.

Times are pinned (Asia/Shanghai): the sensor's clock is injected, materializations are reported under
``freeze_time``; the sensor's check evaluations are then stored the way the daemon stores them.
"""

import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    AssetSelection,
    BackfillPolicy,
    DagsterInstance,
    Definitions,
    MaterializeResult,
    SensorResult,
    asset,
    build_sensor_context,
    define_asset_job,
    instance_for_test,
)
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.test_utils import freeze_time

from resources.landing import LandingResource
from resources.settings import Settings
from sensors.freshness import build_freshness_sensor
from warehouse_assets.catalog import BY_PERIOD, Catalog, load_catalog
from warehouse_assets.definitions import defs
from warehouse_assets.materialize.freshness import build_freshness_check, deadline, judge_now

TZ = ZoneInfo("Asia/Shanghai")
CATALOG = load_catalog()


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=TZ)


def subset(*fqns: str) -> Catalog:
    return Catalog({fqn: CATALOG[fqn] for fqn in fqns})


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as inst:
        yield inst


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    return tmp_path / "landing"


class Clock:
    def __init__(self) -> None:
        self.now = at(1, 0)

    def __call__(self) -> datetime:
        return self.now


def materialize(instance: DagsterInstance, fqn: str, partition: str, when: datetime) -> None:
    with freeze_time(when):
        instance.report_runless_asset_event(AssetMaterialization(AssetKey(fqn.split(".")), partition=partition))


def horizon_hours(hours: float) -> Settings:
    """The settings with ``WAREHOUSE_FRESHNESS_HORIZON_HOURS`` set (the others default)."""
    return Settings.from_env({"WAREHOUSE_FRESHNESS_HORIZON_HOURS": str(hours)})


class Sensor:
    """Ticks the sensor like the daemon: keeps its cursor and stores the evaluations it emits."""

    def __init__(
        self, instance: DagsterInstance, catalog: Catalog, clock: Clock, landing: Path, settings: Settings | None = None
    ) -> None:
        self.instance, self.catalog, self.clock, self.landing = instance, catalog, clock, landing
        self.settings = settings or Settings()  # the defaults, or what a test sets
        self.cursor: str | None = None

    def tick(self, now: datetime) -> list[AssetCheckEvaluation]:
        self.clock.now = now
        # a fresh definition each tick: a restarted daemon
        sensor = build_freshness_sensor(self.catalog, self.clock, self.settings)
        context = build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources={"landing": LandingResource(root=str(self.landing))}
        )
        result = sensor(context)
        assert isinstance(result, SensorResult)
        self.cursor = result.cursor
        events = [e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)]
        assert len(events) == len(result.asset_events)
        for event in events:
            with freeze_time(now):
                self.instance.report_runless_asset_event(event)
        return events


def land(landing: Path, stream: str, start: datetime, end: datetime, at: datetime | None = None) -> None:
    """CDC segments (5 minutes, empty) of one shard from ``start`` to ``end``, numbered on from the last one.
    Each lands one minute after its window (a live source), or all at ``at`` (a backlog delivered at once)."""
    database, table = stream.split(".")
    directory = landing / "binlog" / database / table
    directory.mkdir(parents=True, exist_ok=True)
    seq = len(list(directory.iterdir()))
    window = start
    while window < end:
        seq += 1
        path = directory / f"{seq:06d}-{window:%Y%m%dT%H%M}.jsonl"
        path.touch()
        landed = (at or window + timedelta(minutes=6)).timestamp()
        os.utime(path, (landed, landed))
        window += timedelta(minutes=5)


def summary(events: list[AssetCheckEvaluation]) -> list[tuple[str, str, bool]]:
    return [(".".join(e.asset_key.path), str(e.partition), e.passed) for e in events]


def meta(event: AssetCheckEvaluation) -> dict[str, object]:
    return {k: v.value for k, v in event.metadata.items()}


def status(instance: DagsterInstance, fqn: str) -> dict[str, AssetCheckExecutionRecordStatus]:
    key = AssetCheckKey(AssetKey(fqn.split(".")), "freshness")
    return {
        str(info.partition_key): info.latest_execution_status
        for info in instance.event_log_storage.get_asset_check_partition_info([key])
    }


def test_deadlines_follow_the_declared_slas() -> None:
    for table in CATALOG.ods():
        assert table.sla is not None, f"{table.fqn} declares no freshness SLA"
        assert deadline(table, "2026-03-05-10:00") == at(5, 12, 15)  # window end 11:00 + 1h + 15m grace
    for fqn in ("ads.daily_gmv", "ads.marketing_roi"):
        assert deadline(CATALOG[fqn], "2026-03-05") == at(6, 9)  # 09:00 the next morning


def test_every_sla_compiles_to_a_non_blocking_partitioned_check() -> None:
    graph = defs.resolve_asset_graph()
    with_sla = {t.fqn for t in CATALOG if t.sla is not None}
    assert {"ads.daily_gmv", "ads.marketing_roi"} | {t.fqn for t in CATALOG.ods()} <= with_sla
    freshness = {".".join(k.asset_key.path) for k in graph.asset_check_keys if k.name == "freshness"}
    assert freshness == with_sla
    # and to its early warning, reported by the sla_forecast sensor
    assert {".".join(k.asset_key.path) for k in graph.asset_check_keys if k.name == "sla_forecast"} == with_sla
    for fqn in with_sla:
        for name in ("freshness", "sla_forecast"):
            node = graph.get(AssetCheckKey(AssetKey(fqn.split(".")), name))
            assert not node.blocking
            assert node.partitions_def is not None
            assert node.partitions_def == graph.get(AssetKey(fqn.split("."))).partitions_def
    sensor = next(s for s in defs.sensors or [] if s.name == "freshness_slas")
    assert sensor.minimum_interval_seconds == 60


def test_ods_hours_pass_or_fail_once_their_deadline_passes(
    instance: DagsterInstance, landing: Path, monkeypatch
) -> None:
    sensor = Sensor(instance, subset("ods.order"), Clock(), landing, horizon_hours(0.5))
    materialize(instance, "ods.order", "2026-03-05-10:00", at(5, 11, 40))  # due 12:15: on time

    # before the deadline nothing is judged, materialized or not
    assert sensor.tick(at(5, 12, 14)) == []

    # 12:15: the 10:00 hour is due and was there at 11:40
    events = sensor.tick(at(5, 12, 15))
    assert summary(events) == [("ods.order", "2026-03-05-10:00", True)]
    assert meta(events[0])["deadline"] == "2026-03-05T12:15:00+08:00"
    assert meta(events[0])["materialized_at"] == "2026-03-05T11:40:00+08:00"
    assert meta(events[0])["slack_minutes"] == 35.0
    assert meta(events[0])["lateness_minutes"] == 0.0

    # a second tick (and a restart: every tick is a fresh sensor definition on the saved cursor) repeats nothing
    assert sensor.tick(at(5, 12, 15)) == []
    assert sensor.tick(at(5, 13, 14)) == []

    # 13:16: the 11:00 hour (due 13:15) never arrived — a failure with how late it is
    events = sensor.tick(at(5, 13, 16))
    assert summary(events) == [("ods.order", "2026-03-05-11:00", False)]
    assert meta(events[0])["deadline"] == "2026-03-05T13:15:00+08:00"
    assert meta(events[0])["late_by_minutes"] == 1.0
    assert meta(events[0])["materialized"] is False
    assert status(instance, "ods.order") == {
        "2026-03-05-10:00": AssetCheckExecutionRecordStatus.SUCCEEDED,
        "2026-03-05-11:00": AssetCheckExecutionRecordStatus.FAILED,
    }
    assert sensor.tick(at(5, 13, 30)) == []

    # the 11:00 hour arrives at 13:45: the verdict stands (one per partition; the miss is the record)
    materialize(instance, "ods.order", "2026-03-05-11:00", at(5, 13, 45))
    assert sensor.tick(at(5, 13, 50)) == []
    assert status(instance, "ods.order")["2026-03-05-11:00"] == AssetCheckExecutionRecordStatus.FAILED

    # the 12:00 hour (due 14:15) arrives at 14:30, before the sensor looks again: a miss, with its lateness
    materialize(instance, "ods.order", "2026-03-05-12:00", at(5, 14, 30))
    events = sensor.tick(at(5, 14, 40))
    assert summary(events) == [("ods.order", "2026-03-05-12:00", False)]
    assert meta(events[0])["lateness_minutes"] == 15.0
    assert meta(events[0])["materialized_at"] == "2026-03-05T14:30:00+08:00"
    assert sensor.tick(at(5, 14, 41)) == []

    # one evaluation per partition in the instance, shown per partition
    key = AssetCheckKey(AssetKey(["ods", "order"]), "freshness")
    for partition in ("2026-03-05-10:00", "2026-03-05-11:00", "2026-03-05-12:00"):
        history = instance.event_log_storage.get_asset_check_execution_history(
            key, limit=10, partition_filter=PartitionKeyFilter(key=partition)
        )
        assert len(history) == 1, partition
    assert status(instance, "ods.order") == {
        "2026-03-05-10:00": AssetCheckExecutionRecordStatus.SUCCEEDED,
        "2026-03-05-11:00": AssetCheckExecutionRecordStatus.FAILED,
        "2026-03-05-12:00": AssetCheckExecutionRecordStatus.FAILED,
    }


def test_a_lost_cursor_repeats_nothing(instance: DagsterInstance, landing: Path, monkeypatch) -> None:
    sensor = Sensor(instance, subset("ods.order"), Clock(), landing, horizon_hours(3))
    # the source delivered every hour in time: what the first tick finds missing is a miss of the warehouse's
    land(landing, "edu_trade.order_00", at(5, 0), at(5, 12))
    materialize(instance, "ods.order", "2026-03-05-09:00", at(5, 10, 30))
    # deadlines in (09:15, 12:15]: the hours 07:00 .. 10:00 (due 09:15 excluded, 10:15, 11:15, 12:15)
    first = sensor.tick(at(5, 12, 15))
    assert summary(first) == [
        ("ods.order", "2026-03-05-08:00", False),
        ("ods.order", "2026-03-05-09:00", True),
        ("ods.order", "2026-03-05-10:00", False),
    ]
    sensor.cursor = None  # the cursor is lost; the instance still knows what was judged
    assert summary(sensor.tick(at(5, 13, 15))) == [("ods.order", "2026-03-05-11:00", False)]


def test_ads_days_are_due_at_nine_the_next_morning(instance: DagsterInstance, landing: Path, monkeypatch) -> None:
    sensor = Sensor(instance, subset("ads.daily_gmv", "ads.marketing_roi"), Clock(), landing, horizon_hours(1))
    materialize(instance, "ads.daily_gmv", "2026-03-04", at(5, 8, 30))
    assert sensor.tick(at(5, 8, 59)) == []
    events = sensor.tick(at(5, 9, 0))
    assert summary(events) == [("ads.daily_gmv", "2026-03-04", True), ("ads.marketing_roi", "2026-03-04", False)]
    assert meta(events[0])["slack_minutes"] == 30.0
    assert meta(events[1])["deadline"] == "2026-03-05T09:00:00+08:00"
    assert meta(events[1])["late_by_minutes"] == 0.0
    assert sensor.tick(at(5, 9, 1)) == []
    # the next day: daily_gmv present at 09:00, marketing_roi still missing
    materialize(instance, "ads.daily_gmv", "2026-03-05", at(6, 7, 5))
    events = sensor.tick(at(6, 9, 30))
    assert summary(events) == [("ads.daily_gmv", "2026-03-05", True), ("ads.marketing_roi", "2026-03-05", False)]
    assert meta(events[1])["late_by_minutes"] == 30.0
    assert status(instance, "ads.marketing_roi") == {
        "2026-03-04": AssetCheckExecutionRecordStatus.FAILED,
        "2026-03-05": AssetCheckExecutionRecordStatus.FAILED,
    }


def test_first_tick_looks_back_only_the_horizon(instance: DagsterInstance, landing: Path, monkeypatch) -> None:
    sensor = Sensor(instance, subset("ods.order"), Clock(), landing)  # default horizon: 48 hours
    land(landing, "edu_trade.order_00", at(1, 0), at(5, 12))  # delivered in time since 03-01, never reported
    events = sensor.tick(at(5, 12, 14))
    # deadlines in (03-03 12:14, 03-05 12:14]: the hours 03-03 10:00 .. 03-05 09:00, never back to 2026-01-01
    keys = [e.partition for e in events]
    assert len(keys) == 48
    assert keys[0] == "2026-03-03-10:00" and keys[-1] == "2026-03-05-09:00"
    assert not any(e.passed for e in events)


def test_a_first_start_over_a_backlog_judges_only_what_the_warehouse_could_have_met(
    instance: DagsterInstance, landing: Path, monkeypatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``make dev`` lands days of CDC history, then starts; a first tick that judged all of it would fail hundreds
    of partitions (one warning line each) the warehouse never had the data for. Only what it could have met is judged: a
    partition due before the sensor watched counts when its data was there by the deadline."""
    start = at(5, 12, 14)
    # ods.order: the source delivered live until 03-03 12:00, the rest of the backlog landed just before the
    # start; the other ODS tables have nothing yet
    land(landing, "edu_trade.order_00", at(3, 0), at(3, 12))
    land(landing, "edu_trade.order_00", at(3, 12), at(5, 12), at=start - timedelta(minutes=1))
    materialize(instance, "ods.order", "2026-03-03-12:00", at(3, 13))  # due 14:15: met
    # ads.daily_gmv 03-03: its input was built in the night, the day itself never (due 03-04 09:00)
    materialize(instance, "dws.user_order_daily", "2026-03-03", at(4, 2))
    sensor = Sensor(instance, CATALOG, Clock(), landing)  # default horizon: 48 hours

    capfd.readouterr()
    events = sensor.tick(start)
    assert sorted(summary(events)) == [
        ("ads.daily_gmv", "2026-03-03", False),  # its input was there from 02:00: a real miss
        ("ods.order", "2026-03-03-10:00", False),  # landed by 11:01, due 12:15, never reported: a real miss
        ("ods.order", "2026-03-03-11:00", False),
        ("ods.order", "2026-03-03-12:00", True),
    ]
    lines = [line.split(" - ", 3)[-1] for line in capfd.readouterr().err.splitlines() if "freshness SLA" in line]
    with_sla = [t.fqn for t in CATALOG if t.sla is not None]
    for fqn in with_sla:  # at most one line per table
        assert len([line for line in lines if line.startswith(f"{fqn} ")]) <= 1, lines
    assert len(lines) == len(with_sla), lines  # every table has its backlog summarized
    order = next(line for line in lines if line.startswith("ods.order "))
    assert "2 MISSED" in order and "1 met" in order and "45 not judged" in order, order

    # from now on the sensor watches: a deadline that passes without the partition is a miss, data or not
    events = sensor.tick(at(5, 13, 16))
    hours = ("2026-03-05-10:00", "2026-03-05-11:00")  # due 12:15 and 13:15, after the first tick
    assert sorted(summary(events)) == sorted((t.fqn, hour, False) for t in CATALOG.ods() for hour in hours)
    assert len([line for line in capfd.readouterr().err.splitlines() if "freshness SLA" in line]) == len(CATALOG.ods())


def test_executing_the_check_by_hand_judges_as_of_now(instance: DagsterInstance) -> None:
    table = CATALOG["ods.order"]
    materialize(instance, "ods.order", "2026-03-05-10:00", at(5, 11, 40))
    assert judge_now(instance, table, "2026-03-05-10:00", at(5, 12, 0)).passed  # on time already
    early = judge_now(instance, table, "2026-03-05-11:00", at(5, 12, 0))
    assert not early.passed and early.severity.value == "WARN"  # not due yet: a warning, not a miss
    missed = judge_now(instance, table, "2026-03-05-11:00", at(5, 13, 45))
    assert not missed.passed and missed.metadata["late_by_minutes"].value == 30.0


def _gmv_definitions() -> Definitions:
    """``ads.daily_gmv`` with its real freshness check and a stand-in body (no Spark): what a run of it includes."""
    table = CATALOG["ads.daily_gmv"]

    @asset(key=AssetKey(table.key), partitions_def=BY_PERIOD[table.period], backfill_policy=BackfillPolicy.single_run())
    def daily_gmv() -> MaterializeResult:
        return MaterializeResult()

    by_hand = define_asset_job(
        "freshness_by_hand", AssetSelection.checks(GMV_FRESHNESS), partitions_def=BY_PERIOD[table.period]
    )
    return Definitions(assets=[daily_gmv], asset_checks=[build_freshness_check(table)], jobs=[by_hand])


GMV_FRESHNESS = AssetCheckKey(AssetKey(["ads", "daily_gmv"]), "freshness")
RANGE = {"dagster/asset_partition_range_start": "2026-03-03", "dagster/asset_partition_range_end": "2026-03-04"}


def _records(instance: DagsterInstance, run_id: str) -> list[tuple[str | None, AssetCheckExecutionRecordStatus]]:
    history = instance.event_log_storage.get_asset_check_execution_history(GMV_FRESHNESS, limit=100)
    return sorted((r.partition, r.status) for r in history if r.run_id == run_id)


def test_runs_that_materialize_the_asset_pass_over_the_freshness_check(
    instance: DagsterInstance, landing: Path, monkeypatch
) -> None:
    """A ranged run (backfill, automation catch-up) or the UI's "Materialize" includes every check of the asset; a
    freshness check that read ``partition_key`` would fail the ranged run. Such runs succeed, record
    no freshness verdict, and the sensor still reports its one run-less verdict per partition afterwards."""
    job = _gmv_definitions().resolve_implicit_global_asset_job_def()
    key = AssetKey(["ads", "daily_gmv"])
    with freeze_time(at(5, 8)):  # 03-03 is already late (due 03-04 09:00), 03-04 on time (due 03-05 09:00)
        ranged = job.execute_in_process(instance=instance, asset_selection=[key], tags=RANGE, raise_on_error=False)
    with freeze_time(at(6, 8)):  # the UI's "Materialize" of one day, on time (due 03-06 09:00)
        single = job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key="2026-03-05", raise_on_error=False
        )
    for result in (ranged, single):
        assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert instance.get_materialized_partitions(key) == {"2026-03-03", "2026-03-04", "2026-03-05"}
    # the check was part of both runs (planned per partition), and neither judged anything
    planned = AssetCheckExecutionRecordStatus.PLANNED
    assert _records(instance, ranged.run_id) == [("2026-03-03", planned), ("2026-03-04", planned)]
    assert _records(instance, single.run_id) == [("2026-03-05", planned)]

    # the sensor's verdicts come at the deadlines, one run-less evaluation each (no UNIQUE conflict)
    sensor = Sensor(instance, subset("ads.daily_gmv"), Clock(), landing, horizon_hours(0.5))
    assert sensor.tick(at(3, 12)) == []  # watching since before the deadlines
    events = sensor.tick(at(5, 9))
    assert summary(events) == [("ads.daily_gmv", "2026-03-03", False), ("ads.daily_gmv", "2026-03-04", True)]
    assert summary(sensor.tick(at(6, 9))) == [("ads.daily_gmv", "2026-03-05", True)]
    assert status(instance, "ads.daily_gmv") == {
        "2026-03-03": AssetCheckExecutionRecordStatus.FAILED,
        "2026-03-04": AssetCheckExecutionRecordStatus.SUCCEEDED,
        "2026-03-05": AssetCheckExecutionRecordStatus.SUCCEEDED,
    }


def test_executing_the_check_by_hand_over_a_range_judges_each_partition(instance: DagsterInstance) -> None:
    """The check alone, from the UI, over two days: one verdict per partition (none recorded without one)."""
    materialize(instance, "ads.daily_gmv", "2026-03-03", at(4, 8))  # due 03-04 09:00: on time
    job = _gmv_definitions().resolve_job_def("freshness_by_hand")
    with freeze_time(at(5, 10)):  # 03-04 was due at 03-05 09:00 and never came
        result = job.execute_in_process(instance=instance, tags=RANGE)
    assert result.success
    assert _records(instance, result.run_id) == [
        ("2026-03-03", AssetCheckExecutionRecordStatus.SUCCEEDED),
        ("2026-03-04", AssetCheckExecutionRecordStatus.FAILED),
    ]
