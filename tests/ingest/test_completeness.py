"""Completeness-driven ODS readiness with exact hours: counts, a lagging shard, late changes re-reported.

A hand-written landing area for ``ods.order`` with two shard streams (``order_00``, ``order_01``) and the
source's per-hour counts, so every number is known: hour 10:00 of 2026-03-02 has 10,000 source rows.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    SensorResult,
    build_sensor_context,
)
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.landing import Landing, LandingResource
from sensors.ods import build_readiness_sensor
from tests.center.test_state_store import report
from warehouse_assets.catalog import Catalog, Table, load_catalog
from warehouse_assets.center.resolver import Resolver
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.explain.why import explain
from warehouse_assets.ingest.job import build_ingest_job
from warehouse_assets.ingest.merge import ingest_table
from warehouse_assets.ingest.readiness import readiness, readiness_events, ready_hours
from warehouse_assets.materialize.compiler import max_partitions_per_run
from warehouse_assets.materialize.hour_checks import judge_hours, unchecked_hours

TZ = ZoneInfo("Asia/Shanghai")
DB = "edu_trade"
H10 = datetime(2026, 3, 2, 10, tzinfo=TZ)
MYSQL = {
    "id": "bigint(20)",
    "user_id": "bigint(20)",
    "course_id": "bigint(20)",
    "amount": "decimal(10,2)",
    "status": "varchar(16)",
    "pay_time": "datetime",
    "create_time": "datetime",
    "update_time": "datetime",
}


def _order(pk: int, created: datetime, at: datetime, status: str) -> dict[str, str | None]:
    """An order row as Canal's ``data`` carries it: created at ``created``, last changed at ``at``."""
    stamp = at.strftime("%Y-%m-%d %H:%M:%S")
    return {
        "id": str(pk),
        "user_id": str(pk % 97),
        "course_id": "1",
        "amount": "10.00",
        "status": status,
        "pay_time": stamp if status == "paid" else None,
        "create_time": created.strftime("%Y-%m-%d %H:%M:%S"),
        "update_time": stamp,
    }


class Source:
    """Writes Canal segments and the source counts of one shard stream, window by window."""

    def __init__(self, root: Path, shard: str):
        self.root, self.shard = root, shard
        self.seq, self.message_id = 0, 0
        self.counts: dict[str, int] = {}

    def segment(
        self, window: datetime, rows: list[tuple[int, datetime]], count: bool = True, positions: list[str] | None = None
    ) -> None:
        """One 5-minute segment starting at ``window`` with an INSERT per (id, event time), each at its binlog
        ``positions`` if the source writes them (as ``warehouse capture`` does)."""
        messages = []
        for n, (pk, at) in enumerate(rows):
            message = self._message("INSERT", _order(pk, at, at, "created"), None, at, count)
            if positions is not None:
                message["position"] = positions[n]
            messages.append(message)
        self._write(window, messages)

    def updates(self, window: datetime, changes: list[tuple[int, datetime, datetime, datetime | None]]) -> None:
        """One 5-minute segment starting at ``window`` with an UPDATE per (id, create time, binlog time, old create
        time: None if the update kept it) paying the order, counted in its binlog hour as the source counts it."""
        messages = []
        for pk, created, at, moved_from in changes:
            old: dict[str, str | None] = {"status": "created", "pay_time": None, "update_time": None}
            if moved_from is not None:
                old["create_time"] = moved_from.strftime("%Y-%m-%d %H:%M:%S")
            messages.append(self._message("UPDATE", _order(pk, created, at, "paid"), old, at, True))
        self._write(window, messages)

    def _message(
        self, kind: str, data: dict[str, str | None], old: dict[str, str | None] | None, at: datetime, count: bool
    ) -> dict[str, object]:
        """A Canal message of one row at binlog time ``at``, counted in its binlog hour when ``count``."""
        self.message_id += 1
        es = int(at.timestamp() * 1000)
        if count:
            hour = at.strftime("%Y-%m-%dT%H")
            self.counts[hour] = self.counts.get(hour, 0) + 1
        return {
            "data": [data],
            "database": DB,
            "es": es,
            "id": self.message_id,
            "isDdl": False,
            "mysqlType": MYSQL,
            "old": None if old is None else [old],
            "pkNames": ["id"],
            "sql": "",
            "sqlType": {},
            "table": self.shard,
            "ts": es + 50,
            "type": kind,
        }

    def _write(self, window: datetime, messages: list[dict[str, object]]) -> None:
        self.seq += 1
        directory = self.root / "binlog" / DB / self.shard
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{self.seq:06d}-{window:%Y%m%dT%H%M}.jsonl"
        (directory / name).write_text("".join(json.dumps(m, separators=(",", ":")) + "\n" for m in messages))

    def count_hour(self, hour: datetime, rows: int) -> None:
        self.counts[hour.strftime("%Y-%m-%dT%H")] = rows

    def publish_counts(self) -> None:
        path = self.root / "counts" / DB / f"{self.shard}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"hour": h, "rows": n}) + "\n" for h, n in sorted(self.counts.items())))

    def idle(self, start: datetime, end: datetime) -> None:
        """Empty segments (an idle shard proving progress) and zero counts for its hours."""
        window = start
        while window < end:
            self.segment(window, [])
            self.counts.setdefault(window.strftime("%Y-%m-%dT%H"), 0)
            window += timedelta(minutes=5)


