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

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterInstance,
    TimeWindowPartitionsDefinition,
    partition_loading_context,
)

from resources.delta_lake import DeltaStore, ReadStats
from resources.landing import COUNT_WINDOW_MINUTES, Landing, count_window, is_window_key
from resources.settings import DEFAULT_TIMEZONE
from warehouse_assets.catalog import BY_PERIOD, Catalog, OdsTable, Table, hourly
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


def required_rows(threshold: float, source_rows: int | None) -> int:
    """The ingested rows a window or hour of ``source_rows`` source rows needs: ``ceil(threshold × source)``."""
    return math.ceil(threshold * source_rows - 1e-9) if source_rows is not None else 0


@dataclass
class Completeness:
    """Rows of one hour or 5-minute window: what the source counted, what was ingested, what readiness requires.

    An hour whose every counting stream counts per window is measured by its windows: it is complete when each of
    its 12 windows is (``windows``), and its totals are theirs. An hour some stream counts as a whole is measured as
    a whole (its windows are then not measured at all)."""

    key: str  # an hour's partition key, or a local window "YYYY-MM-DDTHH:MM"
    source_rows: int | None  # None: no stream publishes counts (not measured)
    ingested_rows: int
    required: int
    threshold: float
    missing_by_stream: dict[str, int] = field(default_factory=dict)  # streams short of their source count
    uncounted: list[str] = field(default_factory=list)  # streams whose source has not counted it yet
    windows: list["Completeness"] = field(default_factory=list)  # an hour measured per window: its windows

    @property
    def complete(self) -> bool:
        if self.windows:
            return all(w.complete for w in self.windows)
        return not self.uncounted and (self.source_rows is None or self.ingested_rows >= self.required)

    @property
    def missing(self) -> int:
        if self.windows:
            return sum(w.missing for w in self.windows)
        return max(0, self.required - self.ingested_rows)

    def describe(self) -> str:
        if self.source_rows is None and not self.uncounted:
            return "completeness not measured (the source publishes no counts)"
        text = (
            f"{self.ingested_rows:,} of {self.source_rows:,} source rows ingested "
            f"({self.ingested_rows / self.source_rows:.5%}); needs {self.required:,} at {self.threshold:.3%}"
            if self.source_rows
            else f"{self.ingested_rows:,} rows ingested, the source counted none"
        )
        if self.windows:
            short = [w.key[11:] for w in self.windows if not w.complete]
            text += f" per 5-minute window: {len(self.windows) - len(short)} of {len(self.windows)} complete"
            text += f", short: {', '.join(short)}" if short else ""
        if self.uncounted:
            text += f"; the source has not counted it yet for {', '.join(self.uncounted)}"
        return text


