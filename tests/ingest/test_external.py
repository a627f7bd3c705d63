"""External tables as virtual dependencies: the simulated producers, their sensors, and the downstream users.

Every time is pinned: the producers are simulated up to a clock, each sensor is built with that clock, and
the dependency center is stepped at it (``tests.support.center_harness``), so partitions are exact.
"""

from __future__ import annotations

import csv
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSpec,
    DagsterInstance,
    SensorResult,
    SkipReason,
    build_sensor_context,
    instance_for_test,
    materialize,
)
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.external import ExternalResource, key_problem
from resources.landing import Landing
from resources.spark import SparkResource
from sensors.external import build_external_sensor
from simulator.external import (
    CORRECTION_DAY,
    DUPLICATE_MARKER_DAY,
    FUTURE_DAY,
    FX_CORRECTION_DAY,
    FX_DUPLICATE_DAY,
    FX_MALFORMED_DAY,
    MALFORMED_DIR_DAY,
    MARKER_BEFORE_DATA_DAY,
    arrival,
    bad_cases,
    events_until,
    simulate_external,
)
from tests.support.center_harness import CenterTicker
from tests.support.lake import row_dicts
from warehouse_assets.catalog import Catalog
from warehouse_assets.center.engine import assemble_engine
from warehouse_assets.center.plans import RunPlan
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.definitions import catalog, defs
from warehouse_assets.explain.why import explain
from warehouse_assets.ingest.deliveries import (
    DeliveryCursor,
    ExternalWatcher,
    delivery_tick,
    external_source,
    watched_ago,
)
from warehouse_assets.materialize.compiler import max_partitions_per_run
from warehouse_assets.materialize.gate import DEGRADED, STATE
from warehouse_assets.materialize.quality import report_valid

TZ = ZoneInfo("Asia/Shanghai")
FIRST = date(2026, 3, 2)
SEED = 7
SPEND = catalog["ext.marketing_spend"]
FX = catalog["ext.fx_rate"]
ROI = AssetKey(["ads", "marketing_roi"])
USD = AssetKey(["dws", "order_usd_daily"])


def day(index: int) -> str:
    return f"{FIRST + timedelta(days=index):%Y-%m-%d}"


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Daemon:
    """What the sensor daemon does with one external sensor: tick, store the events, keep the cursor."""

    def __init__(self, instance: DagsterInstance, root: Path, table: object, clock: Clock) -> None:
        self.instance, self.root, self.clock = instance, root, clock
        self.sensor = build_external_sensor(table, clock)  # type: ignore[arg-type]
        self.cursor: str | None = None

    def tick(self) -> list[AssetMaterialization]:
        context = build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources={"external": ExternalResource(root=str(self.root))}
        )
        result = self.sensor(context)
        assert isinstance(result, SensorResult)
        for event in result.asset_events:
            assert isinstance(event, AssetMaterialization)
            self.instance.report_runless_asset_event(event)
        self.cursor = result.cursor
        return list(result.asset_events)  # type: ignore[arg-type]


def report(instance: DagsterInstance, key: AssetKey, partition: str) -> None:
    """An upstream partition that is there and valid: materialized, and its blocking checks passed."""
    report_valid(instance, catalog[".".join(key.path)], partition, "seeded by the test")


def requested(engine: CenterTicker, at: datetime) -> dict[str, set[str]]:
    """One step of the engine at ``at``: the partitions it starts, by asset key."""
    return {AssetKey(catalog[t].key).to_user_string(): set(keys) for t, keys in engine.tick(at).items() if keys}


# --- the simulated producers ---------------------------------------------------------------------------