def windows(start: datetime, end: datetime) -> list[datetime]:
    out, w = [], start
    while w < end:
        out.append(w)
        w += timedelta(minutes=5)
    return out


@pytest.fixture
def order() -> Table:
    return load_catalog()["ods.order"]


@pytest.fixture
def lake(created_order_lake: Path, tmp_path: Path) -> Path:
    """A copy of the module's created ``ods.order``, as a test's first batch would create it."""
    shutil.copytree(created_order_lake, tmp_path / "lake")
    return tmp_path / "lake"


def only(table: Table) -> Catalog:
    return Catalog(tables={table.fqn: table})


def test_the_default_threshold_is_declared_per_table(order: Table) -> None:
    assert order.completeness_threshold == 0.99995


def test_9999_of_10000_rows_keep_the_hour_waiting_and_the_10000th_makes_it_ready(
    spark: SparkSession, tmp_path: Path, lake: Path, order: Table
) -> None:
    landing_root = tmp_path / "landing"
    busy, quiet = Source(landing_root, "order_00"), Source(landing_root, "order_01")
    # hour 10: 10,000 changes on order_00; the distributor delivers 9,999 of them in the hour's segments
    pks = iter(range(1, 10_001))
    per_window = [834] * 11 + [10_000 - 834 * 11]
    late_row: tuple[int, datetime] | None = None
    for window, n in zip(windows(H10, H10 + timedelta(hours=1)), per_window, strict=True):
        rows = [(next(pks), window + timedelta(seconds=i % 300)) for i in range(n)]
        if window.minute == 55:
            late_row = rows.pop()  # counted by the source, delivered late
            hour = late_row[1].strftime("%Y-%m-%dT%H")
            busy.counts[hour] = busy.counts.get(hour, 0) + 1  # the source counted it; its segment comes later
        busy.segment(window, rows)
    assert late_row is not None
    quiet.idle(H10, H10 + timedelta(hours=1))
    busy.publish_counts()
    quiet.publish_counts()
    assert busy.counts["2026-03-02T10"] == 10_000

    landing, store = Landing(landing_root), DeltaStore(str(lake))
    ingest_table(spark, store, landing, order)
    state = readiness(store, landing, order)
    assert state.watermark == H10 + timedelta(hours=1)  # every shard applied past the hour …
    counts = state.completeness("2026-03-02-10:00")
    assert (counts.source_rows, counts.ingested_rows, counts.required) == (10_000, 9_999, 10_000)
    assert counts.missing_by_stream == {f"{DB}.order_00": 1}
    assert not counts.complete
    assert ready_hours(state, None) == []  # … yet the hour is not ready
    events, cursor = readiness_events(store, landing, only(order), {})
    assert events == []

    with DagsterInstance.ephemeral() as instance:
        why = explain(instance, load_catalog(), store, landing, "dwd.order_detail", "2026-03-02")
    hour10 = next(u for u in why.upstream if u.partition == "2026-03-02-10:00")
    assert hour10.state == "not ready"
    assert "1 row(s) missing" in hour10.detail and f"{DB}.order_00 1 missing" in hour10.detail

    # the 10,000th row arrives in the next segment (window 11:00, event time in hour 10)
    busy.segment(H10 + timedelta(hours=1), [late_row], count=False)
    quiet.idle(H10 + timedelta(hours=1), H10 + timedelta(hours=1, minutes=5))
    ingest_table(spark, store, landing, order)
    state = readiness(store, landing, order)
    assert state.completeness("2026-03-02-10:00").ingested_rows == 10_000
    assert ready_hours(state, None) == ["2026-03-02-10:00"]
    events, cursor = readiness_events(store, landing, only(order), cursor)
    assert [(e.partition, e.metadata["ingested_rows"].value, e.metadata["source_rows"].value) for e in events] == [
        ("2026-03-02-10:00", 10_000, 10_000)
    ]
    assert events[0].metadata["rows"].value == 10_000  # all rows in the hour's partition
    assert readiness_events(store, landing, only(order), cursor) == ([], cursor)


