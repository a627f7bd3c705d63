"""A deterministic simulated MySQL source that writes Canal flat-message binlog segments.

The simulated online-education company has four MySQL databases (one source "cluster" each):
``edu_user`` (``user_00``..``user_03``), ``edu_course`` (``course``, ``lesson``), ``edu_trade``
(``order_00``..``order_07``) and ``edu_learning`` (``attendance_00``..``attendance_07``), each with a
``heartbeat`` table updated once a minute. Its users live in four regions, each with its own midnight: a user's
region follows from their id (:func:`user_region`).

Determinism and appendability come from the lifecycle model: time is cut into fixed 5-minute creation
slots counted from the simulation origin (the first ``start``). The number of entities a slot creates and
each entity's whole lifecycle (INSERT, later UPDATEs, maybe a DELETE, all within 48 h) are drawn from
random generators seeded by ``(seed, table, slot[, index])`` only. The events of a micro-batch window are
the lifecycle events falling in that window, so the content of every segment is a pure function of the
configuration and of the window, however the generated range is split into calls.

The landing area (``landing`` is a directory) gets the layout the ingestion reads (``resources/landing.py``
names every file): one segment per window and shard table, empty when the shard had no change, and each
shard's rows per local hour; plus the simulation's own state, ``simulation.json`` (parameters and progress,
for append).

Run ``python -m simulator.cdc --help`` for the command line.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import json
import math
import os
import random
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from resources.column_types import jdbc_type
from resources.landing import (
    COUNT_WINDOW_MINUTES,
    HEARTBEAT_TABLE,
    count_window,
    counts_path,
    counts_text,
    has_segments,
    is_window_key,
    read_counts,
    segment_name,
    stream_dir,
    stream_name,
    stream_parts,
)
from resources.settings import DEFAULT_TIMEZONE

__all__ = [
    "DATABASES",
    "HEARTBEAT_COLUMNS",
    "LOGICAL_TABLES",
    "Column",
    "SimulationConfig",
    "SimulationSummary",
    "TableSpec",
    "TableSummary",
    "add_arguments",
    "append",
    "logical_table_of",
    "main",
    "read_simulation",
    "run",
    "simulate",
]

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
# Model constants
# --------------------------------------------------------------------------------------------------------

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
SLOT_MS = 5 * MINUTE_MS  # creation slot, independent of the micro-batch size
LIFECYCLE_MAX_MS = 48 * HOUR_MS
BOOTSTRAP_SLOTS = 24  # the first two hours create the initial dimensions

# logical table -> (rows at scale 1, first slot, end slot) created during the bootstrap
_BOOTSTRAP: dict[str, tuple[int, int, int]] = {
    "user": (1000, 0, 24),
    "course": (50, 0, 12),
    "lesson": (400, 12, 24),
}
# logical table -> new rows per day at scale 1 after the bootstrap
_DAILY: dict[str, float] = {"user": 2000, "course": 1, "lesson": 20, "order": 3000, "attendance": 10000}
_DEPENDS: dict[str, tuple[str, ...]] = {
    "lesson": ("course",),
    "order": ("user", "course"),
    "attendance": ("user", "lesson"),
}

# relative volume per local hour (0..23): users and orders follow "activity", attendance "learning"
# fmt: off
_ACTIVITY = (0.35, 0.2, 0.1, 0.05, 0.04, 0.06, 0.2, 0.55, 0.9, 1.1, 1.2, 1.2,
             1.1, 1.0, 1.0, 1.1, 1.2, 1.35, 1.6, 1.9, 2.1, 2.0, 1.5, 0.8)
_LEARNING = (0.1, 0.03, 0.01, 0.01, 0.01, 0.02, 0.1, 0.4, 0.8, 1.0, 1.0, 0.8,
             0.5, 0.6, 0.8, 1.0, 1.2, 1.5, 2.2, 3.0, 3.2, 2.6, 1.2, 0.3)
# fmt: on

USER_DELETE_P = 0.03
USER_UPDATE_P = 0.15
COURSE_UPDATE_P = 0.3
LESSON_UPDATE_P = 0.1
ORDER_PAID_P = 0.72
ORDER_CANCELLED_P = 0.18
ORDER_REFUND_P = 0.05
CANCELLED_DELETE_P = 0.03
MULTI_ROW_P = 0.1  # chance to try a multi-row statement; only adjacent compatible rows join

# The region each user lives in, with its time zone: a user's region is their id modulo the number of regions, in this
# order. So every row that names a user (attendance, orders) names their region too, and no source table gains a
# column: the binlog, the source counts and every figure computed from them are unchanged.
USER_REGIONS: tuple[tuple[str, str], ...] = (
    ("shanghai", "Asia/Shanghai"),
    ("karachi", "Asia/Karachi"),
    ("utc", "UTC"),
    ("los_angeles", "America/Los_Angeles"),
)


def user_region(user_id: int) -> str:
    """The region of a simulated user (:data:`USER_REGIONS`)."""
    return USER_REGIONS[user_id % len(USER_REGIONS)][0]


_SURNAMES = "王李张刘陈杨黄赵吴周徐孙马朱胡郭何林高罗"
# fmt: off
_GIVEN = ("子涵", "欣怡", "梓轩", "浩然", "雨桐", "一诺", "思远", "宇航", "佳怡", "俊杰", "诗涵", "博文",
          "梓萱", "明轩", "嘉怡", "晨曦", "若曦", "天佑")
_CITIES = ("北京", "上海", "广州", "深圳", "杭州", "成都", "武汉", "南京", "西安", "重庆", "长沙", "郑州",
           "苏州", "天津", "青岛", "合肥")
# fmt: on
_CHANNELS = ("app_store", "huawei", "xiaomi", "wechat", "douyin", "baidu", "referral", "offline")
_SUBJECTS = (
    ("math", "数学"),
    ("chinese", "语文"),
    ("english", "英语"),
    ("physics", "物理"),
    ("chemistry", "化学"),
    ("biology", "生物"),
    ("programming", "编程"),
)
_COURSE_KINDS = ("寒假班", "暑期班", "春季班", "秋季班", "专题课", "直播课")
_PRICES = ("99.00", "199.00", "299.00", "499.00", "999.00", "1999.00")
_DISCOUNTS = ("1", "1", "1", "0.9", "0.8", "0.5")
_LESSON_TIMES = ((19, 0), (19, 30), (20, 0), (10, 0), (14, 30))
_CENT = Decimal("0.01")

Row = dict[str, str | None]

# --------------------------------------------------------------------------------------------------------
# Random streams
# --------------------------------------------------------------------------------------------------------


def _hash_int(*parts: object) -> int:
    key = "|".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def _rng(*parts: object) -> random.Random:
    """A random generator that depends on ``parts`` only."""
    return random.Random(_hash_int(*parts))


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 50:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def _between(rng: random.Random, low_ms: int, high_ms: int) -> int:
    """A uniform offset in [low_ms, high_ms)."""
    return rng.randrange(low_ms, high_ms)


# --------------------------------------------------------------------------------------------------------
# Events and entity lifecycles
# --------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RowEvent:
    """One row change: ``data`` is the image after it (before it for DELETE), ``old`` the changed values."""

    es: int
    kind: str
    db: str
    table: str
    pk: int
    data: Row
    old: Row | None


Changes = Mapping[str, str | None] | Callable[[int], Mapping[str, str | None]]


class _Lifecycle:
    """Collects the events of one entity, applying idle shifts, the 48 h bound and schema drift."""

    def __init__(self, world: _World, spec: TableSpec, pk: int, t0: int, row: Row, phone: str | None = None):
        self.world, self.spec, self.pk, self.t0 = world, spec, pk, t0
        self.row = row
        self.phone = phone
        self.table = spec.physical_table(row)
        self.events: list[RowEvent] = []
        self.ended = False
        self._image: Row = {}
        self._emit("INSERT", t0)

    def _drifted(self, t: int) -> bool:
        drift = self.world.drift_ms
        return bool(self.spec.drift_columns) and drift is not None and t >= drift

    def _emit(self, kind: str, t: int, hide_old: Sequence[str] | None = ()) -> None:
        image = dict(self.row)
        if self._drifted(t):
            image["phone"] = self.phone
        old = None
        if kind == "UPDATE" and hide_old is not None:
            old = {k: v for k, v in self._image.items() if k in image and image[k] != v and k not in hide_old}
        self.events.append(RowEvent(t, kind, self.spec.db, self.table, self.pk, image, old))
        self._image = image

    def _when(self, t: int) -> int | None:
        if self.ended:
            return None
        shifted = self.world.shift_out_of_idle(self.spec.db, t)
        if shifted > self.t0 + LIFECYCLE_MAX_MS:
            self.ended = True
            return None
        return shifted

    def update(self, t: int, changes: Changes, hide_old: Sequence[str] | None = ()) -> None:
        """``hide_old``: columns whose previous values ``old`` leaves out (None: ``old`` is null)."""
        when = self._when(t)
        if when is None:
            return
        values = changes(when) if callable(changes) else changes
        self.row.update(values)
        self.row["update_time"] = self.world.local(when)
        self._emit("UPDATE", when, hide_old)

    def delete(self, t: int) -> None:
        when = self._when(t)
        if when is not None:
            self._emit("DELETE", when)
            self.ended = True


def _phone(rng: random.Random) -> str:
    return "1" + rng.choice("3578") + "".join(rng.choice("0123456789") for _ in range(9))


def _build_user(w: _World, slot: int, k: int, pk: int, t0: int) -> list[RowEvent]:
    rng = w.entity_rng("user", slot, k)
    deleted = rng.random() < USER_DELETE_P  # first draw: see _World.user_deleted
    row: Row = {
        "id": str(pk),
        "name": rng.choice(_SURNAMES) + rng.choice(_GIVEN),
        "city": rng.choice(_CITIES),
        "grade": str(rng.randint(1, 12)),
        "channel": rng.choice(_CHANNELS),
        "create_time": w.local(t0),
        "update_time": w.local(t0),
    }
    phone = _phone(rng) if rng.random() < 0.8 else None
    drifted_at_birth = w.drift_ms is not None and t0 >= w.drift_ms
    life = _Lifecycle(w, LOGICAL_TABLES["user"], pk, t0, row, phone if drifted_at_birth else None)
    last = t0
    if rng.random() < USER_UPDATE_P:
        last = t0 + _between(rng, 10 * MINUTE_MS, 40 * HOUR_MS)
        if rng.random() < 0.6:
            life.update(last, {"city": rng.choice(_CITIES)})
        else:
            grade = int(str(row["grade"]))
            life.update(last, {"grade": str(grade + 1 if grade < 12 else grade - 1)})
    if deleted:
        life.delete(last + _between(rng, 10 * MINUTE_MS, 6 * HOUR_MS))
    return life.events


def _course_profile(rng: random.Random) -> tuple[str, tuple[str, str], int]:
    """The first draws of a course's generator: price, subject, grade."""
    return rng.choice(_PRICES), rng.choice(_SUBJECTS), rng.randint(1, 12)