def test_producers_are_deterministic_and_deliver_late_and_early(tmp_path: Path) -> None:
    until = datetime(2026, 3, 12, 12, tzinfo=TZ)
    simulate_external(tmp_path / "a", FIRST, until, SEED)
    # the same deliveries whether the clock advances in one step or many
    for hours in range(0, 11 * 24, 7):
        simulate_external(tmp_path / "b", FIRST, datetime(2026, 3, 2, tzinfo=TZ) + timedelta(hours=hours), SEED)
    simulate_external(tmp_path / "b", FIRST, until, SEED)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a" / "marketing_spend").rglob("*.csv"))
    assert files and files == sorted(
        p.relative_to(tmp_path / "b") for p in (tmp_path / "b" / "marketing_spend").rglob("*.csv")
    )
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    # next morning as a rule, but some deliveries come early (before 01:00) and some late (afternoon or later)
    hours = [
        (
            arrival(SEED, "marketing_spend", FIRST + timedelta(days=n), TZ)
            - datetime.combine(FIRST + timedelta(days=n + 1), datetime.min.time(), TZ)
        ).total_seconds()
        / 3600
        for n in range(60)
    ]
    assert all(h > 0 for h in hours)
    assert any(h < 1 for h in hours) and any(h >= 14 for h in hours) and sum(5 <= h < 9 for h in hours) > 30
    # nothing is delivered before its time
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    first = arrival(SEED, "marketing_spend", FIRST, TZ)
    simulate_external(tmp_path / "c", FIRST, first - timedelta(minutes=1), SEED)
    assert not (tmp_path / "c" / "marketing_spend" / f"dt={FIRST}").exists()
    simulate_external(tmp_path / "c", FIRST, first, SEED)
    assert (tmp_path / "c" / "marketing_spend" / f"dt={FIRST}" / "_SUCCESS").is_file()


# --- arrival starts the downstream exactly once --------------------------------------------------------


def test_marketing_spend_arrival_starts_marketing_roi_exactly_once(tmp_path: Path) -> None:
    at = arrival(SEED, "marketing_spend", FIRST, TZ)
    clock = Clock(at - timedelta(minutes=1))
    with instance_for_test() as instance:
        report(instance, AssetKey(["ads", "daily_gmv"]), day(0))  # the other input of the day is there
        daemon = Daemon(instance, tmp_path, SPEND, clock)

        simulate_external(tmp_path, FIRST, clock.now, SEED)
        assert daemon.tick() == []
        engine = CenterTicker(instance, catalog)
        # the seeded day's own downstream starts (its week so far: a Monday needs no day before); marketing_roi
        # waits for the partner's delivery
        assert requested(engine, clock.now) == {"ads/gmv_week_to_date": {day(0)}}

        clock.now = at + timedelta(minutes=1)
        simulate_external(tmp_path, FIRST, clock.now, SEED)
        events = daemon.tick()
        assert [(e.asset_key, e.partition) for e in events] == [(AssetKey(SPEND.key), day(0))]
        metadata = {k: v.value for k, v in events[0].metadata.items()}
        rows = sum(
            len(list(csv.DictReader(p.open())))
            for p in (tmp_path / "marketing_spend" / f"dt={day(0)}").glob("part-*.csv")
        )
        assert metadata["files"] == 2 and metadata["rows"] == rows > 0 and metadata["redelivery"] is False
        assert metadata["delivered_at"] == at.isoformat(timespec="seconds")
        assert requested(engine, clock.now) == {"ads/marketing_roi": {day(0)}}

        clock.now += timedelta(minutes=1)
        assert daemon.tick() == []
        assert requested(engine, clock.now) == {}
        engine.close()


def test_fx_rate_version_starts_order_usd_daily_exactly_once(tmp_path: Path) -> None:
    at = arrival(SEED, "fx_rate", FIRST, TZ)
    clock = Clock(at - timedelta(minutes=1))
    with instance_for_test() as instance:
        report(instance, AssetKey(["dwd", "order_detail"]), day(0))
        daemon = Daemon(instance, tmp_path, FX, clock)
        simulate_external(tmp_path, FIRST, clock.now, SEED)
        assert daemon.tick() == []
        engine = CenterTicker(instance, catalog)
        # the seeded day's own downstream starts; order_usd_daily waits for the partner's rate
        assert requested(engine, clock.now) == {"dws/user_order_daily": {day(0)}}

        clock.now = at + timedelta(minutes=1)
        simulate_external(tmp_path, FIRST, clock.now, SEED)
        events = daemon.tick()
        assert [(e.asset_key, e.partition) for e in events] == [(AssetKey(FX.key), day(0))]
        metadata = {k: v.value for k, v in events[0].metadata.items()}
        assert metadata["delta_version"] == 0 and metadata["rows"] == 2 and metadata["files"] == 1
        assert requested(engine, clock.now) == {"dws/order_usd_daily": {day(0)}}

        clock.now += timedelta(minutes=1)
        assert daemon.tick() == []
        assert requested(engine, clock.now) == {}
        engine.close()


