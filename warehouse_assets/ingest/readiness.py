"""ODS readiness: when is an hour of an ODS table complete?

An ODS hour H is ready once

1. every shard stream of its source has been *applied* (committed in the ODS Delta table, see
   :mod:`warehouse_assets.ingest.merge`) through the end of H. A stream's watermark is the end of the window of
   the last segment committed; segments are written for every window, empty when the shard was idle, so an
   idle shard still advances while a lagging one holds the hour back; and
2. the rows ingested for H reach the table's completeness threshold (default 99.995 %) of the rows the
   source counted for H. Both sides count the same thing: distinct DML row changes (one per row image of a
   Canal message, a re-sent message once) whose binlog time ``es`` falls in the local hour H, summed over
   the shard streams. The source publishes its counts in the landing area (``counts/``, the equivalent of
   Kafka offsets); the ingestion records its own in ``ops.ingested_counts``. A stream whose source
   publishes no counts is not measured. An hour needs ``ceil(threshold × source)`` rows: with 10,000 source
   rows, 9,999 are not enough at 99.995 %.

Hours are reported in order, so a ready hour also means every earlier hour was complete. One sensor covers
all ODS tables and reports each ready hour as a materialization; when late changes of an hour already
reported are ingested (its ingested count grows), the hour is reported again, so its downstream partitions
re-run (``any_deps_updated``). The count is by binlog hour, so it misses a change written in a later hour to a row
of a reported one (an order of 08:00 paid at 14:33 counts in 14:00 but changes partition 08:00): the ingestion run
reports such hours again too, from the partitions its merge wrote (:func:`changed_hours`).

A tick reads ``ops.ingested_counts`` only for the hours it judges: the ones after the last reported hour
(at most :data:`MAX_EVENTS_PER_TICK`) and the :data:`LATE_CHANGE_LOOKBACK` before it, where late changes are
looked for, pruned to their date partitions. Its cost does not grow with the lake's history
(``bench/readiness_history.py``). Late changes of older hours are applied but not re-reported.
"""

import math
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from dagster import AssetKey, AssetMaterialization, AssetRecordsFilter, DagsterInstance

from resources.delta_lake import DeltaStore, ReadStats
from resources.landing import Landing
from resources.settings import DEFAULT_TIMEZONE
from warehouse_assets.catalog import Catalog, OdsTable, Table, hourly
from warehouse_assets.ingest.merge import committed_positions, ingested_counts

MAX_EVENTS_PER_TICK = 500
# How far back from the last reported hour a tick looks for late changes. The automation re-runs a day's
# partitions on a re-report only within its own 35-day lookback; late binlog arrives within hours.
LATE_CHANGE_LOOKBACK = timedelta(days=7)


@dataclass
class StreamState:
    stream: str
    position: int
    watermark: datetime | None  # end of the last committed segment's window (or the heartbeat's idle proof)
    idle_by_heartbeat: bool = False


@dataclass
class HourCompleteness:
    """Rows of one hour: what the source counted, what was ingested, what readiness requires."""

    hour: str  # partition key
    source_rows: int | None  # None: no stream publishes counts (not measured)
    ingested_rows: int
    required: int
    threshold: float
    missing_by_stream: dict[str, int] = field(default_factory=dict)  # streams short of their source count
    uncounted: list[str] = field(default_factory=list)  # streams whose source has not counted the hour yet

    @property
    def complete(self) -> bool:
        return not self.uncounted and (self.source_rows is None or self.ingested_rows >= self.required)

    @property
    def missing(self) -> int:
        return max(0, self.required - self.ingested_rows)

    def describe(self) -> str:
        if self.source_rows is None:
            return "completeness not measured (the source publishes no counts)"
        text = (
            f"{self.ingested_rows:,} of {self.source_rows:,} source rows ingested "
            f"({self.ingested_rows / self.source_rows:.5%}); needs {self.required:,} at {self.threshold:.3%}"
            if self.source_rows
            else f"{self.ingested_rows:,} rows ingested, the source counted none"
        )
        if self.uncounted:
            text += f"; the source has not counted the hour yet for {', '.join(self.uncounted)}"
        return text


