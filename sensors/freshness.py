"""The ``freshness_slas`` sensor: exactly one freshness check evaluation per partition, when its deadline passes.

Rules and metadata: :mod:`warehouse_assets.build.freshness`. Each tick, for every table with an SLA, every
partition whose deadline fell in ``(through, now]`` is judged once — passed when it was first materialized
by its deadline, failed otherwise — and reported as a partitioned ``AssetCheckEvaluation``
(``SensorResult(asset_events=...)``; the daemon stores it run-less, per partition, like a check run would).

The cursor holds, per table, ``through``: every deadline up to it has been judged. So a restarted daemon
neither repeats nor skips an evaluation. Without a cursor entry (first start, a table that just declared
its SLA) only the deadlines of the last ``WAREHOUSE_FRESHNESS_HORIZON_HOURS`` (default 48) are judged —
never the whole history — and a partition that already has the sensor's evaluation in the instance (a lost
cursor) is skipped: Dagster keeps one run-less evaluation per partition and refuses a second. A tick
judges at most ``MAX_EVALUATIONS_PER_TABLE`` partitions per table and continues from there on the next.

A deadline is judged only once the warehouse could have met it. Those that passed before the sensor first
watched a table (the backlog of a first start: ``make dev`` lands three days of CDC history, then starts)
are judged only when the partition's data was there by the deadline — an ODS hour's segments had landed
on every shard, a derived partition's mapped upstream partitions had been materialized — or when it was
materialized on time. The others get no verdict: the warehouse never had their data in time, and failing
them would raise an alarm per partition that nobody can act on. From the first tick on, every deadline
counts, late source data included (that is what the consumers of the SLA see).

Each tick logs one line per table (met, missed, not judged), not one per partition.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dagster import (
    DagsterInstance,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.landing import Landing, LandingResource
from resources.settings import Settings, current
from warehouse_assets.build.freshness import due_between, first_materialized, judge, judged
from warehouse_assets.build.quality import Outcome, evaluation
from warehouse_assets.catalog import BY_PERIOD, Catalog, OdsTable, Table, business_zone, upstream_partitions

MAX_EVALUATIONS_PER_TABLE = 500
Clock = Callable[[], datetime]
Lookup = Callable[[Table, str], datetime | None]


def now_in_business_tz() -> datetime:
    return datetime.now(business_zone())


@dataclass
class Cursor:
    through: dict[str, str] = field(default_factory=dict)  # table -> ISO time: every deadline up to it judged

    @classmethod
    def load(cls, raw: str | None) -> "Cursor":
        data = json.loads(raw) if raw else {}
        return cls(dict(data.get("through", {})))

    def dump(self) -> str:
        return json.dumps({"through": self.through}, sort_keys=True)


@dataclass
class Tick:
    verdicts: list[tuple[Table, Outcome]]  # reported, with the table of each
    unjudged: dict[str, list[str]]  # table -> partitions of the first start's backlog left without a verdict
    cursor: Cursor


def evaluate(
    catalog: Catalog,
    first_materialization: Lookup,
    cursor: Cursor,
    now: datetime,
    already_judged: Callable[[Table, str], bool],
    data_available: Lookup,
    horizon: timedelta,
) -> Tick:
    """The verdicts one tick reports, the backlog it leaves unjudged, and the cursor after it.

    ``data_available(table, key)``: since when the warehouse had the partition's data (None: not all yet);
    asked only about deadlines that passed before the sensor watched the table. ``horizon``: how far back a
    table without a cursor entry is judged (``WAREHOUSE_FRESHNESS_HORIZON_HOURS``)."""
    cursor = Cursor(dict(cursor.through))
    tick = Tick([], {}, cursor)
    for table in catalog:
        if table.sla is None:
            continue
        known = table.fqn in cursor.through
        after = datetime.fromisoformat(cursor.through[table.fqn]) if known else now - horizon
        due = due_between(table, after, now)
        through = now
        if len(due) > MAX_EVALUATIONS_PER_TABLE:
            due = due[:MAX_EVALUATIONS_PER_TABLE]
            through = due[-1][1]
        for key, deadline in due:
            if not known and already_judged(table, key):
                continue
            materialized = first_materialization(table, key)
            if not known and (materialized is None or materialized > deadline):
                had = data_available(table, key)
                if had is None or had > deadline:  # passed before we watched, without its data: not a miss of ours
                    tick.unjudged.setdefault(table.fqn, []).append(key)
                    continue
            tick.verdicts.append((table, judge(table, key, deadline, materialized, now)))
        cursor.through[table.fqn] = max(through, after).astimezone(business_zone()).isoformat()
    return tick


Landed = dict[str, list[tuple[datetime, float]]]  # stream -> (segment end, newest file time through it)


def _landed(landing: Landing, stream: str, until: datetime, cache: Landed) -> float | None:
    """When the stream's segments through ``until`` had all landed (newest file time), or None if not yet."""
    if stream not in cache:
        newest, ends = 0.0, []
        for segment in landing.segments(stream):  # contiguous, in order: a shard's watermark
            newest = max(newest, segment.path.stat().st_mtime)
            ends.append((segment.end, newest))
        cache[stream] = ends
    return next((landed for end, landed in cache[stream] if end >= until), None)