# --- bad deliveries, duplicates and re-deliveries -----------------------------------------------------


def replay(root: Path, table: object, until: datetime) -> tuple[list[tuple[str, bool]], list[str]]:
    """Tick the sensor right after every producer event up to ``until``; reports and rejections."""
    source = external_source(ExternalResource(root=str(root)), table)  # type: ignore[arg-type]
    cursor, reported, rejected = DeliveryCursor(), [], []
    times = sorted({e.at for e in events_until(SEED, FIRST, until)} | {until})
    for now in times:
        simulate_external(root, FIRST, now, SEED)
        tick, cursor = delivery_tick(source, cursor, now + timedelta(minutes=1))
        reported += [(str(e.partition), bool(e.metadata["redelivery"].value)) for e in tick.events]
        rejected += tick.rejected
    return reported, rejected


def test_bad_markers_are_rejected_and_never_reported(tmp_path: Path) -> None:
    until = datetime(2026, 3, 10, 12, tzinfo=TZ)
    reported, rejected = replay(tmp_path, SPEND, until)
    firsts = [p for p, again in reported if not again]
    assert firsts == [day(n) for n in range(8)], "each arrived day once, in arrival order"
    assert [p for p, again in reported if again] == [day(CORRECTION_DAY)], "the corrected delivery only"
    assert all("2026-3-" not in p for p, _ in reported)

    def lines(fragment: str) -> list[str]:
        return [line for line in rejected if fragment in line]

    malformed = lines("malformed")
    assert len(malformed) == 1 and f"dt=2026-3-{FIRST.day + MALFORMED_DIR_DAY}" in malformed[0]
    assert len(lines(f"dt={day(MARKER_BEFORE_DATA_DAY)} — marker without data files")) == 1
    duplicate = lines("duplicate delivery")
    assert len(duplicate) == 1 and f"dt={day(DUPLICATE_MARKER_DAY)}" in duplicate[0]
    future = lines("future")
    assert len(future) == 1 and f"dt={day(FUTURE_DAY + 2)}" in future[0]
    assert len(rejected) == 4, rejected


def test_bad_fx_versions_are_rejected_and_corrections_reported_again(tmp_path: Path) -> None:
    until = datetime(2026, 3, 10, 12, tzinfo=TZ)
    reported, rejected = replay(tmp_path, FX, until)
    assert sorted(p for p, again in reported if not again) == [day(n) for n in range(8)]
    assert [p for p, again in reported if again] == [day(FX_CORRECTION_DAY)]
    assert any("malformed partition value '20260304'" in line for line in rejected), rejected
    assert any(f"dt={day(FX_DUPLICATE_DAY)} — same content" in line for line in rejected), rejected
    assert any(f"dt={day(7)}" in line and "is in the future" in line for line in rejected), rejected


def test_the_simulation_names_each_bad_delivery_it_makes_on_purpose(tmp_path: Path) -> None:
    """`warehouse dev` prints these as the producers deliver them: the rejections they cause then read as the
    simulation's deliberate bad cases, not as a fault of the warehouse."""
    applied = simulate_external(tmp_path, FIRST, datetime(2026, 3, 10, 12, tzinfo=TZ))
    cases = bad_cases(applied)
    malformed = day(FX_MALFORMED_DAY)
    assert (
        f"fx_rate {malformed}: an extra partition dt={malformed.replace('-', '')}, a malformed dt value (rejected)"
        in cases
    ), cases
    assert len(cases) == sum(1 for ident in applied if ident.count("/") == 2)  # every bad case, each once
    assert bad_cases([f"fx_rate/{malformed}"]) == []  # an ordinary delivery is none