def test_a_lagging_shard_holds_the_hour_while_the_others_are_hours_ahead(
    spark: SparkSession, tmp_path: Path, lake: Path, order: Table
) -> None:
    landing_root = tmp_path / "landing"
    ahead, behind = Source(landing_root, "order_00"), Source(landing_root, "order_01")
    pk = 0
    for window in windows(H10, H10 + timedelta(hours=4)):  # order_00 delivers 10:00 .. 14:00
        pk += 1
        ahead.segment(window, [(pk, window + timedelta(seconds=30))])
    for window in windows(H10, H10 + timedelta(minutes=30)):  # order_01 stops at 10:30
        pk += 1
        behind.segment(window, [(pk, window + timedelta(seconds=30))])
    for hour in range(10, 14):  # the source counted every hour of both shards
        behind.count_hour(H10.replace(hour=hour), 12)
    ahead.publish_counts()
    behind.publish_counts()

    landing, store = Landing(landing_root), DeltaStore(str(lake))
    ingest_table(spark, store, landing, order)
    state = readiness(store, landing, order)
    assert state.lagging[0].stream == f"{DB}.order_01"
    assert state.lagging[0].watermark == H10 + timedelta(minutes=30)
    assert state.lagging[1].watermark == H10 + timedelta(hours=4)
    assert ready_hours(state, None) == []
    assert readiness_events(store, landing, only(order), {})[0] == []
    counts = state.completeness("2026-03-02-10:00")
    assert counts.missing_by_stream == {f"{DB}.order_01": 6}

    with DagsterInstance.ephemeral() as instance:
        why = explain(instance, load_catalog(), store, landing, "dwd.order_detail", "2026-03-02")
    hour10 = next(u for u in why.upstream if u.partition == "2026-03-02-10:00")
    assert hour10.state == "not ready"
    assert f"1 of 2 shard stream(s) not applied past 11:00; {DB}.order_01 is applied through 2026-03-02 10:30" in (
        hour10.detail
    )
    assert f"{DB}.order_01 6 missing" in hour10.detail

    # the lagging shard catches up: the four hours become ready at once, in order
    for window in windows(H10 + timedelta(minutes=30), H10 + timedelta(hours=4)):
        pk += 1
        behind.segment(window, [(pk, window + timedelta(seconds=30))], count=False)
    ingest_table(spark, store, landing, order)
    events, _ = readiness_events(store, landing, only(order), {})
    assert [e.partition for e in events] == [f"2026-03-02-{h}:00" for h in range(10, 14)]


