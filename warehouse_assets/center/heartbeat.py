"""The engine's heartbeat: how the dependency center shows in the UI and in ``warehouse status``.

The engine is a process of its own, not a Dagster sensor, so nothing in Dagster would show whether it is alive. It
writes a heartbeat into the instance's key-value store every few seconds (when it beats, the store's cursor, its
backlog, the plans it still has to submit, its latest submissions) and a last one when it stops. The
``dependency_center`` sensor (:mod:`sensors.center`) reads it on every tick: an alive engine is a skipped tick whose
message is the heartbeat, so each engine-driven asset's Automation tab names the sensor and its ticks read as the
engine's pulse; an engine that stopped, died or hangs makes the tick fail, saying since when. The engine's runs carry
the sensor's name in Dagster's ``dagster/sensor_name`` tag, which the Runs page shows as "Launched by".

The instance's key-value store is where the engine already keeps its external watch, and it is shared by every
process of a deployment (SQLite or PostgreSQL), so the sensor may run on another host than the engine.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

from dagster import DagsterInstance, RunsFilter

from warehouse_assets.catalog import business_time

SENSOR_NAME = "dependency_center"  # the sensor that shows the engine, and the "Launched by" of its runs
KEY = "warehouse/engine/heartbeat"  # in the instance's key-value store
BEAT_SECONDS = 5.0  # how often the engine writes its heartbeat
STALE_SECONDS = 60.0  # a heartbeat older than this: the engine died or hangs
SHOWN = 3  # latest submissions in a tick's message


@dataclass
class Heartbeat:
    """One beat of the engine."""

    at: float  # epoch seconds
    started_at: float
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    cursor: int = -1  # the state store's cursor: the event log's storage id it has read through
    backlog: int = 0  # candidates left for the next rounds (a burst is resolved over several)
    pending: int = 0  # plans recorded whose runs are not created yet
    submitted: int = 0  # runs submitted since the engine started
    latest: list[str] = field(default_factory=list)  # the latest submissions, newest first
    failing: str = ""  # why the last round or submission failed, while it does
    stopped: bool = False  # the engine's last beat, as it stops

    def dump(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def load(cls, raw: str | None) -> Heartbeat | None:
        if not raw:
            return None
        try:
            return cls(**json.loads(raw))
        except (TypeError, ValueError):
            return None  # written by another version: as if none


def beat(instance: DagsterInstance, heartbeat: Heartbeat) -> None:
    instance.run_storage.set_cursor_values({KEY: heartbeat.dump()})


def read(instance: DagsterInstance) -> Heartbeat | None:
    return Heartbeat.load(instance.run_storage.get_cursor_values({KEY}).get(KEY))


class EngineDown(Exception):
    """The engine is not running: no heartbeat, a stopped one, or one too old."""


def engine_status(instance: DagsterInstance, now: float | None = None) -> str:
    """The engine's heartbeat as one line: alive, how far behind the event log its cursor is, its backlog and latest
    submissions. :class:`EngineDown` when it is not running, saying since when and what to do."""
    now = time.time() if now is None else now
    heartbeat = read(instance)
    restart = "nothing starts derived partitions until it runs again (`warehouse dev` starts it, or `warehouse engine`)"
    if heartbeat is None:
        raise EngineDown(f"the dependency center's engine has never run against this instance: {restart}")
    where = f"pid {heartbeat.pid} on {heartbeat.host}"
    if heartbeat.stopped:
        raise EngineDown(f"the engine stopped at {_clock(heartbeat.at)} ({where}): {restart}")
    age = max(0.0, now - heartbeat.at)  # a beat written just after this caller read its clock is of now
    if age > STALE_SECONDS:
        raise EngineDown(
            f"no heartbeat from the engine for {age:.0f} s (last at {_clock(heartbeat.at)}, {where}): it died or "
            f"hangs; {restart}"
        )
    head = instance.event_log_storage.get_maximum_record_id() or -1
    lag = max(0, head - heartbeat.cursor)
    parts = [
        f"engine alive ({where}, up {_span(now - heartbeat.started_at)}, last beat {age:.0f} s ago)",
        f"cursor {lag} event(s) behind the log",
        f"backlog {heartbeat.backlog} candidate(s)",
        f"{heartbeat.pending} run(s) to submit",
        f"{heartbeat.submitted} submitted since start",
    ]
    text = "; ".join(parts)
    if heartbeat.latest:
        text += "; latest: " + "; ".join(heartbeat.latest[:SHOWN])
    if heartbeat.failing:
        text += f"; failing: {heartbeat.failing}"
    return text


CURSOR_CHARS = 95  # what the tick list's Cursor column shows of a cursor before it cuts it with "…"
_WINDOW = re.compile(r"launched \d\d:\d\d:\d\d–(\d\d):(\d\d):(\d\d)([+-]\d\d:\d\d);")


@dataclass(frozen=True)
class TickText:
    """What one tick of the ``dependency_center`` sensor says. Dagster's tick list shows a skipped tick as "0 runs
    requested" (the engine's runs are not the sensor's requests), its skip reason only when hovered, and the tick's
    cursor in a column of its own: ``line`` is that cursor, short enough to be read there whole; ``message`` is the
    skip reason and the tick's log line, the whole heartbeat."""

    line: str
    message: str