def test_partition_values_from_outside_are_validated() -> None:
    now = datetime(2026, 3, 10, 12, tzinfo=TZ)
    days = {"timezone": "Asia/Shanghai", "first": "2026-01-01"}
    assert key_problem("2026-03-09", now, now, **days) is None
    assert "malformed" in str(key_problem("2026-3-9", now, now, **days))
    assert "malformed" in str(key_problem("20260309", now, now, **days))
    assert "not a calendar date" in str(key_problem("2026-02-30", now, now, **days))
    assert "before the first partition" in str(key_problem("2025-12-31", now, now, **days))
    assert "in the future" in str(key_problem("2026-03-11", now, now, **days))
    assert "before its day began" in str(key_problem("2026-03-10", now - timedelta(days=1), now, **days))


def test_a_future_directory_is_rejected(tmp_path: Path) -> None:
    now = datetime(2026, 3, 4, 12, tzinfo=TZ)
    simulate_external(tmp_path, FIRST, now, SEED)
    future = tmp_path / "marketing_spend" / "dt=2026-03-20"
    future.mkdir()
    (future / "part-00000.csv").write_text("channel,campaign_id,spend,impressions,clicks\nx,y,1.00,1,1\n")
    (future / "_SUCCESS").write_text("")
    tick, cursor = delivery_tick(external_source(ExternalResource(root=str(tmp_path)), SPEND), DeliveryCursor(), now)
    assert sorted(str(e.partition) for e in tick.events) == [day(0), day(1)]
    assert [line for line in tick.rejected if "2026-03-20" in line] == [
        "ext.marketing_spend: rejected delivery dt=2026-03-20 — partition 2026-03-20 is in the future "
        "(now 2026-03-04 12:00); not reported"
    ]
    # decided once: the next tick neither reports nor repeats the warning
    tick, _ = delivery_tick(
        external_source(ExternalResource(root=str(tmp_path)), SPEND), cursor, now + timedelta(minutes=1)
    )
    assert tick.events == [] and tick.rejected == []


# --- the cursor across restarts -------------------------------------------------------------------------


def test_a_restart_neither_loses_nor_repeats_a_report(tmp_path: Path) -> None:
    with instance_for_test() as instance:
        for table in (SPEND, FX):
            root = tmp_path / table.name
            clock = Clock(datetime(2026, 3, 5, 12, tzinfo=TZ))
            simulate_external(root, FIRST, clock.now, SEED)
            first = Daemon(instance, root, table, clock)
            assert sorted(str(e.partition) for e in first.tick()) == [day(0), day(1), day(2)]

            # the daemon restarts with its stored cursor: nothing is repeated
            restarted = Daemon(instance, root, table, clock)
            restarted.cursor = first.cursor
            assert restarted.tick() == []

            # the cursor is lost: the fingerprints in the instance still prevent a second report
            amnesiac = Daemon(instance, root, table, clock)
            assert amnesiac.tick() == []

            # deliveries made while the daemon was down are reported on its first tick back, once
            clock.now = datetime(2026, 3, 7, 12, tzinfo=TZ)
            simulate_external(root, FIRST, clock.now, SEED)
            back = Daemon(instance, root, table, clock)
            back.cursor = first.cursor
            assert sorted(str(e.partition) for e in back.tick()) == [day(3), day(4)]
            assert back.tick() == []
            assert instance.get_materialized_partitions(AssetKey(table.key)) == {day(n) for n in range(5)}


# --- "why is this waiting" ----------------------------------------------------------------------------------


def test_why_names_an_external_partition_not_arrived(tmp_path: Path) -> None:
    external = ExternalResource(root=str(tmp_path / "external"))
    store, landing = DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing")
    with instance_for_test() as instance:
        report(instance, AssetKey(["ads", "daily_gmv"]), day(0))
        why = explain(instance, catalog, store, landing, "ads.marketing_roi", day(0), external)
        states = {u.table: (u.state, u.detail) for u in why.upstream}
        assert states["ads.daily_gmv"] == ("materialized", "")
        state, detail = states["ext.marketing_spend"]
        assert state == "external not arrived" and "nothing delivered yet" in detail
        assert why.verdict.endswith(f"first: ext.marketing_spend {day(0)} (external not arrived)")

        marker = tmp_path / "external" / "marketing_spend" / f"dt={day(0)}" / "_SUCCESS"
        marker.parent.mkdir(parents=True)
        marker.write_text("")
        why = explain(instance, catalog, store, landing, "ads.marketing_roi", day(0), external)
        assert "marker but no data files" in {u.table: u.detail for u in why.upstream}["ext.marketing_spend"]


