"""A source that sent wrong values for one hour, and later re-sends the corrected rows.

:func:`corrupt_hour` rewrites, in the landing area as written, one column of the rows a table created in one local
hour (a unit error upstream: amounts 100 times too high), for the rows whose every change falls in that hour, so the
bad data lies in exactly that hour's partition and that hour's binlog. :func:`resend_corrected` is the source's fix:
the latest change of each of those rows again, with the correct value, at its original binlog time, as a new segment
of each shard stream after its last one (the same window: no stream moves past it), with new message ids, and the
hour's source count raised by the rows re-sent, as a re-delivery through Kafka raises its offsets.

Both act on a landing area the CDC simulator wrote (``simulation.json`` gives the timezone and each stream's next
message id, which the re-send advances). The simulator appends nothing after a re-send.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from resources.landing import count_window, counts_path, counts_text, read_counts, segment_name
from simulator.cdc import _load_state, _save_state, _write_atomic

_DATABASE = {"order": "edu_trade", "attendance": "edu_learning", "user": "edu_user", "course": "edu_course"}


def _streams(landing: Path, table: str) -> Iterator[tuple[str, Path]]:
    """(physical table, its directory) of each shard of the logical ``table``."""
    base = landing / "binlog" / _DATABASE.get(table, "edu_course")
    for directory in sorted(p for p in base.iterdir() if p.is_dir()):
        if directory.name == table or directory.name.rsplit("_", 1)[0] == table:
            yield directory.name, directory


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _message(line: str) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) and message.get("data") else None


def _zone(landing: Path) -> ZoneInfo:
    state = _load_state(landing)
    if state is None:
        raise ValueError(f"{landing} holds no simulation")
    return ZoneInfo(state.config.tz)


def _scaled(value: Any, factor: Decimal) -> Any:
    return None if value is None else str((Decimal(value) * factor).quantize(Decimal("0.01")))


def confined_rows(landing: Path, table: str, hour: datetime) -> set[int]:
    """The keys of ``table`` created in the local ``hour`` whose every change falls in that hour."""
    tz = _zone(landing)
    local = hour.astimezone(tz).replace(tzinfo=None) if hour.tzinfo is not None else hour
    return confined_rows_of_day(landing, table, local.date())[local.replace(minute=0, second=0, microsecond=0)]


def confined_rows_of_day(landing: Path, table: str, day: date) -> dict[datetime, set[int]]:
    """:func:`confined_rows` of each local hour of ``day`` (naive local hours), from one read of the table's streams:
    a key is confined to the hour its first and last change fall in, if it was created in that hour."""
    tz = _zone(landing)
    hours = [datetime(day.year, day.month, day.day) + timedelta(hours=h) for h in range(24)]
    starts = [int(h.replace(tzinfo=tz).timestamp() * 1000) for h in hours]
    end = int((hours[-1] + timedelta(hours=1)).replace(tzinfo=tz).timestamp() * 1000)
    changes: dict[int, tuple[int, int]] = {}  # key -> its first and last change's binlog time
    created: dict[int, set[str]] = {}  # key -> the local hours ("YYYY-MM-DD HH") its rows say it was created in
    for _, directory in _streams(landing, table):
        for path in sorted(directory.glob("*.jsonl")):
            for line in _lines(path):
                message = _message(line)
                if message is None:
                    continue
                es = message["es"]
                for row in message["data"]:
                    key = int(row["id"])
                    first, last = changes.get(key, (es, es))
                    changes[key] = (min(first, es), max(last, es))
                    created.setdefault(key, set()).add(str(row.get("create_time", ""))[:13])
    confined: dict[datetime, set[int]] = {hour: set() for hour in hours}
    for key, (first, last) in changes.items():
        if not starts[0] <= first < end:
            continue
        index = bisect_right(starts, first) - 1
        hour = hours[index]
        hour_end = starts[index + 1] if index + 1 < len(starts) else end
        if last < hour_end and hour.strftime("%Y-%m-%d %H") in created[key]:
            confined[hour].add(key)
    return confined


def corrupt_hour(landing: Path, table: str, hour: datetime, column: str = "amount", factor: int = 100) -> set[int]:
    """Multiply ``column`` by ``factor`` in every change of the rows :func:`confined_rows` finds, in place; returns
    their keys."""
    keys = confined_rows(landing, table, hour)
    scale = Decimal(factor)
    for _, directory in _streams(landing, table):
        for path in sorted(directory.glob("*.jsonl")):
            lines, changed = [], False
            for line in _lines(path):
                message = _message(line)
                if message is not None and any(int(r["id"]) in keys for r in message["data"]):
                    for i, row in enumerate(message["data"]):
                        if int(row["id"]) in keys:
                            row[column] = _scaled(row.get(column), scale)
                            old = (message.get("old") or [None] * len(message["data"]))[i]
                            if old and column in old:
                                old[column] = _scaled(old[column], scale)
                    line, changed = json.dumps(message, ensure_ascii=False, separators=(",", ":")), True
                lines.append(line)
            if changed:
                _write_atomic(path, "".join(f"{line}\n" for line in lines))
    return keys


def resend_corrected(
    landing: Path, table: str, hour: datetime, keys: set[int], column: str = "amount", factor: int = 100
) -> int:
    """Re-send the latest change of each of ``keys`` with ``column`` divided back by ``factor``; returns the rows."""
    tz = _zone(landing)
    state = _load_state(landing)
    assert state is not None
    scale = Decimal(1) / Decimal(factor)
    sent = 0
    for physical, directory in _streams(landing, table):
        segments = sorted(directory.glob("*.jsonl"))
        latest: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # key → (message, its row)
        for path in segments:
            for line in _lines(path):
                message = _message(line)
                for row in (message or {}).get("data") or []:
                    if int(row["id"]) in keys:
                        latest[int(row["id"])] = (message, row)  # type: ignore[assignment]
        if not latest:
            continue
        stream = state.streams[f"{directory.parent.name}.{physical}"]
        messages = []
        for key in sorted(latest):
            message, row = latest[key]
            fixed = {**row, column: _scaled(row.get(column), scale)}
            messages.append(
                {**message, "id": stream.next_id, "data": [fixed], "old": [{column: row.get(column)}], "type": "UPDATE"}
            )
            stream.next_id += 1
        last = segments[-1].name
        seq, start = int(last.split("-", 1)[0]), datetime.strptime(last.split("-", 1)[1][:13], "%Y%m%dT%H%M")
        text = "".join(json.dumps(m, ensure_ascii=False, separators=(",", ":")) + "\n" for m in messages)
        _write_atomic(directory / segment_name(seq + 1, start), text)  # the same window: a re-delivery in it
        stream.segments += 1
        # the source counts what it sent: the re-sent rows count in the window of their binlog time
        path = counts_path(landing, directory.parent.name, physical)
        counts = read_counts(path)
        for message in messages:
            when = count_window(datetime.fromtimestamp(message["es"] / 1000, tz).replace(tzinfo=None))
            counts[when] = counts.get(when, 0) + 1
        _write_atomic(path, counts_text(counts))
        sent += len(messages)
    _save_state(landing, state)
    return sent
