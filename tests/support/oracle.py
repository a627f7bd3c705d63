"""Ground truth for end-to-end tests: an independent replay of a simulator landing area.

Deliberately shares nothing with ``simulator/cdc.py`` but the file layout::

    <landing>/binlog/<db>/<physical_table>/<seq:06d>-<YYYYMMDDTHHMM>.jsonl   Canal flat messages
    <landing>/counts/<db>/<physical_table>.jsonl                               {"window": ..., "rows": N}
    <landing>/simulation.json                                                  {"config": {"tz": ...}, ...}

Replay rules: messages are applied in file order per physical table; a message id already seen in that
table is a duplicate and skipped; a line that is not a JSON object is skipped and counted as malformed;
INSERT and UPDATE store the row image (the last change wins), DELETE removes the key. Rows are returned
as in Canal (values are strings or None) plus ``_es``, the binlog time of the last change (epoch ms).
"""

from __future__ import annotations

import json
import re
import struct
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote
from zoneinfo import ZoneInfo

import pyarrow.parquet as pq

from simulator.cdc_world import USER_REGIONS, user_region

LOGICAL_TABLES = ("user", "course", "lesson", "order", "attendance")
HEARTBEAT = "heartbeat"
_SHARDED = re.compile(r"(?P<name>.+)_\d{2}")

Row = dict[str, Any]
Tables = dict[str, dict[int, Row]]


def logical_name(physical_table: str) -> str:
    """``order_03`` → ``order``; unsharded names are returned as they are."""
    match = _SHARDED.fullmatch(physical_table)
    return match.group("name") if match else physical_table


def segment_files(landing: Path) -> Iterator[tuple[str, str, Path]]:
    """(db, physical table, segment path) for every segment, streams sorted, segments in sequence order."""
    binlog = Path(landing) / "binlog"
    if not binlog.is_dir():
        return
    for db_dir in sorted(p for p in binlog.iterdir() if p.is_dir()):
        for table_dir in sorted(p for p in db_dir.iterdir() if p.is_dir()):
            for path in sorted(table_dir.glob("*.jsonl")):
                if not path.name.startswith("."):
                    yield db_dir.name, table_dir.name, path


def parse_line(line: str) -> dict[str, Any] | None:
    """The message on ``line``, or None when the line is not a JSON object (a malformed line)."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def assert_each_key_live_once(
    rows: Iterable[Mapping[str, Any]],
    primary_key: Sequence[str] = ("id",),
    partition_by: Sequence[str] = ("dt", "hh"),
) -> None:
    """No primary key of an ODS table is live (not a ``_deleted`` tombstone) more than once, table-wide.

    The per-partition ``unique`` check cannot see a key left live in a partition it moved out of."""
    places: dict[tuple[Any, ...], list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        if not row.get("_deleted"):
            places[tuple(row[c] for c in primary_key)].append(tuple(row.get(c) for c in partition_by))
    several = {key: sorted(where) for key, where in places.items() if len(where) > 1}
    assert not several, (
        f"{len(several)} keys of {list(primary_key)} live more than once; key → {list(partition_by)}: "
        + ", ".join(f"{key} → {where}" for key, where in sorted(several.items())[:5])
    )


@dataclass
class ReplayResult:
    """Final rows per logical table and what the replay met on the way."""

    tables: Tables
    messages: int = 0
    rows: int = 0
    duplicates: int = 0
    malformed: int = 0
    messages_by_stream: dict[str, int] = field(default_factory=dict)
    rows_by_stream: dict[str, int] = field(default_factory=dict)  # the row images of the messages applied


def replay_detailed(landing: Path, cutoff_es_ms: int | None = None) -> ReplayResult:
    """Replay every data table; with a cutoff only messages with ``es < cutoff_es_ms`` are applied."""
    result = ReplayResult({name: {} for name in LOGICAL_TABLES})
    seen: dict[str, set[int]] = defaultdict(set)
    for db, physical, path in segment_files(landing):
        if physical == HEARTBEAT:
            continue
        stream = f"{db}.{physical}"
        table = result.tables.setdefault(logical_name(physical), {})
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            message = parse_line(line)
            if message is None:
                result.malformed += 1
                continue
            if message["id"] in seen[stream]:
                result.duplicates += 1
                continue
            seen[stream].add(message["id"])
            if message.get("isDdl") or (cutoff_es_ms is not None and message["es"] >= cutoff_es_ms):
                continue
            _apply(table, message)
            result.messages += 1
            result.rows += len(message["data"])
            result.messages_by_stream[stream] = result.messages_by_stream.get(stream, 0) + 1
            result.rows_by_stream[stream] = result.rows_by_stream.get(stream, 0) + len(message["data"])
    return result


def _apply(table: dict[int, Row], message: Mapping[str, Any]) -> None:
    for row in message["data"]:
        pk = int(row["id"])
        if message["type"] == "DELETE":
            table.pop(pk, None)
        else:
            table[pk] = {**row, "_es": message["es"]}


def replay(landing: Path) -> Tables:
    """Logical table → primary key → final row."""
    return replay_detailed(landing).tables


def replay_until(landing: Path, cutoff_es_ms: int) -> Tables:
    """The state of the source just before ``cutoff_es_ms`` (messages with ``es < cutoff`` applied)."""
    return replay_detailed(landing, cutoff_es_ms).tables


def business_tz(landing: Path) -> str:
    """The simulation's business timezone, from ``simulation.json``."""
    state = json.loads((Path(landing) / "simulation.json").read_text(encoding="utf-8"))
    return str(state["config"]["tz"])


