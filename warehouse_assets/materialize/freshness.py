"""Freshness SLAs per partition (``sla:`` in the catalog), compiled to one non-blocking asset check per table.

When is a partition due? Its *deadline*, local time (the business timezone), derived from the end of its window:

* ``sla: {within: 1h, grace: 15m}`` — window end + ``within`` + ``grace``. The ODS hour 10:00–11:00
  (partition ``2026-03-05-10:00``) is due at 12:15.
* ``sla: {deadline: "09:00"}`` (daily tables) — 09:00 on the day after the window, + ``grace`` if any.
  The day ``2026-03-05`` is due at 2026-03-06 09:00.

A partition is *on time* when its **first** materialization is at or before the deadline (a later
re-materialization — late CDC changes merged, a re-run — does not make an on-time partition late).

The ``freshness`` check is non-blocking (it never holds back data) and is evaluated by the
``freshness_slas`` sensor (:mod:`sensors.freshness`), once per partition, when the deadline has passed:

* passed — materialized on time; metadata ``deadline``, ``materialized_at``, ``slack_minutes``;
* failed — not materialized by the deadline; metadata ``deadline``, ``late_by_minutes`` (at evaluation),
  and ``materialized_at`` / ``lateness_minutes`` when it arrived late before the sensor looked.
  A failed freshness check is what an alert hangs on.

One verdict per partition, and it stands: a partition that missed its deadline stays failed when its data
arrives later. Dagster 1.13 stores at most one run-less evaluation per check
and partition (the unique index of ``asset_check_executions`` on asset, check, run id ``""`` and
partition: a second one raises an IntegrityError), so a passing "late" evaluation from the sensor is not
possible — and the failed partition is exactly the record of the miss. Executing the check by hand is a
run, not run-less, and may add a newer verdict.

Every run that materializes the asset includes the check: the engine's runs, a backfill's and the UI's
"Materialize" (Dagster puts every check of the selected assets in a run unless told otherwise). A check cannot
exist as a spec only (an ``AssetsDefinition`` without a computation may not carry check specs), so in those runs the
check yields nothing (``can_subset``): the run succeeds, and the partitions' verdicts stay the sensor's.
Judging there would be wrong twice over: a backfill of history would report a miss per partition (an alarm
flood), and a run-based verdict would supersede the sensor's. Dagster still records the run's planned
evaluation of each partition, shown as skipped; the sensor's run-less verdict is a row of its own (no UNIQUE
conflict) and becomes the latest at the deadline. A run after the verdict (re-running a judged day) leaves
its skipped row as the partition's latest in the UI; the verdict stays in the check's history. Executing the
check by hand (the check alone, one partition or a range) judges each selected partition as of now, by the
same rules, one evaluation per partition.
"""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    TimeWindow,
    multi_asset_check,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData
from dagster._core.event_api import PartitionKeyFilter

from resources.landing import Landing
from warehouse_assets.catalog import BY_PERIOD, Catalog, OdsTable, Sla, Table, business_zone, upstream_partitions
from warehouse_assets.catalog.checks import Check
from warehouse_assets.materialize.quality import Outcome, latest_materialization


@dataclass(frozen=True, kw_only=True)
class Freshness(Check):
    """The check kind of a freshness SLA: declared by ``sla:``, never blocking, judged by :func:`judge` (the
    ``freshness_slas`` sensor) rather than on the partition's rows."""

    kind: ClassVar[str] = "freshness"
    blocking: bool = False

    def describe(self) -> str:
        return "each partition materialized by its freshness SLA (non-blocking)"


CHECK_NAME = Freshness.kind
FRESHNESS = Freshness()
# the early warning of the same SLA: a partition predicted to miss its deadline, reported before the deadline by the
# ``sla_forecast`` sensor (the prediction: :mod:`warehouse_assets.explain.eta`)
FORECAST_CHECK_NAME = "sla_forecast"
_PERIOD_PAD = {"hourly": timedelta(hours=1), "daily": timedelta(days=1), "weekly": timedelta(days=7)}


