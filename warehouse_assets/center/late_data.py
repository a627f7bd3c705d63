"""When late data rebuilds a partition: the rule of a table's late-data policy, as a pure function of times.

A partition already built is *stale* once upstream data it read changed after its build started. Its late-data
policy (:class:`warehouse_assets.catalog.LateDataPolicy`, declared per table or per dependency) says when it is built
again; :func:`due_time` computes that moment from when the first late change it has not absorbed appeared
(``since``) and when its last rebuild was requested. The resolver asks it, keeps the answer in its ledger, and looks
at the partition again at that moment; ``warehouse why`` and ``warehouse status`` print it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from warehouse_assets.catalog import Catalog, DerivedTable, LateDataPolicy
from warehouse_assets.catalog.key_locality import key_locality
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.catalog.model import AT_ONCE, DAILY_AT, EVERY, NEVER

# Automatic runs look this far back from the latest partition; older history is a backfill's: deploying a table must
# not start runs for all of its past. Late data reaches back no further than each table's own, shorter, lookback.
LOOKBACK = timedelta(days=35)

# the lane of a run whose partitions were all built before (late data, a later state, a repair): the instance's run
# coordinator holds such runs to a share of the run slots (dagster_home/dagster.yaml, tag_concurrency_limits), so a
# first build, and what a user launches, always find a slot free
LANE_TAG = "warehouse/lane"
REBUILD_LANE = "rebuild"


def due_time(
    policy: LateDataPolicy,
    *,
    window_end: datetime,
    newest_end: datetime,
    since: datetime,
    last_rebuild: datetime | None,
    now: datetime,
    timezone: ZoneInfo,
) -> tuple[datetime | None, str]:
    """When the rebuild of a partition (window ending ``window_end``; the table's newest built partition's ending
    ``newest_end``) with late data since ``since`` is due; or None, with the reason, when the policy never rebuilds
    it automatically."""
    # the lookback counts back from the table's newest partition, not from the clock (as SQLMesh's and dbt's count
    # intervals back from the latest one): a catch-up of past days, or a replay, follows late data as the live
    # stream does, and a partition the table has moved far beyond is left to a repair
    if window_end < newest_end - timedelta(minutes=policy.lookback_minutes):
        return None, (
            f"beyond the late-data lookback ({policy.describe_lookback()} behind the table's newest partition): "
            "rebuilt only by a repair (warehouse taint)"
        )
    if policy.rebuild == NEVER:
        return None, "the policy rebuilds it only by a repair (warehouse taint)"
    if policy.rebuild == AT_ONCE:
        return since, ""
    if last_rebuild is None and since < window_end + timedelta(minutes=policy.grace_minutes):
        # the period that just closed is still settling: its last rows are the build it waits for, not a correction
        return since, ""
    if policy.rebuild == EVERY:
        interval = timedelta(minutes=policy.every_minutes or 0)
        due = since + interval
        # at most one rebuild per interval, also for a change older than the last rebuild that it did not absorb (one
        # that reached an input after that input's read, and comes through the input's own rebuild later)
        if last_rebuild is not None:
            due = max(due, last_rebuild + interval)
        return due, ""
    assert policy.rebuild == DAILY_AT and policy.at is not None
    hour, minute = (int(part) for part in policy.at.split(":"))
    after = max(since, last_rebuild) if last_rebuild is not None else since
    local = after.astimezone(timezone)
    day = local.date()
    while (at := datetime(day.year, day.month, day.day, hour, minute, tzinfo=timezone)) <= after:
        day += timedelta(days=1)
    return at, ""


class RebuildKinds:
    """Which policy rule a table's late-data rebuild follows: a key-local table's rebuild replaces only the changed
    keys' rows (``rebuild``), any other's recomputes whole partitions (``whole``). Proven from each table's SQL the
    first time it matters (a warehouse of 10,000 tables pays for the ones late data reaches), and kept."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._lineage: WarehouseLineage | None = None
        self._key_local: dict[str, bool] = {}

    def policy(self, table: DerivedTable, policy: LateDataPolicy) -> LateDataPolicy:
        return policy if policy.whole is None or self.key_local(table) else policy.for_whole_rebuilds()

    def key_local(self, table: DerivedTable) -> bool:
        found = self._key_local.get(table.fqn)
        if found is None:
            if self._lineage is None:
                self._lineage = WarehouseLineage(self.catalog)
            try:
                found = key_locality(table, self._lineage.input_columns(table)).key_local
            except Exception:  # a proof that cannot be followed is no proof: rebuilt whole, as the runner does
                found = False
            self._key_local[table.fqn] = found
        return found
