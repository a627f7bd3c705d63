"""Completeness per 5-minute window: a window is complete at exactly the threshold of its source count, an hour when
its 12 windows are, and one arrival of changes completes the partitions of every period it closes, each once.

Pure: a :class:`Readiness` of pinned counts (what the source published per window, what the ingestion recorded), no
lake and no Spark.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from warehouse_assets.catalog import BY_PERIOD, OdsWindows
from warehouse_assets.ingest.readiness import (
    Readiness,
    StreamState,
    completed_partitions,
    hour_windows,
    late_hours,
    ready_hours,
    ready_windows,
    window_events,
)

TZ = ZoneInfo("Asia/Shanghai")
H10 = datetime(2026, 3, 2, 10, tzinfo=TZ)
STREAM = "edu_trade.order_00"


def windows_table(period: str) -> OdsWindows:
    """The completeness windows of ``ods.order`` a table of ``period`` reading it makes the catalog add."""
    return OdsWindows(layer="ods", name=f"order_{period}", period=period, path=Path("order.yaml"), source="ods.order")


def window_key(start: datetime) -> str:
    return start.strftime("%Y-%m-%dT%H:%M")


def state(
    source: dict[str, int], ingested: dict[str, int], watermark: datetime, threshold: float = 0.99995
) -> Readiness:
    """One shard stream applied through ``watermark``; ``source`` and ``ingested`` are rows per local window."""
    hours: dict[str, int] = {}
    for window, rows in ingested.items():
        hours[window[:13]] = hours.get(window[:13], 0) + rows
    return Readiness(
        "ods.order",
        streams=[StreamState(STREAM, 1, watermark)],
        watermark=watermark,
        first_hour=min(datetime.strptime(w, "%Y-%m-%dT%H:%M").replace(tzinfo=TZ) for w in source).replace(minute=0),
        threshold=threshold,
        source={STREAM: dict(source)},
        ingested={STREAM: hours},
        ingested_windows={STREAM: dict(ingested)},
        timezone="Asia/Shanghai",
    )


def test_a_window_completes_at_exactly_the_threshold_and_not_one_change_below() -> None:
    window = window_key(H10)
    # 20,000 source changes at 99.995 %: ceil(19,999.0) = 19,999 are needed, 19,998 are not enough
    below = state({window: 20_000}, {window: 19_998}, H10 + timedelta(minutes=5))
    counts = below.window_completeness(window)
    assert (counts.source_rows, counts.ingested_rows, counts.required) == (20_000, 19_998, 19_999)
    assert not counts.complete and counts.missing == 1
    assert counts.missing_by_stream == {STREAM: 2}
    assert ready_windows(below, None) == []

    at = state({window: 20_000}, {window: 19_999}, H10 + timedelta(minutes=5))
    assert at.window_completeness(window).complete
    assert ready_windows(at, None) == [H10]


def test_a_window_the_source_has_not_counted_yet_is_not_complete() -> None:
    first, second = H10, H10 + timedelta(minutes=5)
    ingested = {window_key(first): 10, window_key(second): 3}
    pending = state({window_key(first): 10}, ingested, second + timedelta(minutes=5))
    assert pending.window_completeness(window_key(second)).uncounted == [STREAM]
    assert ready_windows(pending, None) == [first]  # applied past both, but the second is not counted yet


def test_an_hour_is_complete_when_its_12_windows_are_not_by_a_count_of_its_own() -> None:
    windows = hour_windows(H10)
    assert len(windows) == 12 and windows[-1] == H10 + timedelta(minutes=55)
    source = {window_key(w): 2_000 for w in windows}
    ingested = dict(source)
    ingested[window_key(H10 + timedelta(minutes=30))] = 1_999  # one change of 10:30 missing
    short = state(source, ingested, H10 + timedelta(hours=1))
    hour = short.completeness("2026-03-02-10:00")
    # the hour's totals would pass a threshold of their own (23,999 of 24,000 >= ceil(23,998.8)) …
    assert (hour.source_rows, hour.ingested_rows) == (24_000, 23_999)
    assert hour.ingested_rows >= 0.99995 * hour.source_rows
    # … yet its window 10:30 is short (1,999 of 2,000 needs 2,000), so the hour is not complete
    assert [w.key for w in hour.windows if not w.complete] == ["2026-03-02T10:30"]
    assert not hour.complete and hour.missing == 1
    assert "11 of 12 complete, short: 10:30" in hour.describe()
    assert ready_hours(short, None) == []
    assert ready_windows(short, None) == windows[:6]  # 10:00 .. 10:25, the walk stops at 10:30

    ingested[window_key(H10 + timedelta(minutes=30))] = 2_000
    whole = state(source, ingested, H10 + timedelta(hours=1))
    assert whole.completeness("2026-03-02-10:00").complete
    assert ready_hours(whole, None) == ["2026-03-02-10:00"]
    assert ready_windows(whole, None) == windows


def test_an_hour_counted_by_the_source_as_a_whole_is_measured_whole_and_its_windows_with_it() -> None:
    hourly_source = state({window_key(H10): 0}, {}, H10 + timedelta(hours=1))
    hourly_source.source = {STREAM: {"2026-03-02T10": 100}}
    hourly_source.ingested = {STREAM: {"2026-03-02T10": 100}}
    hourly_source.ingested_windows = {STREAM: {window_key(H10): 100}}
    assert not hourly_source.by_window("2026-03-02T10")
    hour = hourly_source.completeness("2026-03-02-10:00")
    assert hour.complete and hour.windows == []
    assert ready_windows(hourly_source, None) == hour_windows(H10)  # each window complete with its hour

    hourly_source.ingested = {STREAM: {"2026-03-02T10": 99}}
    assert ready_windows(hourly_source, None) == []


def test_reaching_the_threshold_for_1558_to_1608_posts_exactly_four_events() -> None:
    """99.995 % reached for [15:58, 16:08) completes the hour 15:00-16:00, the 10 minutes 15:50-16:00 and the 5-minute
    windows 15:55-16:00 and 16:00-16:05: the windows before 15:58 were complete already, 16:05-16:10 still lacks the
    changes of 16:08 on."""
    h15 = datetime(2026, 3, 2, 15, tzinfo=TZ)
    minutes = [h15 + timedelta(minutes=m) for m in range(120)]  # 15:00 .. 16:59, 20 changes a minute

    def ingested_before(until: datetime) -> dict[str, int]:
        """The changes of the minutes before ``until``, per 5-minute window."""
        rows: dict[str, int] = {}
        for minute in minutes:
            if minute < until:
                key = window_key(minute - timedelta(minutes=minute.minute % 5))
                rows[key] = rows.get(key, 0) + 20
        return rows

    source = ingested_before(h15 + timedelta(hours=2))  # what the source counted: every change

    watermark = datetime(2026, 3, 2, 17, tzinfo=TZ)  # every shard applied; only counts hold the windows back
    before = state(source, ingested_before(h15 + timedelta(minutes=58)), watermark)
    after = state(source, ingested_before(h15 + timedelta(minutes=68)), watermark)
    assert ready_windows(before, None)[-1] == h15 + timedelta(minutes=50)  # complete through 15:55
    assert ready_windows(after, None)[-1] == h15 + timedelta(minutes=60)  # complete through 16:05

    # what the ODS table's reporter posts: its hours, and the completeness windows its mini-batch tables read (a table
    # declaring 10min gives ods.order its 10-minute windows)
    tables = [windows_table("5min"), windows_table("10min")]
    assert ready_hours(before, None) == []
    reported, through = window_events(before, tables, None, {})
    assert through == h15 + timedelta(minutes=55)
    assert [e.partition for e in reported if e.asset_key.path[-1] == "order_10min"][-1] == "2026-03-02-15:40"

    hours = ready_hours(after, None)
    windows, through = window_events(after, tables, through, {STREAM: 1})
    events = [("ods.order", hour) for hour in hours] + [(".".join(e.asset_key.path), e.partition) for e in windows]
    assert events == [
        ("ods.order", "2026-03-02-15:00"),
        ("ods.order_5min", "2026-03-02-15:55"),
        ("ods.order_5min", "2026-03-02-16:00"),
        ("ods.order_10min", "2026-03-02-15:50"),
    ]
    assert through == h15 + timedelta(minutes=65)
    assert [e.metadata["source_rows"].value for e in windows] == [100, 100, 200]
    assert [e.metadata["ingested_rows"].value for e in windows] == [100, 100, 200]
    # nothing new: nothing posted again
    assert window_events(after, tables, through, {STREAM: 1}) == ([], through)


@pytest.mark.parametrize(("period", "expected"), [("5min", 12), ("10min", 6), ("15min", 4), ("hourly", 1)])
def test_one_complete_hour_completes_every_partition_of_each_period_within_it_once(period: str, expected: int) -> None:
    keys = completed_partitions(BY_PERIOD[period], H10, H10, H10 + timedelta(hours=1))
    assert len(keys) == len(set(keys)) == expected
    assert keys[0] == "2026-03-02-10:00"


def test_a_late_change_to_a_reported_window_reports_it_again_and_its_hour_counts_it() -> None:
    windows = hour_windows(H10)
    source = {window_key(w): 10 for w in windows}
    on_time = state(source, dict(source), H10 + timedelta(hours=1))
    tables = [windows_table("5min"), windows_table("15min")]
    reported, through = window_events(on_time, tables, None, {})
    assert len(reported) == 12 + 4 and through == H10 + timedelta(hours=1)

    # a later batch (segment 7) brings one more change of 10:20, which the source counted late too
    late_source = {**source, window_key(H10 + timedelta(minutes=20)): 11}
    ingested = {**source, window_key(H10 + timedelta(minutes=20)): 11}
    late = state(late_source, ingested, H10 + timedelta(hours=1))
    late.count_entries = [
        {"stream": STREAM, "hour": "2026-03-02T10", "window": "2026-03-02T10:20", "rows": 1, "seq_to": 7}
    ]
    again, still = window_events(late, tables, through, {STREAM: 6})
    assert still == through
    assert [(e.asset_key.path[-1], e.partition, e.metadata["late_changes"].value) for e in again] == [
        ("order_5min", "2026-03-02-10:20", True),
        ("order_15min", "2026-03-02-10:15", True),
    ]
    # its hour is reported again too, as any late change of a reported hour (the late-data policy rebuilds from it)
    assert late_hours(late, "2026-03-02-10:00", {STREAM: 6}) == ["2026-03-02-10:00"]
    assert late.completeness("2026-03-02-10:00").ingested_rows == 121
    assert window_events(late, tables, through, {STREAM: 7}) == ([], through)  # seen: not again