# --- the downstream users compute from what arrived -----------------------------------------------------


def _materialize(
    instance: DagsterInstance, key: AssetKey, partition: str, resources: dict[str, object]
) -> dict[str, object]:
    assets = [a for a in defs.assets or [] if isinstance(a, AssetsDefinition | AssetSpec)]
    result = materialize(assets, selection=[key], partition_key=partition, instance=instance, resources=resources)
    assert result.success
    return {k: v.value for k, v in result.get_asset_materialization_events()[0].materialization.metadata.items()}


def test_marketing_roi_and_order_usd_equal_an_independent_computation(
    tmp_path: Path, spark: SparkSession, consolidated: DagsterInstance
) -> None:

    now = datetime(2026, 3, 4, 12, tzinfo=TZ)
    simulate_external(tmp_path / "external", FIRST, now, SEED)
    store = DeltaStore(str(tmp_path / "lake"))
    gmv, paying = Decimal("12345.67"), 37
    store.overwrite(
        ["ads", "daily_gmv"],
        spark.sql(
            f"SELECT '{day(0)}' AS ds, CAST({gmv} AS decimal(18,2)) AS gmv, CAST({paying} AS bigint) AS paying_users, "
            f"CAST(50 AS bigint) AS orders, '{day(0)}' AS dt"
        ),
        ["dt"],
        [{"dt": day(0)}],
    )
    orders = [(1, "paid", "199.00"), (2, "paid", "99.00"), (3, "cancelled", "499.00"), (4, "paid", "0.50")]
    values = ", ".join(f"({i}, 10, 20, CAST({a} AS decimal(10,2)), '{s}')" for i, s, a in orders)
    store.overwrite(
        ["dwd", "order_detail"],
        spark.sql(
            f"SELECT col1 AS order_id, CAST(col2 AS bigint) AS user_id, CAST(col3 AS bigint) AS course_id, "
            f"col4 AS amount, col5 AS status, CAST(NULL AS timestamp) AS pay_time, CAST(NULL AS timestamp) "
            f"AS create_time, '{day(0)}' AS dt FROM VALUES {values}"
        ),
        ["dt"],
        [{"dt": day(0)}],
    )
    resources = {
        "spark": SparkResource(),
        "lake": DeltaLakeResource(root=str(tmp_path / "lake")),
        "external": ExternalResource(root=str(tmp_path / "external")),
    }
    instance = consolidated  # one event log in memory-backed storage: the runs without a database each
    report(instance, AssetKey(["ads", "daily_gmv"]), day(0))
    report(instance, AssetKey(["dwd", "order_detail"]), day(0))
    for table in (SPEND, FX):
        Daemon(instance, tmp_path / "external", table, Clock(now)).tick()
    numbers = _materialize(instance, ROI, day(0), resources)
    assert numbers["rows"] == 1
    _materialize(instance, USD, day(0), resources)

    # independently: the partner's CSV files with the csv module, the finance table with delta-rs
    rows = []
    for path in sorted((tmp_path / "external" / "marketing_spend" / f"dt={day(0)}").glob("part-*.csv")):
        rows += list(csv.DictReader(path.open()))
    spend = sum(Decimal(r["spend"]) for r in rows)
    [roi] = row_dicts(str(tmp_path / "lake" / "ads" / "marketing_roi"))
    assert roi["ds"] == roi["dt"] == day(0)
    assert roi["spend"] == spend
    assert roi["impressions"] == sum(int(r["impressions"]) for r in rows)
    assert roi["clicks"] == sum(int(r["clicks"]) for r in rows)
    assert roi["channels"] == len({r["channel"] for r in rows})
    assert roi["gmv"] == gmv and roi["paying_users"] == paying
    assert roi["roi"] == (gmv / spend).quantize(Decimal("0.0001"), ROUND_HALF_UP)
    assert roi["cost_per_paying_user"] == (spend / paying).quantize(Decimal("0.01"), ROUND_HALF_UP)

    fx = row_dicts(str(tmp_path / "external" / "fx_rate"))
    [rate] = [r["rate"] for r in fx if r["dt"] == day(0) and r["currency"] == "CNY" and r["quote"] == "USD"]
    usd = {r["status"]: r for r in row_dicts(str(tmp_path / "lake" / "dws" / "order_usd_daily"))}
    assert set(usd) == {"paid", "cancelled"}
    paid = sum(Decimal(a) for _, s, a in orders if s == "paid")
    assert usd["paid"]["orders"] == 3 and usd["paid"]["amount_cny"] == paid
    assert usd["paid"]["amount_usd"] == (paid * rate).quantize(Decimal("0.01"), ROUND_HALF_UP)
    assert usd["cancelled"]["cny_usd_rate"] == rate