def deadline(table: Table, partition_key: str) -> datetime:
    """When ``partition_key`` of ``table`` must be materialized (aware, business timezone)."""
    sla = _sla(table)
    pdef = BY_PERIOD[table.period]
    zone = ZoneInfo(pdef.timezone)
    end = pdef.time_window_for_partition_key(partition_key).end.astimezone(zone)
    if sla.deadline is not None:
        hours, minutes = (int(part) for part in sla.deadline.split(":"))
        return datetime.combine(end.date(), time(hours, minutes), tzinfo=zone) + timedelta(minutes=sla.grace_minutes)
    assert sla.within_minutes is not None
    return end + timedelta(minutes=sla.within_minutes + sla.grace_minutes)


def _sla(table: Table) -> Sla:
    if table.sla is None:
        raise ValueError(f"{table.fqn} declares no sla")
    return table.sla


def _lead(table: Table) -> timedelta:
    """An upper bound of deadline − window start (to find the partitions due in a span of time)."""
    sla = _sla(table)
    period = _PERIOD_PAD.get(table.period, timedelta(days=31))
    if sla.deadline is not None:
        return period + timedelta(days=1, minutes=sla.grace_minutes)
    return period + timedelta(minutes=(sla.within_minutes or 0) + sla.grace_minutes)


def due_between(table: Table, after: datetime, until: datetime) -> list[tuple[str, datetime]]:
    """The partitions of ``table`` whose deadline is in ``(after, until]``, oldest first, with it."""
    pdef = BY_PERIOD[table.period]
    first = pdef.time_window_for_partition_key(pdef.get_first_partition_key()).start
    start = max(after.astimezone(business_zone()) - _lead(table), first)
    if start >= until:
        return []
    keys = pdef.get_partition_keys_in_time_window(TimeWindow(start, until.astimezone(business_zone())))
    due = [(key, deadline(table, key)) for key in keys]
    return [(key, at) for key, at in due if after < at <= until]


def first_materialized(instance: DagsterInstance, table: Table, partition_key: str) -> datetime | None:
    """When the partition was first materialized (reported, for ODS and external tables), or None."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(table.key), asset_partitions=[partition_key]), limit=1, ascending=True
    ).records
    return datetime.fromtimestamp(records[0].timestamp, business_zone()) if records else None


def _minutes(delta: timedelta) -> float:
    return round(delta.total_seconds() / 60, 1)


def _at(value: datetime) -> str:
    return value.astimezone(business_zone()).isoformat(timespec="seconds")


def judge(table: Table, partition_key: str, due: datetime, materialized: datetime | None, now: datetime) -> Outcome:
    """The verdict on a partition whose deadline ``due`` has passed (``now`` >= ``due``)."""
    meta: dict[str, Any] = {"deadline": _at(due), "sla": _sla(table).describe(), "evaluated_at": _at(now)}
    if materialized is not None and materialized <= due:
        slack = _minutes(due - materialized)
        meta |= {"materialized_at": _at(materialized), "slack_minutes": slack, "lateness_minutes": 0.0}
        return Outcome(FRESHNESS, partition_key, True, meta, f"materialized {slack} min before its deadline {_at(due)}")
    if materialized is not None:
        late = _minutes(materialized - due)
        meta |= {"materialized_at": _at(materialized), "lateness_minutes": late, "late_by_minutes": late}
        return Outcome(
            FRESHNESS, partition_key, False, meta, f"missed its deadline {_at(due)}: arrived {late} min late"
        )
    late = _minutes(now - due)
    meta |= {"materialized": False, "late_by_minutes": late}
    return Outcome(
        FRESHNESS, partition_key, False, meta, f"not materialized by its deadline {_at(due)}: {late} min late so far"
    )


def judged(instance: DagsterInstance, table: Table, partition_key: str, check_name: str = CHECK_NAME) -> bool:
    """Whether the partition already has a run-less evaluation of the check (a sensor's; Dagster stores one)."""
    history = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(AssetKey(table.key), check_name), limit=20, partition_filter=PartitionKeyFilter(key=partition_key)
    )
    return any(not record.run_id for record in history)


