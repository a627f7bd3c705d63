"""The capture connector: a MySQL/MariaDB row-based binlog → Canal flat-message segments in the landing area.

``warehouse capture`` is the real-source counterpart of the simulator (``simulator/cdc.py``): it reads the
source server's binlog as a replica would and writes what the ingestion reads, in the landing area's layout
(``resources/landing.py`` names every file): one segment per window and shard, empty when the shard had no
change; the same for each captured database's heartbeat table; and each shard's rows per local hour. Its own
state is ``capture.json`` in the landing root: the binlog position and the open window.

What it captures is the catalog's: every ODS table's ``source: {database, tables}``, plus each of those
databases' ``heartbeat`` table.

Windows follow the binlog's own clock, never the connector's: a window ``[start, start + segment_minutes)``
(business-local, aligned like the simulator's) is closed, and one segment written for it on every shard, when
a transaction committed at or after its end is read. Rows go to the open window in binlog order, so a segment
keeps its shard's order even when a long transaction commits with an older timestamp. So that an idle
source's windows close too, the connector writes its own heartbeat every ``heartbeat_seconds`` (the
pt-heartbeat practice: one row in each captured database's ``heartbeat`` table, created when missing); those
changes come back through the binlog like any other.

Crash safety: segments and counts of a window are written first, then ``capture.json`` (atomically, by
rename) with the binlog position where the next window's first transaction begins. A restart re-reads from
there: what was written after that point is written again, byte for byte (message ids, ``ts`` and counts are
functions of the binlog), so a crash at any point neither loses nor duplicates an event.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from zoneinfo import ZoneInfo

from resources.column_types import canal_column_type
from resources.landing import (
    COUNT_WINDOW_MINUTES,
    HEARTBEAT_TABLE,
    Landing,
    count_window,
    counts_text,
    read_counts,
    stream_name,
    stream_parts,
)
from warehouse_assets.catalog import Catalog, OdsTable

log = logging.getLogger(__name__)

STATE_FILE = "capture.json"
STATE_FORMAT = 1
COUNTS_KEPT_DAYS = 8  # hours this recent are counted in the state; older ones stay as the counts file has them
START_POSITIONS = ("earliest", "current")

Row = dict[str, str | None]


# --- the source ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where the source server listens and who reads its binlog (REPLICATION SLAVE, REPLICATION CLIENT and
    SELECT; INSERT and CREATE on ``<db>.heartbeat`` for the heartbeat)."""

    host: str
    port: int
    user: str
    password: str = ""

    @classmethod
    def parse(cls, url: str, password: str = "") -> Source:
        """``mysql://user@host:port`` (the password comes from the environment, never the command line)."""
        parts = urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb") or not parts.hostname or not parts.username:
            raise ValueError(f"source {url!r}: expected mysql://USER@HOST[:PORT]")
        if parts.password:
            raise ValueError(f"source {url!r}: give the password in WAREHOUSE_CAPTURE_PASSWORD, not in the URL")
        try:
            port = parts.port or 3306
        except ValueError:
            raise ValueError(f"source {url!r}: the port is not a number") from None
        return cls(parts.hostname, port, unquote(parts.username), password)

    def connection_settings(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": self.user, "passwd": self.password}

    def connect(self) -> Any:
        import pymysql

        return pymysql.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, autocommit=True, charset="utf8mb4"
        )


def capture_targets(catalog: Catalog) -> dict[str, str]:
    """Database → regular expression of the physical tables to capture, from the ODS tables' sources."""
    patterns: dict[str, list[str]] = {}
    for table in catalog.tables.values():
        if isinstance(table, OdsTable):
            patterns.setdefault(table.source_database, []).append(table.source_tables)
    return {db: "|".join(f"(?:{p})" for p in sorted(found)) for db, found in sorted(patterns.items())}


# --- Canal flat messages ----------------------------------------------------------------------------------------


def canal_value(value: Any) -> str | None:
    """A column value as Canal writes it: a string, or null."""
    if value is None:
        return None
    if isinstance(value, datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        return text + (f".{value.microsecond:06d}" if value.microsecond else "")
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
        return f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, set | frozenset):
        return ",".join(sorted(str(v) for v in value))
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


