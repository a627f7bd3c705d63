"""The CDC landing area: ordered Canal flat-message segments per physical shard table.

Layout (what the simulator and the capture connector write, and what a Kafka → file distributor would write
for real sources)::

    <landing>/binlog/<database>/<physical table>/<seq:06d>-<YYYYMMDDTHHMM>.jsonl
    <landing>/binlog/<database>/heartbeat/...               the source database's heartbeat table, the same way
    <landing>/counts/<database>/<physical table>.jsonl      per local 5-minute window:
                                                            {"window": "YYYY-MM-DDTHH:MM", "rows": N}
                                                            (or per local hour: {"hour": "YYYY-MM-DDTHH", ...})

A segment holds the binlog of one micro-batch window (``segment_minutes``, local time in its name), in
binlog order, and is written atomically; an empty segment says the shard had no change in that window,
which is how an idle shard proves its progress. Sequence numbers are contiguous per shard. A stream is one
shard table, named ``<database>.<physical table>``.

The counts are the source's row changes per local window of :data:`COUNT_WINDOW_MINUTES` minutes, keyed by the
window's start, every window written (0 when idle). A source that can only count per hour writes hour lines
instead; completeness is then measured per hour for it, its windows not at all. Readers get one mapping of both
kinds of key (a window key is its hour key plus ``:MM``, so keys sort in time order and ``key[:13]`` is the hour).

This module is the one place the layout is spelled: the writers name their files with :func:`stream_dir`,
:func:`segment_name`, :func:`counts_path`, :func:`count_hour` and :func:`counts_text`; the ingestion reads
them through :class:`Landing`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
from dagster import ConfigurableResource
from pydantic import Field

from resources.settings import DEFAULT_TIMEZONE

BINLOG_DIR = "binlog"
COUNTS_DIR = "counts"
HEARTBEAT_TABLE = "heartbeat"
"""The table every source database keeps a heartbeat in: its segments carry the source's clock."""
_SUFFIX = ".jsonl"
_SEGMENT = re.compile(r"^(?P<seq>\d+)-(?P<start>\d{8}T\d{4})\.jsonl$")
_WINDOW_START = "%Y%m%dT%H%M"  # a segment's window start, local time
COUNT_HOUR = "%Y-%m-%dT%H"  # a counted local hour
COUNT_WINDOW = "%Y-%m-%dT%H:%M"  # a counted local window, by its start
COUNT_WINDOW_MINUTES = 5
_COUNTED_KEY = re.compile(r'"(?:hour|window)"\s*:\s*"([^"]*)"')


# --- names ------------------------------------------------------------------------------------------------------


def stream_name(database: str, table: str) -> str:
    """The stream of one shard table: ``<database>.<physical table>``."""
    return f"{database}.{table}"


def stream_parts(stream: str) -> tuple[str, str]:
    """(database, physical table) of a stream."""
    database, table = stream.split(".", 1)
    return database, table


def stream_dir(root: Path, database: str, table: str) -> Path:
    """The directory holding a shard table's segments."""
    return root / BINLOG_DIR / database / table


def segment_name(seq: int, start: datetime) -> str:
    """The file name of a shard's ``seq``-th segment, whose window starts at ``start`` (local time)."""
    return f"{seq:06d}-{start.strftime(_WINDOW_START)}{_SUFFIX}"


def segment_seq(name: str) -> int | None:
    """The sequence number in a segment's file name; None for a file that is no segment."""
    match = _SEGMENT.match(name)
    return int(match.group("seq")) if match else None


def segment_start(name: str) -> datetime:
    """The window start in a segment's file name (one :func:`segment_seq` accepts), as a naive local time.

    Apart from :func:`segment_seq`: a listing parses only the starts of the segments it keeps."""
    return datetime.strptime(name[name.index("-") + 1 : -len(_SUFFIX)], _WINDOW_START)


def counts_path(root: Path, database: str, table: str) -> Path:
    """The file of a shard table's rows per local hour, as its source counted them."""
    return root / COUNTS_DIR / database / f"{table}{_SUFFIX}"