def tick_text(instance: DagsterInstance, previous_line: str | None, now: float | None = None) -> TickText:
    """The runs the engine launched since the window the previous tick's line (``previous_line``, its cursor) counted,
    and its heartbeat; :class:`EngineDown` when it is not running.

    Each tick counts the runs created in whole seconds ``[start, end)``, ``end`` the second it is evaluated in, and
    says that window in its line; the next tick starts where it ended, so that no run is counted by two ticks.
    (Dagster tells a sensor when its previous tick started, before it was evaluated: counting from there, a run
    launched while that tick was evaluated was counted by both.) Whole seconds, since SQLite keeps a run's creation
    time to the second. Without a window to start from (the sensor's first tick, or a cursor an older version wrote),
    it counts from the engine's start."""
    now = time.time() if now is None else now
    status = engine_status(instance, now)
    heartbeat = read(instance)
    assert heartbeat is not None  # engine_status raised otherwise
    end = float(int(now))
    start = _previous_end(previous_line, now)
    start = min(float(int(heartbeat.started_at)) if start is None else start, end)
    launched = instance.get_runs_count(
        RunsFilter(
            tags={"dagster/sensor_name": SENSOR_NAME},
            # a microsecond inside each bound, the filters being strict: SQLite keeps "12:00:07" and compares it
            # below "12:00:07.000000" (PostgreSQL keeps microseconds: a run of a window's last one goes uncounted)
            created_after=datetime.fromtimestamp(start, UTC) - _MICROSECOND,
            created_before=datetime.fromtimestamp(end, UTC) - _MICROSECOND,
        )
    )
    window = f"{_clock(start)[11:19]}–{_clock(end)[11:]}"  # the end's offset names the zone of both
    runs = f"{launched} run{'' if launched == 1 else 's'} launched {window}"
    state = "FAILING (hover)" if heartbeat.failing else "alive"  # the reason is in the skip reason shown on hover
    age = max(0.0, now - heartbeat.at)  # a beat written just after the tick read its clock is of now, not "-0 s ago"
    line = f"{runs}; engine {state}, beat {age:.0f} s ago, {heartbeat.pending} to submit"
    if len(line) > CURSOR_CHARS:
        line = line[: CURSOR_CHARS - 1] + "…"
    return TickText(line, f"{runs}; {status}")


_MICROSECOND = timedelta(microseconds=1)


def _previous_end(line: str | None, now: float) -> float | None:
    """The end of the window a tick's line counted (epoch seconds), the latest instant at that clock time not later
    than ``now`` (give or take a minute of clock skew between hosts); None when the line says no window."""
    found = _WINDOW.search(line or "")
    if found is None:
        return None
    hours, minutes, seconds = (int(found[i]) for i in (1, 2, 3))
    zone = datetime.fromisoformat(f"2000-01-01T00:00:00{found[4]}").tzinfo
    local = datetime.fromtimestamp(now, zone)
    end = local.replace(hour=hours, minute=minutes, second=seconds, microsecond=0)
    if end.timestamp() > now + 60:
        end -= timedelta(days=1)
    return end.timestamp()


def _clock(at: float) -> str:
    return business_time(at, "seconds")


def _span(seconds: float) -> str:
    minutes = int(max(0.0, seconds) // 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"