@dataclass(frozen=True)
class RowsChange:
    """One binlog rows event of a captured table: one Canal message."""

    database: str
    table: str
    kind: str  # INSERT / UPDATE / DELETE
    es: int  # binlog time, epoch ms
    pk_names: tuple[str, ...]
    mysql_types: Mapping[str, str]
    sql_types: Mapping[str, int]
    data: tuple[Row, ...]
    old: tuple[Row, ...] | None = None
    position: str = ""  # binlog file:end offset of the rows event: tells apart equal changes within one second

    @property
    def stream(self) -> str:
        return stream_name(self.database, self.table)

    def encode(self, message_id: int) -> str:
        """The Canal flat message (keys sorted, compact, UTF-8, like the simulator and Canal's fastjson)."""
        obj = {
            "data": list(self.data),
            "database": self.database,
            "es": self.es,
            "id": message_id,
            "isDdl": False,
            "mysqlType": dict(self.mysql_types),
            "old": list(self.old) if self.old is not None else None,
            "pkNames": list(self.pk_names),
            "position": self.position or None,
            "sql": "",
            "sqlType": dict(self.sql_types),
            "table": self.table,
            # Canal's build time; the binlog time here, so that a segment re-written after a crash is identical
            "ts": self.es,
            "type": self.kind,
        }
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def rows_change(event: Any, log_file: str = "") -> RowsChange:
    """The Canal message of a pymysqlreplication rows event read from ``log_file``."""
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    columns = [c for c in event.columns if c.name is not None]
    types = {c.name: canal_column_type(c) for c in columns}
    key = event.primary_key
    pk_names = tuple(key) if isinstance(key, list | tuple) else ((key,) if key else ())

    def image(values: Mapping[str, Any]) -> Row:
        return {name: canal_value(values.get(name)) for name in types}

    es = int(event.timestamp) * 1000
    common = {
        "database": event.schema,
        "table": event.table,
        "es": es,
        "position": f"{log_file}:{event.packet.log_pos}" if log_file else "",
        "pk_names": pk_names,
        "mysql_types": {n: t[0] for n, t in types.items()},
        "sql_types": {n: t[1] for n, t in types.items()},
    }
    if isinstance(event, UpdateRowsEvent):
        after = tuple(image(r["after_values"]) for r in event.rows)
        before = tuple(image(r["before_values"]) for r in event.rows)
        old = tuple({k: v for k, v in b.items() if a.get(k) != v} for a, b in zip(after, before, strict=True))
        return RowsChange(kind="UPDATE", data=after, old=old, **common)
    if isinstance(event, WriteRowsEvent):
        return RowsChange(kind="INSERT", data=tuple(image(r["values"]) for r in event.rows), **common)
    if isinstance(event, DeleteRowsEvent):
        return RowsChange(kind="DELETE", data=tuple(image(r["values"]) for r in event.rows), **common)
    raise TypeError(f"not a rows event: {type(event).__name__}")


# --- state ----------------------------------------------------------------------------------------------------


@dataclass
class StreamProgress:
    seq: int = 0  # the last segment written
    next_id: int = 1  # the next Canal message id


@dataclass
class CaptureState:
    """What ``capture.json`` holds: everything before ``position`` is in segments up to ``window``."""

    log_file: str
    log_pos: int
    window: int | None = None  # the open window's start (epoch ms); None before the first transaction
    streams: dict[str, StreamProgress] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # stream → local window → rows

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "position": {"file": self.log_file, "pos": self.log_pos},
            "window": self.window,
            "streams": {s: {"seq": p.seq, "next_id": p.next_id} for s, p in sorted(self.streams.items())},
            "counts": {s: dict(sorted(h.items())) for s, h in sorted(self.counts.items())},
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CaptureState:
        if obj.get("format") != STATE_FORMAT:
            raise ValueError(f"{STATE_FILE}: unknown format {obj.get('format')!r} (expected {STATE_FORMAT})")
        return cls(
            str(obj["position"]["file"]),
            int(obj["position"]["pos"]),
            None if obj.get("window") is None else int(obj["window"]),
            {s: StreamProgress(int(p["seq"]), int(p["next_id"])) for s, p in obj.get("streams", {}).items()},
            {s: {h: int(n) for h, n in hours.items()} for s, hours in obj.get("counts", {}).items()},
        )