def _build_course(w: _World, slot: int, k: int, pk: int, t0: int) -> list[RowEvent]:
    rng = w.entity_rng("course", slot, k)
    price, (subject, subject_cn), grade = _course_profile(rng)
    row: Row = {
        "id": str(pk),
        "title": f"{grade}年级{subject_cn}{rng.choice(_COURSE_KINDS)}",
        "subject": subject,
        "grade": str(grade),
        "price": price,
        "teacher_id": str(rng.randint(1000, 1999)),
        "create_time": w.local(t0),
        "update_time": w.local(t0),
    }
    life = _Lifecycle(w, LOGICAL_TABLES["course"], pk, t0, row)
    if rng.random() < COURSE_UPDATE_P:
        discounted = (Decimal(price) * Decimal("0.8")).quantize(_CENT)
        life.update(t0 + _between(rng, HOUR_MS, 40 * HOUR_MS), {"price": str(discounted)})
    return life.events


def _build_lesson(w: _World, slot: int, k: int, pk: int, t0: int) -> list[RowEvent]:
    rng = w.entity_rng("lesson", slot, k)
    course_id = w.lesson_course_from(rng, slot)  # first draw: see _World.lesson_course
    start = w.local_datetime(t0).replace(hour=0, minute=0, second=0) + timedelta(days=rng.randint(1, 7))
    hour, minute = rng.choice(_LESSON_TIMES)
    start = start.replace(hour=hour, minute=minute)
    end = start + timedelta(minutes=rng.choice((45, 60, 90)))
    row: Row = {
        "id": str(pk),
        "course_id": str(course_id),
        "title": f"第{rng.randint(1, 30)}讲",
        "start_time": _fmt(start),
        "end_time": _fmt(end),
        "create_time": w.local(t0),
        "update_time": w.local(t0),
    }
    life = _Lifecycle(w, LOGICAL_TABLES["lesson"], pk, t0, row)
    if rng.random() < LESSON_UPDATE_P:
        day = timedelta(days=1)
        life.update(
            t0 + _between(rng, HOUR_MS, 40 * HOUR_MS),
            {"start_time": _fmt(start + day), "end_time": _fmt(end + day)},
        )
    return life.events