def test_why_follows_an_ads_day_to_the_ods_hour_and_the_shard_behind_it(
    spark: SparkSession, tmp_path: Path, lake: Path, order: Table
) -> None:
    """ads.daily_gmv → dws.user_order_daily → dwd.order_detail → 24 ODS hours: the last hour waits for a shard."""
    from warehouse_assets.materialize.quality import report_valid

    h23 = H10.replace(hour=23)
    day = f"{h23:%Y-%m-%d}"
    landing_root = tmp_path / "landing"
    ahead, behind = Source(landing_root, "order_00"), Source(landing_root, "order_01")
    pk = 0
    for window in windows(h23, h23 + timedelta(hours=2)):  # order_00 delivers 23:00 .. 01:00 the next day
        pk += 1
        ahead.segment(window, [(pk, window + timedelta(seconds=30))])
    for window in windows(h23, h23 + timedelta(minutes=30)):  # order_01 stops at 23:30
        pk += 1
        behind.segment(window, [(pk, window + timedelta(seconds=30))])
    behind.count_hour(h23, 12)
    ahead.publish_counts()
    behind.publish_counts()
    landing, store = Landing(landing_root), DeltaStore(str(lake))
    ingest_table(spark, store, landing, order)

    catalog = load_catalog()
    with DagsterInstance.ephemeral() as instance:
        for hour in range(23):  # the readiness sensor reported hours 00 .. 22, and they passed their checks
            report_valid(instance, order, f"2026-03-02-{hour:02d}:00", "reported by the test")
        why = explain(instance, catalog, store, landing, "ads.daily_gmv", day)

    assert [(u.table, u.state) for u in why.upstream] == [("dws.user_order_daily", "missing")]
    assert [(c.table, c.partition, c.state) for c in why.root_causes] == [("ods.order", f"{day}-23:00", "not ready")]
    detail = why.root_causes[0].detail
    assert f"1 of 2 shard stream(s) not applied past 00:00; {DB}.order_01 is applied through 2026-03-02 23:30" in detail
    assert f"{DB}.order_01 6 missing" in detail
    lines = why.lines()
    causes = lines[lines.index("root causes:") + 1 : -1]
    assert len(causes) == 1 and causes[0].split()[:2] == ["ods.order", "2026-03-02-23:00"]
    assert f"{DB}.order_01 is applied through 2026-03-02 23:30" in causes[0]


def test_late_changes_for_a_reported_hour_report_it_again(
    spark: SparkSession, tmp_path: Path, lake: Path, order: Table
) -> None:
    lenient = replace(order, completeness_threshold=0.9)
    landing_root = tmp_path / "landing"
    shard = Source(landing_root, "order_00")
    pk = 0
    for window in windows(H10, H10 + timedelta(hours=2)):
        rows = []
        for _ in range(10):
            pk += 1
            rows.append((pk, window + timedelta(seconds=pk % 300)))
        shard.segment(window, rows)
    shard.count_hour(H10, 121)  # one change of hour 10 is still on its way
    shard.publish_counts()
    landing, store = Landing(landing_root), DeltaStore(str(lake))
    ingest_table(spark, store, landing, lenient)
    events, cursor = readiness_events(store, landing, only(lenient), {})
    assert [(e.partition, e.metadata["ingested_rows"].value) for e in events] == [
        ("2026-03-02-10:00", 120),
        ("2026-03-02-11:00", 120),
    ]
    assert readiness_events(store, landing, only(lenient), cursor) == ([], cursor)
    reported = {e.partition: e.metadata["ingested_rows"].value for e in events}

    # a change of hour 10 arrives late (in the 12:00 window): hour 10 is reported again, hour 11 is not
    shard.segment(H10 + timedelta(hours=2), [(pk + 1, H10 + timedelta(minutes=59))], count=False)
    ingest_table(spark, store, landing, lenient)
    events, cursor = readiness_events(
        store, landing, only(lenient), cursor, reported_rows=lambda table, key: reported.get(key)
    )
    assert [(e.partition, e.metadata["ingested_rows"].value, e.metadata["late_changes"].value) for e in events] == [
        ("2026-03-02-10:00", 121, True)
    ]
    assert events[0].metadata["rows"].value == 121
    # how many changes the report adds to the hour's previous one: what its readers' late-data rule weighs
    assert events[0].metadata["changed_rows"].value == 1
    assert readiness_events(store, landing, only(lenient), cursor) == ([], cursor)