def load_state(landing_root: Path) -> CaptureState | None:
    path = landing_root / STATE_FILE
    if not path.exists():
        return None
    return CaptureState.from_json(json.loads(path.read_text(encoding="utf-8")))


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# --- windows and segments ----------------------------------------------------------------------------------------


class SegmentWriter:
    """Cuts committed transactions into per-shard window segments, counts and the persisted position."""

    def __init__(
        self, landing: Landing, state: CaptureState, streams: Iterable[str], say: Callable[[str], None] | None = None
    ):
        self.landing = landing
        self.state = state
        self.say = say
        self.step = landing.segment_minutes * 60_000
        self.open: list[RowsChange] = []  # the open window's changes, in binlog order
        for stream in streams:
            self.add_stream(stream)

    @property
    def tz(self) -> ZoneInfo:
        return self.landing.tz

    def add_stream(self, stream: str) -> None:
        self.state.streams.setdefault(stream, StreamProgress())

    def window_of(self, ms: int) -> int:
        local = datetime.fromtimestamp(ms / 1000, self.tz)
        minutes = local.hour * 60 + local.minute
        floored = local.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(
            minutes=minutes - minutes % self.landing.segment_minutes
        )
        return int(floored.timestamp() * 1000)

    def commit(self, changes: list[RowsChange], commit_ms: int, position_before: tuple[str, int]) -> None:
        """A committed transaction: close the windows it ends (saving ``position_before``), then keep its rows."""
        window = self.window_of(commit_ms)
        if self.state.window is None:
            self.state.window = window
        elif window > self.state.window:
            self._close_until(window, position_before)
        for change in changes:
            self.add_stream(change.stream)
        self.open.extend(changes)

    def _close_until(self, window: int, position: tuple[str, int]) -> None:
        assert self.state.window is not None
        start, rows = self.state.window, sum(len(c.data) for c in self.open)
        while start < window:
            self._write_window(start, self.open)
            self.open = []
            start += self.step
        self.state.window = window
        self.state.log_file, self.state.log_pos = position
        self._write_counts()
        self.save()
        if self.say is not None:
            until = datetime.fromtimestamp(window / 1000, self.tz)
            self.say(
                f"{datetime.now(self.tz):%H:%M:%S} segments written up to {until:%Y-%m-%d %H:%M} ({rows} row changes);"
                f" position {position[0]}:{position[1]}"
            )

    def _write_window(self, start: int, changes: list[RowsChange]) -> None:
        by_stream: dict[str, list[RowsChange]] = {s: [] for s in self.state.streams}
        for change in changes:
            by_stream[change.stream].append(change)
        local = datetime.fromtimestamp(start / 1000, self.tz)
        # every counted window the segment spans, 0 when the shard was idle in it, like the simulator
        idle = [
            count_window(local + timedelta(minutes=m))
            for m in range(0, self.landing.segment_minutes, COUNT_WINDOW_MINUTES)
        ]
        for stream, stream_changes in sorted(by_stream.items()):
            progress = self.state.streams[stream]
            lines = [c.encode(progress.next_id + i) for i, c in enumerate(stream_changes)]
            seq = progress.seq + 1
            _write_atomic(self.landing.segment_path(stream, seq, local), "".join(line + "\n" for line in lines))
            progress.seq = seq
            progress.next_id += len(lines)
            if stream_parts(stream)[1] == HEARTBEAT_TABLE:
                continue
            windows = self.state.counts.setdefault(stream, {})
            for window in idle:
                windows.setdefault(window, 0)
            for change in stream_changes:
                changed = count_window(datetime.fromtimestamp(change.es / 1000, self.tz))
                windows[changed] = windows.get(changed, 0) + len(change.data)

    def _write_counts(self) -> None:
        assert self.state.window is not None
        horizon = datetime.fromtimestamp(self.state.window / 1000, self.tz) - timedelta(days=COUNTS_KEPT_DAYS)
        oldest = count_window(horizon)
        for stream, windows in self.state.counts.items():
            path = self.landing.counts_path(stream)
            _write_atomic(path, counts_text({**read_counts(path), **windows}))
            self.state.counts[stream] = {w: n for w, n in windows.items() if w >= oldest}

    def save(self) -> None:
        _write_atomic(self.landing.root / STATE_FILE, json.dumps(self.state.to_json(), indent=1) + "\n")