def _local_date(value: str, source_tz: str, tz: str) -> date:
    moment = datetime.strptime(value, "%Y-%m-%d %H:%M:%S")
    if source_tz == tz:
        return moment.date()
    return moment.replace(tzinfo=ZoneInfo(source_tz)).astimezone(ZoneInfo(tz)).date()


def _values(rows: Mapping[int, Row] | Iterable[Row]) -> Iterable[Row]:
    return rows.values() if isinstance(rows, Mapping) else rows


def daily_gmv(
    rows: Mapping[int, Row] | Iterable[Row], tz: str = "Asia/Shanghai", source_tz: str | None = None
) -> dict[date, Decimal]:
    """Sum of ``amount`` of orders whose status is 'paid', by local date (in ``tz``) of ``create_time``.

    ``create_time`` values are business-local strings in ``source_tz`` (default: the same as ``tz``).
    """
    out: dict[date, Decimal] = defaultdict(Decimal)
    for row in _values(rows):
        if row.get("status") == "paid":
            out[_local_date(row["create_time"], source_tz or tz, tz)] += Decimal(row["amount"])
    return dict(sorted(out.items()))


def row_counts(landing: Path, tz: str | None = None) -> dict[str, dict[str, int]]:
    """Row images per ``db.table`` and local hour of ``es``, read from the segments.

    Duplicates and malformed lines are left out, hours without rows are absent. Compare with
    ``source_counts`` to measure completeness.
    """
    zone = ZoneInfo(tz or business_tz(landing))
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    seen: dict[str, set[int]] = defaultdict(set)
    for db, physical, path in segment_files(landing):
        if physical == HEARTBEAT:
            continue
        stream = f"{db}.{physical}"
        for line in path.read_text(encoding="utf-8").splitlines():
            message = parse_line(line) if line.strip() else None
            if message is None or message["id"] in seen[stream]:
                continue
            seen[stream].add(message["id"])
            hour = datetime.fromtimestamp(message["es"] // 1000, zone).strftime("%Y-%m-%dT%H")
            out[stream][hour] += len(message["data"])
    return {stream: dict(hours) for stream, hours in out.items()}


def source_counts(landing: Path, include_zero: bool = False) -> dict[str, dict[str, int]]:
    """The simulator's source row counts per ``db.table`` (the "Kafka offsets"), summed per hour from its 5-minute
    windows."""
    out: dict[str, dict[str, int]] = {}
    counts = Path(landing) / "counts"
    for path in sorted(counts.glob("*/*.jsonl")):
        hours: dict[str, int] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                hour = str(entry.get("window", entry.get("hour")))[:13]
                hours[hour] = hours.get(hour, 0) + int(entry["rows"])
        out[f"{path.parent.name}.{path.stem}"] = {h: n for h, n in hours.items() if include_zero or n}
    return out


def live_counts(tables: Tables) -> dict[str, int]:
    """Number of live rows per logical table after a replay."""
    return {name: len(rows) for name, rows in tables.items()}


def partition_counts(
    rows: Mapping[int, Row] | Iterable[Row], column: str = "create_time", hourly: bool = True
) -> dict[str, int]:
    """Live rows per partition of ``column`` ('YYYY-MM-DD-HH' hourly, 'YYYY-MM-DD' daily)."""
    out: dict[str, int] = defaultdict(int)
    for row in _values(rows):
        value = row[column]
        key = f"{value[:10]}-{value[11:13]}" if hourly else value[:10]
        out[key] += 1
    return dict(sorted(out.items()))


def _live_files(table_dir: Path) -> dict[str, dict[str, Any]]:
    """The add actions of a Delta table's live files by a plain replay of its JSON log (independent of delta-rs
    and Spark). A file is its path and its deletion vector: a commit that marks more of a file's rows deleted
    removes the (path, old vector) and adds the (path, new vector), in either order."""

    def identity(action: Mapping[str, Any]) -> tuple[str, str | None]:
        dv = action.get("deletionVector")
        return action["path"], None if not dv else f"{dv['storageType']}{dv['pathOrInlineDv']}@{dv.get('offset')}"

    live: dict[tuple[str, str | None], dict[str, Any]] = {}
    for entry in sorted((Path(table_dir) / "_delta_log").glob("*.json")):
        for line in entry.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "add" in action:
                live[identity(action["add"])] = action["add"]
            elif "remove" in action:
                live.pop(identity(action["remove"]), None)
    return {f"{path}#{vector}": add for (path, vector), add in live.items()}


def delta_live_paths(table_dir: Path) -> set[str]:
    """Live data files of a Delta table by a plain replay of its JSON log (independent of delta-rs)."""
    return {add["path"] for add in _live_files(table_dir).values()}


_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_DV_MAGIC = 1681511377


def _z85_decode(text: str) -> bytes:
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for char in text[i : i + 5]:
            value = value * 85 + _Z85.index(char)
        out += value.to_bytes(4, "big")
    return bytes(out)


def _roaring_bitmap(data: bytes, at: int) -> tuple[set[int], int]:
    """One 32-bit Roaring bitmap in the portable format (RoaringFormatSpec) starting at ``at``, and where it ends."""
    (cookie,) = struct.unpack_from("<I", data, at)
    at += 4
    runs: bytes = b""
    if cookie & 0xFFFF == 12347:  # with run containers
        size = (cookie >> 16) + 1
        runs = data[at : at + (size + 7) // 8]
        at += len(runs)
    elif cookie == 12346:
        (size,) = struct.unpack_from("<I", data, at)
        at += 4
    else:
        raise ValueError(f"not a portable Roaring bitmap (cookie {cookie})")
    header = [struct.unpack_from("<HH", data, at + 4 * i) for i in range(size)]
    at += 4 * size
    if not runs or size >= 4:  # the offset header, not needed to read the containers in order
        at += 4 * size
    values: set[int] = set()
    for i, (key, cardinality_minus_one) in enumerate(header):
        high = key << 16
        if runs and runs[i // 8] >> (i % 8) & 1:
            (count,) = struct.unpack_from("<H", data, at)
            at += 2
            for start, length in (struct.unpack_from("<HH", data, at + 4 * r) for r in range(count)):
                values.update(range(high + start, high + start + length + 1))
            at += 4 * count
        elif cardinality_minus_one + 1 > 4096:  # a bitset of 2^16 bits
            for word_index, word in enumerate(struct.unpack_from("<1024Q", data, at)):
                values.update(high + word_index * 64 + b for b in range(64) if word >> b & 1)
            at += 8192
        else:
            count = cardinality_minus_one + 1
            values.update(high + v for v in struct.unpack_from(f"<{count}H", data, at))
            at += 2 * count
    return values, at


def deleted_row_indexes(table_dir: Path, vector: Mapping[str, Any]) -> set[int]:
    """The row indexes a deletion vector descriptor marks deleted, decoded as the Delta protocol describes it:
    z85-encoded inline or in a ``deletion_vector_<uuid>.bin`` file (at ``offset``, a big-endian size first), a
    magic number then a 64-bit Roaring bitmap array (bitmaps by their high 32 bits)."""
    kind, where = vector["storageType"], vector["pathOrInlineDv"]
    if kind == "i":
        data = _z85_decode(where)
    else:
        if kind == "u":
            raw = _z85_decode(where[-20:]).hex()
            uuid = f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
            path = Path(table_dir) / where[:-20] / f"deletion_vector_{uuid}.bin"
        else:
            path = Path(where.removeprefix("file:"))
        blob = path.read_bytes()
        offset = int(vector.get("offset") or 1)
        (size,) = struct.unpack_from(">I", blob, offset)
        data = blob[offset + 4 : offset + 4 + size]
    magic, bitmaps = struct.unpack_from("<IQ", data, 0)
    if magic != _DV_MAGIC:
        raise ValueError(f"{table_dir}: deletion vector {where} has magic {magic}, not {_DV_MAGIC}")
    at, rows = 12, set()
    for _ in range(bitmaps):
        (high,) = struct.unpack_from("<I", data, at)
        low, at = _roaring_bitmap(data, at + 4)
        rows.update((high << 32) | v for v in low)
    if len(rows) != int(vector["cardinality"]):
        raise ValueError(
            f"{table_dir}: deletion vector {where} decodes to {len(rows)} rows, not {vector['cardinality']}"
        )
    return rows


def delta_live_rows(table_dir: Path) -> list[Row]:
    """The rows a reader of a Delta table sees, by a plain replay of its JSON log: each live file read with Parquet
    alone, the rows its deletion vector marks deleted dropped, its partition values (strings) added."""
    rows: list[Row] = []
    for add in _live_files(table_dir).values():
        data = pq.read_table(Path(table_dir) / unquote(add["path"])).to_pylist()
        deleted = deleted_row_indexes(table_dir, add["deletionVector"]) if add.get("deletionVector") else set()
        rows += [{**row, **add["partitionValues"]} for i, row in enumerate(data) if i not in deleted]
    return rows


# --- the example warehouse's figures, from the replayed rows ----------------------------------------------
#
# Each function restates a table's documented meaning in plain Python over the final source rows (Canal
# strings). Datetimes in the rows are business-local wall times; days are 'YYYY-MM-DD', hours
# 'YYYY-MM-DD HH'.


def _wall(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%d %H:%M:%S")


def _day_before(day: str, days: int) -> str:
    return (date.fromisoformat(day) - timedelta(days=days)).isoformat()


@dataclass(frozen=True)
class Session:
    """One attendance session as the DWD fact describes it."""

    attendance_id: int
    user_id: int
    lesson_id: int
    course_id: int
    day: str
    duration: int
    attended: bool


def sessions(truth: Tables) -> list[Session]:
    """Every attendance session; attended = stayed at least half of the lesson's scheduled length."""
    out = []
    for row in truth["attendance"].values():
        duration = int(row["duration_sec"] or 0)
        lesson = truth["lesson"].get(int(row["lesson_id"]))
        attended = False
        if lesson is not None:
            length = (_wall(lesson["end_time"]) - _wall(lesson["start_time"])).total_seconds()
            attended = duration * 2 >= length
        out.append(
            Session(
                int(row["id"]),
                int(row["user_id"]),
                int(row["lesson_id"]),
                int(row["course_id"]),
                row["create_time"][:10],
                duration,
                attended,
            )
        )
    return out


def user_learning_daily(truth: Tables) -> dict[str, dict[int, dict[str, int]]]:
    """day → user → sessions, attended_sessions, lessons, learning_seconds."""
    out: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for s in sessions(truth):
        user = out[s.day].setdefault(s.user_id, {"sessions": 0, "attended_sessions": 0, "lessons": set(), "secs": 0})
        user["sessions"] += 1
        user["attended_sessions"] += int(s.attended)
        user["lessons"].add(s.lesson_id)
        user["secs"] += s.duration
    return {
        day: {
            u: {
                "sessions": v["sessions"],
                "attended_sessions": v["attended_sessions"],
                "lessons": len(v["lessons"]),
                "learning_seconds": v["secs"],
            }
            for u, v in users.items()
        }
        for day, users in out.items()
    }


def user_learning_cumulative(truth: Tables, day: str, first_day: str) -> dict[int, dict[str, Any]]:
    """user → totals of every day from ``first_day`` (the warehouse start) to ``day`` included."""
    out: dict[int, dict[str, Any]] = {}
    for d, users in sorted(user_learning_daily(truth).items()):
        if not first_day <= d <= day:
            continue
        for user, v in users.items():
            total = out.setdefault(
                user,
                {
                    "total_sessions": 0,
                    "total_attended_sessions": 0,
                    "total_learning_seconds": 0,
                    "learning_days": 0,
                    "first_learning_dt": d,
                },
            )
            total["total_sessions"] += v["sessions"]
            total["total_attended_sessions"] += v["attended_sessions"]
            total["total_learning_seconds"] += v["learning_seconds"]
            total["learning_days"] += 1
            total["last_learning_dt"] = d
    return out


def attendance_rate(truth: Tables, day: str) -> dict[str, Any]:
    """到课率 of ``day``: attended sessions / sessions (None without sessions)."""
    of_day = [s for s in sessions(truth) if s.day == day]
    attended = sum(s.attended for s in of_day)
    return {
        "sessions": len(of_day),
        "attended_sessions": attended,
        "learners": len({s.user_id for s in of_day}),
        "attending_learners": len({s.user_id for s in of_day if s.attended}),
        "attendance_rate": attended / len(of_day) if of_day else None,
    }


def course_attendance(truth: Tables, days: Iterable[str]) -> dict[int, dict[str, int]]:
    """course → sessions, attended, learners, lessons, seconds and days with sessions over ``days``."""
    wanted = set(days)
    out: dict[int, list[Session]] = defaultdict(list)
    for s in sessions(truth):
        if s.day in wanted:
            out[s.course_id].append(s)
    return {
        course: {
            "sessions": len(rows),
            "attended_sessions": sum(s.attended for s in rows),
            "learners": len({s.user_id for s in rows}),
            "lessons": len({s.lesson_id for s in rows}),
            "learning_seconds": sum(s.duration for s in rows),
            "days_with_sessions": len({s.day for s in rows}),
        }
        for course, rows in out.items()
    }


def active_users(truth: Tables) -> dict[str, set[int]]:
    """day → users who joined a lesson or created an order that day."""
    out: dict[str, set[int]] = defaultdict(set)
    for row in truth["attendance"].values():
        out[row["create_time"][:10]].add(int(row["user_id"]))
    for row in truth["order"].values():
        out[row["create_time"][:10]].add(int(row["user_id"]))
    return out


def regional_dau(truth: Tables, day: str, region: str, tz: str = "Asia/Shanghai") -> int:
    """Distinct users of ``region`` (the simulator's rule) who joined a lesson during that region's ``day``, from its
    midnight to the next in its own time zone; creation times are wall clock of the business time zone ``tz``."""
    zone, business = ZoneInfo(dict(USER_REGIONS)[region]), ZoneInfo(tz)
    start = datetime.fromisoformat(day).replace(tzinfo=zone)
    end = start + timedelta(days=1)  # wall-clock arithmetic: the next local midnight, 23 or 25 hours on a DST day
    return len(
        {
            int(row["user_id"])
            for row in truth["attendance"].values()
            if row["user_id"] is not None
            and user_region(int(row["user_id"])) == region
            and start <= _wall(row["create_time"]).replace(tzinfo=business) < end
        }
    )


def retention(truth: Tables, day: str, after_days: int) -> dict[str, Any]:
    """Users registered ``after_days`` before ``day`` (still live) and how many of them are active on ``day``."""
    cohort_day = _day_before(day, after_days)
    cohort = {int(r["id"]) for r in truth["user"].values() if r["create_time"][:10] == cohort_day}
    retained = cohort & active_users(truth).get(day, set())
    return {
        "cohort_dt": cohort_day,
        "cohort_users": len(cohort),
        "retained_users": len(retained),
        "retention_rate": len(retained) / len(cohort) if cohort else None,
    }


def dau_wau_mau(truth: Tables, day: str) -> dict[str, int]:
    """Distinct active users of the day, of the 7 days and of the 30 days ending on ``day``."""
    active = active_users(truth)

    def over(days: int) -> int:
        return len(set().union(*(active.get(_day_before(day, n), set()) for n in range(days))))

    return {"dau": over(1), "wau": over(7), "mau": over(30)}


def gmv_hourly(truth: Tables, hour: str) -> dict[str, Any]:
    """Orders created in local ``hour`` ('YYYY-MM-DD HH'): GMV of the paid ones, paid orders, orders."""
    rows = [r for r in truth["order"].values() if r["create_time"][:13] == hour]
    paid = [r for r in rows if r["status"] == "paid"]
    return {
        "gmv": sum((Decimal(r["amount"]) for r in paid), Decimal("0.00")),
        "paid_orders": len(paid),
        "orders": len(rows),
    }


def monthly_report(truth: Tables, month: str) -> dict[str, Any]:
    """The month ('YYYY-MM') from its days: trade figures, active users, learners, average DAU."""
    orders = [r for r in truth["order"].values() if r["create_time"][:7] == month]
    paid = [r for r in orders if r["status"] == "paid"]
    gmv = sum((Decimal(r["amount"]) for r in paid), Decimal("0.00"))
    paying = {int(r["user_id"]) for r in paid}
    active = {day: users for day, users in active_users(truth).items() if day[:7] == month}
    learners = {int(r["user_id"]) for r in truth["attendance"].values() if r["create_time"][:7] == month}
    first = date.fromisoformat(f"{month}-01")
    days_in_month = ((first + timedelta(days=32)).replace(day=1) - first).days
    return {
        "gmv": gmv,
        "orders": len(orders),
        "paid_orders": len(paid),
        "paying_users": len(paying),
        "arppu": (gmv / len(paying)).quantize(Decimal("0.01"), ROUND_HALF_UP) if paying else None,
        "active_users": len(set().union(*active.values())),
        "learners": len(learners),
        "avg_dau": sum(len(users) for users in active.values()) / days_in_month,
    }