def test_equal_changes_within_one_second_at_different_binlog_positions_are_both_taken_in(
    spark: SparkSession, tmp_path: Path, lake: Path, order: Table
) -> None:
    """The binlog time has whole seconds: a row written twice alike within one second (inserted, deleted and
    inserted again; A→B→A→B) repeats a change's content. Its binlog position tells them apart; a re-sent copy of
    one (same position) is still a duplicate."""
    landing_root = tmp_path / "landing"
    busy, quiet = Source(landing_root, "order_00"), Source(landing_root, "order_01")
    same_second = (7, H10 + timedelta(minutes=1))
    for window in windows(H10, H10 + timedelta(hours=1)):
        rows, positions = (
            ([same_second, same_second], ["bin.000001:400", "bin.000001:900"]) if window == H10 else ([], [])
        )
        busy.segment(window, rows, positions=positions)
    quiet.idle(H10, H10 + timedelta(hours=1))
    busy.publish_counts()
    quiet.publish_counts()
    landing, store = Landing(landing_root), DeltaStore(str(lake))
    report = ingest_table(spark, store, landing, order)
    assert sum(b.rows_duplicate for b in report.batches) == 0
    assert sum(b.rows_applied + b.rows_superseded for b in report.batches) == 2
    counts = readiness(store, landing, order).completeness("2026-03-02-10:00")
    assert (counts.source_rows, counts.ingested_rows) == (2, 2) and counts.complete

    busy.segment(H10 + timedelta(hours=1), [same_second], count=False, positions=["bin.000001:900"])  # re-sent
    quiet.idle(H10 + timedelta(hours=1), H10 + timedelta(hours=1, minutes=5))
    [batch] = ingest_table(spark, store, landing, order).batches
    assert (batch.rows_in, batch.rows_applied, batch.rows_duplicate) == (1, 0, 1)
    assert readiness(store, landing, order).completeness("2026-03-02-10:00").ingested_rows == 2


def test_a_message_re_sent_in_a_later_batch_does_not_complete_the_hour(
    spark: SparkSession, tmp_path: Path, lake: Path, order: Table
) -> None:
    landing_root = tmp_path / "landing"
    busy, quiet = Source(landing_root, "order_00"), Source(landing_root, "order_01")
    # hour 10: the source counted 4 changes on order_00; 3 arrive, the 4th is still on its way
    first = (1, H10 + timedelta(minutes=1))
    for window in windows(H10, H10 + timedelta(hours=1)):
        busy.segment(
            window, [first, (2, H10 + timedelta(minutes=2)), (3, H10 + timedelta(minutes=3))] if window == H10 else []
        )
    busy.count_hour(H10, 4)
    quiet.idle(H10, H10 + timedelta(hours=1))
    busy.publish_counts()
    quiet.publish_counts()
    landing, store = Landing(landing_root), DeltaStore(str(lake))
    ingest_table(spark, store, landing, order)
    state = readiness(store, landing, order)
    assert state.watermark == H10 + timedelta(hours=1)
    assert state.completeness("2026-03-02-10:00").ingested_rows == 3
    assert ready_hours(state, None) == []

    # after a restart the distributor delivers the first message again, in the next batch (a new message id:
    # a re-sent change is recognised by its content)
    busy.segment(H10 + timedelta(hours=1), [first], count=False)
    quiet.idle(H10 + timedelta(hours=1), H10 + timedelta(hours=1, minutes=5))
    report = ingest_table(spark, store, landing, order)
    state = readiness(store, landing, order)
    counts = state.completeness("2026-03-02-10:00")
    assert (counts.source_rows, counts.ingested_rows, counts.required) == (4, 3, 4)
    assert counts.missing_by_stream == {f"{DB}.order_00": 1}
    assert not counts.complete
    assert ready_hours(state, None) == []
    assert readiness_events(store, landing, only(order), {})[0] == []
    [batch] = report.batches  # the re-sent change is a duplicate, not applied again
    assert (batch.rows_in, batch.rows_applied, batch.rows_duplicate) == (1, 0, 1)
    assert batch.ingested == {}