def count_hour(moment: datetime) -> str:
    """The local hour a counts file keys ``moment`` by (``YYYY-MM-DDTHH``, in ``moment``'s time zone)."""
    return moment.strftime(COUNT_HOUR)


def count_window(moment: datetime) -> str:
    """The local window a counts file keys ``moment`` by (``YYYY-MM-DDTHH:MM``, the window's start, in ``moment``'s
    time zone)."""
    return moment.replace(minute=moment.minute - moment.minute % COUNT_WINDOW_MINUTES).strftime(COUNT_WINDOW)


def is_window_key(key: str) -> bool:
    """Whether a counts key names a window (``YYYY-MM-DDTHH:MM``) rather than an hour (``YYYY-MM-DDTHH``)."""
    return len(key) == len("YYYY-MM-DDTHH:MM")


def counts_text(counts: Mapping[str, int]) -> str:
    """A counts file's content: one ``{"window": ..., "rows": ...}`` line per window (``{"hour": ...}`` per hour
    key), in time order."""
    return "".join(
        json.dumps({"window" if is_window_key(k) else "hour": k, "rows": n}) + "\n" for k, n in sorted(counts.items())
    )


def _counted_key(item: Mapping[str, object], path: Path) -> str:
    key = item.get("window", item.get("hour"))
    if not isinstance(key, str) or len(key) not in (len("YYYY-MM-DDTHH"), len("YYYY-MM-DDTHH:MM")):
        raise ValueError(f"{path}: a counts line needs a window 'YYYY-MM-DDTHH:MM' or an hour 'YYYY-MM-DDTHH': {item}")
    if is_window_key(key) and int(key[-2:]) % COUNT_WINDOW_MINUTES:
        raise ValueError(f"{path}: window {key} does not start on a {COUNT_WINDOW_MINUTES}-minute boundary")
    return key


def read_counts(path: Path) -> dict[str, int]:
    """Rows per window (and per hour, for hour lines) of a counts file (none when it does not exist)."""
    if not path.is_file():
        return {}
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            found[_counted_key(item, path)] = int(item["rows"])
    return found


def has_segments(root: Path) -> bool:
    """Whether a landing area holds any segment file."""
    binlog = root / BINLOG_DIR
    return binlog.exists() and any(p.suffix == _SUFFIX for p in binlog.rglob(f"*{_SUFFIX}"))