def data_available(
    instance: DagsterInstance,
    catalog: Catalog,
    landing: Landing,
    table: Table,
    key: str,
    cache: Landed,
) -> datetime | None:
    """Since when the warehouse had what it needs to deliver the partition, or None (not all of it yet).

    ODS hour: every shard's segments through the hour's end had landed. External: it was delivered.
    Derived: every mapped upstream partition had been materialized (first materialization)."""
    if table.is_ods:
        assert isinstance(table, OdsTable)
        streams = landing.streams(table.source_database, table.source_tables)
        end = BY_PERIOD[table.period].time_window_for_partition_key(key).end
        landed = [_landed(landing, stream, end, cache) for stream in streams]
        if not landed or any(t is None for t in landed):
            return None
        return datetime.fromtimestamp(max(t for t in landed if t is not None), business_zone())
    if table.is_external:
        return first_materialized(instance, table, key)
    newest: datetime | None = None
    for dep in table.deps:
        upstream = catalog[dep.table]
        for up_key in upstream_partitions(catalog, table, dep, key).keys:
            at = first_materialized(instance, upstream, up_key)
            if at is None:
                return None
            newest = at if newest is None else max(newest, at)
    return newest


def _span(keys: list[str], shown: int = 3) -> str:
    return ", ".join(keys[:shown]) + (f" … {keys[-1]} ({len(keys)})" if len(keys) > shown else "")


def log_tick(log: Any, tick: Tick) -> None:
    """One line per table: how many deadlines were met, missed and left unjudged, naming the partitions."""
    tables = list(dict.fromkeys([t.fqn for t, _ in tick.verdicts] + list(tick.unjudged)))
    for fqn in tables:
        outcomes = [o for t, o in tick.verdicts if t.fqn == fqn]
        met = [o.partition for o in outcomes if o.passed]
        missed = [o for o in outcomes if not o.passed]
        parts = []
        if met:
            parts.append(f"{len(met)} met ({_span(met)})")
        if missed:
            parts.append(
                f"{len(missed)} MISSED ({_span([o.partition for o in missed])}; first: {missed[0].description})"
            )
        if fqn in tick.unjudged:
            parts.append(
                f"{len(tick.unjudged[fqn])} not judged ({_span(tick.unjudged[fqn])}: due before the sensor watched, "
                "their data came later)"
            )
        (log.warning if missed else log.info)(f"{fqn} freshness SLA: " + "; ".join(parts))


def build_freshness_sensor(
    catalog: Catalog, clock: Clock = now_in_business_tz, settings: Settings | None = None
) -> SensorDefinition:
    settings = settings or current()
    horizon = timedelta(hours=settings.freshness_horizon_hours)
    watched = [t.fqn for t in catalog if t.sla is not None]

    @sensor(
        name="freshness_slas",
        minimum_interval_seconds=settings.freshness_sensor_interval,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Judges each partition's freshness SLA once its deadline passes ({', '.join(watched)}).",
    )
    def _freshness(context: SensorEvaluationContext, landing: LandingResource) -> SensorResult:
        source = landing.landing()
        cache: Landed = {}  # per tick: the landed segments of each stream
        tick = evaluate(
            catalog,
            lambda table, key: first_materialized(context.instance, table, key),
            Cursor.load(context.cursor),
            clock(),
            lambda table, key: judged(context.instance, table, key),
            lambda table, key: data_available(context.instance, catalog, source, table, key, cache),
            horizon,
        )
        log_tick(context.log, tick)
        if not tick.verdicts:
            return SensorResult(skip_reason=SkipReason("no partition reached its deadline"), cursor=tick.cursor.dump())
        events = [evaluation(context.instance, table, outcome) for table, outcome in tick.verdicts]
        return SensorResult(asset_events=events, cursor=tick.cursor.dump())

    return _freshness