def test_the_ingestion_run_reports_the_hours_it_completed_with_their_verdicts_and_the_sensors_add_nothing(
    spark: SparkSession, tmp_path: Path, lake: Path, order: Table
) -> None:
    """An ODS handoff pays no sensor tick and no check run. The ``ods_ingest`` run reports the hours its
    commit completed and logs their checks' verdicts; its late changes re-report the hour once, and the fallback
    sensors (readiness, checks) find nothing left to do."""
    lenient = replace(order, completeness_threshold=0.9)
    landing_root = tmp_path / "landing"
    shard = Source(landing_root, "order_00")
    pk = 0
    for window in windows(H10, H10 + timedelta(hours=2)):
        rows = []
        for _ in range(10):
            pk += 1
            rows.append((pk, window + timedelta(seconds=pk % 300)))
        shard.segment(window, rows)
    shard.count_hour(H10, 121)
    shard.publish_counts()
    catalog = only(lenient)
    resources = {
        "spark": resources_from_env({})["spark"],
        "lake": DeltaLakeResource(root=str(lake)),
        "landing": LandingResource(root=str(landing_root)),
    }
    ods = AssetKey(lenient.key)
    checks = [AssetCheckKey(ods, c.name) for c in lenient.checks]
    assert checks, "ods.order declares checks"

    def reports() -> list[tuple[str, int, bool, str]]:
        records = instance.fetch_materializations(AssetRecordsFilter(asset_key=ods), limit=100).records
        return sorted(
            (
                str(r.partition_key),
                r.asset_materialization.metadata["ingested_rows"].value,  # type: ignore[union-attr]
                r.asset_materialization.metadata["late_changes"].value,  # type: ignore[union-attr]
                r.run_id,
            )
            for r in records
        )

    def verdicts() -> dict[str, set[str]]:
        """Per hour, the checks with a current verdict that passed."""
        out: dict[str, set[str]] = {}
        for info in instance.event_log_storage.get_asset_check_partition_info(checks):
            if info.partition_key and info.is_current and info.latest_execution_status.value == "SUCCEEDED":
                out.setdefault(info.partition_key, set()).add(info.check_key.name)
        return out

    job = build_ingest_job(catalog, judge_hours)
    readiness_sensor = build_readiness_sensor(catalog)
    names = {c.name for c in lenient.checks}
    # in memory: no other process opens the instance, and its reports and verdicts cost a fraction of SQLite's
    with DagsterInstance.ephemeral() as instance:
        first = job.execute_in_process(instance=instance, resources=resources)
        assert first.success
        assert reports() == [
            ("2026-03-02-10:00", 120, False, first.run_id),
            ("2026-03-02-11:00", 120, False, first.run_id),
        ]
        assert verdicts() == {"2026-03-02-10:00": names, "2026-03-02-11:00": names}
        sensor_context = build_sensor_context(instance=instance, resources=resources)
        fallback = readiness_sensor(sensor_context)
        assert not isinstance(fallback, SensorResult) or not fallback.asset_events
        cursor = fallback.cursor if isinstance(fallback, SensorResult) else None
        assert unchecked_hours(instance, {lenient.fqn: lenient}) == {}

        # a change of hour 10 arrives late: the next ingestion run re-reports hour 10 (only) and judges it again
        shard.segment(H10 + timedelta(hours=2), [(pk + 1, H10 + timedelta(minutes=59))], count=False)
        second = job.execute_in_process(instance=instance, resources=resources)
        assert second.success
        assert reports() == [
            ("2026-03-02-10:00", 120, False, first.run_id),
            ("2026-03-02-10:00", 121, True, second.run_id),
            ("2026-03-02-11:00", 120, False, first.run_id),
        ]
        assert verdicts() == {"2026-03-02-10:00": names, "2026-03-02-11:00": names}
        # the sensor's cursor predates the late changes; the hour's latest report already counts them
        after = readiness_sensor(build_sensor_context(instance=instance, cursor=cursor, resources=resources))
        assert not isinstance(after, SensorResult) or not after.asset_events
        assert unchecked_hours(instance, {lenient.fqn: lenient}) == {}

        # the headless path reports on its own (its hours bounded by the range it builds): the run reports nothing
        shard.segment(H10 + timedelta(hours=2, minutes=5), [(pk + 2, H10 + timedelta(minutes=58))], count=False)
        quiet = job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config={"ops": {"ingest_ods": {"config": {"report_ready": False}}}},
        )
        assert quiet.success and len(reports()) == 3


H08 = datetime(2026, 3, 2, 8, tzinfo=TZ)


class IngestRuns:
    """The ``ods_ingest`` job on one landing area and lake, its runs checked, its reports of ``ods.order`` read."""

    def __init__(self, lake: Path, landing: Path, table: Table, instance: DagsterInstance):
        self.table, self.instance = table, instance
        self.job = build_ingest_job(only(table), judge_hours)
        self.resources = {
            "spark": resources_from_env({})["spark"],
            "lake": DeltaLakeResource(root=str(lake)),
            "landing": LandingResource(root=str(landing)),
        }

    def run(self) -> list[tuple[str, bool, int, int]]:
        """One run, which must succeed; what it reported: (hour, late changes, live rows, Delta version)."""
        result = self.job.execute_in_process(instance=self.instance, resources=self.resources)
        assert result.success
        records = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(self.table.key)), limit=100
        ).records
        return sorted(
            (
                str(r.partition_key),
                r.asset_materialization.metadata["late_changes"].value,  # type: ignore[union-attr]
                r.asset_materialization.metadata["rows"].value,  # type: ignore[union-attr]
                r.asset_materialization.metadata["delta_version"].value,  # type: ignore[union-attr]
            )
            for r in records
            if r.run_id == result.run_id
        )


