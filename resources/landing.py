"""The CDC landing area: ordered Canal flat-message segments per physical shard table.

Layout (what the simulator writes, and what a Kafka → file distributor would write for real sources)::

    <landing>/binlog/<database>/<physical table>/<seq:06d>-<YYYYMMDDTHHMM>.jsonl
    <landing>/counts/<database>/<physical table>.jsonl      per local hour: {"hour", "rows"}

A segment holds the binlog of one micro-batch window (``segment_minutes``, local time in its name), in
binlog order, and is written atomically; an empty segment says the shard had no change in that window,
which is how an idle shard proves its progress. Sequence numbers are contiguous per shard.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
from dagster import ConfigurableResource
from pydantic import Field

from resources.settings import DEFAULT_TIMEZONE

_SEGMENT = re.compile(r"^(?P<seq>\d+)-(?P<start>\d{8}T\d{4})\.jsonl$")
HEARTBEAT_TABLE = "heartbeat"
_COUNTED_HOUR = re.compile(r'"hour"\s*:\s*"([^"]*)"')


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
        base = self.root / "binlog" / database
        if not base.is_dir():
            return []
        pattern = re.compile(f"^(?:{tables_pattern})$")
        return sorted(f"{database}.{d.name}" for d in base.iterdir() if d.is_dir() and pattern.match(d.name))

    def stream_dir(self, stream: str) -> Path:
        database, table = stream.split(".", 1)
        return self.root / "binlog" / database / table

    def segments(self, stream: str, after_seq: int = 0) -> list[Segment]:
        """Segments of a stream with seq > ``after_seq``, in order, stopping at the first gap."""
        found: list[Segment] = []
        directory = self.stream_dir(stream)
        if not directory.is_dir():
            return found
        step = timedelta(minutes=self.segment_minutes)
        for entry in directory.iterdir():
            match = _SEGMENT.match(entry.name)
            if not match:
                continue
            seq = int(match.group("seq"))
            if seq <= after_seq:
                continue
            start = datetime.strptime(match.group("start"), "%Y%m%dT%H%M").replace(tzinfo=self.tz)
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
        matches = sorted(self.stream_dir(stream).glob(f"{seq:06d}-*.jsonl"))
        for path in matches:
            match = _SEGMENT.match(path.name)
            if match and int(match.group("seq")) == seq:
                start = datetime.strptime(match.group("start"), "%Y%m%dT%H%M").replace(tzinfo=self.tz)
                return Segment(stream, seq, start, start + timedelta(minutes=self.segment_minutes), path)
        return None

    def first_segment(self, stream: str) -> Segment | None:
        return self.segment_at(stream, 1)

    def heartbeat_clock(self, database: str) -> datetime | None:
        """End of the newest heartbeat segment of a source database (the source's own clock)."""
        segments = self.segments(f"{database}.{HEARTBEAT_TABLE}")
        return segments[-1].end if segments else None

    def publishes_counts(self, stream: str) -> bool:
        database, table = stream.split(".", 1)
        return (self.root / "counts" / database / f"{table}.jsonl").is_file()

    def source_counts(self, stream: str, hours: tuple[str, str] | None = None) -> dict[str, int]:
        """Rows the source produced per local hour ("YYYY-MM-DDTHH"), if it publishes counts; only the hours
        ``first <= hour <= last`` of ``hours = (first, last)`` if given (a line of another hour is not parsed)."""
        import json

        database, table = stream.split(".", 1)
        path = self.root / "counts" / database / f"{table}.jsonl"
        counts: dict[str, int] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                found = _COUNTED_HOUR.search(line) if hours is not None else None
                if found and hours and not hours[0] <= found.group(1) <= hours[1]:
                    continue  # another hour: no JSON parse (a tick reads a window of a long history)
                item = json.loads(line)
                if hours is None or hours[0] <= str(item["hour"]) <= hours[1]:
                    counts[str(item["hour"])] = int(item["rows"])
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