# --- the connector -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptureConfig:
    landing: Landing
    targets: Mapping[str, str]  # database → regular expression of physical tables
    server_id: int = 5401  # the replica id the connector registers with; unique among the source's replicas
    start: str = "current"  # where a first start reads from: the binlog's earliest or current position
    heartbeat_seconds: float = 60.0  # 0: no heartbeat of its own (an idle source then closes no window)

    def __post_init__(self) -> None:
        if self.start not in START_POSITIONS:
            raise ValueError(f"start {self.start!r}: expected one of {', '.join(START_POSITIONS)}")
        if self.heartbeat_seconds < 0:
            raise ValueError(f"heartbeat_seconds must not be negative, got {self.heartbeat_seconds}")
        if not self.targets:
            raise ValueError("nothing to capture: the catalog names no ODS source database")


def _captured(targets: Mapping[str, str]) -> Callable[[str, str], bool]:
    compiled = {db: re.compile(f"^(?:{p})$") for db, p in targets.items()}

    def captured(database: str, table: str) -> bool:
        pattern = compiled.get(database)
        return pattern is not None and (table == HEARTBEAT_TABLE or bool(pattern.match(table)))

    return captured


def _start_position(connection: Any, start: str) -> tuple[str, int]:
    with connection.cursor() as cursor:
        if start == "earliest":
            cursor.execute("SHOW BINARY LOGS")
            logs = cursor.fetchall()
            if not logs:
                raise RuntimeError("the source has no binary log: start it with --log-bin --binlog-format=ROW")
            return str(logs[0][0]), 4
        cursor.execute("SHOW MASTER STATUS")
        status = cursor.fetchone()
        if not status:
            raise RuntimeError("the source has no binary log: start it with --log-bin --binlog-format=ROW")
        return str(status[0]), int(status[1])


def _check_source(connection: Any) -> None:
    import pymysql

    with connection.cursor() as cursor:
        try:
            cursor.execute("SELECT @@binlog_format, @@binlog_row_image, @@binlog_row_metadata")
        except pymysql.err.OperationalError as exc:  # an older server: no binlog_row_metadata at all
            raise RuntimeError(
                f"the source's binlog cannot be captured ({exc.args[-1]}): it needs binlog_row_metadata=FULL "
                "(MariaDB 10.5+, MySQL 8.0+)"
            ) from None
        binlog_format, row_image, metadata = cursor.fetchone()
    wrong = []
    if str(binlog_format).upper() != "ROW":
        wrong.append(f"binlog_format={binlog_format} (needs ROW)")
    if str(row_image).upper() != "FULL":
        wrong.append(f"binlog_row_image={row_image} (needs FULL: an UPDATE must carry whole rows)")
    if str(metadata).upper() != "FULL":
        wrong.append(f"binlog_row_metadata={metadata} (needs FULL: column names and keys in the binlog)")
    if wrong:
        raise RuntimeError("the source's binlog cannot be captured: " + ", ".join(wrong))