def orders_of_two_hours(shard: Source) -> None:
    """12 orders created in each of hours 08:00 and 09:00 (one per 5-minute window, binlog = create time)."""
    for n, window in enumerate(windows(H08, H08 + timedelta(hours=2))):
        shard.segment(window, [(n + 1, window + timedelta(minutes=1))])
    shard.publish_counts()


def test_an_update_arriving_hours_later_reports_the_hour_of_its_row_again_and_its_downstream_rebuilds_once(
    spark: SparkSession, tmp_path: Path, lake: Path, consolidated: DagsterInstance, order: Table
) -> None:
    """An order created at 08:01 and paid at 10:33: the change counts in binlog hour 10:00 but rewrites partition
    08:00, already reported and built downstream. The run that merges it reports 08:00 again (once), so the
    dependency center requests dws.order_hourly 08:00 again, and only it; so does an update moving a row out of
    08:00 (its old partition)."""
    shard = Source(tmp_path / "landing", "order_00")
    orders_of_two_hours(shard)
    hourly_orders = load_catalog()["dws.order_hourly"]
    catalog = Catalog(tables={order.fqn: order, hourly_orders.fqn: hourly_orders})
    now = H08 + timedelta(hours=3)  # the morning of the story: its late changes are well within the policy's lookback
    store = PartitionStateStore(consolidated)
    resolver = Resolver(catalog, ReverseIndex.build(catalog, current_time=now), store, max_partitions_per_run)
    downstream = AssetKey(hourly_orders.key)

    def requested(at: datetime = now) -> list[str]:
        plans = resolver.step(at)
        assert {p.table for p in plans} <= {hourly_orders.fqn}
        keys = sorted(k for p in plans for k in p.partitions)
        for key in keys:  # its run built it
            report(consolidated, downstream, key)
        return keys

    try:
        runs = IngestRuns(lake, tmp_path / "landing", order, consolidated)
        first = runs.run()
        assert [(hour, late, rows) for hour, late, rows, _ in first] == [
            ("2026-03-02-08:00", False, 12),
            ("2026-03-02-09:00", False, 12),
        ]
        assert requested() == ["2026-03-02-08:00", "2026-03-02-09:00"]
        assert requested() == []

        # order 1 (created 08:01) is paid at 10:33, after an idle half hour of the shard
        shard.idle(H08 + timedelta(hours=2), H08 + timedelta(hours=2, minutes=30))
        shard.updates(
            H08 + timedelta(hours=2, minutes=30),
            [(1, H08 + timedelta(minutes=1), H08 + timedelta(hours=2, minutes=33), None)],
        )
        shard.publish_counts()
        second = runs.run()
        assert [(hour, late, rows) for hour, late, rows, _ in second] == [("2026-03-02-08:00", True, 12)]
        assert second[0][3] > first[0][3]  # the Delta version that holds the change
        # the hour's summary is rebuilt as its late-data policy says (every 15 min), once
        assert requested() == []
        assert requested(now + timedelta(minutes=14)) == []
        assert requested(now + timedelta(minutes=15)) == ["2026-03-02-08:00"]
        assert requested(now + timedelta(minutes=15)) == []

        # order 2 (created 08:06) is re-dated to 10:06 at 10:40: its old hour changed (the row left it), its new
        # hour 10:00 is not complete yet and is not reported
        moved = (
            2,
            H08 + timedelta(hours=2, minutes=6),
            H08 + timedelta(hours=2, minutes=40),
            H08 + timedelta(minutes=6),
        )
        shard.updates(H08 + timedelta(hours=2, minutes=35), [moved])
        shard.publish_counts()
        third = runs.run()
        # (the key stays in 08:00 as a tombstone, a row of the partition: its live rows stay 12)
        assert [(hour, late) for hour, late, *_ in third] == [("2026-03-02-08:00", True)]
        assert third[0][3] > second[0][3]
        # seen a minute after the last rebuild was requested: an interval after it
        assert requested(now + timedelta(minutes=16)) == []
        assert requested(now + timedelta(minutes=30)) == []
        assert requested(now + timedelta(minutes=31)) == ["2026-03-02-08:00"]
        assert requested(now + timedelta(minutes=31)) == []
    finally:
        resolver.close()
        store.close()