def _build_order(w: _World, slot: int, k: int, pk: int, t0: int) -> list[RowEvent]:
    rng = w.entity_rng("order", slot, k)
    user_id = w.pick_user(rng, slot)
    course_id, (cslot, ck) = w.pick(rng, "course", slot)
    price = Decimal(w.course_price(cslot, ck))
    amount = (price * Decimal(rng.choice(_DISCOUNTS))).quantize(_CENT)
    row: Row = {
        "id": str(pk),
        "user_id": str(user_id),
        "course_id": str(course_id),
        "amount": str(amount),
        "status": "created",
        "pay_time": None,
        "create_time": w.local(t0),
        "update_time": w.local(t0),
    }
    life = _Lifecycle(w, LOGICAL_TABLES["order"], pk, t0, row)
    if w.config.unplaced_move_rate:  # a generator of its own: the other draws stay those of the default stream
        redate = _rng(w.seed, "unplaced-move", slot, k)
        if redate.random() < w.config.unplaced_move_rate:
            # before any other change of the order (a payment comes a minute after its creation at the earliest)
            moved = w.local(t0 + _between(redate, HOUR_MS + MINUTE_MS, 3 * HOUR_MS))
            # ``old`` null, as a producer without before images writes (Canal's ``old`` names every changed column)
            life.update(t0 + _between(redate, 1000, MINUTE_MS - 1000), {"create_time": moved}, None)
    outcome = rng.random()
    if outcome < ORDER_PAID_P:
        _pay_order(w, rng, life, t0)
    elif outcome < ORDER_PAID_P + ORDER_CANCELLED_P:
        cancelled = t0 + _between(rng, 15 * MINUTE_MS, 24 * HOUR_MS)
        life.update(cancelled, {"status": "cancelled"})
        if rng.random() < CANCELLED_DELETE_P:
            life.delete(cancelled + _between(rng, 5 * MINUTE_MS, HOUR_MS))
    return life.events


def _pay_order(w: _World, rng: random.Random, life: _Lifecycle, t0: int) -> None:
    speed = rng.random()
    if speed < 0.7:
        paid = t0 + _between(rng, MINUTE_MS, 30 * MINUTE_MS)
    elif speed < 0.95:
        paid = t0 + _between(rng, 30 * MINUTE_MS, 6 * HOUR_MS)
    else:
        paid = t0 + _between(rng, 6 * HOUR_MS, 24 * HOUR_MS)
    life.update(paid, lambda when: {"status": "paid", "pay_time": w.local(when)})
    if rng.random() < ORDER_REFUND_P:
        life.update(paid + _between(rng, HOUR_MS, 23 * HOUR_MS), {"status": "refunded"})