GMV_USD = AssetKey(["ads", "gmv_usd_daily"])


def test_gmv_usd_runs_degraded_past_its_deadline_and_whole_once_the_rate_arrives(
    tmp_path: Path, spark: SparkSession, consolidated: DagsterInstance
) -> None:
    """ads.gmv_usd_daily waits for the day's rate until 10:00 on D+1 (long past here): built without it, its USD
    figure is null and the partition says degraded (metadata, state store, why); the rate arriving builds it whole."""
    from deltalake import DeltaTable

    rate_at = arrival(SEED, "fx_rate", FIRST, TZ)
    external = ExternalResource(root=str(tmp_path / "external"))
    simulate_external(tmp_path / "external", FIRST, rate_at - timedelta(minutes=1), SEED)  # no rate for day 0 yet
    store, landing = DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing")
    gmv = Decimal("12345.67")
    store.overwrite(
        ["ads", "daily_gmv"],
        spark.sql(f"SELECT '{day(0)}' AS ds, CAST({gmv} AS decimal(18,2)) AS gmv, '{day(0)}' AS dt"),
        ["dt"],
        [{"dt": day(0)}],
    )
    resources = {"spark": SparkResource(), "lake": DeltaLakeResource(root=str(tmp_path / "lake")), "external": external}
    lake = str(tmp_path / "lake" / "ads" / "gmv_usd_daily")
    instance = consolidated  # one event log in memory-backed storage: the runs without a database each
    report(instance, AssetKey(["ads", "daily_gmv"]), day(0))
    Daemon(instance, tmp_path / "external", FX, Clock(rate_at - timedelta(minutes=1))).tick()
    assert day(0) not in instance.get_materialized_partitions(AssetKey(FX.key))

    numbers = _materialize(instance, GMV_USD, day(0), resources)
    lacking = f"ext.fx_rate {day(0)} (missing; deadline {day(1)} 10:00)"
    assert numbers[DEGRADED] == {day(0): lacking}
    [row] = row_dicts(lake)
    assert (row["gmv"], row["gmv_usd"], row["cny_usd_rate"]) == (gmv, None, None)
    states = PartitionStateStore(instance)
    states.update()
    assert states.states(GMV_USD, [day(0)])[day(0)].degraded == lacking
    why = explain(instance, catalog, store, landing, "ads.gmv_usd_daily", day(0), external)
    assert why.own_state == (f"materialized, degraded: built without {lacking}; it is built again when they arrive")
    assert {u.table: u.state for u in why.upstream}["ext.fx_rate"] == "waived"

    simulate_external(tmp_path / "external", FIRST, rate_at + timedelta(minutes=1), SEED)
    Daemon(instance, tmp_path / "external", FX, Clock(rate_at + timedelta(minutes=1))).tick()
    numbers = _materialize(instance, GMV_USD, day(0), resources)
    assert DEGRADED not in numbers
    states.update()
    assert states.states(GMV_USD, [day(0)])[day(0)].degraded is None
    states.close()

    fx = DeltaTable(str(tmp_path / "external" / "fx_rate")).to_pyarrow_table().to_pylist()
    [rate] = [r["rate"] for r in fx if r["dt"] == day(0) and r["currency"] == "CNY" and r["quote"] == "USD"]
    [row] = row_dicts(lake)
    assert row["cny_usd_rate"] == rate
    assert row["gmv_usd"] == (gmv * rate).quantize(Decimal("0.01"), ROUND_HALF_UP)


