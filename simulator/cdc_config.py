"""What the simulated MySQL source is and how a simulation is set up: its databases, shard tables and columns
(:data:`LOGICAL_TABLES`, one binlog stream per shard table and database heartbeat), the configuration of a run
(:class:`SimulationConfig`) and the summary of what it wrote (:class:`SimulationSummary`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from resources.column_types import jdbc_type
from resources.landing import (
    HEARTBEAT_TABLE,
)
from resources.settings import DEFAULT_TIMEZONE

# --------------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A MySQL column as Canal describes it."""

    name: str
    mysql_type: str

    @property
    def sql_type(self) -> int:
        """The JDBC type code Canal writes in ``sqlType``."""
        return jdbc_type(self.mysql_type)


def _cols(*pairs: tuple[str, str]) -> tuple[Column, ...]:
    return tuple(Column(name, mysql_type) for name, mysql_type in pairs)


_BIGINT, _DATETIME, _TINYINT = "bigint(20)", "datetime", "tinyint(4)"
_TIMES = (("create_time", _DATETIME), ("update_time", _DATETIME))


@dataclass(frozen=True)
class TableSpec:
    """A logical source table: where it lives, how it is sharded and its columns."""

    name: str
    db: str
    columns: tuple[Column, ...]
    shard_count: int = 1
    shard_key: str = "id"
    pk: tuple[str, ...] = ("id",)
    partition_column: str = "create_time"
    drift_columns: tuple[Column, ...] = ()

    @property
    def physical_tables(self) -> tuple[str, ...]:
        """Physical table names, e.g. ``order_00``..``order_07`` (or just the name when unsharded)."""
        if self.shard_count == 1:
            return (self.name,)
        return tuple(f"{self.name}_{i:02d}" for i in range(self.shard_count))

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def physical_table(self, row: Mapping[str, str | None]) -> str:
        """The shard holding ``row`` (``shard = int(row[shard_key]) % shard_count``)."""
        if self.shard_count == 1:
            return self.name
        return f"{self.name}_{int(str(row[self.shard_key])) % self.shard_count:02d}"

    def mysql_types(self, with_drift: bool = False) -> dict[str, str]:
        columns = self.columns + (self.drift_columns if with_drift else ())
        return {c.name: c.mysql_type for c in columns}


LOGICAL_TABLES: dict[str, TableSpec] = {
    "user": TableSpec(
        "user",
        "edu_user",
        _cols(
            ("id", _BIGINT),
            ("name", "varchar(64)"),
            ("city", "varchar(32)"),
            ("grade", _TINYINT),
            ("channel", "varchar(32)"),
            *_TIMES,
        ),
        shard_count=4,
        drift_columns=_cols(("phone", "varchar(20)")),
    ),
    "course": TableSpec(
        "course",
        "edu_course",
        _cols(
            ("id", _BIGINT),
            ("title", "varchar(128)"),
            ("subject", "varchar(32)"),
            ("grade", _TINYINT),
            ("price", "decimal(10,2)"),
            ("teacher_id", _BIGINT),
            *_TIMES,
        ),
    ),
    "lesson": TableSpec(
        "lesson",
        "edu_course",
        _cols(
            ("id", _BIGINT),
            ("course_id", _BIGINT),
            ("title", "varchar(128)"),
            ("start_time", _DATETIME),
            ("end_time", _DATETIME),
            *_TIMES,
        ),
    ),
    "order": TableSpec(
        "order",
        "edu_trade",
        _cols(
            ("id", _BIGINT),
            ("user_id", _BIGINT),
            ("course_id", _BIGINT),
            ("amount", "decimal(10,2)"),
            ("status", "varchar(16)"),
            ("pay_time", _DATETIME),
            *_TIMES,
        ),
        shard_count=8,
        shard_key="user_id",
    ),
    "attendance": TableSpec(
        "attendance",
        "edu_learning",
        _cols(
            ("id", _BIGINT),
            ("user_id", _BIGINT),
            ("lesson_id", _BIGINT),
            ("course_id", _BIGINT),
            ("join_time", _DATETIME),
            ("leave_time", _DATETIME),
            ("duration_sec", "int(11)"),
            *_TIMES,
        ),
        shard_count=8,
        shard_key="user_id",
    ),
}

DATABASES: tuple[str, ...] = ("edu_user", "edu_course", "edu_trade", "edu_learning")
HEARTBEAT_COLUMNS: tuple[Column, ...] = _cols(("id", _BIGINT), ("ts", _DATETIME))
HEARTBEAT = HEARTBEAT_TABLE

_PHYSICAL_TO_LOGICAL = {p: spec.name for spec in LOGICAL_TABLES.values() for p in spec.physical_tables}


