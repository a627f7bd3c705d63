"""The predictions the product records and ``warehouse eta --accuracy``: recorded predictions scored against real
materialization events in a test instance, every figure computed by hand."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance, instance_for_test
from dagster._core.test_utils import freeze_time

from warehouse_assets.catalog import Catalog, business_zone, load_catalog
from warehouse_assets.explain.accuracy import instance_accuracy
from warehouse_assets.explain.eta import ARRIVES, RUNS, Estimate, Prediction, Step
from warehouse_assets.explain.prediction_log import FORECAST, REFRESH_S, RETAIN, WHY, PredictionLog
from warehouse_assets.materialize.freshness import deadline
from warehouse_assets.materialize.quality import report_valid

ZONE = business_zone()
DAY = "2026-03-02"


def at(hour: int, minute: int = 0) -> float:
    return datetime(2026, 3, 2, hour, minute, tzinfo=ZONE).timestamp()


def prediction(table: str, partition: str, finish: float) -> Prediction:
    source = Step("ods.order", f"{DAY}-09:00", ARRIVES, finish - 600)
    own = Step(table, partition, RUNS, finish, finish - 600, Estimate(600, 3, True))
    return Prediction(table, partition, finish, (source, own))


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def test_recorded_predictions_survive_a_reopen_with_their_path_and_deadline(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    with PredictionLog(path) as log:
        written = log.record(
            [prediction("ads.daily_gmv", DAY, at(20))], at(10), FORECAST, {("ads.daily_gmv", DAY): 5.0}
        )
    assert written == 1
    with PredictionLog(path) as log:  # a restarted process reads what the last one wrote
        [row] = log.read()
    assert (row.table, row.partition, row.made_at, row.source, row.finish, row.deadline) == (
        "ads.daily_gmv",
        DAY,
        at(10),
        FORECAST,
        at(20),
        5.0,
    )
    assert [(s.table, s.partition, s.kind) for s in row.path] == [
        ("ods.order", f"{DAY}-09:00", ARRIVES),
        ("ads.daily_gmv", DAY, RUNS),
    ]


def test_the_log_stays_bounded_unchanged_predictions_thinned_old_rows_pruned(tmp_path: Path) -> None:
    log = PredictionLog(tmp_path / "states.db")
    gmv = ("ads.daily_gmv", DAY)
    assert log.record([prediction(*gmv, at(20))], at(10), FORECAST) == 1
    assert log.record([prediction(*gmv, at(20) + 10)], at(10, 1), FORECAST) == 0  # unchanged a minute later
    assert log.record([prediction(*gmv, at(20))], at(10, 1), WHY) == 1  # another source keeps its own rows
    assert log.record([prediction(*gmv, at(21))], at(10, 2), FORECAST) == 1  # moved: recorded
    assert log.record([prediction(*gmv, at(21))], at(10, 2) + REFRESH_S, FORECAST) == 1  # unchanged but due again
    # one row per partition and tick, however often the tick predicted it
    assert log.record([prediction(*gmv, at(22)), prediction(*gmv, at(23))], at(11), FORECAST) == 1
    assert [r.finish for r in log.read(at(11))] == [at(23)]
    later = at(11) + RETAIN.total_seconds() + 1
    log.record([prediction("ads.marketing_roi", DAY, later + 60)], later, FORECAST)
    assert [(r.table, r.made_at) for r in log.read()] == [("ads.marketing_roi", later)]  # the older ones pruned
    with pytest.raises(ValueError, match="unknown prediction source 'ui'"):
        log.record([], later, "ui")
    log.close()


def test_accuracy_scores_recorded_predictions_against_the_event_logs_materializations(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    order = catalog["ods.order"]
    a, b, c = (f"{DAY}-{h}:00" for h in ("10", "11", "12"))  # due 12:15, 13:15, 14:15 (window end + 1 h 15 min)
    assert deadline(order, a).timestamp() == at(12, 15)
    for key, done in ((a, at(11, 40)), (b, at(13, 45))):  # a in time, b late; c never materialized
        with freeze_time(datetime.fromtimestamp(done, ZONE)):
            report_valid(instance, order, key, "delivered")
    due = {k: deadline(order, k).timestamp() for k in (a, b, c)}
    made = [
        (a, at(8, 30), at(11, 50), FORECAST),  # 3 h 10 min before its finish: 10 min off
        (a, at(10, 0), at(12, 30), FORECAST),  # past its deadline: a warning, and a false one
        (a, at(10, 30), at(11, 30), FORECAST),  # 70 min before: the 1 h horizon's latest, 10 min off
        (a, at(11, 25), at(11, 45), FORECAST),  # 15 min before: 5 min off
        (b, at(12, 30), at(13, 40), FORECAST),  # 75 min before: 5 min off; past the deadline 45 min ahead
        (c, at(13, 0), at(15, 0), WHY),  # past its deadline, but `why` warns nobody
    ]
    with PredictionLog.of(instance) as log:
        for key, when, finish, source in made:
            log.record([prediction("ods.order", key, finish)], when, source, {("ods.order", key): due[key]})

    since = datetime.fromtimestamp(at(11, 30), ZONE)  # a's finish and the three deadlines after it
    accuracy = instance_accuracy(instance, catalog, since, datetime.fromtimestamp(at(14, 20), ZONE))

    figures = accuracy.figures()
    assert (figures["real_eta_samples_1h"], figures["real_eta_err_p50_s"], figures["real_eta_err_p90_s"]) == (
        "2",
        "300",
        "600",
    )
    three, ten = accuracy.horizon("3h"), accuracy.horizon("10m")
    assert (three.samples, three.p90_s, ten.samples, ten.p90_s) == (1, 600, 1, 300)
    assert accuracy.horizon("1h").p90_share == pytest.approx(600 / (70 * 60))
    order_misses = {(m.partition, m.lead_s) for m in accuracy.misses if m.table == "ods.order"}
    assert order_misses == {(b, 45 * 60.0), (c, None)}
    # the other four ODS tables' three hours due in the span were never delivered: missed, never warned
    assert len(accuracy.misses) == 2 + 4 * 3 and len(accuracy.warned) == 1
    assert [(w.table, w.partition) for w in accuracy.false_warnings] == [("ods.order", a)]
    assert figures["real_warned_lead_min_s"] == "2700"
    text = "\n".join(accuracy.lines(ZONE))
    assert "missed ods.order 2026-03-02-11:00: due 03-02 13:15, materialized 03-02 13:45, warned 45 min ahead" in text
    assert "missed ods.order 2026-03-02-12:00: due 03-02 14:15, not materialized, NOT warned" in text


def test_the_error_of_the_partitions_that_met_their_sla_is_given_apart_from_the_misses(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """A held-back hour, 40 min off an hour before, sets the P90 of two finishes alone; on time, 2 min."""
    order = catalog["ods.order"]
    a, b = f"{DAY}-10:00", f"{DAY}-11:00"  # due 12:15 and 13:15
    for key, done in ((a, at(11, 20)), (b, at(13, 45))):
        with freeze_time(datetime.fromtimestamp(done, ZONE)):
            report_valid(instance, order, key, "delivered")
    with PredictionLog.of(instance) as log:
        for key, when, finish in ((a, at(10, 10), at(11, 22)), (b, at(12, 30), at(13, 5))):
            log.record([prediction("ods.order", key, finish)], when, FORECAST)
    since, now = (datetime.fromtimestamp(at(h, m), ZONE) for h, m in ((11, 16), (13, 50)))
    accuracy = instance_accuracy(instance, catalog, since, now)

    assert [(m.table, m.partition) for m in accuracy.misses if m.table == "ods.order"] == [("ods.order", b)]
    figures = accuracy.figures()
    assert (figures["real_eta_samples_1h"], figures["real_eta_err_p90_s"]) == ("2", "2400")
    assert (figures["real_eta_samples_1h_on_time"], figures["real_eta_err_p90_s_on_time"]) == ("1", "120")
    assert figures["real_eta_err_p90_share_on_time"] == f"{120 / 4200:.2f}"
    text = "\n".join(accuracy.lines(ZONE))
    assert "the partitions that met their SLA (or were due after the span):" in text
    assert "1 h before:    1 finishes, error P50 2 min, P90 2 min" in text, text


def test_accuracy_counts_only_the_finishes_since_the_start_of_the_span(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    order = catalog["ods.order"]
    key = f"{DAY}-05:00"
    with freeze_time(datetime.fromtimestamp(at(7), ZONE)):
        report_valid(instance, order, key, "delivered")
    with PredictionLog.of(instance) as log:
        log.record([prediction("ods.order", key, at(7, 30))], at(5, 50), FORECAST)
    now = datetime.fromtimestamp(at(12), ZONE)
    before = instance_accuracy(instance, catalog, datetime.fromtimestamp(at(6), ZONE), now)
    after = instance_accuracy(instance, catalog, datetime.fromtimestamp(at(8), ZONE), now)
    assert before.horizon("1h").samples == 1 and before.horizon("1h").p50_s == 1800
    assert after.horizon("1h").samples == 0


def test_the_eta_command_prints_the_scores_and_refuses_a_bad_since(
    instance: DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from warehouse_assets.cli.eta import eta_command

    since = (datetime.now(ZONE) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    assert eta_command(argparse.Namespace(accuracy=True, since=since), instance) == 0
    out = capsys.readouterr().out
    assert "0 predictions recorded" in out and "1 h before: no finish had a prediction made then" in out
    assert eta_command(argparse.Namespace(accuracy=True, since="yesterday"), instance) == 2
    assert "--since 'yesterday' is not a time" in capsys.readouterr().err
    assert eta_command(argparse.Namespace(accuracy=False, since=None), instance) == 2


def test_the_forecast_sensors_ticks_and_why_record_their_predictions(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    from dagster import build_sensor_context

    from resources.delta_lake import DeltaStore
    from resources.landing import Landing, LandingResource
    from sensors.freshness import build_forecast_sensor
    from warehouse_assets.explain.why import explain

    now = datetime(2026, 3, 3, 7, 0, tzinfo=ZONE)
    sensor = build_forecast_sensor(catalog, clock=lambda: now)
    resources = {"landing": LandingResource(root=str(tmp_path / "landing"))}
    sensor(build_sensor_context(instance=instance, resources=resources))
    with PredictionLog.of(instance) as log:
        rows = log.read()
    gmv = [r for r in rows if (r.table, r.partition) == ("ads.daily_gmv", "2026-03-02")]
    assert len(gmv) == 1 and gmv[0].source == FORECAST and gmv[0].made_at == now.timestamp()
    assert gmv[0].deadline == deadline(catalog["ads.daily_gmv"], "2026-03-02").timestamp()
    assert gmv[0].path[-1].table == "ads.daily_gmv" and gmv[0].path[0].table.startswith("ods.")
    assert {r.table for r in rows} >= {"ods.order", "ads.daily_gmv", "ads.marketing_roi"}

    sensor(build_sensor_context(instance=instance, resources=resources))  # the same tick again: nothing new to record
    lake, landing = DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing")
    explain(instance, catalog, lake, landing, "ads.daily_gmv", DAY, current_time=now)
    with PredictionLog.of(instance) as log:
        again = log.read()
    assert len(again) == len(rows) + 1
    [why] = [r for r in again if r.source == WHY]
    assert (why.table, why.partition) == ("ads.daily_gmv", DAY)
