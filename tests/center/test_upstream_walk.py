"""The late-data rule's walk above a partition whose whole rebuild is due: what it remembers between the looks of one
clock time (each partition's upstream partitions) is never taken for another time's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from tests.support.small_catalog import sql_catalog
from warehouse_assets.catalog import Table
from warehouse_assets.center.late_data import LateData
from warehouse_assets.center.ledger import Ledger, Rebuild, Stale
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionState

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-05"
TABLES = {
    "dwd/by_hour.sql": ("period: hourly\nprimary_key: [id]\n", "SELECT id FROM ods.src"),
    "dws/by_day.sql": ("period: daily\nprimary_key: [id]\n", "SELECT id, count(*) AS n FROM dwd.by_hour GROUP BY id"),
}


class Snapshot:
    """What the walk reads of a resolver call's snapshot: every partition built, the ``queued`` ones being rebuilt."""

    def __init__(self, queued: set[tuple[str, str]]):
        self.queued = queued
        self.rebuilds: dict[tuple[str, str], Rebuild] = {}

    def states(self, table: Table, keys: Sequence[str]) -> dict[str, PartitionState]:
        name = table.fqn.replace(".", "/")
        return {k: PartitionState(name, k, storage_id=1, run_id="", queued=(table.fqn, k) in self.queued) for k in keys}

    def stale(self, fqn: str, partition: str) -> Stale | None:
        return None

    def read_stale(self, fqn: str, partitions: Iterable[str]) -> None:
        pass


def test_the_walk_above_a_day_sees_the_input_hours_that_exist_at_its_look_not_at_an_earlier_one(
    tmp_path: Path,
) -> None:
    """At noon the day's hours of ``dwd.by_hour`` are not all there (the index gives no window: nothing to wait
    for); after the day, its last hour being rebuilt is a rebuild coming upstream."""
    catalog = sql_catalog(tmp_path / "tables", TABLES)
    after = datetime(2026, 3, 6, 1, tzinfo=TZ)
    index = ReverseIndex.build(catalog, current_time=after)
    late = LateData(catalog, Ledger(tmp_path / "ledger.db"), TZ, index)
    by_day = catalog["dws.by_day"]
    hours = index.upstream_of("dws.by_day", "dwd.by_hour", DAY, after)
    assert hours is not None and len(hours) == 24
    rebuilding = {("dwd.by_hour", hours[-1])}
    noon = datetime(2026, 3, 5, 12, tzinfo=TZ)
    assert late._upstream_rebuilding(by_day, DAY, Snapshot(rebuilding), noon, noon + timedelta(hours=2)) is None
    found = late._upstream_rebuilding(by_day, DAY, Snapshot(rebuilding), after, after + timedelta(hours=2))
    assert found is not None
    assert found[1] == f"waits for dwd.by_hour {hours[-1]}'s rebuild upstream, coming now"