def merged_order_row(order_id: int, user_id: int, created: datetime, pos: int, course_id: int = 1) -> dict[str, Any]:
    """One paid ``ods.order`` row as the ingestion leaves it (CDC bookkeeping and partition columns
    included), created at ``created`` (local time): for seeding a lake directly in tests and benches."""
    return {
        "id": order_id,
        "user_id": user_id,
        "course_id": course_id,
        "amount": Decimal("20.00"),
        "status": "paid",
        "pay_time": created,
        "create_time": created,
        "update_time": created,
        "_es": int(created.timestamp() * 1000),
        "_pos": pos,
        "_stream": "edu_trade.order_00",
        "_deleted": False,
        "dt": created.strftime("%Y-%m-%d"),
        "hh": created.strftime("%H"),
    }


def logical_table_of(physical_table: str) -> str | None:
    """``order_03`` → ``order``; ``heartbeat`` and unknown names → None."""
    return _PHYSICAL_TO_LOGICAL.get(physical_table)


def _stream_keys() -> list[tuple[str, str]]:
    """Every (db, physical table) stream in a fixed order: data tables, then heartbeats."""
    keys = [(spec.db, p) for spec in LOGICAL_TABLES.values() for p in spec.physical_tables]
    return keys + [(db, HEARTBEAT) for db in DATABASES]


STREAMS: tuple[tuple[str, str], ...] = tuple(_stream_keys())

# --------------------------------------------------------------------------------------------------------
# Configuration and results
# --------------------------------------------------------------------------------------------------------

IdleRange = tuple[str, datetime, datetime]
Burst = tuple[datetime, datetime, float]  # (start, end, factor): the change rate times factor in [start, end)


@dataclass(frozen=True)
class SimulationConfig:
    """Parameters of a simulation. Naive datetimes are business-local (``tz``).

    ``lag`` maps a physical table (``order_03`` or ``edu_trade.order_03``; heartbeats need the db prefix)
    to how much earlier its segments stop. ``idle`` lists ``(db, start, end)`` ranges with heartbeats only.
    """

    seed: int = 7
    scale: float = 1.0
    tz: str = DEFAULT_TIMEZONE
    batch_minutes: int = 5
    dup_rate: float = 0.002
    malformed_rate: float = 0.0
    lag: Mapping[str, timedelta] = field(default_factory=dict)
    idle: Sequence[IdleRange] = ()
    schema_drift_at: datetime | None = None
    unplaced_move_rate: float = 0.0
    """Share of orders re-dated (``create_time`` an hour and more later, so another hourly partition) soon after
    their INSERT by an UPDATE whose ``old`` does not carry the previous ``create_time``: ``null``, or only the
    other changed columns, as ``binlog_row_image=MINIMAL`` or a producer other than Canal gives."""
    bursts: Sequence[Burst] = ()
    """(start, end, factor): every table's new entities in [start, end) come at ``factor`` times the normal rate (a
    sale, a migration replaying a backlog), and their lifecycles' later changes with them."""


@dataclass(frozen=True)
class TableSummary:
    """What one call wrote for one physical table (``messages`` excludes duplicates)."""

    segments: int = 0
    messages: int = 0
    rows: int = 0
    duplicates: int = 0
    malformed: int = 0


@dataclass(frozen=True)
class SimulationSummary:
    """The range generated by one call and, per ``db.table``, what was written."""

    start: datetime
    end: datetime
    tables: Mapping[str, TableSummary]

    @property
    def messages(self) -> int:
        return sum(t.messages for t in self.tables.values())

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())

    def format_table(self) -> str:
        """A plain-text table: one line per physical table, then the totals."""
        header = f"{'table':<28}{'segments':>9}{'messages':>10}{'rows':>10}{'dups':>7}{'malformed':>10}"
        lines = [f"generated {self.start.isoformat()} .. {self.end.isoformat()}", header]
        total = TableSummary()
        for key, t in self.tables.items():
            lines.append(f"{key:<28}{t.segments:>9}{t.messages:>10}{t.rows:>10}{t.duplicates:>7}{t.malformed:>10}")
            total = _add(total, t)
        lines.append(
            f"{'total':<28}{total.segments:>9}{total.messages:>10}{total.rows:>10}"
            f"{total.duplicates:>7}{total.malformed:>10}"
        )
        return "\n".join(lines)


def _add(a: TableSummary, b: TableSummary) -> TableSummary:
    return TableSummary(
        a.segments + b.segments,
        a.messages + b.messages,
        a.rows + b.rows,
        a.duplicates + b.duplicates,
        a.malformed + b.malformed,
    )


# --------------------------------------------------------------------------------------------------------
# Time
# --------------------------------------------------------------------------------------------------------


def _aware(dt: datetime, tz: ZoneInfo) -> datetime:
    return dt.replace(tzinfo=tz) if dt.tzinfo is None else dt.astimezone(tz)


def _to_ms(dt: datetime, tz: ZoneInfo) -> int:
    aware = _aware(dt, tz)
    return int(aware.timestamp()) * 1000 + aware.microsecond // 1000
