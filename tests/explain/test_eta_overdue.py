"""A source later than all its history (overdue) makes its readers' finishes uncertain: the point prediction stays a
little after now, the SLA warning reads the pessimistic finish (the source as late again past its usual lateness),
so a real miss is warned while there is time, and the scoring counts that warning. Pinned times, figures by hand."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, instance_for_test
from dagster._core.test_utils import freeze_time

from warehouse_assets.catalog import Catalog, business_zone, load_catalog
from warehouse_assets.explain.accuracy import instance_accuracy
from warehouse_assets.explain.eta import NOT_BUILT, History, Node, Prediction, Predictor, RunTime, Seen
from warehouse_assets.explain.forecast import sla_warning
from warehouse_assets.explain.prediction_log import FORECAST, PredictionLog
from warehouse_assets.materialize.freshness import deadline
from warehouse_assets.materialize.quality import report_valid

ZONE = business_zone()
HOUR = "2026-03-02-10:00"  # ods.order's hour 10:00-11:00: due 12:15 (its end + 1 h 15 min)
SOURCE: Node = ("ods.order", HOUR)
READER: Node = ("dws.r", HOUR)


def at(hour: int, minute: int = 0) -> float:
    return datetime(2026, 3, 2, hour, minute, tzinfo=ZONE).timestamp()


class Graph:
    def upstream(self, node: Node) -> Sequence[Node]:
        return [SOURCE] if node == READER else []

    def is_source(self, table: str) -> bool:
        return table == "ods.order"

    def window_end(self, node: Node) -> float:
        return at(11)


class States:
    def __init__(self, seen: Mapping[Node, Seen] | None = None):
        self.known = seen or {}

    def seen(self, table: str, keys: Sequence[str]) -> dict[str, Seen]:
        return {k: self.known.get((table, k), NOT_BUILT) for k in keys}


# its hours came 5 to 8 minutes after their end: its usual lateness is 8 minutes
USUAL = History(arrivals={"ods.order": [300.0, 360.0, 420.0, 480.0]}, runs={"dws.r": [RunTime(600.0)] * 3})


def predicted(now: float, history: History = USUAL) -> tuple[Prediction, Prediction]:
    predictor = Predictor(Graph(), States(), history, now)
    return predictor.predict(*SOURCE), predictor.predict(*READER)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def test_an_overdue_source_warns_while_there_is_time_and_an_hour_late_by_its_usual_minutes_does_not(
    catalog: Catalog,
) -> None:
    order = catalog["ods.order"]
    assert deadline(order, HOUR).timestamp() == at(12, 15)

    # 11:08: late by its usual 8 minutes, not overdue: the pessimistic finish is the finish, no warning
    source, reader = predicted(at(11, 8))
    assert (source.finish, source.latest, reader.latest) == (at(11, 13), at(11, 13), at(11, 23))
    assert sla_warning(order, HOUR, source, at(11, 8)) is None

    # 11:30: 22 min past its usual lateness: expected at 11:35 at the earliest, 11:52 if as late again: in time
    source, reader = predicted(at(11, 30))
    assert (source.finish, source.latest) == (at(11, 35), at(11, 52))
    assert (reader.finish, reader.latest) == (at(11, 45), at(12, 2))  # its reader shifts with it
    assert sla_warning(order, HOUR, source, at(11, 30)) is None

    # 11:42: 34 min past it: as late again it comes 12:16, past the 12:15 deadline, warned 33 min ahead, while the
    # point prediction (11:47) alone would have warned only at 12:11, four minutes before
    source, _ = predicted(at(11, 42))
    assert (source.finish, source.latest) == (at(11, 47), at(12, 16))
    warning = sla_warning(order, HOUR, source, at(11, 42))
    assert warning is not None and warning.late_by_s == 60
    assert warning.describe().startswith(
        f"ods.order {HOUR} is 34 min past its usual lateness: as late again, ready ~03-02 12:16, 60 s after its "
        "deadline 2026-03-02 12:15 (~03-02 11:47 if it comes now)"
    )


def test_a_source_without_history_is_overdue_past_the_default_delay() -> None:
    # no reports learned yet (a stack just started): its usual lateness is the default 10 minutes
    source, _ = predicted(at(11, 50), History(default_arrival_s=600.0))
    assert (source.finish, source.latest) == (at(11, 55), at(11, 50) + 40 * 60)
    assert History().lateness("ods.order") == 600.0
    assert USUAL.lateness("ods.order") == 480.0


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def test_the_pessimistic_finish_is_recorded_and_scored_as_the_warning_it_raised(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    order = catalog["ods.order"]
    with freeze_time(datetime.fromtimestamp(at(12, 18), ZONE)):  # 3 min after its deadline
        report_valid(instance, order, HOUR, "delivered")
    due = {SOURCE: at(12, 15)}
    with PredictionLog.of(instance) as log:
        for minute in (30, 42, 50):  # in time at 11:30; past the deadline by its pessimistic finish from 11:42 on
            source, _ = predicted(at(11, minute))
            assert log.record([source], at(11, minute), FORECAST, due) == 1
        rows = log.read()
    assert [r.latest for r in rows] == [at(11, 52), at(12, 16), at(12, 32)]
    assert [r.warns for r in rows] == [False, True, True]

    since, now = datetime.fromtimestamp(at(12), ZONE), datetime.fromtimestamp(at(12, 20), ZONE)
    accuracy = instance_accuracy(instance, catalog, since, now)
    ours = [m for m in accuracy.misses if (m.table, m.partition) == SOURCE]
    assert len(ours) == 1 and ours[0].lead_s == 33 * 60


def test_a_prediction_log_written_before_the_pessimistic_finish_gains_its_column(tmp_path: Path) -> None:
    path = tmp_path / "partition_states.db"
    with sqlite3.connect(path) as db:  # the table as it was: no column for the pessimistic finish
        db.execute(
            "CREATE TABLE eta_predictions (table_fqn TEXT NOT NULL, partition TEXT NOT NULL, made_at REAL NOT NULL, "
            "source TEXT NOT NULL, finish REAL NOT NULL, deadline REAL, path TEXT NOT NULL, "
            "PRIMARY KEY (table_fqn, partition, source, made_at)) WITHOUT ROWID"
        )
        row = ("ods.order", HOUR, at(11), FORECAST, at(11, 20), None, "[]")
        db.execute("INSERT INTO eta_predictions VALUES (?, ?, ?, ?, ?, ?, ?)", row)
    db.close()
    with PredictionLog(path) as log:
        source, _ = predicted(at(11, 42))
        log.record([source], at(11, 42), FORECAST)
        rows = log.read()
    assert [(r.made_at, r.latest) for r in rows] == [(at(11), None), (at(11, 42), at(12, 16))]
    with PredictionLog(path) as log:  # opened again: the column is there, nothing to add
        assert len(log.read()) == 2
