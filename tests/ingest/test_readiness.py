"""ODS readiness (watermarks, ready hours, events) and the two sensors, on a small simulated landing."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    SensorResult,
    SkipReason,
    build_sensor_context,
    instance_for_test,
)
from dagster._core.test_utils import create_run_for_test
from pyspark.sql import SparkSession

import sensors.ods
from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.landing import Landing, LandingResource
from sensors.ods import build_landing_sensor, build_readiness_sensor
from simulator.cdc import SimulationConfig, simulate
from tests.center.test_state_store import report, taint
from tests.support.lake import row_dicts
from warehouse_assets.catalog import Catalog, Table, load_catalog
from warehouse_assets.ingest.job import build_ingest_job
from warehouse_assets.ingest.merge import ingest_table
from warehouse_assets.ingest.readiness import readiness, readiness_events, ready_hours, unreported_changes
from warehouse_assets.materialize.hour_checks import judge_hours
from warehouse_assets.materialize.validity import taint_times

TZ = ZoneInfo("Asia/Shanghai")
LAGGING = "edu_trade.order_03"


def hours(first: int, last: int) -> list[str]:
    return [f"2026-03-02-{h:02d}:00" for h in range(first, last + 1)]


# every ODS table is ingested; the order_03 shard stops two hours early (04:00), the others run to 06:00
EXPECTED_READY = {fqn: hours(0, 5) for fqn in ("ods.attendance", "ods.course", "ods.lesson", "ods.user")}
EXPECTED_READY["ods.order"] = hours(0, 3)


@dataclass
class Lake:
    catalog: Catalog
    landing: Landing
    store: DeltaStore  # every ODS table ingested
    empty: DeltaStore  # nothing ingested yet

    def resources(self, store: DeltaStore) -> dict[str, object]:
        return {"lake": DeltaLakeResource(root=store.root), "landing": LandingResource(root=str(self.landing.root))}


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Lake:
    root = tmp_path_factory.mktemp("readiness")
    config = SimulationConfig(scale=0.03, lag={"order_03": timedelta(hours=2)})
    simulate(root / "landing", datetime(2026, 3, 2), datetime(2026, 3, 2, 6), config)
    catalog, landing = load_catalog(), Landing(root / "landing")
    store = DeltaStore(str(root / "lake"))
    for table in catalog.ods():
        ingest_table(spark, store, landing, table)
    return Lake(catalog, landing, store, DeltaStore(str(root / "empty-lake")))


def test_the_watermark_is_held_back_by_the_lagging_shard(lake: Lake) -> None:
    order = readiness(lake.store, lake.landing, lake.catalog["ods.order"])
    assert len(order.streams) == 8
    assert order.first_hour == datetime(2026, 3, 2, 0, 0, tzinfo=TZ)
    assert order.watermark == datetime(2026, 3, 2, 4, 0, tzinfo=TZ)
    assert order.lagging[0].stream == LAGGING
    assert order.lagging[0].position == 48
    assert {s.watermark for s in order.lagging[1:]} == {datetime(2026, 3, 2, 6, 0, tzinfo=TZ)}
    assert ready_hours(order, None) == hours(0, 3)
    assert ready_hours(order, "2026-03-02-01:00") == hours(2, 3)
    assert ready_hours(order, "2026-03-02-03:00") == []

    user = readiness(lake.store, lake.landing, lake.catalog["ods.user"])
    assert user.watermark == datetime(2026, 3, 2, 6, 0, tzinfo=TZ)
    assert ready_hours(user, None) == hours(0, 5)


def test_nothing_is_ready_before_ingestion(lake: Lake) -> None:
    for table in lake.catalog.ods():
        state = readiness(lake.empty, lake.landing, table)
        assert state.streams and {s.position for s in state.streams} == {0}, table.fqn
        assert state.watermark is None
        assert ready_hours(state, None) == []
    assert readiness_events(lake.empty, lake.landing, lake.catalog, {}) == ([], {})


def test_readiness_events_report_each_hour_once(lake: Lake) -> None:
    events, cursor = readiness_events(lake.store, lake.landing, lake.catalog, {})
    reported: dict[str, list[str]] = {}
    for event in events:
        reported.setdefault(".".join(event.asset_key.path), []).append(str(event.partition))
    assert reported == EXPECTED_READY
    assert {fqn: c["last"] for fqn, c in cursor.items()} == {fqn: keys[-1] for fqn, keys in EXPECTED_READY.items()}

    assert readiness_events(lake.store, lake.landing, lake.catalog, cursor) == ([], cursor)

    # hours the instance already holds (reported by another path) are skipped, yet the cursor moves past them
    done = set(hours(0, 1))
    events, again = readiness_events(
        lake.store, lake.landing, lake.catalog, {}, lambda t: done if t.fqn == "ods.user" else set()
    )
    partitions = Counter(".".join(e.asset_key.path) for e in events)
    assert partitions["ods.user"] == 4 and partitions["ods.order"] == 4
    assert sorted(str(e.partition) for e in events if e.asset_key == AssetKey(["ods", "user"])) == hours(2, 5)
    assert again == cursor


def test_event_rows_are_the_rows_of_the_partition(lake: Lake) -> None:
    events, _ = readiness_events(lake.store, lake.landing, lake.catalog, {})
    counted = 0
    for event in events:
        table = lake.catalog[".".join(event.asset_key.path)]
        rows = row_dicts(lake.store.table_uri(table.key))
        start = datetime.strptime(str(event.partition), "%Y-%m-%d-%H:%M")
        expected = sum(1 for r in rows if (r["dt"], r["hh"]) == (f"{start:%Y-%m-%d}", f"{start:%H}"))
        assert event.metadata["rows"].value == expected, (table.fqn, event.partition)
        counted += expected
    assert counted > 0, "the simulation should put rows in some ready hour"


def test_landing_sensor_requests_a_run_when_segments_are_pending_and_skips_otherwise(lake: Lake) -> None:
    sensor = build_landing_sensor(lake.catalog, build_ingest_job(lake.catalog, judge_hours))
    with instance_for_test() as instance:
        pending = sensor.evaluate_tick(build_sensor_context(instance=instance, resources=lake.resources(lake.empty)))
        assert len(pending.run_requests) == 1
        request = pending.run_requests[0]
        assert request.run_key and request.run_key.startswith("ingest-")
        assert all(t.fqn in request.tags["warehouse/pending"] for t in lake.catalog.ods())
        # the same pending segments give the same run key: the instance launches them once
        again = sensor.evaluate_tick(build_sensor_context(instance=instance, resources=lake.resources(lake.empty)))
        assert again.run_requests[0].run_key == request.run_key

        done = sensor.evaluate_tick(build_sensor_context(instance=instance, resources=lake.resources(lake.store)))
        assert not done.run_requests
        assert done.skip_message == "no pending segments"

        create_run_for_test(instance, job_name="ods_ingest", status=DagsterRunStatus.STARTED)
        busy = sensor.evaluate_tick(build_sensor_context(instance=instance, resources=lake.resources(lake.empty)))
        assert not busy.run_requests
        assert busy.skip_message and "already" in busy.skip_message


def test_readiness_sensor_reports_ready_hours_once(lake: Lake) -> None:
    sensor = build_readiness_sensor(lake.catalog)
    with instance_for_test() as instance:
        # called directly: evaluate_tick would need the repository holding the ODS assets
        first = sensor(build_sensor_context(instance=instance, resources=lake.resources(lake.store)))
        assert isinstance(first, SensorResult)
        reported: dict[str, list[str]] = {}
        for event in first.asset_events:
            reported.setdefault(".".join(event.asset_key.path), []).append(str(event.partition))
        assert reported == EXPECTED_READY
        assert first.cursor is not None
        last = {fqn: c["last"] for fqn, c in json.loads(first.cursor).items()}
        assert last == {fqn: keys[-1] for fqn, keys in EXPECTED_READY.items()}

        context = build_sensor_context(instance=instance, cursor=first.cursor, resources=lake.resources(lake.store))
        second = sensor(context)
        assert isinstance(second, SkipReason)
        assert second.skip_message == "no ODS hour became ready"

        # before any ingestion the sensor reports nothing
        empty = sensor(build_sensor_context(instance=instance, resources=lake.resources(lake.empty)))
        assert isinstance(empty, SkipReason)


def test_readiness_sensor_leaves_the_hours_to_a_reingest_in_flight(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-ingest (the ``taint_repair`` job re-ingesting hours) merges an hour, then reports it: a readiness tick
    between the two would find the hour changed since its last report and report it too, a second materialization
    that is not the re-ingest's. The sensor waits while one is in flight, or starts during its tick; a taint run
    that re-ingests nothing does not hold it."""
    sensor = build_readiness_sensor(lake.catalog)

    def taint_run(instance: DagsterInstance, **config: object) -> str:
        ops = {"taint_and_repair": {"config": {"table": "ods.order", "start": "2026-03-02-01:00", **config}}}
        run = create_run_for_test(
            instance, job_name="taint_repair", status=DagsterRunStatus.STARTED, run_config={"ops": ops}
        )
        return run.run_id

    with instance_for_test() as instance:
        context = build_sensor_context(instance=instance, resources=lake.resources(lake.store))
        plan = taint_run(instance, reason="bad", apply=False)  # shows a plan: changes nothing in the lake
        assert isinstance(sensor(context), SensorResult)
        for config in ({"action": "reingest"}, {"reason": "bad", "apply": True, "reingest": True}):
            reingest = taint_run(instance, **config)
            skipped = sensor(build_sensor_context(instance=instance, resources=lake.resources(lake.store)))
            assert isinstance(skipped, SkipReason) and reingest in str(skipped.skip_message), (config, skipped)
            instance.report_run_canceled(instance.get_run_by_id(reingest))
        instance.report_run_canceled(instance.get_run_by_id(plan))

        # a re-ingest launched while the tick reads the lake
        read = sensors.ods.readiness_events
        started: list[str] = []

        def reading(*args: object, **kwargs: object) -> object:
            started.append(taint_run(instance, action="reingest"))
            return read(*args, **kwargs)

        monkeypatch.setattr(sensors.ods, "readiness_events", reading)
        during = sensor(build_sensor_context(instance=instance, resources=lake.resources(lake.store)))
        assert isinstance(during, SkipReason) and started[0] in str(during.skip_message), during