@dataclass
class Readiness:
    table: str
    streams: list[StreamState] = field(default_factory=list)
    watermark: datetime | None = None
    first_hour: datetime | None = None
    threshold: float = 1.0
    # stream -> window ("YYYY-MM-DDTHH:MM") or, from a source counting per hour only, hour ("YYYY-MM-DDTHH") -> rows
    source: dict[str, dict[str, int] | None] = field(default_factory=dict)
    ingested: dict[str, dict[str, int]] = field(default_factory=dict)  # stream -> hour -> rows
    ingested_windows: dict[str, dict[str, int]] = field(default_factory=dict)  # stream -> window -> rows
    # stream -> hours with ingested entries written before windows were counted: such an hour is measured whole
    unwindowed: dict[str, set[str]] = field(default_factory=dict)
    counted_seq: dict[str, int] = field(default_factory=dict)  # how far each stream's ingested counts go
    count_entries: list[dict[str, Any]] = field(default_factory=list)
    timezone: str = DEFAULT_TIMEZONE
    counted_hours: tuple[str, str] | None = None  # the local hours whose counts were read; None: all of them
    counts_read: ReadStats = field(default_factory=ReadStats)
    _window_hours: dict[str, set[str]] | None = field(default=None, init=False, repr=False)

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

    def by_window(self, hour: str) -> bool:
        """Whether the local hour ("YYYY-MM-DDTHH") is measured by its 5-minute windows: every stream that publishes
        counts counts it per window, and every ingested entry of it names its window."""
        if self._window_hours is None:
            self._window_hours = {
                s: {k[:13] for k in counts if is_window_key(k)} for s, counts in self.source.items() if counts
            }
        counting = [s for s, counts in self.source.items() if counts is not None]
        return (
            bool(counting)
            and all(hour in self._window_hours.get(s, set()) for s in counting)
            and not any(hour in hours for hours in self.unwindowed.values())
        )

    def completeness(self, key: str) -> Completeness:
        """Source and ingested rows of the hour partition ``key``, summed over the shard streams; from its 12
        windows when the hour is measured by window."""
        hour = self.local_hour(key)
        if not self.counts_cover(hour):
            raise ValueError(f"{self.table}: the ingested counts of {key} were not read (read {self.counted_hours})")
        if self.by_window(hour):
            start = hourly.time_window_for_partition_key(key).start
            windows = [self.window_completeness(self.local_window(w)) for w in hour_windows(start)]
            missing: dict[str, int] = {}
            for w in windows:
                for stream, n in w.missing_by_stream.items():
                    missing[stream] = missing.get(stream, 0) + n
            counted = [w.source_rows for w in windows if w.source_rows is not None]
            return Completeness(
                key,
                sum(counted) if counted else None,
                sum(w.ingested_rows for w in windows),
                sum(w.required for w in windows),
                self.threshold,
                missing,
                sorted({s for w in windows for s in w.uncounted}),
                windows,
            )
        return self._measure(key, hour, self.ingested, _hour_count)

    def window_completeness(self, window: str) -> Completeness:
        """Source and ingested rows of the local window ``window`` ("YYYY-MM-DDTHH:MM"), summed over the streams."""
        return self._measure(window, window, self.ingested_windows, lambda counts, w: counts.get(w))

    def _measure(
        self,
        key: str,
        counted: str,
        ingested: dict[str, dict[str, int]],
        source_count: Callable[[dict[str, int], str], int | None],
    ) -> Completeness:
        source_total: int | None = None
        ingested_total = 0
        missing: dict[str, int] = {}
        uncounted: list[str] = []
        for stream in self.source:
            got = ingested.get(stream, {}).get(counted, 0)
            ingested_total += got
            counts = self.source[stream]
            if counts is None:
                continue
            rows = source_count(counts, counted)
            if rows is None:
                uncounted.append(stream)
                continue
            source_total = (source_total or 0) + rows
            if got < rows:
                missing[stream] = rows - got
        required = required_rows(self.threshold, source_total)
        return Completeness(key, source_total, ingested_total, required, self.threshold, missing, uncounted)

    def local_window(self, start: datetime) -> str:
        """The counts' key of the window starting at ``start``: local "YYYY-MM-DDTHH:MM"."""
        return count_window(start.astimezone(ZoneInfo(self.timezone)))

    def window_complete(self, start: datetime) -> bool:
        """Whether the 5-minute window starting at ``start`` is complete by count (its watermark aside): measured on
        its own when its hour is measured by window, else only as part of its whole hour."""
        hour = self.local_hour(hour_key(_floor_hour(start)))
        if self.by_window(hour):
            return self.window_completeness(self.local_window(start)).complete
        return self.completeness(hour_key(_floor_hour(start))).complete


WINDOW = timedelta(minutes=COUNT_WINDOW_MINUTES)


def _hour_count(counts: dict[str, int], hour: str) -> int | None:
    """A stream's source rows of a local hour: its hour line, or the sum of its windows once all 12 are counted."""
    if hour in counts:
        return counts[hour]
    windows = [counts.get(f"{hour}:{m:02d}") for m in range(0, 60, COUNT_WINDOW_MINUTES)]
    return None if any(n is None for n in windows) else sum(n for n in windows if n is not None)


def hour_windows(start: datetime) -> list[datetime]:
    """The starts of the hour's 5-minute windows (12)."""
    return [start + i * WINDOW for i in range(int(timedelta(hours=1) / WINDOW))]


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
        state,
        source={},
        ingested={},
        ingested_windows={},
        unwindowed={},
        counted_seq={},
        count_entries=[],
        counted_hours=None,
        counts_read=ReadStats(),
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
    state._window_hours = None
    for e in state.count_entries:
        per = state.ingested.setdefault(e["stream"], {})
        per[e["hour"]] = per.get(e["hour"], 0) + int(e["rows"])
        if e.get("window"):
            windows = state.ingested_windows.setdefault(e["stream"], {})
            windows[e["window"]] = windows.get(e["window"], 0) + int(e["rows"])
        elif int(e["rows"]):
            state.unwindowed.setdefault(e["stream"], set()).add(e["hour"])
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