def _build_attendance(w: _World, slot: int, k: int, pk: int, t0: int) -> list[RowEvent]:
    rng = w.entity_rng("attendance", slot, k)
    user_id = w.pick_user(rng, slot)
    lesson_id, (lslot, lk) = w.pick(rng, "lesson", slot)
    row: Row = {
        "id": str(pk),
        "user_id": str(user_id),
        "lesson_id": str(lesson_id),
        "course_id": str(w.lesson_course(lslot, lk)),
        "join_time": w.local(t0),
        "leave_time": None,
        "duration_sec": "0",
        "create_time": w.local(t0),
        "update_time": w.local(t0),
    }
    life = _Lifecycle(w, LOGICAL_TABLES["attendance"], pk, t0, row)
    stay_ms = int(rng.triangular(3, 100, 50) * MINUTE_MS) + rng.randrange(1000)
    life.update(t0 + stay_ms, lambda when: {"leave_time": w.local(when), "duration_sec": str((when - t0) // 1000)})
    return life.events


Builder = Callable[["_World", int, int, int, int], list[RowEvent]]
_BUILDERS: dict[str, Builder] = {
    "user": _build_user,
    "course": _build_course,
    "lesson": _build_lesson,
    "order": _build_order,
    "attendance": _build_attendance,
}
_TABLE_INDEX = {name: i for i, name in enumerate(LOGICAL_TABLES)}


def _fmt(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S")


# --------------------------------------------------------------------------------------------------------
# The world: slot counts, ids, references
# --------------------------------------------------------------------------------------------------------


class _World:
    """Everything that is a pure function of the configuration and the origin."""

    def __init__(self, config: SimulationConfig, origin_ms: int):
        self.config = config
        self.seed = config.seed
        self.origin = origin_ms
        self.tz = ZoneInfo(config.tz)
        self.drift_ms = None if config.schema_drift_at is None else _to_ms(config.schema_drift_at, self.tz)
        self.idle: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for db, start, end in config.idle:
            self.idle[db].append((_to_ms(start, self.tz), _to_ms(end, self.tz)))
        for ranges in self.idle.values():
            ranges.sort()
        self.bursts = [(_to_ms(start, self.tz), _to_ms(end, self.tz), factor) for start, end, factor in config.bursts]
        self._prefix: dict[str, list[int]] = {name: [0] for name in LOGICAL_TABLES}
        self.local = lru_cache(maxsize=1 << 16)(self._local_uncached)
        # facts about referenced entities, looked up again and again by orders and attendance
        self.user_deleted = lru_cache(maxsize=1 << 17)(self._user_deleted)
        self.course_price = lru_cache(maxsize=1 << 12)(self._course_price)
        self.lesson_course = lru_cache(maxsize=1 << 15)(self._lesson_course)

    # time --------------------------------------------------------------------------------------------
    def _local_uncached(self, ms: int) -> str:
        return _fmt(self.local_datetime(ms))

    def local_datetime(self, ms: int) -> datetime:
        return datetime.fromtimestamp(ms // 1000, self.tz)

    def slot_start(self, slot: int) -> int:
        return self.origin + slot * SLOT_MS

    def shift_out_of_idle(self, db: str, t: int) -> int:
        for start, end in self.idle.get(db, ()):
            if start <= t < end:
                t = end
        return t

    def is_idle(self, db: str, start: int, end: int) -> bool:
        return any(s < end and start < e for s, e in self.idle.get(db, ()))

    # counts and ids ----------------------------------------------------------------------------------
    def prefix(self, table: str, slot: int) -> int:
        """How many ``table`` entities the slots before ``slot`` create (ids are 1..prefix)."""
        counts = self._prefix[table]
        while len(counts) <= slot:
            counts.append(counts[-1] + self._slot_count(table, len(counts) - 1))
        return counts[slot]

    def _slot_count(self, table: str, slot: int) -> int:
        start = self.slot_start(slot)
        if self.is_idle(LOGICAL_TABLES[table].db, start, start + SLOT_MS):
            return 0
        if any(self.prefix(dep, slot) == 0 for dep in _DEPENDS.get(table, ())):
            return 0
        if slot < BOOTSTRAP_SLOTS:
            return self._bootstrap_count(table, slot)
        return _poisson(_rng(self.seed, "count", table, slot), self._rate(table, start))

    def _bootstrap_count(self, table: str, slot: int) -> int:
        if table not in _BOOTSTRAP:
            return 0
        total, first, end = _BOOTSTRAP[table]
        if not first <= slot < end:
            return 0
        per_slot, extra = divmod(max(1, round(total * self.config.scale)), end - first)
        return per_slot + (1 if slot - first < extra else 0)

    def _rate(self, table: str, start: int) -> float:
        local = self.local_datetime(start)
        daily = _DAILY[table] * self.config.scale
        if table == "user":
            daily *= 0.35 + 0.65 * math.exp(-(start - self.origin) / DAY_MS / 10)
        if table == "attendance":
            curve = _LEARNING
            daily *= 1.3 if local.weekday() >= 5 else 0.88
        else:
            curve = _ACTIVITY
        weight = curve[local.hour] * len(curve) / sum(curve)
        burst = math.prod(factor for begin, end, factor in self.bursts if begin <= start < end)
        return daily * SLOT_MS / DAY_MS * weight * burst

    # entities ----------------------------------------------------------------------------------------
    def entity_rng(self, table: str, slot: int, k: int) -> random.Random:
        return _rng(self.seed, "entity", table, slot, k)

    def slot_entities(self, table: str, slot: int) -> list[list[RowEvent]]:
        """The lifecycles of the entities ``table`` creates in ``slot``, in creation order."""
        first_id = self.prefix(table, slot)
        n = self.prefix(table, slot + 1) - first_id
        if n == 0:
            return []
        rng = _rng(self.seed, "times", table, slot)
        offsets = sorted(rng.randrange(SLOT_MS) for _ in range(n))
        start, build = self.slot_start(slot), _BUILDERS[table]
        return [build(self, slot, k, first_id + k + 1, start + off) for k, off in enumerate(offsets)]

    def locate(self, table: str, pk: int) -> tuple[int, int]:
        """(slot, index in slot) of the entity with id ``pk``."""
        counts = self._prefix[table]
        slot = bisect.bisect_left(counts, pk) - 1
        return slot, pk - counts[slot] - 1

    def pick(self, rng: random.Random, table: str, before_slot: int) -> tuple[int, tuple[int, int]]:
        """A uniformly chosen ``table`` id created in a slot before ``before_slot``, and its location."""
        total = self.prefix(table, before_slot)
        pk = rng.randint(1, total)
        return pk, self.locate(table, pk)

    def pick_user(self, rng: random.Random, before_slot: int) -> int:
        """Like ``pick`` but avoiding users that get deleted (within a few tries)."""
        pk = 0
        for _ in range(8):
            pk, (slot, k) = self.pick(rng, "user", before_slot)
            if not self.user_deleted(slot, k):
                break
        return pk

    def _user_deleted(self, slot: int, k: int) -> bool:
        return self.entity_rng("user", slot, k).random() < USER_DELETE_P

    def _course_price(self, slot: int, k: int) -> str:
        return _course_profile(self.entity_rng("course", slot, k))[0]

    def lesson_course_from(self, rng: random.Random, slot: int) -> int:
        return self.pick(rng, "course", slot)[0]

    def _lesson_course(self, slot: int, k: int) -> int:
        return self.lesson_course_from(self.entity_rng("lesson", slot, k), slot)

    def heartbeats(self, db: str, start: int, end: int) -> list[RowEvent]:
        """One UPDATE of ``heartbeat`` per minute in [start, end)."""
        events = []
        first = -(-(start - self.origin) // MINUTE_MS)
        minute = self.origin + first * MINUTE_MS
        while minute < end:
            index = (minute - self.origin) // MINUTE_MS
            es = minute + _hash_int(self.seed, HEARTBEAT, db, index) % 500
            data: Row = {"id": "1", "ts": self.local(minute)}
            old: Row = {"ts": self.local(minute - MINUTE_MS)}
            events.append(RowEvent(es, "UPDATE", db, HEARTBEAT, 1, data, old))
            minute += MINUTE_MS
        return events


class _EventStream:
    """Lifecycle events of all entities in time order, generated slot by slot from a 48 h lookback."""

    def __init__(self, world: _World, from_ms: int):
        self.world = world
        self.from_ms = from_ms
        self.next_slot = max(0, (from_ms - LIFECYCLE_MAX_MS - world.origin) // SLOT_MS - 1)
        self.heap: list[tuple[int, int, int, int, int, RowEvent]] = []

    def pop_until(self, until_ms: int) -> list[RowEvent]:
        """Events with ``from_ms <= es < until_ms`` not returned yet, by es then generation order."""
        while self.world.slot_start(self.next_slot) < until_ms:
            self._generate(self.next_slot)
            self.next_slot += 1
        out = []
        while self.heap and self.heap[0][0] < until_ms:
            item = heapq.heappop(self.heap)
            if item[0] >= self.from_ms:
                out.append(item[-1])
        return out

    def _generate(self, slot: int) -> None:
        for table in LOGICAL_TABLES:
            tindex = _TABLE_INDEX[table]
            for k, events in enumerate(self.world.slot_entities(table, slot)):
                for i, event in enumerate(events):
                    heapq.heappush(self.heap, (event.es, slot, tindex, k, i, event))


# --------------------------------------------------------------------------------------------------------
# Canal messages
# --------------------------------------------------------------------------------------------------------


@dataclass
class _Message:
    rows: list[RowEvent]
    ts_delay: int
    malformed: int  # 0: fine, 1: truncated JSON, 2: garbage
    dup_after: int | None  # re-emitted this many messages later

    @property
    def es(self) -> int:
        return self.rows[-1].es


def _groupable(event: RowEvent, group: list[RowEvent], origin: int) -> bool:
    """Same type and columns, another row, and the same creation slot (so references stay valid)."""
    first = group[0]
    return (
        event.kind == first.kind
        and event.data.keys() == first.data.keys()
        and (event.es - origin) // SLOT_MS == (first.es - origin) // SLOT_MS
        and all(event.pk != other.pk for other in group)
    )


def _messages(events: list[RowEvent], rng: random.Random, config: SimulationConfig, origin: int) -> list[_Message]:
    """Cut a window's events of one table into messages (mostly one row, sometimes a multi-row statement)."""
    messages: list[_Message] = []
    i = 0
    while i < len(events):
        group = [events[i]]
        multi, size = rng.random() < MULTI_ROW_P, rng.choice((2, 3))
        while multi and len(group) < size and i + len(group) < len(events):
            candidate = events[i + len(group)]
            if not _groupable(candidate, group, origin):
                break
            group.append(candidate)
        ts_delay = rng.randrange(20, 900)
        bad, kind, dup, dup_after = rng.random(), rng.choice((1, 1, 2)), rng.random(), rng.randint(1, 4)
        malformed = kind if bad < config.malformed_rate else 0
        duplicate = dup_after if dup < config.dup_rate and not malformed else None
        messages.append(_Message(group, ts_delay, malformed, duplicate))
        i += len(group)
    return messages


def _mysql_types(table: str, row: Row) -> dict[str, str]:
    if table == HEARTBEAT:
        return {c.name: c.mysql_type for c in HEARTBEAT_COLUMNS}
    spec = LOGICAL_TABLES[_PHYSICAL_TO_LOGICAL[table]]
    types = spec.mysql_types(with_drift=True)
    return {name: types[name] for name in row}


_SQL_TYPE_OF = {
    m: Column("x", m).sql_type for spec in LOGICAL_TABLES.values() for m in spec.mysql_types(with_drift=True).values()
}


def _encode(message: _Message, message_id: int) -> str:
    """A Canal flat message as Canal's fastjson writes it (keys sorted, compact, UTF-8)."""
    first = message.rows[0]
    mysql_type = _mysql_types(first.table, first.data)
    obj: dict[str, Any] = {
        "data": [e.data for e in message.rows],
        "database": first.db,
        "es": message.es,
        "id": message_id,
        "isDdl": False,
        "mysqlType": mysql_type,
        "old": None
        if first.kind != "UPDATE" or all(e.old is None for e in message.rows)
        else [e.old for e in message.rows],
        "pkNames": ["id"],
        "sql": "",
        "sqlType": {name: _SQL_TYPE_OF[m] for name, m in mysql_type.items()},
        "table": first.table,
        "ts": message.es + message.ts_delay,
        "type": first.kind,
    }
    line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    if message.malformed == 1:
        return line[: max(1, len(line) // 2)]
    if message.malformed == 2:
        return f"#@!corrupted binlog event at {message.es}"
    return line


def _segment_lines(messages: list[_Message], first_id: int) -> list[str]:
    """Lines of a segment: each message once in order, duplicates re-emitted a few messages later."""
    keyed: list[tuple[int, int, str]] = []
    for i, message in enumerate(messages):
        line = _encode(message, first_id + i)
        keyed.append((i, 0, line))
        if message.dup_after is not None:
            keyed.append((min(i + message.dup_after, len(messages) - 1), 1 + i, line))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in keyed]


# --------------------------------------------------------------------------------------------------------
# Landing state
# --------------------------------------------------------------------------------------------------------

STATE_FILE = "simulation.json"


@dataclass
class _StreamState:
    written_until: int
    next_id: int = 1
    segments: int = 0


@dataclass
class _State:
    config: SimulationConfig
    origin: int
    end: int
    streams: dict[str, _StreamState] = field(default_factory=dict)


def _config_to_json(config: SimulationConfig) -> dict[str, Any]:
    tz = ZoneInfo(config.tz)

    def iso(dt: datetime) -> str:
        return _aware(dt, tz).isoformat()

    return {
        "seed": config.seed,
        "scale": config.scale,
        "tz": config.tz,
        "batch_minutes": config.batch_minutes,
        "dup_rate": config.dup_rate,
        "malformed_rate": config.malformed_rate,
        "lag": {key: delta.total_seconds() for key, delta in sorted(_normalise_lag(config.lag).items())},
        "idle": [[db, iso(start), iso(end)] for db, start, end in config.idle],
        "schema_drift_at": None if config.schema_drift_at is None else iso(config.schema_drift_at),
        "unplaced_move_rate": config.unplaced_move_rate,
        "bursts": [[iso(start), iso(end), factor] for start, end, factor in config.bursts],
    }


def _config_from_json(obj: Mapping[str, Any]) -> SimulationConfig:
    drift = obj.get("schema_drift_at")
    return SimulationConfig(
        seed=int(obj["seed"]),
        scale=float(obj["scale"]),
        tz=str(obj["tz"]),
        batch_minutes=int(obj["batch_minutes"]),
        dup_rate=float(obj["dup_rate"]),
        malformed_rate=float(obj["malformed_rate"]),
        lag={key: timedelta(seconds=seconds) for key, seconds in obj.get("lag", {}).items()},
        idle=tuple((db, datetime.fromisoformat(s), datetime.fromisoformat(e)) for db, s, e in obj.get("idle", [])),
        schema_drift_at=None if drift is None else datetime.fromisoformat(drift),
        unplaced_move_rate=float(obj.get("unplaced_move_rate", 0.0)),
        bursts=tuple(
            (datetime.fromisoformat(start), datetime.fromisoformat(end), float(factor))
            for start, end, factor in obj.get("bursts", [])
        ),
    )


def _iso_ms(ms: int, tz: ZoneInfo) -> str:
    return datetime.fromtimestamp(ms / 1000, tz).isoformat()


def _save_state(landing: Path, state: _State) -> None:
    tz = ZoneInfo(state.config.tz)
    obj = {
        "format": 1,
        "config": _config_to_json(state.config),
        "start": _iso_ms(state.origin, tz),
        "end": _iso_ms(state.end, tz),
        "streams": {
            key: {"written_until": _iso_ms(s.written_until, tz), "next_id": s.next_id, "segments": s.segments}
            for key, s in state.streams.items()
        },
    }
    _write_atomic(landing / STATE_FILE, json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def _load_state(landing: Path) -> _State | None:
    path = landing / STATE_FILE
    if not path.exists():
        return None
    obj = json.loads(path.read_text(encoding="utf-8"))
    config = _config_from_json(obj["config"])
    tz = ZoneInfo(config.tz)
    streams = {
        key: _StreamState(_to_ms(datetime.fromisoformat(s["written_until"]), tz), int(s["next_id"]), int(s["segments"]))
        for key, s in obj.get("streams", {}).items()
    }
    return _State(
        config,
        _to_ms(datetime.fromisoformat(obj["start"]), tz),
        _to_ms(datetime.fromisoformat(obj["end"]), tz),
        streams,
    )


def read_simulation(landing: Path) -> tuple[SimulationConfig, datetime, datetime] | None:
    """The configuration and generated range ``[start, end)`` recorded in ``landing``, if any."""
    state = _load_state(Path(landing))
    if state is None:
        return None
    tz = ZoneInfo(state.config.tz)
    return (
        state.config,
        datetime.fromtimestamp(state.origin / 1000, tz),
        datetime.fromtimestamp(state.end / 1000, tz),
    )


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------------
# Time helpers and validation
# --------------------------------------------------------------------------------------------------------


def _aware(dt: datetime, tz: ZoneInfo) -> datetime:
    return dt.replace(tzinfo=tz) if dt.tzinfo is None else dt.astimezone(tz)


def _to_ms(dt: datetime, tz: ZoneInfo) -> int:
    aware = _aware(dt, tz)
    return int(aware.timestamp()) * 1000 + aware.microsecond // 1000


def _hour_start(ms: int, tz: ZoneInfo) -> int:
    local = datetime.fromtimestamp(ms / 1000, tz).replace(minute=0, second=0, microsecond=0)
    return int(local.timestamp()) * 1000


def _window_key(ms: int, tz: ZoneInfo) -> str:
    return count_window(datetime.fromtimestamp(ms // 1000, tz))


def _normalise_lag(lag: Mapping[str, timedelta]) -> dict[str, timedelta]:
    """Lag keys as ``db.table``; a bare physical name must be unambiguous."""
    known = {stream_name(db, table) for db, table in STREAMS}
    out: dict[str, timedelta] = {}
    for key, delta in lag.items():
        matches = [k for k in known if k == key or stream_parts(k)[1] == key]
        if len(matches) != 1:
            raise ValueError(f"lag key {key!r} must name one physical table (e.g. 'order_03' or 'edu_trade.heartbeat')")
        if delta < timedelta(0):
            raise ValueError(f"lag for {key!r} must not be negative")
        out[matches[0]] = delta
    return out


def _validate(config: SimulationConfig) -> None:
    ZoneInfo(config.tz)
    if config.scale <= 0:
        raise ValueError(f"scale must be positive, got {config.scale}")
    if not 1 <= config.batch_minutes <= 24 * 60:
        raise ValueError(f"batch_minutes must be between 1 and 1440, got {config.batch_minutes}")
    for name in ("dup_rate", "malformed_rate", "unplaced_move_rate"):
        if not 0 <= getattr(config, name) <= 1:
            raise ValueError(f"{name} must be within [0, 1]")
    _normalise_lag(config.lag)
    for db, start, end in config.idle:
        if db not in DATABASES:
            raise ValueError(f"idle range names unknown database {db!r}; known: {', '.join(DATABASES)}")
        if _to_ms(end, ZoneInfo(config.tz)) <= _to_ms(start, ZoneInfo(config.tz)):
            raise ValueError(f"idle range for {db} ends before it starts")
    for start, end, factor in config.bursts:
        if _to_ms(end, ZoneInfo(config.tz)) <= _to_ms(start, ZoneInfo(config.tz)) or not 0 < factor <= 1000:
            raise ValueError(
                f"burst {start} .. {end} x{factor}: it must end after it starts, with a factor in (0, 1000]"
            )


def _check_start(start: datetime, config: SimulationConfig) -> None:
    local = _aware(start, ZoneInfo(config.tz))
    minute_of_day = local.hour * 60 + local.minute
    if local.second or local.microsecond or minute_of_day % config.batch_minutes:
        raise ValueError(f"start {start} is not aligned to {config.batch_minutes}-minute batch windows")


# --------------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------------

Progress = Callable[[str], None]


@dataclass
class _Run:
    """One generation call: what to write per stream and what to count."""

    state: _State
    world: _World
    end: int
    write_from: dict[str, int]
    write_until: dict[str, int]
    count_from: int
    counts: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    written: dict[str, TableSummary] = field(default_factory=dict)


def _plan(state: _State, end: int) -> _Run:
    config, origin = state.config, state.origin
    batch = config.batch_minutes * MINUTE_MS
    lag = _normalise_lag(config.lag)
    tz = ZoneInfo(config.tz)
    write_from, write_until = {}, {}
    for db, table in STREAMS:
        key = stream_name(db, table)
        stream = state.streams.setdefault(key, _StreamState(origin))
        write_from[key] = stream.written_until
        lag_ms = int(lag.get(key, timedelta(0)).total_seconds() * 1000)
        stop = origin + max(0, end - lag_ms - origin) // batch * batch
        write_until[key] = max(stream.written_until, stop)
    count_from = origin if state.end == origin else max(origin, _hour_start(state.end, tz))
    return _Run(state, _World(config, origin), end, write_from, write_until, count_from)


def _generate(landing: Path, state: _State, end: int, progress: Progress | None) -> SimulationSummary:
    tz = ZoneInfo(state.config.tz)
    begin = state.end
    if end <= state.end:
        when = datetime.fromtimestamp(state.end / 1000, tz)
        return SimulationSummary(when, when, {})
    run = _plan(state, end)
    batch = state.config.batch_minutes * MINUTE_MS
    gen_from = min([run.count_from, *run.write_from.values()])
    gen_from = state.origin + (gen_from - state.origin) // batch * batch
    stream = _EventStream(run.world, gen_from)
    day_totals = [0, 0]
    for window in range(gen_from, end, batch):
        _process_window(landing, run, stream, window, window + batch, day_totals)
        _report_day(run, window, batch, day_totals, progress)
    _write_counts(landing, run)
    state.end = end
    for key, until in run.write_until.items():
        state.streams[key].written_until = until
    _save_state(landing, state)
    return SimulationSummary(
        datetime.fromtimestamp(begin / 1000, tz),
        datetime.fromtimestamp(end / 1000, tz),
        {key: run.written.get(key, TableSummary()) for key in run.write_from},
    )


def _report_day(run: _Run, window: int, batch: int, totals: list[int], progress: Progress | None) -> None:
    next_window = window + batch
    day = run.world.local_datetime(window).date()
    if next_window < run.end and run.world.local_datetime(next_window).date() == day:
        return
    if progress is not None and next_window > run.state.end:
        progress(f"{day.isoformat()}: {totals[0]:,} data messages, {totals[1]:,} rows")
    totals[0] = totals[1] = 0


def _process_window(
    landing: Path, run: _Run, stream: _EventStream, start: int, end: int, day_totals: list[int]
) -> None:
    by_stream: dict[str, list[RowEvent]] = defaultdict(list)
    for event in stream.pop_until(end):
        by_stream[stream_name(event.db, event.table)].append(event)
    for db in DATABASES:
        by_stream[stream_name(db, HEARTBEAT)] = run.world.heartbeats(db, start, end)
    window_index = (start - run.state.origin) // (run.state.config.batch_minutes * MINUTE_MS)
    for db, table in STREAMS:
        key = stream_name(db, table)
        events = by_stream.get(key, [])
        if events and table != HEARTBEAT:
            rng = _rng(run.world.seed, "messages", key, window_index)
            messages = _messages(events, rng, run.state.config, run.state.origin)
        else:
            messages = [_Message([e], 20 + e.es % 300, 0, None) for e in events]
        if table != HEARTBEAT:
            _count(run, key, messages, day_totals)
        if run.write_from[key] <= start < run.write_until[key]:
            _write_segment(landing, run, db, table, start, window_index, messages)


def _count(run: _Run, key: str, messages: list[_Message], day_totals: list[int]) -> None:
    tz = run.world.tz
    for message in messages:
        if run.count_from <= message.es < run.end:
            run.counts[key][_window_key(message.es, tz)] += len(message.rows)
        if message.es >= run.state.end:
            day_totals[0] += 1
            day_totals[1] += len(message.rows)


def _write_segment(
    landing: Path, run: _Run, db: str, table: str, start: int, window_index: int, messages: list[_Message]
) -> None:
    key = stream_name(db, table)
    stream = run.state.streams[key]
    directory = stream_dir(landing, db, table)
    directory.mkdir(parents=True, exist_ok=True)
    name = segment_name(window_index + 1, run.world.local_datetime(start))
    lines = _segment_lines(messages, stream.next_id)
    _write_atomic(directory / name, "".join(line + "\n" for line in lines))
    stream.next_id += len(messages)
    stream.segments += 1
    dups = sum(1 for m in messages if m.dup_after is not None)
    bad = sum(1 for m in messages if m.malformed)
    rows = sum(len(m.rows) for m in messages)
    run.written[key] = _add(run.written.get(key, TableSummary()), TableSummary(1, len(messages), rows, dups, bad))


def _write_counts(landing: Path, run: _Run) -> None:
    tz = run.world.tz
    first_key = _window_key(run.count_from, tz)
    step = COUNT_WINDOW_MINUTES * MINUTE_MS
    for db, table in STREAMS:
        if table == HEARTBEAT:
            continue
        key = stream_name(db, table)
        path = counts_path(landing, db, table)
        # what was counted before this run (an hour line of an older landing area only for an hour before it)
        windows = {
            w: n for w, n in read_counts(path).items() if w < (first_key if is_window_key(w) else first_key[:13])
        }
        window = run.count_from // step * step
        while window < run.end:  # every window, 0 when the shard was idle in it
            window_key = _window_key(window, tz)
            windows[window_key] = run.counts[key].get(window_key, 0)
            window += step
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, counts_text(windows))


# --------------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------------


def _mismatch(state: _State, config: SimulationConfig, start_ms: int) -> str | None:
    old, new = _config_to_json(state.config), _config_to_json(config)
    for name in old:
        if old[name] != new.get(name):
            return f"{name}: existing {old[name]!r}, requested {new.get(name)!r}"
    if state.origin != start_ms:
        tz = ZoneInfo(config.tz)
        return f"start: existing {_iso_ms(state.origin, tz)}, requested {_iso_ms(start_ms, tz)}"
    return None


def simulate(
    landing: Path,
    start: datetime,
    end: datetime,
    config: SimulationConfig,
    *,
    progress: Progress | None = None,
) -> SimulationSummary:
    """Generate ``[start, end)`` into ``landing`` (datetimes naive local or tz-aware, batch-aligned).

    Re-running with the same configuration and start is a no-op for the part already generated and
    continues past it otherwise. A landing generated with a different configuration or start is refused.
    """
    _validate(config)
    _check_start(start, config)
    tz = ZoneInfo(config.tz)
    start_ms, end_ms = _to_ms(start, tz), _to_ms(end, tz)
    batch = config.batch_minutes * MINUTE_MS
    if end_ms <= start_ms:
        raise ValueError(f"end {end} must be after start {start}")
    if (end_ms - start_ms) % batch:
        raise ValueError(f"end {end} is not aligned to {config.batch_minutes}-minute batch windows from {start}")
    landing = Path(landing)
    state = _load_state(landing)
    if state is None:
        if has_segments(landing):
            raise ValueError(f"{landing} holds binlog segments but no {STATE_FILE}; refusing to overwrite them")
        state = _State(config, start_ms, start_ms)
    else:
        problem = _mismatch(state, config, start_ms)
        if problem is not None:
            raise ValueError(
                f"{landing} was generated with a different configuration ({problem}); "
                "refusing to overwrite its segments"
            )
    landing.mkdir(parents=True, exist_ok=True)
    return _generate(landing, state, end_ms, progress)


def append(landing: Path, end: datetime, *, progress: Progress | None = None) -> SimulationSummary:
    """Continue the simulation recorded in ``landing`` up to ``end`` (floored to a batch window)."""
    landing = Path(landing)
    state = _load_state(landing)
    if state is None:
        raise ValueError(f"{landing} has no {STATE_FILE}: run simulate first")
    tz = ZoneInfo(state.config.tz)
    batch = state.config.batch_minutes * MINUTE_MS
    end_ms = _to_ms(end, tz)
    end_ms = state.origin + max(0, end_ms - state.origin) // batch * batch
    return _generate(landing, state, end_ms, progress)


# --------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _parse_duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (use e.g. 30m, 2h, 1d)")
    return timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})


def _parse_lag(text: str) -> tuple[str, timedelta]:
    table, _, duration = text.partition("=")
    if not duration:
        raise argparse.ArgumentTypeError(f"bad lag {text!r} (use TABLE=DURATION, e.g. order_03=90m)")
    return table, _parse_duration(duration)


def _parse_idle(text: str) -> IdleRange:
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"bad idle range {text!r} (use DB,START,END)")
    return parts[0], datetime.fromisoformat(parts[1]), datetime.fromisoformat(parts[2])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to ``parser``."""
    parser.add_argument("--landing", type=Path, default=Path("data/landing"), help="landing directory")
    parser.add_argument("--start", help="first day or datetime (business-local), e.g. 2024-03-01")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--days", type=float, help="how many days to generate (default 1)")
    group.add_argument("--end", help="end datetime (exclusive, business-local)")
    parser.add_argument("--append-until", help="continue the landing up to this datetime, or 'now'")
    defaults = SimulationConfig()
    parser.add_argument(
        "--scale",
        type=float,
        default=defaults.scale,
        help=f"volume (1.0 ≈ 3,000 orders a day; default {defaults.scale})",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="random seed: the same seed, the same data")
    parser.add_argument("--tz", default=defaults.tz, help="business timezone")
    parser.add_argument(
        "--batch-minutes",
        type=int,
        default=defaults.batch_minutes,
        help=f"minutes of binlog per segment file (default {defaults.batch_minutes})",
    )
    parser.add_argument(
        "--dup-rate", type=float, default=defaults.dup_rate, help="share of messages delivered twice (0 to 1)"
    )
    parser.add_argument(
        "--malformed-rate", type=float, default=defaults.malformed_rate, help="share of lines written broken (0 to 1)"
    )
    parser.add_argument(
        "--lag",
        type=_parse_lag,
        action="append",
        default=[],
        metavar="TABLE=DURATION",
        help="a shard table that lands late, e.g. order_03=2h (repeatable)",
    )
    parser.add_argument(
        "--idle",
        type=_parse_idle,
        action="append",
        default=[],
        metavar="DB,START,END",
        help="a source database with only heartbeats between two datetimes (repeatable)",
    )
    parser.add_argument("--schema-drift-at", type=datetime.fromisoformat, help="user rows gain 'phone' from here")
    parser.add_argument(
        "--unplaced-move-rate",
        type=float,
        default=defaults.unplaced_move_rate,
        help="share of orders re-dated to a later hour by an UPDATE without old (0 to 1)",
    )


def _parse_when(text: str, tz: ZoneInfo) -> datetime:
    return datetime.now(tz) if text == "now" else datetime.fromisoformat(text)


def run(args: argparse.Namespace) -> int:
    """Run the command line parsed with ``add_arguments``; returns the exit status."""
    try:
        summary = _run(args)
    except ValueError as error:
        print(f"simulator: {error}", file=sys.stderr)
        return 2
    print(summary.format_table())
    return 0


def _run(args: argparse.Namespace) -> SimulationSummary:
    if args.start is None:
        if args.append_until is None:
            raise ValueError("give --start (a new simulation) or --append-until (continue one)")
        existing = read_simulation(args.landing)
        tz = ZoneInfo(existing[0].tz if existing else args.tz)
        return append(args.landing, _parse_when(args.append_until, tz), progress=print)
    config = SimulationConfig(
        seed=args.seed,
        scale=args.scale,
        tz=args.tz,
        batch_minutes=args.batch_minutes,
        dup_rate=args.dup_rate,
        malformed_rate=args.malformed_rate,
        lag=dict(args.lag),
        idle=tuple(args.idle),
        schema_drift_at=args.schema_drift_at,
        unplaced_move_rate=args.unplaced_move_rate,
    )
    tz = ZoneInfo(config.tz)
    start = _aware(datetime.fromisoformat(args.start), tz)
    if args.append_until is not None:
        end = _aware(_parse_when(args.append_until, tz), tz)
        batch = timedelta(minutes=config.batch_minutes)
        end = start + (end - start) // batch * batch
    elif args.end is not None:
        end = datetime.fromisoformat(args.end)
    else:
        end = start + timedelta(days=args.days if args.days is not None else 1)
    return simulate(args.landing, start, end, config, progress=print)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simulator", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