def test_an_hour_changed_in_the_lake_and_tainted_before_a_reporter_looked_is_not_reported_again(
    tmp_path: Path,
) -> None:
    """Two reported hours of orders change in the lake outside the ingestion (an UPDATE by hand); on-call taints one
    of them before any reporter has looked. Reporting that hour again would lift its taint with nothing corrected (a
    new materialization leaves the taint behind): it is left out, the other hour is reported. A change committed after
    the taint (the source re-sending the hour, a re-ingest) is reported again."""
    order = load_catalog()["ods.order"]
    store, key = DeltaStore(str(tmp_path / "lake")), AssetKey(order.key)
    h10, h11 = "2026-03-02-10:00", "2026-03-02-11:00"

    def write(hh: str) -> int:
        rows = pa.table({"id": pa.array([1], pa.int64()), "dt": ["2026-03-02"], "hh": [hh]})
        return store.append(order.key, rows, ["dt", "hh"])

    with instance_for_test(temp_dir=str(tmp_path)) as instance:
        reported = max(write("10"), write("11"))
        for hour in (h10, h11):
            report(instance, key, hour, reported)
        write("10")
        write("11")
        assert unreported_changes(instance, store, order, "Asia/Shanghai", tainted_at=taint_times) == [h10, h11]

        [record] = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[h10]), 1).records
        time.sleep(0.01)  # commit times are in milliseconds
        taint(instance, key, h10, record.storage_id, root=f"ods.order {h10}")
        assert set(taint_times(instance, order, [h10, h11])) == {h10}
        assert unreported_changes(instance, store, order, "Asia/Shanghai", tainted_at=taint_times) == [h11]

        time.sleep(0.01)
        write("10")  # new data for the tainted hour: reported, and judged on its own
        assert unreported_changes(instance, store, order, "Asia/Shanghai", tainted_at=taint_times) == [h10, h11]


def test_a_tainted_hour_changed_since_its_taint_is_reported_again_however_old(lake: Lake) -> None:
    """A change to a reported hour before the counts a tick reads (the lookback before the last reported hour) is left
    to a repair, but for a tainted hour: the change is the correction its repair waits for (a source re-sending an
    hour found wrong weeks later), reported once its counts, read for it alone, say it is complete."""
    order = lake.catalog["ods.order"]
    catalog = Catalog({order.fqn: order})
    h01, h02 = "2026-03-02-01:00", "2026-03-02-02:00"
    cursor = {order.fqn: {"last": "2026-03-30-00:00", "seen": {}}}  # four weeks on

    def reported(tainted: Callable[[Table, Sequence[str]], list[str]] | None = None) -> list[str]:
        changed = {order.fqn: [h01, h02]}
        events, _ = readiness_events(lake.store, lake.landing, catalog, cursor, changed=changed, tainted=tainted)
        return [str(e.partition) for e in events if e.asset_key == AssetKey(order.key)]

    assert reported() == []
    assert reported(tainted=lambda table, keys: [k for k in keys if k == h01]) == [h01]