def ready_windows(state: Readiness, after: datetime | None, limit: int = MAX_EVENTS_PER_TICK * 12) -> list[datetime]:
    """Starts of the 5-minute windows complete under the watermark and by count, in order, after the window ending at
    ``after`` (from the first hour of data without); the first incomplete window (or the end of the hours whose
    counts were read) stops the walk, as hours are walked."""
    start = after if after is not None else _walk_start(state, None)
    if state.watermark is None or start is None:
        return []
    found: list[datetime] = []
    window = start
    while window + WINDOW <= state.watermark and len(found) < limit:
        if not state.counts_cover(state.local_hour(hour_key(_floor_hour(window)))):
            break
        if not state.window_complete(window):
            break
        found.append(window)
        window += WINDOW
    return found


def completed_partitions(
    pdef: TimeWindowPartitionsDefinition, since: datetime, before: datetime, after: datetime
) -> list[str]:
    """The partitions of ``pdef`` that the complete windows reaching from ``before`` to ``after`` complete: every one
    ending in (``before``, ``after``] and starting at or after ``since`` (where the complete run of windows began).

    One walk of windows thus completes the partitions of every period at once, each once: the windows of 5 minutes,
    a mini-batch table's 10 or 15, the hour of the ODS table itself."""
    keys: list[str] = []
    with partition_loading_context(after + timedelta(days=1)):
        # the partition holding ``before`` is the first that can end after it
        window = pdef.time_window_for_partition_key(pdef.get_partition_key_for_timestamp(before.timestamp()))
        while window.end <= after:
            if window.end > before and window.start >= since:
                keys.append(pdef.get_partition_key_for_timestamp(window.start.timestamp()))
            following = pdef.get_next_partition_window(window.end, respect_bounds=False)
            if following is None:
                break
            window = following
    return keys


def changed_hours(partitions: Iterable[Mapping[str, str]], timezone: str) -> list[str]:
    """The hour partition keys of ODS partitions (``dt``, ``hh``: local date and hour in ``timezone``), such as
    those a merge wrote (:attr:`~warehouse_assets.ingest.merge.BatchReport.partitions_changed`)."""
    return sorted(_changed_hours_at(((p, None) for p in partitions), timezone))


def _changed_hours_at(
    partitions: Iterable[tuple[Mapping[str, str], float | None]], timezone: str
) -> dict[str, float | None]:
    """Hour partition key → the time of its latest change, of ODS partitions with theirs (None: unknown)."""
    local, zone = ZoneInfo(timezone), ZoneInfo(hourly.timezone)
    found: dict[str, float | None] = {}
    for partition, at in partitions:
        start = datetime.strptime(f"{partition['dt']}T{partition['hh']}", "%Y-%m-%dT%H").replace(tzinfo=local)
        key = hour_key(start.astimezone(zone))
        if not hourly.has_partition_key(key):
            continue
        before = found.get(key, at)
        found[key] = None if at is None or before is None else max(at, before)
    return found


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
    tainted: Callable[[Table, Sequence[str]], Iterable[str]] | None = None,
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
    again, as for count growth, but for those ``tainted`` says are tainted (table, hour keys → the tainted ones): a
    change to a tainted hour is the correction its repair waits for, however old the hour.
    """
    events: list[AssetMaterialization] = []
    cursor = dict(cursor)
    for table in catalog.ods():
        last, seen = _table_cursor(cursor.get(table.fqn))
        state = shard_state(store, landing, table)
        if state.streams:
            read_counts(state, store, landing, table, *tick_hours(state, last, lookback))
        late = [k for k in late_hours(state, last, seen) if state.completeness(k).complete]
        # what each late hour's previous report had ingested: the report says how many changes are new since
        before = {k: reported_rows(table, k) for k in late} if reported_rows is not None else {}
        if reported_rows is not None:
            late = [k for k in late if state.completeness(k).ingested_rows > (before[k] or -1)]
        if changed and changed.get(table.fqn) and last is not None:
            rewritten = [k for k in changed[table.fqn] if k <= last and state.counts_cover(state.local_hour(k))]
            late = sorted({*late, *rewritten})
            older = [k for k in changed[table.fqn] if k <= last and not state.counts_cover(state.local_hour(k))]
            if older and tainted is not None:
                events.extend(_corrected_hours(store, landing, table, sorted(tainted(table, older))))
        keys = ready_hours(state, last, MAX_EVENTS_PER_TICK - len(events))
        # the counts read cover the tick's hours only: what was seen before stays seen
        counted = {s: max(seen.get(s, 0), state.counted_seq.get(s, 0)) for s in {*seen, *state.counted_seq}}
        through = _windows_through(cursor.get(table.fqn))
        windows, through_now = window_events(state, catalog.windows(table.fqn), through, seen, already_reported)
        if keys or counted != seen or through_now != through:
            cursor[table.fqn] = {"last": keys[-1] if keys else last, "seen": dict(sorted(counted.items()))}
            if through_now is not None:
                cursor[table.fqn]["windows"] = through_now.isoformat()
        done = already_reported(table) if already_reported and (keys or late) else set()
        keys = [k for k in keys if k not in done]
        if keys or late:
            new_changes = {
                k: state.completeness(k).ingested_rows - n for k in late if (n := before.get(k)) is not None and n >= 0
            }
            events.extend(_hour_events(store, table, state, late, keys, new_changes))
        events.extend(windows)
    return events, cursor


def _corrected_hours(
    store: DeltaStore, landing: Landing, table: Table, keys: Sequence[str]
) -> list[AssetMaterialization]:
    """The reports, again, of tainted hours changed since their taint that lie before the counts a tick reads: their
    counts read for their own hours, each reported once complete (a late change left to a repair past the lookback;
    this change is the repair's)."""
    if not keys:
        return []
    state = shard_state(store, landing, table)
    starts = [hourly.time_window_for_partition_key(k).start for k in keys]
    read_counts(state, store, landing, table, min(starts), max(starts) + timedelta(hours=1))
    return _hour_events(store, table, state, [k for k in keys if state.completeness(k).complete], [], {})


def _hour_events(
    store: DeltaStore,
    table: Table,
    state: Readiness,
    late: Sequence[str],
    keys: Sequence[str],
    new_changes: Mapping[str, int],
) -> list[AssetMaterialization]:
    """The reports of ``late`` hours (again) and of newly ready ``keys``; a late report says how many changes it
    adds to the hour's previous one (``changed_rows``) where that is known, which the late-data rule of the tables
    reading the hour weighs: a few changed keys are a key-scoped rebuild, many a whole one."""
    rows = partition_rows(store, table, [*late, *keys])
    version = store.version(table.key)
    events = []
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
            **({"changed_rows": new_changes[key]} if key in new_changes else {}),
        }
        events.append(AssetMaterialization(asset_key=AssetKey(table.key), partition=key, metadata=metadata))
    return events


