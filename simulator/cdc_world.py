"""The simulated company's lifecycle model: time cut into 5-minute creation slots counted from the simulation's
origin; each slot creates entities (users, courses, lessons, orders, attendance) whose whole lifecycle (INSERT, later
UPDATEs, maybe a DELETE, all within 48 h) is drawn from random generators seeded by ``(seed, table, slot[, index])``
only, so the events falling in a window are a pure function of the configuration and of that window.
:class:`_EventStream` yields them in time order for :mod:`simulator.cdc` to write.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from zoneinfo import ZoneInfo

from simulator.cdc_config import HEARTBEAT, LOGICAL_TABLES, SimulationConfig, TableSpec, _to_ms

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