def test_late_changes_a_killed_run_merged_but_never_reported_are_reported_by_the_next_reporter(
    spark: SparkSession,
    tmp_path: Path,
    lake: Path,
    consolidated: DagsterInstance,
    order: Table,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run killed after its merge committed (Spark finishes a merge whose client died) and before its report: the
    late change it merged into 08:00 counts in binlog hour 10:00, so no count of 08:00 grows. The next reporter,
    the ingestion run's retry or else the readiness sensor, reports 08:00 again, once."""
    import warehouse_assets.ingest.job as ingest_job

    shard = Source(tmp_path / "landing", "order_00")
    orders_of_two_hours(shard)
    runs = IngestRuns(lake, tmp_path / "landing", order, consolidated)
    assert [(hour, late) for hour, late, *_ in runs.run()] == [("2026-03-02-08:00", False), ("2026-03-02-09:00", False)]
    sensor = build_readiness_sensor(only(order))
    lake_and_landing = {k: runs.resources[k] for k in ("lake", "landing")}

    def killed_run() -> None:
        def killed(*args: object, **kwargs: object) -> None:
            raise RuntimeError("worker killed after its merge committed")

        monkeypatch.setattr(ingest_job, "report_completed_hours", killed)
        dead = runs.job.execute_in_process(instance=consolidated, resources=runs.resources, raise_on_error=False)
        monkeypatch.undo()
        assert not dead.success

    cursor: list[str | None] = [None]

    def sensor_reports() -> list[tuple[str, bool]]:
        """One tick of the readiness sensor, its cursor kept from tick to tick as the daemon keeps it."""
        result = sensor(build_sensor_context(instance=consolidated, cursor=cursor[0], resources=lake_and_landing))
        if not isinstance(result, SensorResult):
            return []
        cursor[0] = result.cursor
        for event in result.asset_events:
            consolidated.report_runless_asset_event(event)
        return [(str(e.partition), e.metadata["late_changes"].value) for e in result.asset_events]

    # order 1 (created 08:01) paid at 10:33: the run's retry reports 08:00 again, then nobody does
    shard.idle(H08 + timedelta(hours=2), H08 + timedelta(hours=2, minutes=30))
    shard.updates(
        H08 + timedelta(hours=2, minutes=30),
        [(1, H08 + timedelta(minutes=1), H08 + timedelta(hours=2, minutes=33), None)],
    )
    shard.publish_counts()
    killed_run()
    assert [(hour, late) for hour, late, *_ in runs.run()] == [("2026-03-02-08:00", True)]
    assert sensor_reports() == []
    assert runs.run() == []

    # order 3 (created 08:11) paid at 10:37, its run killed the same way, no retry: the sensor reports 08:00 again
    shard.updates(
        H08 + timedelta(hours=2, minutes=35),
        [(3, H08 + timedelta(minutes=11), H08 + timedelta(hours=2, minutes=37), None)],
    )
    shard.publish_counts()
    killed_run()
    assert sensor_reports() == [("2026-03-02-08:00", True)]
    assert sensor_reports() == []
    assert runs.run() == []


def test_a_batch_changing_only_hours_not_reported_yet_reports_nothing_again(
    spark: SparkSession, tmp_path: Path, lake: Path, consolidated: DagsterInstance, order: Table
) -> None:
    """Orders of 10:00 inserted and paid within their hour while hours 08:00 and 09:00 are reported: nothing is
    reported again, and hour 10:00 waits for the readiness judgement (its end is not applied yet)."""
    shard = Source(tmp_path / "landing", "order_00")
    orders_of_two_hours(shard)
    runs = IngestRuns(lake, tmp_path / "landing", order, consolidated)
    assert [hour for hour, *_ in runs.run()] == ["2026-03-02-08:00", "2026-03-02-09:00"]

    h10 = H08 + timedelta(hours=2)
    shard.segment(h10, [(100, h10 + timedelta(minutes=1)), (101, h10 + timedelta(minutes=2))])
    shard.updates(h10 + timedelta(minutes=5), [(100, h10 + timedelta(minutes=1), h10 + timedelta(minutes=7), None)])
    shard.publish_counts()
    assert runs.run() == []