def _windows_through(value: Any) -> datetime | None:
    """How far a table's cursor says its completeness windows were complete (the end of the last one)."""
    if isinstance(value, dict) and value.get("windows"):
        return datetime.fromisoformat(str(value["windows"]))
    return None


def window_events(
    state: Readiness,
    tables: Sequence[Table],
    through: datetime | None,
    seen: Mapping[str, int],
    already_reported: Callable[[Table], set[str]] | None = None,
) -> tuple[list[AssetMaterialization], datetime | None]:
    """Materializations of the completeness windows ``tables`` (of one ODS table) that the windows complete since
    ``through`` (the end of the complete run of windows reported before) complete, each partition once whatever its
    period; and the partitions already reported whose windows' ingested counts grew since the streams' ``seen``
    positions (late changes), reported again. Returns them and how far the windows are complete now.

    Without ``through``, it is the end of the latest partition ``already_reported`` of any of ``tables``, else the walk
    starts at the first hour whose counts were read."""
    if not tables or not state.streams:
        return [], through
    if through is None and already_reported is not None:
        ends = []
        for windows in tables:
            done = already_reported(windows)
            if done:
                ends.append(BY_PERIOD[windows.period].time_window_for_partition_key(max(done)).end)
        through = max(ends) if ends else None
    # where the complete run of windows begins: a partition starting before it was never whole in it
    origin = _walk_start(state, None)
    if through is None and origin is not None and state.counted_hours is not None:
        zone = ZoneInfo(state.timezone)
        counted = datetime.strptime(state.counted_hours[0], "%Y-%m-%dT%H").replace(tzinfo=zone)
        origin = max(origin, counted.astimezone(origin.tzinfo))
    start = through or origin
    if start is None or origin is None:
        return [], through
    found = ready_windows(state, start)
    now = found[-1] + WINDOW if found else through
    events: list[AssetMaterialization] = []
    late = _late_windows(state, through, seen)
    for windows in tables:
        pdef = BY_PERIOD[windows.period]
        fresh = completed_partitions(pdef, origin, start, found[-1] + WINDOW) if found else []
        again = sorted(
            {pdef.get_partition_key_for_timestamp(w.timestamp()) for w in late} - set(fresh),
            key=lambda k: pdef.time_window_for_partition_key(k).start,
        )
        again = [k for k in again if _whole(state, pdef, k, through)]
        if already_reported is not None and fresh:
            done = already_reported(windows)
            fresh = [k for k in fresh if k not in done]
        for key in [*again, *fresh]:
            window = pdef.time_window_for_partition_key(key)
            parts = [state.window_completeness(state.local_window(w)) for w in _windows_of(window.start, window.end)]
            sources = [c.source_rows for c in parts if c.source_rows is not None]
            metadata: dict[str, Any] = {
                "windows": len(parts),
                "watermark": state.watermark.isoformat() if state.watermark else "",
                "source_rows": sum(sources) if sources else -1,
                "ingested_rows": sum(c.ingested_rows for c in parts),
                "completeness_threshold": state.threshold,
                "late_changes": key in again,
            }
            events.append(AssetMaterialization(asset_key=AssetKey(windows.key), partition=key, metadata=metadata))
    return events, now


