"""A deterministic simulated MySQL source that writes Canal flat-message binlog segments.

The simulated online-education company has four MySQL databases (one source "cluster" each):
``edu_user`` (``user_00``..``user_03``), ``edu_course`` (``course``, ``lesson``), ``edu_trade``
(``order_00``..``order_07``) and ``edu_learning`` (``attendance_00``..``attendance_07``), each with a
``heartbeat`` table updated once a minute. Its users live in four regions, each with its own midnight: a user's
region follows from their id (:func:`simulator.cdc_world.user_region`).

Determinism and appendability come from the lifecycle model (:mod:`simulator.cdc_world`): time is cut into fixed
5-minute creation slots counted from the simulation origin (the first ``start``). The number of entities a slot
creates and each entity's whole lifecycle (INSERT, later UPDATEs, maybe a DELETE, all within 48 h) are drawn
from random generators seeded by ``(seed, table, slot[, index])`` only. The events of a micro-batch window are
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
import json
import os
import random
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from resources.landing import (
    COUNT_WINDOW_MINUTES,
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
from simulator.cdc_config import (
    _PHYSICAL_TO_LOGICAL,
    DATABASES,
    HEARTBEAT,
    HEARTBEAT_COLUMNS,
    LOGICAL_TABLES,
    STREAMS,
    Column,
    IdleRange,
    SimulationConfig,
    SimulationSummary,
    TableSpec,
    TableSummary,
    _add,
    _aware,
    _to_ms,
    logical_table_of,
)
from simulator.cdc_world import MINUTE_MS, MULTI_ROW_P, SLOT_MS, Row, RowEvent, _EventStream, _rng, _World

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
