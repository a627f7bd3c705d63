"""The predicted finish of a partition, its critical path and the early SLA warning, at pinned times with pinned
history: the figures are computed by hand in each test."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    DagsterInstance,
    SensorResult,
    build_sensor_context,
    instance_for_test,
)
from dagster._core.test_utils import freeze_time

from resources.delta_lake import DeltaStore
from resources.landing import Landing, LandingResource
from sensors.freshness import build_forecast_sensor
from warehouse_assets.catalog import Catalog, Table, business_zone, load_catalog
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.explain.eta import (
    ARRIVES,
    DEFAULT_RUN_S,
    MATERIALIZED,
    NOT_BUILT,
    QUEUED,
    RUNNING,
    RUNS,
    History,
    Node,
    Predictor,
    Queue,
    QueuedRun,
    Report,
    RunTime,
    Seen,
    predict,
    usual_delays,
)
from warehouse_assets.explain.eta_instance import CatalogGraph, instance_history, instance_predictor
from warehouse_assets.explain.forecast import (
    day_predictions,
    forecast_tick,
    sla_warning,
    timeline_markdown,
    warning_evaluation,
)
from warehouse_assets.explain.status import status_lines
from warehouse_assets.explain.why import explain
from warehouse_assets.materialize.quality import report_valid

ZONE = ZoneInfo("Asia/Shanghai")
END = datetime(2026, 3, 2, 11, 0, tzinfo=ZONE).timestamp()  # the source hour's window end


class Graph:
    """A hand-drawn partition graph: node → its upstream partitions; ``sources`` arrive by themselves."""

    def __init__(self, edges: Mapping[Node, Sequence[Node]], sources: set[str], ends: Mapping[Node, float]):
        self.edges, self.sources, self.ends = edges, sources, ends

    def upstream(self, node: Node) -> Sequence[Node]:
        return self.edges.get(node, ())

    def is_source(self, table: str) -> bool:
        return table in self.sources

    def window_end(self, node: Node) -> float:
        return self.ends[node]


class States:
    def __init__(self, seen: Mapping[Node, Seen]):
        self.known = seen
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    def seen(self, table: str, keys: Sequence[str]) -> dict[str, Seen]:
        self.asked.append((table, tuple(keys)))
        return {k: self.known.get((table, k), NOT_BUILT) for k in keys}


def runs(*seconds: float, failed: Sequence[float] = ()) -> list[RunTime]:
    return [RunTime(s) for s in seconds] + [RunTime(s, succeeded=False) for s in failed]


# ods.s hour h1 (not arrived) and h0 (materialized) → dwd.b → ads.c, which also reads dwd.d (running)
CHAIN = Graph(
    {
        ("dwd.b", "h1"): [("ods.s", "h0"), ("ods.s", "h1")],
        ("ads.c", "h1"): [("dwd.b", "h1"), ("dwd.d", "h1")],
    },
    {"ods.s"},
    {("ods.s", "h0"): END - 3600, ("ods.s", "h1"): END, ("dwd.b", "h1"): END, ("ads.c", "h1"): END},
)
CHAIN_STATES = {("ods.s", "h0"): Seen(ready_at=END - 3000), ("dwd.d", "h1"): Seen(started_at=END - 100)}
CHAIN_HISTORY = History(
    runs={"dwd.b": runs(100, 200, 300, 400), "dwd.d": runs(50, 50, 50), "ads.c": runs(10, 20)},
    arrivals={"ods.s": [60, 120, 180, 240, 600]},
)


def test_the_prediction_of_a_small_chain_equals_the_hand_computed_finish_and_names_its_path() -> None:
    # at END + 30 s, the hour waited 30 s: of its past delays all five are longer, their median is 180 s →
    # arrives END + 180; dwd.b starts then and takes the median of its 4 runs, 250 s → END + 430; dwd.d runs since
    # END - 100 for 50 s: overdue, so now (END + 30); ads.c has 2 runs, fewer than 3: what this warehouse's trusted
    # tables typically take, the median of dwd.b's 250 s and dwd.d's 50 s, 150 s → END + 580
    prediction = predict(CHAIN, States(CHAIN_STATES), CHAIN_HISTORY, END + 30, "ads.c", "h1")

    assert prediction.finish == END + 580
    assert [(s.table, s.partition, s.kind, s.finish) for s in prediction.path] == [
        ("ods.s", "h1", ARRIVES, END + 180),
        ("dwd.b", "h1", RUNS, END + 430),
        ("ads.c", "h1", RUNS, END + 580),
    ]
    assert prediction.path[1].start == END + 180
    line = prediction.line(ZONE)
    assert line.startswith("predicted ready ~03-02 11:09; critical path: ods.s h1 arrives ~03-02 11:03 → dwd.b h1")
    assert "ads.c h1 runs ~03-02 11:07 for 2 min (typical here: 2 successful runs known), ready ~03-02 11:09" in line


def test_a_source_later_than_its_usual_delay_is_expected_at_the_median_of_the_longer_delays_then_after_now() -> None:
    history = History(arrivals={"ods.s": [60, 120, 180, 240, 600]})
    assert history.arrival_delay("ods.s", -50) == 180  # before the window's end: the median of all
    assert history.arrival_delay("ods.s", 200) == 420  # waited 200 s: the median of 240 and 600
    assert history.arrival_delay("ods.s", 700) == 1000  # later than ever: 5 min after now


def test_too_few_runs_give_the_default_run_time() -> None:
    history = History(runs={"ads.c": runs(10, 20)}, default_run_s=123)
    estimate = history.run_time("ads.c")
    assert (estimate.seconds, estimate.runs, estimate.trusted) == (123, 2, False)
    assert history.run_time("never.ran").seconds == 123
    trusted = History(runs={"ads.c": runs(10, 20, 90)}).run_time("ads.c")
    assert (trusted.seconds, trusted.trusted) == (20, True)


def test_a_table_not_yet_learned_takes_what_this_warehouses_trusted_tables_typically_take() -> None:
    # three trusted tables (medians 20, 60, 100 s) and the ingestion job's long runs, which are not a table's
    history = History(
        runs={
            "dwd.a": runs(10, 20, 30),
            "dws.b": runs(60, 60, 60),
            "ads.c": runs(100, 100, 100),
            "job:ods_ingest": runs(900, 900, 900),
            "ads.new": runs(5000),
        }
    )
    estimate = history.run_time("ads.new")
    assert (estimate.seconds, estimate.runs, estimate.trusted) == (60, 1, False)
    assert history.run_time("never.ran").seconds == 60
    # no table trusted yet: the fixed default
    assert History(runs={"job:ods_ingest": runs(900, 900, 900)}).run_time("never.ran").seconds == DEFAULT_RUN_S


def test_failed_runs_are_excluded_from_a_tables_run_time() -> None:
    # the failures are long (a timeout) and the newest: they neither count nor push the successes out of the window
    history = History(runs={"dwd.b": runs(100, 200, 300, failed=[5000, 5000, 5000])[::-1]}, recent=3)
    assert history.run_time("dwd.b").seconds == 200
    only_two = History(runs={"dwd.b": runs(100, 200, failed=[50, 50, 50])}, default_run_s=77)
    assert only_two.run_time("dwd.b").seconds == 77  # two successes are too few, however many failures

    prediction = predict(
        CHAIN, States(CHAIN_STATES), History(runs={"dwd.b": runs(100, 200, 300, failed=[9000])}), END, "dwd.b", "h1"
    )
    assert prediction.path[-1].run is not None and prediction.path[-1].run.seconds == 200


def test_the_queue_ahead_delays_a_queued_run_and_a_run_not_yet_submitted() -> None:
    now = END
    history = History(runs={"x.x": runs(100, 100, 100), "y.y": runs(200, 200, 200), "z.z": runs(50, 50, 50)})
    graph = Graph({("w.w", "p"): [("z.z", "p0")]}, set(), {("w.w", "p"): now - 3600})
    states = States({("z.z", "p"): Seen(queued=True), ("z.z", "p0"): Seen(ready_at=now - 10)})
    queue = [
        QueuedRun("x.x", ("p",), started_at=now - 10),  # frees its slot at now + 90
        QueuedRun("y.y", ("p",)),  # queued ahead of z.z: starts at now + 90, ends now + 290
        QueuedRun("z.z", ("p",)),
    ]
    one_slot = Predictor(graph, states, history, now, Queue(queue, slots=1))
    queued = one_slot.predict("z.z", "p")
    assert (queued.path[-1].kind, queued.path[-1].start, queued.finish) == (QUEUED, now + 290, now + 340)
    # w.w's upstream is ready now, but whatever is submitted now waits until the queue has drained: now + 340; it
    # never ran, so it takes what the tables here typically take (the median of 100, 200 and 50 s)
    waiting = one_slot.predict("w.w", "p")
    assert (waiting.path[-1].start, waiting.finish) == (now + 340, now + 340 + 100)

    two_slots = predict(graph, states, history, now, "z.z", "p", Queue(queue, slots=2))
    assert two_slots.finish == now + 90 + 50  # y.y takes the free slot at once, z.z the one x.x frees
    unlimited = predict(graph, states, history, now, "z.z", "p", Queue(queue))
    assert unlimited.finish == now + 50
    with pytest.raises(ValueError, match="at least one slot"):
        Queue(queue, slots=0)


def test_materialized_running_and_queued_partitions_end_the_walk() -> None:
    states = States({**CHAIN_STATES, ("dwd.b", "h1"): Seen(started_at=END - 60)})
    prediction = predict(CHAIN, states, CHAIN_HISTORY, END, "ads.c", "h1")
    # dwd.b runs since END - 60 for 250 s: END + 190, then ads.c the typical 150 s; the source hour under it is never
    # asked for
    assert prediction.finish == END + 340
    assert [s.kind for s in prediction.path] == [RUNNING, RUNS]
    assert all(table != "ods.s" for table, _ in states.asked)

    built = predict(CHAIN, States({("ads.c", "h1"): Seen(ready_at=END - 5)}), CHAIN_HISTORY, END, "ads.c", "h1")
    assert built.known and built.finish == END - 5 and built.path[-1].kind == MATERIALIZED


# --- the SLA warning on the example warehouse: ads.daily_gmv is due at 09:00 the next morning ---------------------

DAY = "2026-03-02"
LATE_HOUR = ("ods.order", f"{DAY}-23:00")
CHAIN_TO_GMV = [LATE_HOUR, ("dwd.order_detail", DAY), ("dws.user_order_daily", DAY), ("ads.daily_gmv", DAY)]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def index(catalog: Catalog) -> ReverseIndex:
    return ReverseIndex.build(catalog, current_time=datetime(2026, 3, 10, tzinfo=ZONE))


class Everything:
    """Every partition materialized at ``at`` but the ``missing`` ones."""

    def __init__(self, at: float, missing: set[Node]):
        self.at, self.missing = at, missing

    def seen(self, table: str, keys: Sequence[str]) -> dict[str, Seen]:
        return {k: NOT_BUILT if (table, k) in self.missing else Seen(ready_at=self.at) for k in keys}


def _predictor(catalog: Catalog, index: ReverseIndex, now: datetime, run_s: float) -> Predictor:
    history = History(
        runs={t.fqn: runs(run_s, run_s, run_s) for t in catalog},
        arrivals={"ods.order": [300.0] * 5, "ext.marketing_spend": [7 * 3600.0] * 5},
    )
    missing = {*CHAIN_TO_GMV, ("ads.marketing_roi", DAY)}
    states = Everything(datetime(2026, 3, 3, 0, 10, tzinfo=ZONE).timestamp(), missing)
    return Predictor(CatalogGraph(catalog, index, now), states, history, now.timestamp())


def test_the_warning_fires_before_the_deadline_naming_the_critical_path(catalog: Catalog, index: ReverseIndex) -> None:
    # at 07:00 the 23:00 hour of ods.order is 7 h later than any it had (5 min): expected 07:05; then three runs of
    # 40 min each: ready 09:05, five minutes past the 09:00 deadline
    now = datetime(2026, 3, 3, 7, 0, tzinfo=ZONE)
    predictor = _predictor(catalog, index, now, run_s=40 * 60)
    prediction = predictor.predict("ads.daily_gmv", DAY)
    assert prediction.at(ZONE) == datetime(2026, 3, 3, 9, 5, tzinfo=ZONE)
    assert [(s.table, s.partition) for s in prediction.path] == CHAIN_TO_GMV

    warning = sla_warning(catalog["ads.daily_gmv"], DAY, prediction, now.timestamp())
    assert warning is not None
    assert warning.due == datetime(2026, 3, 3, 9, 0, tzinfo=ZONE) and warning.late_by_s == 300
    assert "5 min after its deadline 2026-03-03 09:00" in warning.describe()
    assert "ods.order 2026-03-02-23:00 arrives ~03-03 07:05 → dwd.order_detail 2026-03-02 runs" in warning.describe()

    event = warning_evaluation(warning, timeline_markdown([prediction], ZONE, DAY))
    assert (event.check_name, event.passed, event.severity, event.blocking) == (
        "sla_forecast",
        False,
        AssetCheckSeverity.WARN,
        False,
    )
    assert event.partition == DAY and event.metadata["lead_minutes"].value == 120.0
    assert "ods.order 2026-03-02-23:00" in str(event.metadata["critical_path"].value)
    timeline = str(event.metadata["timeline"].value)
    assert "```mermaid\ngantt" in timeline
    assert "ods.order 2026-03-02-23h00 arrives :milestone, 2026-03-03T07:05, 0d" in timeline
    assert "ads.daily_gmv 2026-03-02 runs :crit, 2026-03-03T08:25, 40m" in timeline


def test_no_warning_when_the_prediction_is_within_the_sla(catalog: Catalog, index: ReverseIndex) -> None:
    # the 23:00 hour waited 3 min of its usual 5: expected 00:05, the other inputs are in at 00:10, then three runs
    # of 30 min (an hour hours overdue warns by its pessimistic finish: tests/explain/test_eta_overdue.py)
    now = datetime(2026, 3, 3, 0, 3, tzinfo=ZONE)
    prediction = _predictor(catalog, index, now, run_s=30 * 60).predict("ads.daily_gmv", DAY)
    assert prediction.at(ZONE) == datetime(2026, 3, 3, 1, 40, tzinfo=ZONE)
    assert sla_warning(catalog["ads.daily_gmv"], DAY, prediction, now.timestamp()) is None
    # nor once the deadline has passed: the freshness check judges the partition then
    late = datetime(2026, 3, 3, 9, 1, tzinfo=ZONE)
    prediction = _predictor(catalog, index, late, run_s=30 * 60).predict("ads.daily_gmv", DAY)
    assert sla_warning(catalog["ads.daily_gmv"], DAY, prediction, late.timestamp()) is None


def test_a_tick_warns_once_per_partition_and_keeps_it_until_the_deadline(catalog: Catalog, index: ReverseIndex) -> None:
    now = datetime(2026, 3, 3, 7, 0, tzinfo=ZONE)
    first = forecast_tick(catalog, _predictor(catalog, index, now, 40 * 60), {}, timedelta(hours=6))
    # marketing_roi reads the GMV (and the partner's delivery, there since 00:10): late through the same chain
    assert sorted((w.table.fqn, w.partition) for w in first.warnings) == [
        ("ads.daily_gmv", DAY),
        ("ads.marketing_roi", DAY),
    ]
    roi = next(p for p in first.predictions if p.table == "ads.marketing_roi")
    assert [(s.table, s.partition) for s in roi.path] == [*CHAIN_TO_GMV, ("ads.marketing_roi", DAY)]
    assert roi.at(ZONE) == datetime(2026, 3, 3, 9, 45, tzinfo=ZONE)
    assert first.warned == {"ads.daily_gmv": [DAY], "ads.marketing_roi": [DAY]}

    again = forecast_tick(catalog, _predictor(catalog, index, now, 40 * 60), first.warned, timedelta(hours=6))
    assert again.warnings == [] and again.warned == first.warned
    lost_cursor = forecast_tick(
        catalog, _predictor(catalog, index, now, 40 * 60), {}, timedelta(hours=6), lambda table, key: True
    )
    assert lost_cursor.warnings == []
    after = datetime(2026, 3, 3, 9, 30, tzinfo=ZONE)
    assert (
        forecast_tick(catalog, _predictor(catalog, index, after, 40 * 60), first.warned, timedelta(hours=6)).warned
        == {}
    )


def test_a_days_timeline_has_each_ads_table_and_its_critical_path(catalog: Catalog, index: ReverseIndex) -> None:
    now = datetime(2026, 3, 3, 7, 0, tzinfo=ZONE)
    predictions = day_predictions(catalog, _predictor(catalog, index, now, 40 * 60), DAY)
    daily_ads = sorted(t.fqn for t in catalog if t.layer == "ads" and t.period == "daily")
    # a table with regions: each region's day of the date
    regional = [f"{DAY}|{region}" for region in ("shanghai", "karachi", "utc", "los_angeles")]
    expected = [(t, key) for t in daily_ads for key in (regional if t == "ads.dau_by_region" else [DAY])]
    assert [(p.table, p.partition) for p in predictions] == expected
    timeline = timeline_markdown(predictions, ZONE, DAY)
    for table, key in expected:
        assert f"section {table} {key}" in timeline
    assert f"| ads.daily_gmv {DAY} | 03-03 09:05 |" in timeline
    # Markdown's cell delimiter in a region's key is escaped: each row keeps its four cells
    assert f"| ads.dau_by_region {DAY}\\|los_angeles | " in timeline
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 5 for line in timeline.splitlines() if line.startswith("| ads."))
    with pytest.raises(ValueError, match="not a day's partition key"):
        day_predictions(catalog, _predictor(catalog, index, now, 60), "2026-03-02-10:00")


def test_a_partition_runs_once_its_window_has_ended_however_early_its_upstream_was_ready() -> None:
    # a day reading only the day before: its upstream is ready at END - 100, but the day exists from its end on
    graph = Graph({("dws.d", "day"): [("dws.d", "day-1")]}, set(), {("dws.d", "day"): END + 3600})
    states = States({("dws.d", "day-1"): Seen(ready_at=END - 100)})
    prediction = predict(graph, states, History(default_run_s=60), END, "dws.d", "day")
    assert (prediction.path[-1].start, prediction.finish) == (END + 3600, END + 3660)


# --- on an instance: what `warehouse why`, `warehouse status` and the sla_forecast sensor show -------------------

HOURS = [f"{DAY}-{h:02d}:00" for h in range(24)]
GMV_PATH = f"ods.order {DAY}-23:00 → dwd.order_detail {DAY} → dws.user_order_daily {DAY} → ads.daily_gmv {DAY}"


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def test_why_and_status_print_the_prediction_and_its_critical_path(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    order = catalog["ods.order"]
    for hour in HOURS[:23]:  # the 23:00 hour is not reported
        report_valid(instance, order, hour, "loaded by the test")
    now = datetime.now(UTC)
    why = explain(
        instance,
        catalog,
        DeltaStore(str(tmp_path / "lake")),
        Landing(tmp_path / "landing"),
        "ads.daily_gmv",
        DAY,
        current_time=now,
    )
    prediction = why.prediction
    assert prediction is not None
    assert [(s.table, s.partition, s.kind) for s in prediction.path] == [
        ("ods.order", f"{DAY}-23:00", ARRIVES),
        ("dwd.order_detail", DAY, RUNS),
        ("dws.user_order_daily", DAY, RUNS),
        ("ads.daily_gmv", DAY, RUNS),
    ]
    # no table has run yet: three runs of the default 5 min each after the hour arrives (it is late: after now)
    assert prediction.path[0].finish > now.timestamp()
    assert prediction.finish == prediction.path[0].finish + 3 * 300
    lines = why.lines()
    predicted = next(line for line in lines if line.startswith("predicted ready: ~"))
    assert "(SLA deadline 2026-03-03 09:00: predicted" in predicted and predicted.endswith(" late)")
    path = lines[lines.index(predicted) + 1]
    assert path.startswith(f"critical path: {GMV_PATH}; set by ods.order {DAY}-23:00 arrives ~")
    assert lines[-1].startswith("verdict: ")  # the verdict stays the last line
    steps = prediction.critical_path(ZONE)
    assert f"ads.daily_gmv {DAY} runs ~" in steps and "(typical here: 0 successful runs known)" in steps

    store = PartitionStateStore(instance)
    try:
        view = store.view()
        predictor = instance_predictor(instance, catalog, view, now)
        status = status_lines(catalog, view, "ads.daily_gmv", [DAY], None, predictor.predict)
        built = status_lines(catalog, view, "ods.order", [HOURS[0]], None, predictor.predict)
    finally:
        store.close()
    assert f"predicted ready ~{prediction.at(ZONE):%m-%d %H:%M} (critical path: {GMV_PATH})" in status[1]
    assert "SLA deadline 2026-03-03 09:00: predicted" in status[1]
    assert "predicted" not in built[1]  # a built partition has nothing to predict


def report_at(instance: DagsterInstance, table: Table, partition: str, at: datetime) -> None:
    """``partition`` reported (materialized, its blocking checks passed) at ``at``, as its source delivered it."""
    with freeze_time(at):
        report_valid(instance, table, partition, "loaded by the test")


SLOW_NOW = datetime(2026, 3, 3, 7, 0, tzinfo=business_zone())  # the forecast's tick of the slow source


def deliver_slowly(instance: DagsterInstance, catalog: Catalog) -> None:
    """ods.order as a slow source: each hour of 2026-03-02 delivered alone, 9 hours after it ends, up to
    :data:`SLOW_NOW` (21:00-22:00 at 07:00). Its 23:00 hour is then expected at 09:00, and the day's GMV, three runs
    later, after its 09:00 deadline."""
    for h in range(22):
        end = datetime(2026, 3, 2, h, tzinfo=business_zone()) + timedelta(hours=1)
        report_at(instance, catalog["ods.order"], f"{DAY}-{h:02d}:00", end + timedelta(hours=9))


def test_the_forecast_sensor_warns_before_the_deadline_naming_the_path_with_the_days_timeline(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    now = SLOW_NOW
    # the day whose 09:00 deadline is the next one: predicted at this tick
    day = now.date() if now.hour >= 9 else now.date() - timedelta(days=1)
    deliver_slowly(instance, catalog)
    assert instance_history(instance, catalog, now).arrivals["ods.order"] == [9 * 3600.0] * 10
    sensor = build_forecast_sensor(catalog, clock=lambda: now)
    landing = {"landing": LandingResource(root=str(tmp_path / "landing"))}  # nothing landed: the hours are late
    result = sensor(build_sensor_context(instance=instance, resources=landing))
    assert isinstance(result, SensorResult)
    warnings = {(e.asset_key.to_user_string(), e.partition): e for e in result.asset_events}
    gmv = warnings[("ads/daily_gmv", day.isoformat())]
    assert isinstance(gmv, AssetCheckEvaluation)
    assert (gmv.check_name, gmv.passed, gmv.severity, gmv.blocking) == (
        "sla_forecast",
        False,
        AssetCheckSeverity.WARN,
        False,
    )
    assert str(gmv.metadata["critical_path"].value).startswith(f"ods.order {day}-23:00 arrives ~")
    assert gmv.metadata["lead_minutes"].value > 0
    timeline = str(gmv.metadata["timeline"].value)
    assert "```mermaid\ngantt" in timeline and f"section ads.daily_gmv {day}" in timeline
    # ods.order's own hours due within a day are predicted late too; of the derived tables only those it delays
    # (another ODS table's hour, without history, may be warned about when it is already overdue)
    soon = (now + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    assert ("ods/order", f"{soon:%Y-%m-%d-%H}:00") in warnings
    assert {table for table, _ in warnings if not table.startswith("ods/")} == {"ads/daily_gmv", "ads/marketing_roi"}

    again = sensor(build_sensor_context(instance=instance, cursor=result.cursor, resources=landing))
    assert isinstance(again, SensorResult) and not again.asset_events  # once per partition


def test_a_catch_ups_reports_teach_no_delay_and_raise_no_warning(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    # a stack started at 15:10 on three and a half days of past data: its ingestion reports ods.order a day's hours at
    # a time, two minutes apart, the last batch today's hours up to 14:00-15:00 (16 minutes after that hour ended)
    now = datetime(2026, 3, 5, 15, 20, tzinfo=business_zone())
    order = catalog["ods.order"]
    for n, day in enumerate(["2026-03-02", "2026-03-03", "2026-03-04", "2026-03-05"]):
        at = datetime(2026, 3, 5, 15, 10 + 2 * n, tzinfo=business_zone())
        for h in range(24 if n < 3 else 15):
            report_at(instance, order, f"{day}-{h:02d}:00", at)

    # of the days-late hours nothing is learned: only the newest hour, which waited as a live hour waits
    assert instance_history(instance, catalog, now).arrivals["ods.order"] == [16 * 60.0]
    sensor = build_forecast_sensor(catalog, clock=lambda: now)
    result = sensor(build_sensor_context(instance=instance, resources={"landing": LandingResource(root=str(tmp_path))}))
    assert isinstance(result, SensorResult)
    # no warning: not for the hours to come (no delay of days was learned), nor for the catch-up's GMV days, unbuilt,
    # whose deadlines have passed (missed SLAs, which the freshness check reports, not a forecast)
    assert result.asset_events == []


def test_a_source_learns_its_usual_delays_not_a_backlogs() -> None:
    hour = 3600.0

    def hourly(h: int, at_minutes: float) -> Report:  # hour h of the day (epoch 0), reported at a minute of the day
        return Report(h * hour, (h + 1) * hour, at_minutes * 60)

    # live hours: 10:00-11:00 at 11:05, 11:00-12:00 at 12:04, each learned, newest first
    assert usual_delays([hourly(10, 11 * 60 + 5), hourly(11, 12 * 60 + 4)]) == [240, 300]
    # a backlog: hours 00:00 to 09:00 all reported at 11:30; only the newest, 90 minutes after its end, is learned
    assert usual_delays([hourly(h, 11 * 60 + 30) for h in range(10)]) == [90 * 60]
    # a late hour that came alone is learned (the next one came on time, 35 minutes before it)
    assert usual_delays([hourly(10, 12 * 60 + 40), hourly(11, 12 * 60 + 5)]) == [100 * 60, 5 * 60]
    # a day or more late is a catch-up, also alone; a month delivered three days after its end is not
    assert usual_delays([hourly(0, 25 * 60)]) == []
    month = 31 * 24 * hour
    assert usual_delays([Report(0, month, month + 3 * 24 * hour)]) == [3 * 24 * hour]
