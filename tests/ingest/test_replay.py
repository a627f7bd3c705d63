"""A source replaying hours already ingested and reported: what reaches the dependency center is its corrections only.

The late-data horizon (``bench/late_horizon.py``) counts a replay's corrected rows as the changed keys its readers
rebuild from, and nothing for the rows re-sent unchanged. This holds it to the ingestion: the unchanged copies are
dropped by their content before the merge (not written, not counted), so an hour replayed without a correction is
not reported again, and one with corrections is reported with those alone as its new changes.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.ingest.test_completeness import H10, TZ, Source, only, order, windows
from warehouse_assets.catalog import Table
from warehouse_assets.ingest.merge import ingest_table
from warehouse_assets.ingest.readiness import changed_hours, readiness_events

__all__ = ["order"]  # the fixture, shared with the completeness tests


def test_a_replay_of_reported_hours_reports_only_the_hour_it_corrects_with_its_corrections(
    spark: SparkSession, tmp_path: Path, order: Table
) -> None:
    lenient = replace(order, completeness_threshold=0.9)
    shard = Source(tmp_path / "landing", "order_00")
    sent: list[tuple[int, datetime]] = []  # (order id, binlog time) of each INSERT
    for i, window in enumerate(windows(H10, H10 + timedelta(hours=2)), start=1):
        rows = [(i * 10 + n, window + timedelta(seconds=n)) for n in range(10)]
        shard.segment(window, rows)
        sent += rows
    shard.publish_counts()
    landing, store = Landing(tmp_path / "landing"), DeltaStore(str(tmp_path / "lake"))
    ingest_table(spark, store, landing, lenient)
    events, cursor = readiness_events(store, landing, only(lenient), {})
    reported = {e.partition: e.metadata["ingested_rows"].value for e in events}
    assert reported == {"2026-03-02-10:00": 120, "2026-03-02-11:00": 120}

    # both hours delivered again as they were (new message ids, the same changes), one order of hour 10 corrected
    replay = H10 + timedelta(hours=2)
    shard.segment(replay, sent, count=False)
    first, created = sent[0]
    shard.updates(replay, [(first, created, H10 + timedelta(minutes=30), None)])  # paid: counted in hour 10
    shard.publish_counts()
    batches = ingest_table(spark, store, landing, lenient).batches
    assert (sum(b.rows_duplicate for b in batches), sum(b.rows_applied for b in batches)) == (240, 1)
    assert changed_hours([p for b in batches for p in b.partitions_changed], str(TZ)) == ["2026-03-02-10:00"]
    events, _ = readiness_events(
        store, landing, only(lenient), cursor, reported_rows=lambda table, key: reported.get(key)
    )
    assert [(e.partition, e.metadata["changed_rows"].value) for e in events] == [("2026-03-02-10:00", 1)]
