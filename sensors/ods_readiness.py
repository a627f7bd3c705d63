"""ODS readiness: when is an hour of an ODS table complete? (design AD-4, seeds 001 and 002)

An ODS hour H is ready once every shard stream of its source has been *applied* (committed in the ODS
Delta table, see :mod:`warehouse_assets.ingestion`) through the end of H. A stream's watermark is the end
of the window of the last segment committed; segments are written for every window, empty when the shard
was idle, so an idle shard still advances while a lagging one holds the hour back. One sensor covers all
ODS tables of the landing area and reports each ready hour as a materialization, once.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
from dagster import (
    AssetKey,
    AssetMaterialization,
    DefaultSensorStatus,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.landing import Landing, LandingResource
from warehouse_assets.catalog import Catalog, Table
from warehouse_assets.ingestion import committed_positions
from warehouse_assets.partitions import hourly

MAX_EVENTS_PER_TICK = 500


@dataclass
class StreamState:
    stream: str
    position: int
    watermark: datetime | None  # end of the last committed segment's window (or the heartbeat's idle proof)
    idle_by_heartbeat: bool = False


@dataclass
class Readiness:
    table: str
    streams: list[StreamState] = field(default_factory=list)
    watermark: datetime | None = None
    first_hour: datetime | None = None

    @property
    def lagging(self) -> list[StreamState]:
        """Streams, most behind first (never-applied streams before all others)."""
        return sorted(self.streams, key=lambda s: (s.watermark is not None, s.watermark or datetime.min))


def _floor_hour(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def readiness(store: DeltaStore, landing: Landing, table: Table) -> Readiness:
    """The committed watermark of every stream of an ODS table, and of the table (the minimum)."""
    assert table.source_database and table.source_tables
    result = Readiness(table.fqn)
    streams = landing.streams(table.source_database, table.source_tables)
    if not streams:
        return result
    positions = committed_positions(store, table, streams)
    grace = table.heartbeat_idle_grace_minutes
    heartbeat = landing.heartbeat_clock(table.source_database) if grace is not None else None
    firsts = []
    for stream in streams:
        first = landing.first_segment(stream)
        if first is not None:
            firsts.append(first.start)
        seg = landing.segment_at(stream, positions[stream]) if positions[stream] else None
        state = StreamState(stream, positions[stream], seg.end if seg else None)
        if heartbeat is not None and grace is not None and landing.segment_at(stream, positions[stream] + 1) is None:
            # Nothing pending for this shard and the source's heartbeat has moved on: no binlog means
            # no change (seed 001), up to the heartbeat minus the grace the distributor may lag.
            idle_until = heartbeat - timedelta(minutes=grace)
            if state.watermark is None or idle_until > state.watermark:
                state.watermark, state.idle_by_heartbeat = idle_until, True
        result.streams.append(state)
    result.first_hour = _floor_hour(min(firsts)) if firsts else None
    marks = [s.watermark for s in result.streams]
    result.watermark = None if any(m is None for m in marks) else min(m for m in marks if m is not None)
    return result


def hour_key(start: datetime) -> str:
    return start.strftime("%Y-%m-%d-%H:00")


def ready_hours(state: Readiness, after: str | None, limit: int = MAX_EVENTS_PER_TICK) -> list[str]:
    """Hour partition keys complete under the watermark, after the last one reported (``after``)."""
    if state.watermark is None or state.first_hour is None:
        return []
    if after is not None:
        start = hourly.time_window_for_partition_key(after).end
    else:
        start = max(
            state.first_hour, hourly.time_window_for_partition_key(hourly.get_first_partition_key() or "").start
        )
    keys: list[str] = []
    hour = start
    while hour + timedelta(hours=1) <= state.watermark and len(keys) < limit:
        keys.append(hour_key(hour))
        hour += timedelta(hours=1)
    return keys


def partition_rows(store: DeltaStore, table: Table) -> dict[tuple[str, str], dict[str, int]]:
    """Rows and files per (dt, hh) from the Delta log statistics (no data read)."""
    dt = store.table(table.key)
    if dt is None:
        return {}
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    out: dict[tuple[str, str], dict[str, int]] = {}
    for a in actions:
        key = (str(a.get("partition.dt")), str(a.get("partition.hh")))
        entry = out.setdefault(key, {"rows": 0, "files": 0})
        entry["rows"] += int(a.get("num_records") or 0)
        entry["files"] += 1
    return out


def readiness_events(
    store: DeltaStore,
    landing: Landing,
    catalog: Catalog,
    cursor: dict[str, str],
    already_reported: Callable[[Table], set[str]] | None = None,
) -> tuple[list[AssetMaterialization], dict[str, str]]:
    """Materializations for every newly ready ODS hour, and the advanced cursor.

    ``already_reported`` (the instance's materialized partitions) keeps an hour reported by another path
    (the headless command) from being reported twice.
    """
    events: list[AssetMaterialization] = []
    cursor = dict(cursor)
    for table in catalog.ods():
        state = readiness(store, landing, table)
        keys = ready_hours(state, cursor.get(table.fqn), MAX_EVENTS_PER_TICK - len(events))
        if not keys:
            continue
        done = already_reported(table) if already_reported else set()
        cursor[table.fqn] = keys[-1]
        keys = [k for k in keys if k not in done]
        if not keys:
            continue
        rows = partition_rows(store, table)
        version = store.table(table.key)
        for key in keys:
            start = hourly.time_window_for_partition_key(key).start
            stats = rows.get((start.strftime("%Y-%m-%d"), start.strftime("%H")), {"rows": 0, "files": 0})
            metadata: dict[str, Any] = {
                "rows": stats["rows"],
                "files": stats["files"],
                "watermark": state.watermark.isoformat() if state.watermark else "",
                "streams": len(state.streams),
                "delta_version": version.version() if version is not None else -1,
            }
            events.append(AssetMaterialization(asset_key=AssetKey(table.key), partition=key, metadata=metadata))
    return events, cursor


def build_readiness_sensor(catalog: Catalog):  # type: ignore[no-untyped-def]
    @sensor(
        name="ods_readiness",
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.RUNNING,
        asset_selection=[AssetKey(t.key) for t in catalog.ods()],
        description="Reports an ODS hour as materialized once every shard stream is applied past its end.",
    )
    def ods_readiness(
        context: SensorEvaluationContext, lake: DeltaLakeResource, landing: LandingResource
    ) -> SensorResult | SkipReason:
        cursor = json.loads(context.cursor) if context.cursor else {}
        events, new_cursor = readiness_events(
            lake.store(),
            landing.landing(),
            catalog,
            cursor,
            lambda t: set(context.instance.get_materialized_partitions(AssetKey(t.key))),
        )
        if not events:
            if new_cursor != cursor:
                return SensorResult(cursor=json.dumps(new_cursor, sort_keys=True))
            return SkipReason("no ODS hour became ready")
        context.log.info(
            f"{len(events)} ODS hour(s) ready: "
            + ", ".join(f"{'/'.join(e.asset_key.path)} {e.partition}" for e in events[:10])
            + (" …" if len(events) > 10 else "")
        )
        return SensorResult(asset_events=events, cursor=json.dumps(new_cursor, sort_keys=True))

    return ods_readiness
