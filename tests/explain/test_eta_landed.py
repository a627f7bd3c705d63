"""A source hour that has landed (its segments and the source's count of it in the landing area) waits for the
ingestion, not for its source: it is predicted ready when the ingestion run that takes it ends, and is never an
overdue source. An hour not landed, later than every delay it had, still is, and warns. Pinned times, figures by hand.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context, instance_for_test, job
from dagster._core.test_utils import freeze_time

from resources.landing import Landing, LandingResource, counts_path, segment_name, stream_dir
from sensors.freshness import build_forecast_sensor
from tests.center.test_eta import SLOW_NOW, deliver_slowly
from tests.center.test_state_store import end, start
from warehouse_assets.catalog import Catalog, business_zone, load_catalog
from warehouse_assets.explain.eta import (
    ARRIVES,
    INGESTION,
    INGESTS,
    NOT_BUILT,
    History,
    LandedAt,
    Node,
    Prediction,
    Predictor,
    Queue,
    QueuedRun,
    RunTime,
    Seen,
)
from warehouse_assets.explain.eta_instance import instance_history
from warehouse_assets.explain.forecast import sla_warning
from warehouse_assets.explain.landed import LandedHours
from warehouse_assets.ingest.job import JOB
from warehouse_assets.materialize.freshness import deadline

ZONE = business_zone()
DAY = "2026-03-02"
GMV: Node = ("ads.daily_gmv", DAY)  # due 2026-03-03 09:00
LAST_HOUR: Node = ("ods.order", f"{DAY}-23:00")  # ends 2026-03-03 00:00


def at(hour: int, minute: int = 0, day: int = 3) -> float:
    return datetime(2026, 3, day, hour, minute, tzinfo=ZONE).timestamp()


class Graph:
    def upstream(self, node: Node) -> Sequence[Node]:
        return [LAST_HOUR] if node == GMV else []

    def is_source(self, table: str) -> bool:
        return table == "ods.order"

    def window_end(self, node: Node) -> float:
        return at(0)


class States:
    def seen(self, table: str, keys: Sequence[str]) -> Mapping[str, Seen]:
        return dict.fromkeys(keys, NOT_BUILT)


def learned(ingestion_s: float = 300.0, ingested_before: float | None = None) -> History:
    """Hours usually 5 to 8 minutes late; the GMV's run 10 minutes; the ingestion's runs ``ingestion_s``."""
    return History(
        arrivals={"ods.order": [300.0, 360.0, 420.0, 480.0]},
        runs={"ads.daily_gmv": [RunTime(600.0)] * 3, INGESTION: [RunTime(ingestion_s)] * 3},
        ingested_before=ingested_before,
    )


def landed_at(when: float | None) -> LandedAt:
    return lambda table, key: when if (table, key) == LAST_HOUR else None


def predicted(
    now: float, landed: LandedAt | None, history: History | None = None, queue: Queue | None = None
) -> tuple[Prediction, Prediction]:
    predictor = Predictor(Graph(), States(), history or learned(), now, queue, landed)
    return predictor.predict(*LAST_HOUR), predictor.predict(*GMV)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def test_a_landed_hour_waiting_for_ingestion_does_not_warn_its_readers_when_the_ingestion_fits(
    catalog: Catalog,
) -> None:
    gmv = catalog["ads.daily_gmv"]
    assert deadline(gmv, DAY).timestamp() == at(9)
    now = at(8)  # the day's last hour ended 8 hours ago: later than every delay it had (8 minutes)

    # not landed: an overdue source; as late again past its usual lateness, the GMV misses 09:00, and is warned
    hour, day = predicted(now, landed_at(None))
    assert hour.path[-1].kind == ARRIVES and hour.path[-1].overdue_s == 8 * 3600 - 480
    assert day.finish == at(8, 15) and day.latest > at(9)
    assert sla_warning(gmv, DAY, day, now) is not None

    # the same hour landed at 00:05 and waits for the ingestion: ingested by 08:05 (a run launched now, 5 minutes),
    # the GMV by 08:15; nothing pessimistic about it, no warning
    hour, day = predicted(now, landed_at(at(0, 5)))
    assert (hour.path[-1].kind, hour.path[-1].start, hour.finish, hour.latest) == (INGESTS, now, at(8, 5), at(8, 5))
    assert (day.finish, day.latest) == (at(8, 15), at(8, 15))
    assert sla_warning(gmv, DAY, day, now) is None
    assert "landed, ingested by the run from ~03-03 08:00 (ods_ingest 5 min (median of 3 runs))" in day.line(ZONE)

    # an ingestion that does not fit (its runs take an hour) still warns, by the point prediction
    _, day = predicted(now, landed_at(at(0, 5)), learned(ingestion_s=3600.0))
    assert day.finish == at(9, 10)
    assert sla_warning(gmv, DAY, day, now) is not None


def test_a_landed_hour_is_taken_by_the_ingestion_run_in_progress_or_else_by_the_next_one() -> None:
    now = at(8)

    def ingesting(since: float) -> Queue:
        return Queue([QueuedRun(INGESTION, (), started_at=since)])

    # landed before the run in progress started: that run takes it, ending 5 minutes after its start
    hour, _ = predicted(now, landed_at(at(7, 50)), queue=ingesting(at(7, 58)))
    assert (hour.path[-1].start, hour.finish) == (at(7, 58), at(8, 3))
    # a run in progress longer than usual ends at the earliest now
    hour, _ = predicted(now, landed_at(at(7, 50)), queue=ingesting(at(7, 52)))
    assert hour.finish == now
    # landed after it started: the next run, launched when this one ends (08:02), takes it
    hour, _ = predicted(now, landed_at(at(7, 59)), queue=ingesting(at(7, 57)))
    assert (hour.path[-1].start, hour.finish) == (at(8, 2), at(8, 7))


def test_a_landed_hour_an_ingestion_run_has_passed_waits_for_its_source_again(catalog: Catalog) -> None:
    # an ingestion run started at 02:00, after the hour had landed, and did not make it ready (rows it lacks, say):
    # what it waits for is at its source again, overdue as an hour not landed
    now = at(8)
    hour, day = predicted(now, landed_at(at(0, 5)), learned(ingested_before=at(2)))
    assert hour.path[-1].kind == ARRIVES and day.latest > at(9)
    assert sla_warning(catalog["ads.daily_gmv"], DAY, day, now) is not None
    # a run started before it landed did not take it
    hour, _ = predicted(now, landed_at(at(0, 5)), learned(ingested_before=at(0)))
    assert hour.path[-1].kind == INGESTS


# --- the landing area as the product reads it ----------------------------------------------------------------------

SHARDS = ("order_00", "order_01")  # ods.order's streams in this landing area (edu_trade.order_[0-9]{2})


def land(root: Path, table: str, first: datetime, segments: int, mtime: float) -> None:
    """``segments`` five-minute segments of a shard after the ones it has, from ``first`` on, written at ``mtime``."""
    directory = stream_dir(root, "edu_trade", table)
    directory.mkdir(parents=True, exist_ok=True)
    have = len(list(directory.iterdir()))
    for n in range(have, have + segments):
        path = directory / segment_name(n + 1, first + timedelta(minutes=5 * n))
        path.write_text("")
        os.utime(path, (mtime, mtime))


def count(root: Path, table: str, *hours: str) -> None:
    path = counts_path(root, "edu_trade", table)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.writelines(f'{{"hour": "{hour}", "rows": 10}}\n' for hour in hours)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def test_an_hour_has_landed_once_every_shards_segments_through_its_end_and_the_sources_count_are_there(
    tmp_path: Path, instance: DagsterInstance, catalog: Catalog
) -> None:
    landing = Landing(tmp_path, timezone=str(ZONE))
    start = datetime(2026, 3, 2, 22, 0)  # local time, as segment names are written
    land(tmp_path, "order_00", start, 12, at(23, 2, day=2))  # 22:00 to 23:00
    land(tmp_path, "order_00", start, 12, at(0, 5))  # 23:00 to 24:00
    land(tmp_path, "order_01", start, 18, at(23, 40, day=2))  # 22:00 to 23:30: behind
    count(tmp_path, "order_00", "2026-03-02T22", "2026-03-02T23")
    count(tmp_path, "order_01", "2026-03-02T22")

    landed = LandedHours(instance, catalog, landing)
    assert landed("ods.order", f"{DAY}-22:00") == at(23, 40, day=2)  # both shards' segments through 23:00
    assert landed(*LAST_HOUR) is None  # order_01's segments stop at 23:30
    assert landed("ads.daily_gmv", DAY) is None  # a derived table lands nowhere

    land(tmp_path, "order_01", start, 6, at(0, 10))  # its last half hour
    assert LandedHours(instance, catalog, landing)(*LAST_HOUR) is None  # its source has not counted 23:00 yet
    count(tmp_path, "order_01", "2026-03-02T23")
    assert LandedHours(instance, catalog, landing)(*LAST_HOUR) == at(0, 10)


def test_the_forecast_sensor_does_not_warn_for_hours_landed_and_waiting_for_ingestion(
    tmp_path: Path, instance: DagsterInstance, catalog: Catalog
) -> None:
    # ods.order as a slow source, its hours 22:00 and 23:00 not reported at 07:00: expected at 09:00 by its delays,
    # the day's GMV warned; once both hours are in the landing area, they are an ingestion away, and nothing is warned
    deliver_slowly(instance, catalog)
    sensor = build_forecast_sensor(catalog, clock=lambda: SLOW_NOW)

    def warned(root: Path) -> set[tuple[str, str | None]]:
        context = build_sensor_context(instance=instance, resources={"landing": LandingResource(root=str(root))})
        result = sensor(context)
        assert isinstance(result, SensorResult)
        return {(e.asset_key.to_user_string(), e.partition) for e in result.asset_events}

    assert ("ads/daily_gmv", DAY) in warned(tmp_path / "nothing")
    for shard in SHARDS:
        land(tmp_path, shard, datetime(2026, 3, 2, 22, 0), 24, at(0, 5))
        count(tmp_path, shard, "2026-03-02T22", "2026-03-02T23")
    assert not {key for key in warned(tmp_path) if key[0] in ("ads/daily_gmv", "ads/marketing_roi")}


@job(name=JOB)
def ingestion() -> None:  # a stand-in for the ingestion job: only its runs' times are read
    pass


def test_the_history_knows_when_the_newest_successful_ingestion_started(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    for began, ended, how in ((at(1), at(1, 6), "success"), (at(2), at(2, 4), "success"), (at(3), at(3, 1), "failure")):
        run = instance.create_run_for_job(ingestion)
        with freeze_time(datetime.fromtimestamp(began, ZONE)):
            start(instance, run)
        with freeze_time(datetime.fromtimestamp(ended, ZONE)):
            end(instance, run, how)
    known = instance_history(instance, catalog, datetime.fromtimestamp(at(4), ZONE))
    # the failed run at 03:00 took nothing for sure: what landed before 02:00 is ingested
    assert known.ingested_before == at(2)
    assert [(r.seconds, r.succeeded) for r in known.runs[INGESTION]] == [(60.0, False), (240.0, True), (360.0, True)]


def test_warehouse_status_predicts_a_landed_hour_at_the_ingestion_as_why_and_the_forecast_do(
    tmp_path: Path, instance: DagsterInstance, catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    # the slow source of the forecast sensor's test: without the landing area the day's GMV is predicted after its
    # 09:00 deadline; with its last hours landed, `warehouse status` predicts it an ingestion away, in time
    from argparse import Namespace

    from warehouse_assets.cli.repair import table_status_command

    deliver_slowly(instance, catalog)
    args = Namespace(table="ads.daily_gmv", range=(DAY, DAY), as_of=None)

    def status(root: Path) -> str:
        assert table_status_command(args, instance, Landing(root, timezone=str(ZONE)), now=SLOW_NOW) == 0
        return capsys.readouterr().out

    waiting = status(tmp_path / "nothing")
    assert " late" in waiting.split("SLA deadline 2026-03-03 09:00: predicted")[1], waiting
    for shard in SHARDS:
        land(tmp_path, shard, datetime(2026, 3, 2, 22, 0), 24, at(0, 5))
        count(tmp_path, shard, "2026-03-02T22", "2026-03-02T23")
    landed = status(tmp_path)
    assert " early" in landed.split("SLA deadline 2026-03-03 09:00: predicted")[1], landed
