"""The ``freshness_slas`` sensor: exactly one freshness check evaluation per partition, when its deadline passes.

Rules and metadata: :mod:`warehouse_assets.freshness`. Each tick, for every table with an SLA, every
partition whose deadline fell in ``(through, now]`` is judged once — passed when it was first materialized
by its deadline, failed otherwise — and reported as a partitioned ``AssetCheckEvaluation``
(``SensorResult(asset_events=...)``; the daemon stores it run-less, per partition, like a check run would).

The cursor holds, per table, ``through``: every deadline up to it has been judged. So a restarted daemon
neither repeats nor skips an evaluation. Without a cursor entry (first start, a table that just declared
its SLA) only the deadlines of the last ``WAREHOUSE_FRESHNESS_HORIZON_HOURS`` (default 48) are judged —
never the whole history — and a partition that already has the sensor's evaluation in the instance (a lost
cursor) is skipped: Dagster keeps one run-less evaluation per partition and refuses a second. A tick
judges at most ``MAX_EVALUATIONS_PER_TABLE`` partitions per table and continues from there on the next.
"""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dagster import (
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from warehouse_assets.catalog import Catalog, Table
from warehouse_assets.freshness import TZ, due_between, first_materialized, judge, judged
from warehouse_assets.quality import Outcome, evaluation

MAX_EVALUATIONS_PER_TABLE = 500
Clock = Callable[[], datetime]
Lookup = Callable[[Table, str], datetime | None]


def horizon() -> timedelta:
    """``WAREHOUSE_FRESHNESS_HORIZON_HOURS``: how far back a table without a cursor entry is judged."""
    return timedelta(hours=float(os.environ.get("WAREHOUSE_FRESHNESS_HORIZON_HOURS", "48")))


def sensor_interval() -> int:
    """``WAREHOUSE_FRESHNESS_SENSOR_INTERVAL`` seconds between ticks (read when the code location loads)."""
    return int(os.environ.get("WAREHOUSE_FRESHNESS_SENSOR_INTERVAL", "60"))


def now_in_business_tz() -> datetime:
    return datetime.now(TZ)


@dataclass
class Cursor:
    through: dict[str, str] = field(default_factory=dict)  # table -> ISO time: every deadline up to it judged

    @classmethod
    def load(cls, raw: str | None) -> "Cursor":
        data = json.loads(raw) if raw else {}
        return cls(dict(data.get("through", {})))

    def dump(self) -> str:
        return json.dumps({"through": self.through}, sort_keys=True)


def evaluate(
    catalog: Catalog,
    first_materialization: Lookup,
    cursor: Cursor,
    now: datetime,
    already_judged: Callable[[Table, str], bool] = lambda table, key: False,
) -> tuple[list[tuple[Table, Outcome]], Cursor]:
    """The verdicts one tick reports (with the table of each), and the cursor after it."""
    cursor = Cursor(dict(cursor.through))
    verdicts: list[tuple[Table, Outcome]] = []
    for table in catalog:
        if table.sla is None:
            continue
        known = table.fqn in cursor.through
        after = datetime.fromisoformat(cursor.through[table.fqn]) if known else now - horizon()
        due = due_between(table, after, now)
        through = now
        if len(due) > MAX_EVALUATIONS_PER_TABLE:
            due = due[:MAX_EVALUATIONS_PER_TABLE]
            through = due[-1][1]
        for key, deadline in due:
            if not known and already_judged(table, key):
                continue
            verdicts.append((table, judge(table, key, deadline, first_materialization(table, key), now)))
        cursor.through[table.fqn] = max(through, after).astimezone(TZ).isoformat()
    return verdicts, cursor


def build_freshness_sensor(catalog: Catalog, clock: Clock = now_in_business_tz) -> SensorDefinition:
    watched = [t.fqn for t in catalog if t.sla is not None]

    @sensor(
        name="freshness_slas",
        minimum_interval_seconds=sensor_interval(),
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Judges each partition's freshness SLA once its deadline passes ({', '.join(watched)}).",
    )
    def _freshness(context: SensorEvaluationContext) -> SensorResult:
        verdicts, cursor = evaluate(
            catalog,
            lambda table, key: first_materialized(context.instance, table, key),
            Cursor.load(context.cursor),
            clock(),
            lambda table, key: judged(context.instance, table, key),
        )
        for table, outcome in verdicts:
            log = context.log.info if outcome.passed else context.log.warning
            verdict = "met" if outcome.passed else "MISSED"
            log(f"{table.fqn} {outcome.partition} freshness SLA {verdict}: {outcome.description}")
        if not verdicts:
            return SensorResult(skip_reason=SkipReason("no partition reached its deadline"), cursor=cursor.dump())
        events = [evaluation(context.instance, table, outcome) for table, outcome in verdicts]
        return SensorResult(asset_events=events, cursor=cursor.dump())

    return _freshness