@dataclass
class Readiness:
    table: str
    streams: list[StreamState] = field(default_factory=list)
    watermark: datetime | None = None
    first_hour: datetime | None = None
    threshold: float = 1.0
    source: dict[str, dict[str, int] | None] = field(default_factory=dict)  # stream -> hour -> rows
    ingested: dict[str, dict[str, int]] = field(default_factory=dict)
    counted_seq: dict[str, int] = field(default_factory=dict)  # how far each stream's ingested counts go
    count_entries: list[dict[str, Any]] = field(default_factory=list)
    timezone: str = DEFAULT_TIMEZONE
    counted_hours: tuple[str, str] | None = None  # the local hours whose counts were read; None: all of them
    counts_read: ReadStats = field(default_factory=ReadStats)

    def counts_cover(self, hour: str) -> bool:
        """Whether the ingested counts of the local hour ("YYYY-MM-DDTHH") were read."""
        return self.counted_hours is None or self.counted_hours[0] <= hour <= self.counted_hours[1]

    def local_hour(self, key: str) -> str:
        start = hourly.time_window_for_partition_key(key).start.astimezone(ZoneInfo(self.timezone))
        return start.strftime("%Y-%m-%dT%H")

    @property
    def lagging(self) -> list[StreamState]:
        """Streams, most behind first (never-applied streams before all others)."""
        return sorted(self.streams, key=lambda s: (s.watermark is not None, s.watermark or datetime.min))

    def completeness(self, key: str) -> HourCompleteness:
        """Source and ingested rows of the hour partition ``key``, summed over the shard streams."""
        hour = self.local_hour(key)
        if not self.counts_cover(hour):
            raise ValueError(f"{self.table}: the ingested counts of {key} were not read (read {self.counted_hours})")
        source_total: int | None = None
        ingested_total = 0
        missing: dict[str, int] = {}
        uncounted: list[str] = []
        for stream in self.source:
            got = self.ingested.get(stream, {}).get(hour, 0)
            ingested_total += got
            counts = self.source[stream]
            if counts is None:
                continue
            if hour not in counts:
                uncounted.append(stream)
                continue
            source_total = (source_total or 0) + counts[hour]
            if got < counts[hour]:
                missing[stream] = counts[hour] - got
        required = math.ceil(self.threshold * source_total - 1e-9) if source_total is not None else 0
        return HourCompleteness(key, source_total, ingested_total, required, self.threshold, missing, uncounted)