# --- reading ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    stream: str  # "<database>.<physical table>"
    seq: int
    start: datetime  # window start, tz-aware (business timezone)
    end: datetime
    path: Path

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Landing:
    root: Path
    timezone: str = DEFAULT_TIMEZONE
    segment_minutes: int = 5

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def streams(self, database: str, tables_pattern: str) -> list[str]:
        """Physical streams of a logical table: ``database.table`` for shard tables matching the pattern."""
        base = self.root / BINLOG_DIR / database
        if not base.is_dir():
            return []
        pattern = re.compile(f"^(?:{tables_pattern})$")
        return sorted(stream_name(database, d.name) for d in base.iterdir() if d.is_dir() and pattern.match(d.name))

    def stream_dir(self, stream: str) -> Path:
        return stream_dir(self.root, *stream_parts(stream))

    def segment_path(self, stream: str, seq: int, start: datetime) -> Path:
        """Where a stream's ``seq``-th segment, of the window starting at ``start`` (local time), is written."""
        return self.stream_dir(stream) / segment_name(seq, start)

    def counts_path(self, stream: str) -> Path:
        return counts_path(self.root, *stream_parts(stream))

    def segments(self, stream: str, after_seq: int = 0) -> list[Segment]:
        """Segments of a stream with seq > ``after_seq``, in order, stopping at the first gap."""
        found: list[Segment] = []
        directory = self.stream_dir(stream)
        if not directory.is_dir():
            return found
        step = timedelta(minutes=self.segment_minutes)
        for entry in directory.iterdir():
            seq = segment_seq(entry.name)
            if seq is None or seq <= after_seq:
                continue
            start = segment_start(entry.name).replace(tzinfo=self.tz)
            found.append(Segment(stream, seq, start, start + step, entry))
        found.sort(key=lambda s: s.seq)
        contiguous: list[Segment] = []
        expected = after_seq + 1
        for segment in found:
            if segment.seq != expected:
                break  # a gap: a segment not yet delivered; never skip over it
            contiguous.append(segment)
            expected += 1
        return contiguous

    def segment(self, stream: str, seq: int) -> Segment | None:
        found = self.segments(stream, seq - 1)
        return found[0] if found else None

    def segment_at(self, stream: str, seq: int) -> Segment | None:
        """The segment with sequence number ``seq`` (one directory probe, no listing)."""
        matches = sorted(self.stream_dir(stream).glob(f"{seq:06d}-*{_SUFFIX}"))
        for path in matches:
            if segment_seq(path.name) == seq:
                start = segment_start(path.name).replace(tzinfo=self.tz)
                return Segment(stream, seq, start, start + timedelta(minutes=self.segment_minutes), path)
        return None

    def first_segment(self, stream: str) -> Segment | None:
        return self.segment_at(stream, 1)

    def heartbeat_clock(self, database: str) -> datetime | None:
        """End of the newest heartbeat segment of a source database (the source's own clock)."""
        segments = self.segments(stream_name(database, HEARTBEAT_TABLE))
        return segments[-1].end if segments else None

    def publishes_counts(self, stream: str) -> bool:
        return self.counts_path(stream).is_file()

    def source_counts(self, stream: str, hours: tuple[str, str] | None = None) -> dict[str, int]:
        """Rows the source produced per local window ("YYYY-MM-DDTHH:MM") or hour ("YYYY-MM-DDTHH"), if it publishes
        counts; only those of the hours ``first <= hour <= last`` of ``hours = (first, last)`` if given (a line of
        another hour is not parsed)."""
        path = self.counts_path(stream)
        counts: dict[str, int] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                found = _COUNTED_KEY.search(line) if hours is not None else None
                if found and hours and not hours[0] <= found.group(1)[:13] <= hours[1]:
                    continue  # another hour: no JSON parse (a tick reads a window of a long history)
                item = json.loads(line)
                key = _counted_key(item, path)
                if hours is None or hours[0] <= key[:13] <= hours[1]:
                    counts[key] = int(item["rows"])
        return counts


def read_lines(segments: Sequence[Segment]) -> pa.Table:
    """The raw lines of segments, with their source position, as an Arrow table.

    Lines are decoded as UTF-8; a line that is not valid UTF-8 keeps its bytes (``raw``) and gets
    ``valid_utf8 = False`` so the ingestion can quarantine it with its position.
    """
    streams: list[str] = []
    segs: list[str] = []
    seqs: list[int] = []
    lines: list[int] = []
    values: list[str | None] = []
    raws: list[bytes | None] = []
    for segment in segments:
        numbered = list(_split_lines(segment.path.read_bytes()))
        streams += [segment.stream] * len(numbered)
        segs += [segment.name] * len(numbered)
        seqs += [segment.seq] * len(numbered)
        for line_no, raw in numbered:
            lines.append(line_no)
            try:
                values.append(raw.decode("utf-8"))
                raws.append(None)
            except UnicodeDecodeError:
                values.append(None)
                raws.append(raw)
    return pa.table(
        {
            "stream": pa.array(streams, pa.string()),
            "segment": pa.array(segs, pa.string()),
            "seq": pa.array(seqs, pa.int64()),
            "line": pa.array(lines, pa.int64()),
            "value": pa.array(values, pa.string()),
            "raw": pa.array(raws, pa.binary()),
        }
    )


def _split_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            yield number, raw


class LandingResource(ConfigurableResource):  # type: ignore[misc]
    """Where CDC segments land. The simulator writes here in the embedded default."""

    root: str = Field(default="data/landing", description="landing directory")
    timezone: str = Field(default=DEFAULT_TIMEZONE, description="business timezone of segment names")
    segment_minutes: int = Field(default=5, description="micro-batch window of one segment")
    simulate_live: bool = Field(default=False, description="extend a simulated landing area as time passes")

    def landing(self) -> Landing:
        return Landing(Path(self.root).expanduser().resolve(), self.timezone, self.segment_minutes)
