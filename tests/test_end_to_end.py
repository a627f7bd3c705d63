"""The example warehouse on a simulated January, every figure checked against an independent replay.

The warehouse is tests/support/warehouse.py's, built once per session from the warehouse's first day (a backfill of
the whole graph run by the backfill daemon's iterations, then the rest of the month by the headless path,
``materialize_range``) and shared with the taint and backfill modules (all in its xdist group):

* every table over the first 11 days (2026-01-01 .. 01-11: T-1 and T-7 retention, the self-dependent
  snapshots and cumulative learning from their first partition, one whole ISO week 01-05 .. 01-11);
* the hourly tables over the 24 hours of 2026-01-05;
* the daily chain under DAU/WAU/MAU and the monthly report over the whole month, so that the 30-day window
  exists (01-30, 01-31) and ``ads.monthly_report`` 2026-01 can run on all of its days.

The source is small (scale 0.03) and lands one segment per shard and day, so the whole month ingests fast. One hour of
its orders is sent with amounts 100 times too high (what the taint module repairs): the replay reads what was sent,
so every figure here still equals it, the bad hour's day and hour included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetKey, DagsterInstance
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from tests.support import oracle
from tests.support.lake import row_dicts, table_rows
from tests.support.warehouse import (
    DAYS,
    EVERY_DAY,
    EXTERNAL_CLOCK,
    FIRST,
    HOUR_DAY,
    HOURLY,
    MONTH,
    MONTH_CHAIN,
    TZ,
    ExampleWarehouse,
    at,
)
from warehouse_assets.cli.headless import materialize_range

WEEK = "2026-01-05"  # the ISO week 2026-01-05 (Monday) .. 2026-01-11
# the per-test limit: the module's first test may build the whole warehouse (the session's fixture), about 8 min on CI
# and 22 min on a 2-core machine at a load of 10
pytestmark = pytest.mark.timeout(2400)


@dataclass
class Warehouse:
    landing: Path
    lake: Path
    instance: DagsterInstance
    resources: dict[str, Any]
    truth: oracle.Tables


@pytest.fixture(scope="module")
def warehouse(example_warehouse: ExampleWarehouse) -> Iterator[Warehouse]:
    w = example_warehouse
    yield Warehouse(w.landing, w.lake, w.instance, w.resources, oracle.replay(w.landing))


def _table(w: Warehouse, layer: str, name: str) -> list[dict[str, Any]]:
    rows = row_dicts(str(w.lake / layer / name))
    return [r for r in rows if not r.get("_deleted")]  # ODS keeps deletes as tombstones


def _messages(landing: Path, db: str) -> Iterator[dict[str, Any]]:
    for path in sorted((landing / "binlog" / db).glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            message = oracle.parse_line(line)
            if message is not None:
                yield message


@pytest.mark.parametrize("table", ["order", "user", "lesson", "attendance"])
def test_ods_holds_the_deduplicated_source_state(warehouse: Warehouse, table: str) -> None:
    rows = _table(warehouse, "ods", table)
    oracle.assert_each_key_live_once(rows)  # table-wide: no key live in two partitions (or twice in one)
    assert {r["id"] for r in rows} == set(warehouse.truth[table])


def test_a_snapshot_ods_table_holds_each_change_once_in_the_hour_of_its_binlog_time(warehouse: Warehouse) -> None:
    rows = row_dicts(str(warehouse.lake / "ods" / "course"))  # deletions included: they are changes
    source = oracle.replay_detailed(warehouse.landing).rows_by_stream["edu_course.course"]
    assert len(rows) == source > len(warehouse.truth["course"])  # a course's discount is a row of its own
    for row in rows:
        local = row["_changed_at"].astimezone(TZ)
        assert row["_changed_at"] == datetime.fromtimestamp(row["_es"] / 1000, TZ)
        assert (row["dt"], row["hh"]) == (local.strftime("%Y-%m-%d"), local.strftime("%H"))


@pytest.mark.parametrize("day", [DAYS[0], DAYS[5], DAYS[-1]], ids=str)  # a course is discounted on the 2nd
def test_each_days_snapshot_equals_the_source_at_the_end_of_that_day(warehouse: Warehouse, day: date) -> None:
    rows = [r for r in row_dicts(str(warehouse.lake / "dwd" / "course_daily")) if r["dt"] == day.isoformat()]
    end = int(at(day + timedelta(days=1)).timestamp() * 1000)
    truth = oracle.replay_until(warehouse.landing, end)["course"]
    assert {r["course_id"]: (r["title"], r["price"]) for r in rows} == {
        key: (row["title"], Decimal(row["price"])) for key, row in truth.items()
    }


def test_deleted_keys_are_absent_and_updated_keys_hold_their_latest_value(warehouse: Warehouse) -> None:
    messages = list(_messages(warehouse.landing, "edu_trade"))
    deleted = {int(r["id"]) for m in messages if m["type"] == "DELETE" for r in m["data"]}
    updated = {int(r["id"]) for m in messages if m["type"] == "UPDATE" for r in m["data"]} - deleted
    assert deleted and updated, "the simulation should contain deletes and updates"
    ods = {r["id"]: r for r in _table(warehouse, "ods", "order")}
    assert not deleted & set(ods)
    for key in sorted(updated):
        expected = warehouse.truth["order"][key]
        assert ods[key]["status"] == expected["status"]
        assert ods[key]["amount"] == Decimal(expected["amount"])
        paid = ods[key]["pay_time"]
        expected_paid = expected["pay_time"]
        if expected_paid is None:
            assert paid is None
        else:
            assert paid.astimezone(TZ).strftime("%Y-%m-%d %H:%M:%S") == expected_paid


def test_ods_partitions_follow_the_local_create_hour(warehouse: Warehouse) -> None:
    for row in _table(warehouse, "ods", "order"):
        local = row["create_time"].astimezone(TZ)
        assert (row["dt"], row["hh"]) == (local.strftime("%Y-%m-%d"), local.strftime("%H"))


def test_daily_gmv_equals_an_independent_computation(warehouse: Warehouse) -> None:
    expected = oracle.daily_gmv(warehouse.truth["order"], "Asia/Shanghai")
    ads = {r["dt"]: r for r in _table(warehouse, "ads", "daily_gmv")}
    assert sorted(ads) == [d.isoformat() for d in [*DAYS, MONTH[-1]]]
    for day in [*DAYS, MONTH[-1]]:
        assert ads[day.isoformat()]["gmv"] == expected.get(day, Decimal("0")), day
        paying = {
            r["user_id"]
            for r in warehouse.truth["order"].values()
            if r["status"] == "paid" and r["create_time"].startswith(day.isoformat())
        }
        assert ads[day.isoformat()]["paying_users"] == len(paying)


def test_lesson_catalog_counts_the_freshest_snapshot_of_its_window(warehouse: Warehouse) -> None:
    """Each day's own snapshot is the freshest of its three-day any window once it is built (the first day's window
    has two days before the start, waived)."""
    snapshot = _table(warehouse, "dwd", "lesson_snapshot")
    rows = _table(warehouse, "ads", "lesson_catalog")
    for day in DAYS:
        ds = day.isoformat()
        expected = Counter(r["course_id"] for r in snapshot if r["dt"] == ds)
        got = {r["course_id"]: (r["lessons"], r["snapshot_of"]) for r in rows if r["dt"] == ds}
        assert expected and got == {course: (n, ds) for course, n in expected.items()}, ds


def test_the_static_table_is_built_once_and_read_whole_by_every_day(warehouse: Warehouse) -> None:
    tiers = {r["city"]: r["tier"] for r in _table(warehouse, "dwd", "city_tier")}
    assert len(tiers) == 16 and tiers["北京"] == "tier 1" and tiers["杭州"] == "new tier 1"
    key = AssetKey(["dwd", "city_tier"])
    assert len(warehouse.instance.fetch_materializations(key, limit=10).records) == 1  # unpartitioned, built once
    by_day: dict[str, dict[str, int]] = {}
    for row in _table(warehouse, "ads", "new_users_by_tier"):
        by_day.setdefault(row["dt"], {})[row["tier"]] = row["new_users"]
    users = _table(warehouse, "dwd", "user_snapshot")
    for day in DAYS:
        expected: dict[str, int] = {}
        for user in users:
            if user["dt"] == day.isoformat() and user["register_dt"] == day.isoformat():
                tier = tiers.get(user["city"], "unlisted")
                expected[tier] = expected.get(tier, 0) + 1
        assert by_day.get(day.isoformat(), {}) == expected, day
    assert sum(by_day[DAYS[0].isoformat()].values()) > 0


def test_dwd_and_dws_agree_with_the_replay(warehouse: Warehouse) -> None:
    dwd = _table(warehouse, "dwd", "order_detail")
    expected = {k for k, r in warehouse.truth["order"].items() if r["create_time"][:7] == "2026-01"}
    assert {r["order_id"] for r in dwd} == expected
    dws = _table(warehouse, "dws", "user_order_daily")
    assert sum(r["orders"] for r in dws) == len(expected)


def test_every_partition_is_materialized_in_dagster(warehouse: Warehouse) -> None:
    def materialized(fqn: str) -> set[str]:
        return warehouse.instance.get_materialized_partitions(AssetKey(fqn.split(".")))

    days, month = {d.isoformat() for d in DAYS}, {d.isoformat() for d in MONTH}
    for fqn in EVERY_DAY:
        if fqn in MONTH_CHAIN:
            assert materialized(fqn) == month, fqn
        elif fqn == "dws.course_attendance_weekly":
            assert materialized(fqn) == {WEEK}
        elif fqn == "ads.daily_gmv":
            assert materialized(fqn) == {*days, MONTH[-1].isoformat()}
        elif fqn.startswith("ads.retention_d"):  # T-n of the first n days is before the warehouse's start
            n = int(fqn.removeprefix("ads.retention_d"))
            assert materialized(fqn) == {d.isoformat() for d in DAYS[n:]}, fqn
        else:
            assert materialized(fqn) == days, fqn
    hours = {f"{HOUR_DAY}-{h:02d}:00" for h in range(24)}
    for fqn in HOURLY:
        assert materialized(fqn) == hours, fqn
    assert materialized("ads.active_users") == {"2026-01-30", "2026-01-31"}  # the first whole 30-day windows
    assert materialized("ads.monthly_report") == {"2026-01-01"}
    assert materialized("ads.gmv_vs_month") == {"2026-01-31"}
    ods_hours = materialized("ods.order")
    assert len(ods_hours) == 31 * 24 and "2026-01-01-00:00" in ods_hours and "2026-01-31-23:00" in ods_hours


def test_tables_are_valid_delta(warehouse: Warehouse) -> None:
    for table_dir in sorted(p.parent for p in warehouse.lake.glob("*/*/_delta_log")):
        dt = DeltaTable(str(table_dir))
        table_rows(table_dir)  # readable without a JVM
        live = oracle.delta_live_paths(table_dir)
        assert live == {str(Path(u).relative_to(table_dir)) for u in dt.file_uris()}, table_dir
        for rel in live:
            assert (table_dir / rel).is_file(), f"{table_dir}: {rel} in the log but not on disk"


def test_rerunning_the_range_changes_nothing(warehouse: Warehouse) -> None:
    tables = ["dwd.order_detail", "ads.daily_gmv", "dws.user_learning_cumulative"]
    before = {fqn: sorted(map(repr, _table(warehouse, *fqn.split(".")))) for fqn in tables}
    assert materialize_range(warehouse.instance, warehouse.resources, at(DAYS[-3]), at(DAYS[-1]), tables=tables)
    for fqn in tables:
        assert sorted(map(repr, _table(warehouse, *fqn.split(".")))) == before[fqn], fqn


def test_a_range_skips_what_waits_for_an_undelivered_external_and_what_reads_it(
    warehouse: Warehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    """No exchange rate was delivered once the external producers' clock stopped: the revenue in USD waits for it
    from the clock's day on (its previous day's rate has not come), and so does the flash that reads that revenue.
    The range skips both, naming why, builds nothing of them, and finishes (a run of them would only fail on its
    gate)."""
    tables = ["dws.revenue_usd_daily", "ads.revenue_flash"]
    first, last = EXTERNAL_CLOCK, EXTERNAL_CLOCK + timedelta(days=2)
    prior = first - timedelta(days=1)

    def materialized(fqn: str) -> set[str]:
        return warehouse.instance.get_materialized_partitions(AssetKey(fqn.split(".")))

    before = {fqn: materialized(fqn) for fqn in tables}  # the backfill's days, whose rates were delivered
    assert materialize_range(
        warehouse.instance, warehouse.resources, at(first), at(last + timedelta(days=1)), tables, False
    )
    for fqn in tables:
        assert materialized(fqn) == before[fqn] and max(before[fqn]) < first.isoformat(), fqn
    out = capsys.readouterr().out
    assert (
        f"dws.revenue_usd_daily: 3 partition(s) skipped ({first} .. {last} (3)), not ready: "
        f"dws.revenue_usd_daily {first} waits for 1 partition(s) of ext.fx_rate that are not materialized: "
        f"{prior}" in out
    ), out
    assert (
        f"ads.revenue_flash: 3 partition(s) skipped ({first} .. {last} (3)), not ready: ads.revenue_flash "
        f"{first} waits for 1 partition(s) of dws.revenue_usd_daily that are not materialized: {first}" in out
    ), out


def test_why_explains_a_ready_and_a_waiting_partition(warehouse: Warehouse) -> None:
    from warehouse_assets.definitions import catalog
    from warehouse_assets.explain.why import explain

    store, landing = warehouse.resources["lake"].store(), warehouse.resources["landing"].landing()
    done = explain(warehouse.instance, catalog, store, landing, "ads.daily_gmv", "2026-01-02")
    assert done.own_state == "materialized"
    assert [(u.table, u.partition, u.state) for u in done.upstream] == [
        ("dws.user_order_daily", "2026-01-02", "materialized")
    ]
    assert done.verdict.startswith("all 1 upstream partition(s) are materialized")

    waiting = explain(warehouse.instance, catalog, store, landing, "dwd.order_detail", "2026-02-01")
    assert [u.partition for u in waiting.upstream] == [f"2026-02-01-{h:02d}:00" for h in range(24)]
    assert {u.state for u in waiting.upstream} == {"not ready"}
    assert "8 of 8 shard stream(s) not applied past 01:00" in waiting.upstream[0].detail
    assert (
        waiting.verdict == "waiting for 24 of 24 upstream partition(s); first: ods.order 2026-02-01-00:00 (not ready)"
    )

    with pytest.raises(
        ValueError, match=r"^'2026-02-01-01:00' is an hour, but dwd\.order_detail is daily: its partitions"
    ):
        explain(warehouse.instance, catalog, store, landing, "dwd.order_detail", "2026-02-01-01:00")


def test_why_waiting_job_reports_in_the_run(warehouse: Warehouse) -> None:
    from warehouse_assets.definitions import defs

    job = defs.get_job_def("why_waiting")
    result = job.execute_in_process(
        instance=warehouse.instance,
        resources={k: v for k, v in warehouse.resources.items() if k in ("lake", "landing", "external")},
        run_config={
            "ops": {"explain_partition": {"config": {"table": "dws.user_order_daily", "partition": "2026-01-03"}}}
        },
    )
    lines = result.output_for_node("explain_partition")
    assert lines[0] == "dws.user_order_daily 2026-01-03: materialized"
    assert "dwd.order_detail" in lines[1] and "materialized" in lines[1]


def test_zorder_follows_complete_partitions_off_the_critical_path(warehouse: Warehouse) -> None:
    from dagster import DagsterEventType, EventRecordsFilter, build_sensor_context

    from warehouse_assets.definitions import defs

    # the tables the catalog declares Z-order columns and a file size for (analysts' lookups by learner and course)
    zordered = ["dwd.attendance_detail", "dwd.order_detail"]
    before = {fqn: sorted(map(str, _table(warehouse, *fqn.split(".")))) for fqn in zordered}
    sensor = defs.get_sensor_def("zorder_complete_partitions")
    result = sensor(build_sensor_context(instance=warehouse.instance))
    requests = result.run_requests or []
    configs = [r.run_config["ops"]["zorder_partition_files"]["config"] for r in requests]
    assert sorted(configs, key=lambda c: c["table"]) == [
        {"table": fqn, "partitions": [d.isoformat() for d in MONTH]} for fqn in zordered
    ]
    job = defs.get_job_def("zorder_partitions")
    for request in requests:
        run = job.execute_in_process(
            run_config=request.run_config,
            instance=warehouse.instance,
            resources={"lake": warehouse.resources["lake"], "spark": warehouse.resources["spark"]},
        )
        assert run.success
    for fqn in zordered:
        observations = warehouse.instance.get_event_records(
            EventRecordsFilter(DagsterEventType.ASSET_OBSERVATION, asset_key=AssetKey(fqn.split(".")))
        )
        numbers = {r.partition_key: r.asset_observation.metadata for r in observations}  # type: ignore[union-attr]
        assert set(numbers) == {d.isoformat() for d in MONTH}
        for metadata in numbers.values():
            assert metadata["files_removed"].value == metadata["files_before"].value >= 1
            assert metadata["files_after"].value >= 1 and metadata["zorder_by"].value == "user_id, course_id"
            assert metadata["file_size_mib"].value == 4.0  # the declared file size reached OPTIMIZE
        assert sorted(map(str, _table(warehouse, *fqn.split(".")))) == before[fqn]
    # the next tick has nothing new: each complete partition is Z-ordered once
    again = sensor(build_sensor_context(instance=warehouse.instance, cursor=result.cursor))
    assert not again.run_requests


# --- every ADS figure (and the cumulative DWS table) against the oracle ------------------------------------

RATE = pytest.approx  # rates are doubles: equal to 1e-9


def _by(rows: list[dict[str, Any]], *columns: str) -> dict[Any, dict[str, Any]]:
    out = {}
    for row in rows:
        key = row[columns[0]] if len(columns) == 1 else tuple(row[c] for c in columns)
        assert key not in out, f"duplicate key {key}"
        out[key] = row
    return out


def _rate(value: float | None) -> Any:
    return None if value is None else RATE(value, abs=1e-9)


def test_attendance_rate_equals_the_replay(warehouse: Warehouse) -> None:
    ads = _by(_table(warehouse, "ads", "attendance_rate_daily"), "dt")
    assert sorted(ads) == [d.isoformat() for d in DAYS]
    for day in sorted(ads):
        expected = oracle.attendance_rate(warehouse.truth, day)
        row = ads[day]
        assert row["ds"] == day
        assert expected["sessions"] > 0, f"the simulation should hold sessions on {day}"
        assert {k: row[k] for k in expected} == {**expected, "attendance_rate": _rate(expected["attendance_rate"])}
        assert 0 <= row["attendance_rate"] <= 1


def test_user_learning_cumulative_equals_the_replay(warehouse: Warehouse) -> None:
    rows = _table(warehouse, "dws", "user_learning_cumulative")
    by_day: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_day.setdefault(row["dt"], {})[row["user_id"]] = {k: v for k, v in row.items() if k not in ("dt", "user_id")}
    assert sorted(by_day) == [d.isoformat() for d in DAYS]
    for day in sorted(by_day):
        expected = oracle.user_learning_cumulative(warehouse.truth, day, FIRST.isoformat())
        assert by_day[day] == expected, day
    # cumulative: nobody disappears, and the last day adds up every day's learning
    assert set(by_day[DAYS[0].isoformat()]) <= set(by_day[DAYS[-1].isoformat()])
    daily = _table(warehouse, "dws", "user_learning_daily")
    final = by_day[DAYS[-1].isoformat()].values()
    assert sum(r["total_learning_seconds"] for r in final) == sum(
        r["learning_seconds"] for r in daily if r["dt"] <= DAYS[-1].isoformat()
    )


def test_retention_d1_and_d7_equal_the_replay(warehouse: Warehouse) -> None:
    for n in (1, 7):
        ads = _by(_table(warehouse, "ads", f"retention_d{n}"), "dt")
        assert sorted(ads) == [d.isoformat() for d in DAYS[n:]], n
        for day, row in ads.items():
            expected = oracle.retention(warehouse.truth, day, n)
            assert expected["cohort_users"] > 0, f"empty D{n} cohort on {day}"
            assert {k: row[k] for k in expected} == {**expected, "retention_rate": _rate(expected["retention_rate"])}
            assert row["ds"] == day


def test_dau_wau_mau_equal_the_replay(warehouse: Warehouse) -> None:
    ads = _by(_table(warehouse, "ads", "active_users"), "dt")
    assert sorted(ads) == ["2026-01-30", "2026-01-31"]
    for day, row in ads.items():
        expected = oracle.dau_wau_mau(warehouse.truth, day)
        assert {k: row[k] for k in expected} == expected, day
        assert row["dau"] < row["wau"] < row["mau"]


def test_hourly_gmv_equals_the_replay(warehouse: Warehouse) -> None:
    ads = _by(_table(warehouse, "ads", "gmv_hourly"), "dt", "hh")
    assert sorted(ads) == [(HOUR_DAY.isoformat(), f"{h:02d}") for h in range(24)]
    for (day, hh), row in ads.items():
        expected = oracle.gmv_hourly(warehouse.truth, f"{day} {hh}")
        assert row["hour_start"] == f"{day} {hh}:00:00"
        assert {k: row[k] for k in expected} == expected, hh
    daily = _by(_table(warehouse, "ads", "daily_gmv"), "dt")[HOUR_DAY.isoformat()]
    assert sum(r["gmv"] for r in ads.values()) == daily["gmv"]  # the hours add up to the day


def test_weekly_course_attendance_equals_the_replay(warehouse: Warehouse) -> None:
    dws = _table(warehouse, "dws", "course_attendance_weekly")
    assert {r["dt"] for r in dws} == {WEEK}
    week_days = [(date.fromisoformat(WEEK) + timedelta(days=n)).isoformat() for n in range(7)]
    expected = oracle.course_attendance(warehouse.truth, week_days)
    assert {r["course_id"]: {k: r[k] for k in next(iter(expected.values()))} for r in dws} == expected


def test_monthly_report_equals_the_replay(warehouse: Warehouse) -> None:
    (row,) = _table(warehouse, "ads", "monthly_report")
    assert (row["dt"], row["month"]) == ("2026-01-01", "2026-01")
    expected = oracle.monthly_report(warehouse.truth, "2026-01")
    assert {k: row[k] for k in expected} == {**expected, "avg_dau": RATE(expected["avg_dau"], abs=1e-9)}
    assert isinstance(row["gmv"], Decimal) and row["gmv"] > 0


def test_the_week_to_date_adds_each_day_and_starts_afresh_on_monday(warehouse: Warehouse) -> None:
    daily = oracle.daily_gmv(warehouse.truth["order"], "Asia/Shanghai")
    orders = Counter(r["create_time"][:10] for r in warehouse.truth["order"].values())
    rows = {r["dt"]: r for r in _table(warehouse, "ads", "gmv_week_to_date")}
    assert sorted(rows) == [d.isoformat() for d in DAYS]
    for day in DAYS:
        since = max(day - timedelta(days=day.weekday()), FIRST)  # its Monday, or the warehouse's first day
        week = [since + timedelta(days=n) for n in range((day - since).days + 1)]
        row = rows[day.isoformat()]
        assert row["week_gmv"] == sum((daily.get(d, Decimal("0")) for d in week), Decimal("0")), day
        assert row["week_orders"] == sum(orders[d.isoformat()] for d in week), day
        assert row["days"] == len(week), day


def test_the_last_day_of_january_reads_januarys_report_as_the_latest_month(warehouse: Warehouse) -> None:
    (row,) = _table(warehouse, "ads", "gmv_vs_month")
    day_gmv = oracle.daily_gmv(warehouse.truth["order"], "Asia/Shanghai").get(MONTH[-1], Decimal("0"))
    average = oracle.monthly_report(warehouse.truth, "2026-01")["gmv"] / 31
    assert (row["dt"], row["month"], row["gmv"]) == ("2026-01-31", "2026-01", day_gmv)
    assert row["month_avg_daily_gmv"] == average.quantize(Decimal("0.01"), ROUND_HALF_UP)
    assert row["vs_month"] == RATE(float(day_gmv / average), rel=1e-6)


def test_a_self_dependent_table_must_produce_its_declared_columns(spark: SparkSession) -> None:
    from dagster import Failure

    from warehouse_assets.definitions import catalog
    from warehouse_assets.materialize.runner import _check_columns, _empty_like

    table = catalog["dws.user_learning_cumulative"]
    empty = _empty_like(spark, _NoLake(), table, first_of_self=True)  # the first partition's T-1
    assert [n for n, _ in empty.dtypes] == [*(n for n, _ in table.columns), "dt"] and empty.count() == 0
    _check_columns(table, "2026-01-01", empty.drop("dt"))
    with pytest.raises(Failure, match=r"dws.user_learning_cumulative 2026-01-01: the SQL produces columns"):
        _check_columns(table, "2026-01-01", empty.drop("dt").withColumnRenamed("learning_days", "days"))


class _NoLake:
    """A lake where no table exists yet."""

    def exists(self, key: Any) -> bool:
        return False

    def table_uri(self, key: Any) -> str:
        return "memory://nowhere"