def _floor_hour(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def readiness(
    store: DeltaStore, landing: Landing, table: Table, since: datetime | None = None, until: datetime | None = None
) -> Readiness:
    """The committed watermark of every stream of an ODS table, and of the table (the minimum), with the
    ingested counts of the hours in [``since``, ``until``) (all hours without)."""
    state = shard_state(store, landing, table)
    if state.streams:
        read_counts(state, store, landing, table, since, until)
    return state


def with_counts(
    state: Readiness, store: DeltaStore, landing: Landing, table: Table, since: datetime, until: datetime
) -> Readiness:
    """A copy of a shard state (:func:`shard_state`) with the counts of the hours in [since, until)."""
    copy = replace(
        state, source={}, ingested={}, counted_seq={}, count_entries=[], counted_hours=None, counts_read=ReadStats()
    )
    if copy.streams:
        read_counts(copy, store, landing, table, since, until)
    return copy


def read_counts(
    state: Readiness,
    store: DeltaStore,
    landing: Landing,
    table: Table,
    since: datetime | None,
    until: datetime | None,
) -> None:
    """Read the source's and the ingested counts of the hours in [``since``, ``until``) into ``state``, the
    ingested ones from their dates' partitions of ``ops.ingested_counts`` only (every hour when both are None)."""
    zone = ZoneInfo(state.timezone)
    dates = None
    if since is not None and until is not None:
        first = since.astimezone(zone).strftime("%Y-%m-%dT%H")
        last = (until - timedelta(hours=1)).astimezone(zone).strftime("%Y-%m-%dT%H")
        state.counted_hours = (first, last)
        day, dates = datetime.strptime(first[:10], "%Y-%m-%d"), []
        while (key := day.strftime("%Y-%m-%d")) <= last[:10]:
            dates.append(key)
            day += timedelta(days=1)
    streams = [s.stream for s in state.streams]
    state.source = {
        s: landing.source_counts(s, state.counted_hours) if landing.publishes_counts(s) else None for s in streams
    }
    counted, entries = ingested_counts(store, table, dates)
    state.counts_read = counted.read
    state.count_entries = [e for e in entries if state.counts_cover(e["hour"])]
    for e in state.count_entries:
        per = state.ingested.setdefault(e["stream"], {})
        per[e["hour"]] = per.get(e["hour"], 0) + int(e["rows"])
        state.counted_seq[e["stream"]] = max(state.counted_seq.get(e["stream"], 0), int(e["seq_to"]))


def shard_state(store: DeltaStore, landing: Landing, table: Table) -> Readiness:
    """The watermarks of an ODS table's shard streams; no counts yet (:func:`read_counts` adds those)."""
    assert isinstance(table, OdsTable)
    result = Readiness(table.fqn, threshold=table.completeness_threshold, timezone=landing.timezone)
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
            # no change, up to the heartbeat minus the grace the distributor may lag.
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


def _walk_start(state: Readiness, after: str | None) -> datetime | None:
    """The first hour a walk after ``after`` (the last hour reported) judges."""
    if after is not None:
        return hourly.time_window_for_partition_key(after).end
    if state.first_hour is None:
        return None
    return max(state.first_hour, hourly.time_window_for_partition_key(hourly.get_first_partition_key() or "").start)


def tick_hours(
    state: Readiness, after: str | None, lookback: timedelta = LATE_CHANGE_LOOKBACK
) -> tuple[datetime, datetime]:
    """[since, until): the hours one tick judges — late changes ``lookback`` before the walk, the walk itself."""
    start = _walk_start(state, after)
    if start is None:
        start = datetime.now(ZoneInfo(state.timezone)).replace(minute=0, second=0, microsecond=0)
    return (start - lookback if after is not None else start), start + timedelta(hours=MAX_EVENTS_PER_TICK)


def ready_hours(state: Readiness, after: str | None, limit: int = MAX_EVENTS_PER_TICK) -> list[str]:
    """Hour partition keys complete under the watermark and by count, in order, after ``after`` (the last one
    reported); the first incomplete hour (or the end of the hours whose counts were read) stops the walk."""
    start = _walk_start(state, after)
    if state.watermark is None or start is None:
        return []
    keys: list[str] = []
    hour = start
    while hour + timedelta(hours=1) <= state.watermark and len(keys) < limit:
        if not state.counts_cover(state.local_hour(hour_key(hour))):
            break
        if not state.completeness(hour_key(hour)).complete:
            break
        keys.append(hour_key(hour))
        hour += timedelta(hours=1)
    return keys


def changed_hours(partitions: Iterable[Mapping[str, str]], timezone: str) -> list[str]:
    """The hour partition keys of ODS partitions (``dt``, ``hh``: local date and hour in ``timezone``), such as
    those a merge wrote (:attr:`~warehouse_assets.ingest.merge.BatchReport.partitions_changed`)."""
    local, zone = ZoneInfo(timezone), ZoneInfo(hourly.timezone)
    keys = set()
    for partition in partitions:
        start = datetime.strptime(f"{partition['dt']}T{partition['hh']}", "%Y-%m-%dT%H").replace(tzinfo=local)
        keys.add(hour_key(start.astimezone(zone)))
    return sorted(k for k in keys if hourly.has_partition_key(k))


def late_hours(state: Readiness, last_reported: str | None, seen: dict[str, int]) -> list[str]:
    """Hours up to ``last_reported`` whose ingested count grew since the cursor's ``seen`` positions."""
    if last_reported is None:
        return []
    last = hourly.time_window_for_partition_key(last_reported).start
    zone = ZoneInfo(state.timezone)
    keys = set()
    for entry in state.count_entries:
        if entry["seq_to"] <= seen.get(entry["stream"], 0) or not entry["rows"]:
            continue
        start = datetime.strptime(entry["hour"], "%Y-%m-%dT%H").replace(tzinfo=zone)
        if start.astimezone(last.tzinfo) <= last:
            keys.add(hour_key(start.astimezone(last.tzinfo)))
    return sorted(k for k in keys if hourly.has_partition_key(k))


def partition_rows(store: DeltaStore, table: Table, keys: Sequence[str]) -> dict[tuple[str, str], dict[str, int]]:
    """Live rows and files per (dt, hh) of the hours ``keys``: files from the Delta log, rows counted in those hours'
    files with their deletion vectors applied. Never the whole table's deletion vectors, which delta-rs reads all at
    once: a year of merged hours would be read for each report."""
    if not store.exists(table.key) or not keys:
        return {}
    starts = [hourly.time_window_for_partition_key(key).start for key in keys]
    specs = [{"dt": start.strftime("%Y-%m-%d"), "hh": start.strftime("%H")} for start in starts]
    actions, _ = store.live_files(table.key, specs, deletions=False)
    out: dict[tuple[str, str], dict[str, int]] = {}
    for a in actions:
        out.setdefault((str(a.get("partition.dt")), str(a.get("partition.hh"))), {"rows": 0, "files": 0})["files"] += 1
    for (dt, hh), rows in store.count_rows(table.key, specs, ["dt", "hh"]).items():
        out.setdefault((dt, hh), {"rows": 0, "files": 0})["rows"] = rows
    return out


def _table_cursor(value: Any) -> tuple[str | None, dict[str, int]]:
    """A table's cursor: the last hour reported and how far the ingested counts were seen (older cursors
    held only the hour)."""
    if isinstance(value, str):
        return value, {}
    if isinstance(value, dict):
        return value.get("last"), {str(k): int(v) for k, v in (value.get("seen") or {}).items()}
    return None, {}


def readiness_events(
    store: DeltaStore,
    landing: Landing,
    catalog: Catalog,
    cursor: dict[str, Any],
    already_reported: Callable[[Table], set[str]] | None = None,
    lookback: timedelta = LATE_CHANGE_LOOKBACK,
    reported_rows: Callable[[Table, str], int | None] | None = None,
    changed: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[AssetMaterialization], dict[str, Any]]:
    """Materializations for every newly ready ODS hour (and reported hours with late changes), and the
    advanced cursor ``{table: {"last": hour, "seen": {stream: segment position of counts seen}}}``.

    ``already_reported`` (the instance's materialized partitions) keeps an hour reported by another path
    (the ingestion run, the headless command) from being reported twice; a late-change re-report ignores it on
    purpose. ``reported_rows`` (the ``ingested_rows`` of an hour's latest report) keeps late changes that another
    path already re-reported from being re-reported again: only an hour whose ingested count grew past its latest
    report's is.

    ``changed`` (table → hour keys): hours already reported whose partitions a merge has changed since, reported
    again as late changes whether their ingested count grew or not (a late change counts in its binlog hour,
    not in the hour of the row it changes). Hours past the last reported one are left to the walk, which
    reports an hour only once it is complete; hours before the counts read (``lookback``) are not reported
    again, as for count growth.
    """
    events: list[AssetMaterialization] = []
    cursor = dict(cursor)
    for table in catalog.ods():
        last, seen = _table_cursor(cursor.get(table.fqn))
        state = shard_state(store, landing, table)
        if state.streams:
            read_counts(state, store, landing, table, *tick_hours(state, last, lookback))
        late = [k for k in late_hours(state, last, seen) if state.completeness(k).complete]
        if reported_rows is not None:
            late = [k for k in late if state.completeness(k).ingested_rows > (reported_rows(table, k) or -1)]
        if changed and changed.get(table.fqn) and last is not None:
            rewritten = [k for k in changed[table.fqn] if k <= last and state.counts_cover(state.local_hour(k))]
            late = sorted({*late, *rewritten})
        keys = ready_hours(state, last, MAX_EVENTS_PER_TICK - len(events))
        # the counts read cover the tick's hours only: what was seen before stays seen
        counted = {s: max(seen.get(s, 0), state.counted_seq.get(s, 0)) for s in {*seen, *state.counted_seq}}
        if not keys and not late and counted == seen:
            continue
        done = already_reported(table) if already_reported else set()
        if keys or counted != seen:
            cursor[table.fqn] = {"last": keys[-1] if keys else last, "seen": dict(sorted(counted.items()))}
        keys = [k for k in keys if k not in done]
        if not keys and not late:
            continue
        rows = partition_rows(store, table, [*late, *keys])
        version = store.version(table.key)
        for key in [*late, *keys]:
            start = hourly.time_window_for_partition_key(key).start
            stats = rows.get((start.strftime("%Y-%m-%d"), start.strftime("%H")), {"rows": 0, "files": 0})
            counts = state.completeness(key)
            metadata: dict[str, Any] = {
                "rows": stats["rows"],
                "files": stats["files"],
                "watermark": state.watermark.isoformat() if state.watermark else "",
                "streams": len(state.streams),
                "delta_version": version if version is not None else -1,
                "source_rows": counts.source_rows if counts.source_rows is not None else -1,
                "ingested_rows": counts.ingested_rows,
                "completeness_threshold": counts.threshold,
                "late_changes": key in late,
            }
            events.append(AssetMaterialization(asset_key=AssetKey(table.key), partition=key, metadata=metadata))
    return events, cursor


def unreported_changes(
    instance: DagsterInstance, store: DeltaStore, table: Table, timezone: str, materialized: Set[str] | None = None
) -> list[str]:
    """The hours whose partitions commits made after the table's latest report changed: a run that died between
    its merge and its report (a killed worker whose merge Spark finished anyway) leaves them unreported, and an
    already-reported hour among them has late changes that nothing else would report (they count in their
    binlog hour, not in the hour of the row they change). Every reporter, the ingestion run and the readiness
    sensor, reports them again before anything else: its own report then covers those commits. ``materialized``: the
    table's materialized partitions when the caller has just read them."""
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(table.key)), limit=1).records
    if not records or records[0].asset_materialization is None:
        return []
    reported = records[0].asset_materialization.metadata.get("delta_version")
    if reported is None or not isinstance(reported.value, int) or reported.value < 0:
        return []
    changed = changed_hours(store.partitions_written(table.key, after=reported.value), timezone)
    if not changed:
        return []
    done = materialized if materialized is not None else instance.get_materialized_partitions(AssetKey(table.key))
    return [k for k in changed if k in done]


def reported_ingested_rows(instance: DagsterInstance) -> Callable[[Table, str], int | None]:
    """``reported_rows`` for :func:`readiness_events`: the ``ingested_rows`` of the hour's latest report."""

    def lookup(table: Table, key: str) -> int | None:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(table.key), asset_partitions=[key]), limit=1
        ).records
        if not records or records[0].asset_materialization is None:
            return None
        value = records[0].asset_materialization.metadata.get("ingested_rows")
        return value.value if value is not None and isinstance(value.value, int) else None

    return lookup