def freshness_spec(table: Table) -> AssetCheckSpec:
    return AssetCheckSpec(
        CHECK_NAME,
        asset=AssetKey(table.key),
        description=f"Freshness SLA: each partition materialized {_sla(table).describe()} (non-blocking)",
        blocking=False,
        partitions_def=BY_PERIOD[table.period],
        metadata={"kind": "freshness", "sla": _sla(table).describe(), "declared_in": table.path.name},
    )


def forecast_spec(table: Table) -> AssetCheckSpec:
    return AssetCheckSpec(
        FORECAST_CHECK_NAME,
        asset=AssetKey(table.key),
        description=(
            f"Early SLA warning: each partition predicted to miss its deadline ({_sla(table).describe()}) is warned "
            "about before it, naming the critical path (non-blocking; reported by the sla_forecast sensor)"
        ),
        blocking=False,
        partitions_def=BY_PERIOD[table.period],
        metadata={"kind": "sla_forecast", "sla": _sla(table).describe(), "declared_in": table.path.name},
    )


def judge_now(instance: DagsterInstance, table: Table, partition_key: str, now: datetime) -> AssetCheckResult:
    """A hand-executed freshness check: the partition judged as of ``now`` (a warning when not yet due)."""
    due = deadline(table, partition_key)
    materialized = first_materialized(instance, table, partition_key)
    if now < due and materialized is None:
        return AssetCheckResult(
            asset_key=AssetKey(table.key),
            check_name=CHECK_NAME,
            passed=False,
            severity=AssetCheckSeverity.WARN,
            metadata={"deadline": _at(due), "materialized": False, "evaluated_at": _at(now)},
            description=f"not materialized yet; not due until {_at(due)}",
        )
    outcome = judge(table, partition_key, due, materialized, max(now, due))
    return AssetCheckResult(
        asset_key=AssetKey(table.key),
        check_name=CHECK_NAME,
        passed=outcome.passed,
        metadata={**outcome.metadata, "partition": partition_key},
        description=outcome.description,
    )


def build_freshness_check(table: Table) -> AssetChecksDefinition:
    asset_key = AssetKey(table.key)

    @multi_asset_check(
        name=f"{table.layer}_{table.name}_freshness",
        specs=[freshness_spec(table), forecast_spec(table)],
        description=(
            "Evaluated by the freshness_slas sensor (the verdict at the deadline; executing it judges the partition "
            "as of now) and the sla_forecast sensor (the warning before it)."
        ),
        can_subset=True,  # may yield nothing: it does when it rides along with a materialization run
    )
    def _freshness(context: AssetCheckExecutionContext) -> Iterator[AssetCheckEvaluation]:
        if asset_key in (context.run.asset_selection or set()):
            context.log.info(
                f"{table.fqn}: the freshness verdict is reported by the freshness_slas sensor at each "
                "partition's deadline; nothing to judge in a materialization run"
            )
            return
        if AssetCheckKey(asset_key, CHECK_NAME) not in context.selected_asset_check_keys:
            context.log.info(
                f"{table.fqn}: the {FORECAST_CHECK_NAME} warning is reported by the sla_forecast sensor while a "
                "partition is predicted to miss its deadline; `warehouse why` shows the prediction"
            )
            return
        now = datetime.now(business_zone())
        for key in context.partition_keys:  # one partition or a range, each judged on its own
            result = judge_now(context.instance, table, key, now)
            record = latest_materialization(context.instance, table, key)
            yield AssetCheckEvaluation(
                asset_key=asset_key,
                check_name=CHECK_NAME,
                passed=result.passed,
                metadata=result.metadata,
                target_materialization_data=AssetCheckEvaluationTargetMaterializationData(
                    storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
                )
                if record
                else None,
                severity=result.severity,
                description=result.description,
                blocking=False,
                partition=key,  # explicit: in a ranged run Dagster would record None
            )

    return _freshness