def _windows_of(start: datetime, end: datetime) -> list[datetime]:
    found, window = [], start
    while window < end:
        found.append(window)
        window += WINDOW
    return found


def _late_windows(state: Readiness, through: datetime | None, seen: Mapping[str, int]) -> set[datetime]:
    """Starts of the windows before ``through`` whose ingested count grew since the streams' ``seen`` positions."""
    if through is None:
        return set()
    zone = ZoneInfo(state.timezone)
    found = set()
    for entry in state.count_entries:
        if not entry.get("window") or entry["seq_to"] <= seen.get(entry["stream"], 0) or not entry["rows"]:
            continue
        start = datetime.strptime(entry["window"], "%Y-%m-%dT%H:%M").replace(tzinfo=zone).astimezone(through.tzinfo)
        if start + WINDOW <= through:
            found.add(start)
    return found


def _whole(state: Readiness, pdef: TimeWindowPartitionsDefinition, key: str, through: datetime | None) -> bool:
    """Whether the partition ``key`` was reported (ended by ``through``) and each of its windows is complete now."""
    window = pdef.time_window_for_partition_key(key)
    if through is None or window.end > through:
        return False
    return all(
        state.counts_cover(state.local_hour(hour_key(_floor_hour(w)))) and state.window_complete(w)
        for w in _windows_of(window.start, window.end)
    )


# The hours of a table tainted now, among the given ones, each with when it was tainted (epoch seconds). Handed in by
# whoever assembles the reporter: validity belongs to building, above ingestion.
TaintedAt = Callable[[DagsterInstance, Table, Sequence[str]], Mapping[str, float]]


def unreported_changes(
    instance: DagsterInstance,
    store: DeltaStore,
    table: Table,
    timezone: str,
    materialized: Set[str] | None = None,
    tainted_at: TaintedAt | None = None,
) -> list[str]:
    """The hours whose partitions commits made after the table's latest report changed: a run that died between
    its merge and its report (a killed worker whose merge Spark finished anyway) leaves them unreported, and an
    already-reported hour among them has late changes that nothing else would report (they count in their
    binlog hour, not in the hour of the row they change). Every reporter, the ingestion run and the readiness
    sensor, reports them again before anything else: its own report then covers those commits. ``materialized``: the
    table's materialized partitions when the caller has just read them.

    A tainted hour is left out when every change of it was committed before its taint (``tainted_at`` reads when):
    the taint condemned the data they wrote (an hour gone bad in the lake, tainted before a reporter looked), and a
    report would lift it with nothing corrected. A change committed after the taint (the source's, a re-ingest) is
    reported and judged. The commit's time is its writer's clock, the taint's the instance's: their skew blurs the
    order of a change and a taint that close."""
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(table.key)), limit=1).records
    if not records or records[0].asset_materialization is None:
        return []
    reported = records[0].asset_materialization.metadata.get("delta_version")
    if reported is None or not isinstance(reported.value, int) or reported.value < 0:
        return []
    changed = _changed_hours_at(store.partitions_written_at(table.key, after=reported.value), timezone)
    if not changed:
        return []
    done = materialized if materialized is not None else instance.get_materialized_partitions(AssetKey(table.key))
    keys = [k for k in sorted(changed) if k in done]
    tainted = tainted_at(instance, table, keys) if tainted_at is not None and keys else {}
    # a change of unknown time is reported, as before taints were read
    condemned = {k for k, at in tainted.items() if (changed_at := changed[k]) is not None and changed_at <= at}
    return [k for k in keys if k not in condemned]


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