def seed_paid_day(spark: SparkSession, lake: Path, partition: str) -> None:
    """``dws.user_order_daily`` ``partition`` in the lake: one user who paid 100.00 CNY that day."""
    DeltaStore(str(lake)).overwrite(
        ["dws", "user_order_daily"],
        spark.sql(
            f"SELECT CAST(7 AS bigint) AS user_id, CAST(2 AS bigint) AS orders, CAST(1 AS bigint) AS paid_orders, "
            f"CAST(100.00 AS decimal(20,2)) AS paid_amount, CAST(0 AS bigint) AS refunded_orders, '{partition}' AS dt"
        ),
        ["dt"],
        [{"dt": partition}],
    )


REVENUE = AssetKey(["dws", "revenue_usd_daily"])
FLASH = AssetKey(["ads", "revenue_flash"])


def test_revenue_is_estimated_on_the_previous_rate_then_completed_on_the_days_own(
    tmp_path: Path, spark: SparkSession, consolidated: DagsterInstance
) -> None:
    """dws.revenue_usd_daily day 1: estimated with day 0's rate while day 1's has not arrived (its materialization
    says so, the state store keeps it, a consumer accepting estimated builds on it), completed with day 1's."""
    from deltalake import DeltaTable

    before = arrival(SEED, "fx_rate", FIRST + timedelta(days=1), TZ) - timedelta(minutes=1)
    assert arrival(SEED, "fx_rate", FIRST, TZ) < before  # day 0's rate is in, day 1's is not
    external = ExternalResource(root=str(tmp_path / "external"))
    simulate_external(tmp_path / "external", FIRST, before, SEED)
    seed_paid_day(spark, tmp_path / "lake", day(1))
    resources = {"spark": SparkResource(), "lake": DeltaLakeResource(root=str(tmp_path / "lake")), "external": external}
    lake = tmp_path / "lake"
    instance = consolidated  # one event log in memory-backed storage: the runs without a database each
    report(instance, AssetKey(["dws", "user_order_daily"]), day(1))
    Daemon(instance, tmp_path / "external", FX, Clock(before)).tick()
    assert instance.get_materialized_partitions(AssetKey(FX.key)) == {day(0)}

    assert _materialize(instance, REVENUE, day(1), resources)[STATE] == {day(1): "estimated"}
    [row] = row_dicts(str(lake / "dws" / "revenue_usd_daily"))
    assert row["rate_of"] == day(0) and row["revenue_cny"] == Decimal("100.00")
    states = PartitionStateStore(instance)
    states.update()
    assert states.states(REVENUE, [day(1)])[day(1)].state == "estimated"
    _materialize(instance, FLASH, day(1), resources)  # the flash accepts an estimated day
    [flash] = row_dicts(str(lake / "ads" / "revenue_flash"))
    assert flash["final"] is False

    simulate_external(tmp_path / "external", FIRST, before + timedelta(minutes=2), SEED)
    Daemon(instance, tmp_path / "external", FX, Clock(before + timedelta(minutes=2))).tick()
    assert _materialize(instance, REVENUE, day(1), resources)[STATE] == {day(1): "completed"}
    states.update()
    assert states.states(REVENUE, [day(1)])[day(1)].state == "completed"
    states.close()
    _materialize(instance, FLASH, day(1), resources)

    fx = DeltaTable(str(tmp_path / "external" / "fx_rate")).to_pyarrow_table().to_pylist()
    [rate] = [r["rate"] for r in fx if r["dt"] == day(1) and r["currency"] == "CNY" and r["quote"] == "USD"]
    [row] = row_dicts(str(lake / "dws" / "revenue_usd_daily"))
    assert (row["rate_of"], row["cny_usd_rate"]) == (day(1), rate)
    assert row["revenue_usd"] == (Decimal("100.00") * rate).quantize(Decimal("0.01"), ROUND_HALF_UP)
    [flash] = row_dicts(str(lake / "ads" / "revenue_flash"))
    assert flash["final"] is True and flash["revenue_usd"] == row["revenue_usd"]