def build_freshness_checks(catalog: Catalog) -> list[AssetChecksDefinition]:
    return [build_freshness_check(t) for t in catalog if t.sla is not None]


# --- the deadline tick: what the ``freshness_slas`` sensor reports -----------------------------------------------
#
# The ``freshness_slas`` sensor: exactly one freshness check evaluation per partition, when its deadline passes.
#
# Rules and metadata: :mod:`warehouse_assets.materialize.freshness`. Each tick, for every table with an SLA, every
# partition whose deadline fell in ``(through, now]`` is judged once — passed when it was first materialized
# by its deadline, failed otherwise — and reported as a partitioned ``AssetCheckEvaluation``
# (``SensorResult(asset_events=...)``; the daemon stores it run-less, per partition, like a check run would).
#
# The cursor holds, per table, ``through``: every deadline up to it has been judged. So a restarted daemon
# neither repeats nor skips an evaluation. Without a cursor entry (first start, a table that just declared
# its SLA) only the deadlines of the last ``WAREHOUSE_FRESHNESS_HORIZON_HOURS`` (default 48) are judged —
# never the whole history — and a partition that already has the sensor's evaluation in the instance (a lost
# cursor) is skipped: Dagster keeps one run-less evaluation per partition and refuses a second. A tick
# judges at most ``MAX_EVALUATIONS_PER_TABLE`` partitions per table and continues from there on the next.
#
# A deadline is judged only once the warehouse could have met it. Those that passed before the sensor first
# watched a table (the backlog of a first start: ``make dev`` lands three days of CDC history, then starts)
# are judged only when the partition's data was there by the deadline — an ODS hour's segments had landed
# on every shard, a derived partition's mapped upstream partitions had been materialized — or when it was
# materialized on time. The others get no verdict: the warehouse never had their data in time, and failing
# them would raise an alarm per partition that nobody can act on. From the first tick on, every deadline
# counts, late source data included (that is what the consumers of the SLA see).
#
# Each tick logs one line per table (met, missed, not judged), not one per partition.

MAX_EVALUATIONS_PER_TABLE = 500
Clock = Callable[[], datetime]
Lookup = Callable[[Table, str], datetime | None]


def now_in_business_tz() -> datetime:
    return datetime.now(business_zone())


@dataclass
class DeadlineCursor:
    through: dict[str, str] = field(default_factory=dict)  # table -> ISO time: every deadline up to it judged

    @classmethod
    def load(cls, raw: str | None) -> "DeadlineCursor":
        data = json.loads(raw) if raw else {}
        return cls(dict(data.get("through", {})))

    def dump(self) -> str:
        return json.dumps({"through": self.through}, sort_keys=True)


@dataclass
class DeadlineTick:
    verdicts: list[tuple[Table, Outcome]]  # reported, with the table of each
    unjudged: dict[str, list[str]]  # table -> partitions of the first start's backlog left without a verdict
    cursor: DeadlineCursor


def deadline_tick(
    catalog: Catalog,
    first_materialization: Lookup,
    cursor: DeadlineCursor,
    now: datetime,
    already_judged: Callable[[Table, str], bool],
    data_available: Lookup,
    horizon: timedelta,
) -> DeadlineTick:
    """The verdicts one tick reports, the backlog it leaves unjudged, and the cursor after it.

    ``data_available(table, key)``: since when the warehouse had the partition's data (None: not all yet);
    asked only about deadlines that passed before the sensor watched the table. ``horizon``: how far back a
    table without a cursor entry is judged (``WAREHOUSE_FRESHNESS_HORIZON_HOURS``)."""
    cursor = DeadlineCursor(dict(cursor.through))
    tick = DeadlineTick([], {}, cursor)
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


def log_tick(log: Any, tick: DeadlineTick) -> None:
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
