"""Which source hours have landed: an ODS hour whose every shard's segments through its end are in the landing area,
and which every shard whose source publishes counts has counted, is complete at its source. If it is not
materialized yet, it waits for the ingestion, not for its source: the predicted finish
(:mod:`warehouse_assets.explain.eta`) times it as an ingestion run, and never takes it for an overdue source.

The segments are read as the freshness sensor reads them (:func:`warehouse_assets.materialize.freshness.data_available`,
with its per-tick cache of each stream's segments), and an hour is counted as the readiness counts it (an hour line,
or its twelve 5-minute windows). One :class:`LandedHours` is one look at the landing area: each stream's segments are
listed once and each counts file read once (again only for an hour outside the span it read).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from resources.landing import COUNT_HOUR
from warehouse_assets.catalog import Catalog, OdsTable, partition_window
from warehouse_assets.ingest.readiness import _hour_count as hour_count
from warehouse_assets.materialize.freshness import Landed, data_available

if TYPE_CHECKING:
    from dagster import DagsterInstance

    from resources.landing import Landing

# the hours around the one asked whose source counts are read with it: a tick asks about the hours of a day or two
COUNTS_SPAN = timedelta(days=2)


class LandedHours:
    """``landed(table, key)``: when the source hour had landed whole (epoch seconds, its newest segment's file time),
    None when it has not, or when the table is not an ODS table (an external delivery is reported when it lands)."""

    def __init__(self, instance: DagsterInstance, catalog: Catalog, landing: Landing):
        self.instance, self.catalog, self.landing = instance, catalog, landing
        self._segments: Landed = {}
        self._counting: dict[str, list[str]] = {}  # table -> its streams whose source publishes counts
        self._counts: dict[str, tuple[str, str, dict[str, int]]] = {}  # stream -> (first, last hour read, counts)

    def __call__(self, table: str, key: str) -> float | None:
        ods = self.catalog[table]
        if not isinstance(ods, OdsTable):
            return None
        at = data_available(self.instance, self.catalog, self.landing, ods, key, self._segments)
        if at is None:
            return None
        if ods.fqn not in self._counting:
            streams = self.landing.streams(ods.source_database, ods.source_tables)
            self._counting[ods.fqn] = [s for s in streams if self.landing.publishes_counts(s)]
        hour = partition_window(ods, key).start.astimezone(self.landing.tz).strftime(COUNT_HOUR)
        if any(hour_count(self._counted(stream, hour), hour) is None for stream in self._counting[ods.fqn]):
            return None  # its segments are there, but the source has not said how many rows the hour holds
        return at.timestamp()

    def _counted(self, stream: str, hour: str) -> dict[str, int]:
        first, last, counts = self._counts.get(stream, (hour, hour, {}))
        if stream not in self._counts or not first <= hour <= last:
            moment = datetime.strptime(hour, COUNT_HOUR)
            first = min(first, (moment - COUNTS_SPAN).strftime(COUNT_HOUR))
            last = max(last, (moment + COUNTS_SPAN).strftime(COUNT_HOUR))
            counts = self.landing.source_counts(stream, (first, last))
            self._counts[stream] = (first, last, counts)
        return counts