def _present(connection: Any, targets: Mapping[str, str]) -> dict[str, str]:
    """The targets whose database exists on the source (a source server may hold only some of them)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT schema_name FROM information_schema.schemata")
        databases = {str(name) for (name,) in cursor.fetchall()}
    return {db: pattern for db, pattern in targets.items() if db in databases}


def _existing_streams(connection: Any, targets: Mapping[str, str], heartbeat: bool) -> list[str]:
    captured = _captured(targets)
    streams = [stream_name(db, HEARTBEAT_TABLE) for db in targets] if heartbeat else []
    with connection.cursor() as cursor:
        for database in targets:
            cursor.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (database,))
            streams += [stream_name(database, name) for (name,) in cursor.fetchall() if captured(database, str(name))]
    return sorted(set(streams))


class Heartbeat(threading.Thread):
    """Upserts one row in each captured database's ``heartbeat`` table every ``seconds`` (pt-heartbeat)."""

    def __init__(self, source: Source, databases: Iterable[str], seconds: float):
        super().__init__(name="capture-heartbeat", daemon=True)
        self.source, self.databases, self.seconds = source, list(databases), seconds
        self.stopped = threading.Event()

    def run(self) -> None:
        connection = None
        while not self.stopped.wait(0 if connection is None else self.seconds):
            try:
                if connection is None:
                    connection = self.source.connect()
                    with connection.cursor() as cursor:
                        for db in self.databases:
                            cursor.execute(
                                f"CREATE TABLE IF NOT EXISTS `{db}`.`{HEARTBEAT_TABLE}` "
                                "(id bigint PRIMARY KEY, ts datetime NOT NULL)"
                            )
                with connection.cursor() as cursor:
                    for db in self.databases:
                        cursor.execute(
                            f"INSERT INTO `{db}`.`{HEARTBEAT_TABLE}` (id, ts) VALUES (1, NOW()) "
                            "ON DUPLICATE KEY UPDATE ts = VALUES(ts)"
                        )
            except Exception as exc:  # the source restarting: try again on the next beat
                log.warning("heartbeat failed: %s", exc)
                connection = None
                self.stopped.wait(self.seconds)


def run_capture(source: Source, config: CaptureConfig, say: Callable[[str], None] = print) -> None:
    """Capture until interrupted (a signal, KeyboardInterrupt); every state on disk is a consistent one."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import QueryEvent, RotateEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    landing = config.landing
    landing.root.mkdir(parents=True, exist_ok=True)
    connection = source.connect()
    try:
        _check_source(connection)
        state = load_state(landing.root)
        if state is None:
            state = CaptureState(*_start_position(connection, config.start))
        targets = _present(connection, config.targets)
        streams = _existing_streams(connection, targets, config.heartbeat_seconds > 0)
    finally:
        connection.close()
    if not targets:
        raise RuntimeError(f"the source holds none of the catalog's databases ({', '.join(config.targets)})")
    writer = SegmentWriter(landing, state, streams, say)
    writer.save()
    captured = _captured(targets)
    missing = sorted(set(config.targets) - set(targets))
    say(
        f"capturing {source.host}:{source.port} from {state.log_file}:{state.log_pos} into {landing.root} "
        f"({len(writer.state.streams)} streams, {landing.segment_minutes}-minute segments)"
        + (f"; not on this source: {', '.join(missing)}" if missing else "")
    )
    heartbeat = Heartbeat(source, targets, config.heartbeat_seconds) if config.heartbeat_seconds else None
    reader = BinLogStreamReader(
        connection_settings=source.connection_settings(),
        server_id=config.server_id,
        resume_stream=True,
        blocking=True,
        log_file=state.log_file,
        log_pos=state.log_pos,
        only_schemas=list(targets),
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent, RotateEvent],
    )
    if heartbeat is not None:
        heartbeat.start()
    boundary = (state.log_file, state.log_pos)  # where the transaction being read began
    pending: list[RowsChange] = []
    pending_rows, pending_ms = False, 0
    try:
        for event in reader:
            if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                pending_rows, pending_ms = True, max(pending_ms, int(event.timestamp) * 1000)
                if captured(event.schema, event.table):
                    pending.append(rows_change(event, reader.log_file))
                continue
            if isinstance(event, RotateEvent):
                continue
            if isinstance(event, QueryEvent) and event.query.strip().upper() != "COMMIT":
                if not pending_rows and event.query.strip().upper() != "BEGIN":
                    boundary = (reader.log_file, reader.log_pos)  # a DDL statement is a transaction of its own
                continue
            if pending_rows:  # the transaction commits (XID, or COMMIT for a non-transactional table)
                writer.commit(pending, max(pending_ms, int(event.timestamp) * 1000), boundary)
            pending, pending_rows, pending_ms = [], False, 0
            boundary = (reader.log_file, reader.log_pos)
    finally:
        if heartbeat is not None:
            heartbeat.stopped.set()
        reader.close()