def test_external_assets_are_declared_partitioned_and_reported_by_running_sensors() -> None:
    graph = defs.resolve_asset_graph()
    for table in (SPEND, FX):
        node = graph.get(AssetKey(table.key))
        assert not node.is_executable and node.group_name == "ext"
        assert node.partitions_def == graph.get(ROI).partitions_def
        sensor = defs.get_sensor_def(f"ext_{table.name}")
        assert sensor.default_status.value == "RUNNING"
    assert AssetKey(SPEND.key) in graph.get(ROI).parent_keys
    assert AssetKey(FX.key) in graph.get(USD).parent_keys


class Recorder:
    """A submitter recording what the engine submits (the GraphQL submitter is exercised by test_embedded_stack)."""

    def __init__(self) -> None:
        self.plans: list[RunPlan] = []

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str:
        self.plans.append(plan)
        return f"run-{len(self.plans)}"


def test_the_engine_reports_a_delivery_and_starts_its_downstream_in_the_round_it_lands(tmp_path: Path) -> None:
    """No sensor tick between a delivery and its downstream run. The engine's watcher reports the
    marker in the round that first sees it and the same round submits ``ads.marketing_roi``; the sensor skips
    while the engine watches and, once the engine stops, reports nothing twice. A restarted engine repeats no
    report."""
    at = arrival(SEED, "marketing_spend", FIRST, TZ)
    clock = Clock(at - timedelta(minutes=1))
    external = ExternalResource(root=str(tmp_path))
    only_spend = Catalog({SPEND.fqn: SPEND})  # the watcher's producers (fx_rate's simulated table stays unwatched)
    with instance_for_test() as instance:
        report(instance, AssetKey(["ads", "daily_gmv"]), day(0))
        simulate_external(tmp_path, FIRST, clock.now, SEED)
        recorder = Recorder()
        watcher = ExternalWatcher(instance, only_spend, external, clock)
        engine = assemble_engine(
            instance, catalog, recorder, max_partitions_per_run, lambda: clock.now.astimezone(UTC), [watcher]
        )
        # the seeded day's own downstream starts (its week so far); marketing_roi waits for the partner's delivery
        first = engine.tick()
        assert [(p.table, p.partitions) for p, _ in first] == [("ads.gmv_week_to_date", (day(0),))]
        assert watched_ago(instance) is not None

        clock.now = at + timedelta(minutes=1)
        simulate_external(tmp_path, FIRST, clock.now, SEED)
        submitted = engine.tick()  # one round: the marker reported, its downstream resolved and submitted
        assert [(p.table, p.partitions) for p, _ in submitted] == [("ads.marketing_roi", (day(0),))]
        records = instance.fetch_materializations(AssetKey(SPEND.key), limit=10).records
        assert [r.partition_key for r in records] == [day(0)]
        assert engine.tick() == []

        daemon = Daemon(instance, tmp_path, SPEND, clock)
        context = build_sensor_context(instance=instance, resources={"external": external})
        skipped = daemon.sensor(context)
        assert isinstance(skipped, SkipReason) and "the engine reports" in str(skipped.skip_message)

        engine.close()
        assert watched_ago(instance) is None
        assert daemon.tick() == []  # the sensor takes over: the fingerprint of the engine's report stands

        again = assemble_engine(
            instance,
            catalog,
            recorder,
            max_partitions_per_run,
            clock=lambda: clock.now.astimezone(UTC),
            watchers=[ExternalWatcher(instance, only_spend, external, clock)],
        )
        assert again.tick() == []
        assert len(instance.fetch_materializations(AssetKey(SPEND.key), limit=10).records) == 1
        again.close()
