"""External producers behind one small interface: what they delivered, and reading it.

Two kinds of producer deliver tables the platform does not compute (declared in ``tables/ext/``):

* ``csv_files`` — ``<location>/dt=YYYY-MM-DD/part-*.csv`` with a header, then a marker file (``_SUCCESS``)
  written last. A delivery is the directory; it has arrived when the marker and at least one data file
  are there. Its content fingerprint is the hash of the data files; its time is the marker's mtime.
* ``delta`` — a Delta table partitioned by ``dt`` that the producer writes on its own schedule. A delivery
  is a ``dt`` touched by a new table version; its fingerprint is the hash of that ``dt``'s rows, its time
  the newest modification time of the ``dt``'s files.

Partition values come from the outside world, so they are validated before any is reported (malformed, not a
calendar date, before the first partition, in the future, delivered before its day began): :func:`key_problem`.
The sensors in :mod:`sensors.external` decide what to report; downstream SQL reads the reported
partitions through :meth:`ExternalSource.read`, never by polling the producer itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from dagster import ConfigurableResource
from pydantic import Field

from resources.column_types import spark_schema
from resources.delta_lake import DeltaStore

if TYPE_CHECKING:  # imported in read(): `warehouse why` describes deliveries without PySpark
    from pyspark.sql import DataFrame, SparkSession

DATA_FILES = "part-*.csv"
DAY_FORMAT = "%Y-%m-%d"  # an external table's partition value: its local day


@dataclass(frozen=True)
class Delivery:
    """One delivery of one partition, as found at the producer (nothing validated yet)."""

    name: str  # where it was found: the directory name, or "dt=<value>" of a Delta table
    value: str  # the partition value as delivered (may be malformed)
    delivered_at: datetime  # marker mtime / newest file modification time, aware
    fingerprint: str = ""  # content hash: a re-delivery with other content has another fingerprint
    signature: str = ""  # cheap stat signature: unchanged means nothing new to look at
    files: int = 0
    rows: int = 0
    delta_version: int | None = None
    problem: str | None = None  # a defect of the delivery itself (marker without data, wrong header)


def _shape(partition_format: str) -> re.Pattern[str]:
    """What a well-formed value of a partition format looks like: the digits it prints (``%Y`` → 4 digits)."""
    widths = {"%Y": r"\d{4}", "%m": r"\d{2}", "%d": r"\d{2}", "%H": r"\d{2}"}
    pattern = re.escape(partition_format)
    for directive, digits in widths.items():
        pattern = pattern.replace(re.escape(directive), digits)
    return re.compile(f"^{pattern}$")


def key_problem(
    value: str,
    delivered_at: datetime,
    now: datetime,
    *,
    timezone: str,
    first: str | None,
    partition_format: str = DAY_FORMAT,
) -> str | None:
    """Why a delivered partition value cannot be reported (None when it can, now or once its day is over).

    ``timezone`` is the business timezone of the days, ``first`` the first partition (None: no lower bound)."""
    if not _shape(partition_format).match(value):
        return f"malformed partition value {value!r} (expected dt=YYYY-MM-DD)"
    try:
        start = datetime.strptime(value, partition_format).replace(tzinfo=ZoneInfo(timezone))
    except ValueError:
        return f"malformed partition value {value!r}: not a calendar date"
    if first is not None and value < first:
        return f"partition {value} is before the first partition {first}"
    if start > now:
        return f"partition {value} is in the future (now {now.astimezone(start.tzinfo):%Y-%m-%d %H:%M})"
    if delivered_at < start:
        when = delivered_at.astimezone(start.tzinfo)
        return f"partition {value} is future-dated: delivered at {when:%Y-%m-%d %H:%M}, before its day began"
    return None


def is_due(value: str, now: datetime, timezone: str, partition_format: str = DAY_FORMAT) -> bool:
    """The day is over, so the partition exists in Dagster's daily partitions definition."""
    start = datetime.strptime(value, partition_format).replace(tzinfo=ZoneInfo(timezone))
    return start + timedelta(days=1) <= now  # wall-clock: the next local midnight, also across DST


def _sha(parts: Iterable[str | bytes]) -> str:
    digest = hashlib.sha1()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ExternalSource:
    """One external table at its producer's location: plain values, so the resource knows no catalog."""

    name: str  # the table, "ext.<name>"
    declared_location: str  # relative to ``root``, or absolute
    root: str  # the external root
    format: str  # "csv_files" or "delta"
    columns: tuple[tuple[str, str], ...]  # (name, Spark type), as the producer delivers them
    timezone: str  # the business timezone: delivery times are shown in it, and days end in it
    first: str | None = None  # the first partition: a value before it is rejected
    marker: str = "_SUCCESS"
    producer: str = ""
    partition_format: str = DAY_FORMAT

    @property
    def key(self) -> list[str]:
        return self.name.split(".")

    @property
    def location(self) -> Path:
        loc = Path(self.declared_location).expanduser()
        return loc if loc.is_absolute() else Path(self.root).expanduser().resolve() / loc

    def key_problem(self, value: str, delivered_at: datetime, now: datetime) -> str | None:
        return key_problem(
            value, delivered_at, now, timezone=self.timezone, first=self.first, partition_format=self.partition_format
        )

    def is_due(self, value: str, now: datetime) -> bool:
        return is_due(value, now, self.timezone, self.partition_format)

    def _store(self) -> tuple[DeltaStore, str]:
        """The producer's Delta table, through the Delta layer: (a store at its parent, its key)."""
        return DeltaStore(str(self.location.parent)), self.location.name

    # --- deliveries -----------------------------------------------------------------------------------
    def file_deliveries(self, decided: Mapping[str, str] | None = None) -> list[Delivery]:
        """Every directory with a marker, in name order (directories without a marker are still arriving), but
        those whose signature (marker and file stats) is already ``decided``: their files are not read again."""
        if not self.location.is_dir():
            return []
        found = []
        expected = [name for name, _ in self.columns]
        for directory in sorted(p for p in self.location.iterdir() if p.is_dir()):
            marker = directory / self.marker
            if not marker.is_file():
                continue
            data = sorted(directory.glob(DATA_FILES))
            stat = marker.stat()
            value = directory.name[3:] if directory.name.startswith("dt=") else directory.name
            delivered = datetime.fromtimestamp(stat.st_mtime, ZoneInfo(self.timezone))
            signature = _sha(
                [str(stat.st_mtime_ns), *(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in data)]
            )
            if decided is not None and decided.get(directory.name) == signature:
                continue
            if not data:
                found.append(
                    Delivery(directory.name, value, delivered, signature=signature, problem="marker without data files")
                )
                continue
            rows, problem, contents = 0, None, []
            for path in data:
                content = path.read_bytes()
                contents.append(path.name.encode() + b"\0" + content)
                lines = [line for line in content.decode("utf-8", errors="replace").splitlines() if line.strip()]
                header = lines[0].split(",") if lines else []
                if header != expected:
                    problem = f"{path.name}: header {header} is not the declared columns {expected}"
                rows += max(0, len(lines) - 1)
            found.append(
                Delivery(
                    directory.name,
                    value,
                    delivered,
                    fingerprint=_sha(contents),
                    signature=signature,
                    files=len(data),
                    rows=rows,
                    problem=problem,
                )
            )
        return found

    def delta_deliveries(
        self, since_version: int | None, recheck: Sequence[str] = ()
    ) -> tuple[list[Delivery], int | None]:
        """Partitions touched by versions after ``since_version`` (plus ``recheck``), and the current version."""
        store, key = self._store()
        version = store.version(key)
        if version is None:
            return [], since_version
        if version == since_version and not recheck:
            return [], version
        actions, _ = store.live_files(key, version=version)
        by_value: dict[str, list[dict[str, object]]] = {}
        for action in actions:
            by_value.setdefault(str(action.get("partition.dt")), []).append(action)
        touched = set(recheck)
        if since_version is None:
            touched |= set(by_value)
        elif version != since_version:
            if store.version(key, at=since_version) is None:  # the old version is gone: look at everything
                touched |= set(by_value)
            else:
                old_actions, _ = store.live_files(key, version=since_version)
                # a file is its path and the rows its deletion vector marks deleted (a DELETE may only add one)
                before = {(str(a["path"]), a["deleted_records"]) for a in old_actions}
                now_files = {(str(a["path"]), a["deleted_records"]) for a in actions}
                touched |= {
                    str(a.get("partition.dt")) for a in actions if (a["path"], a["deleted_records"]) not in before
                }
                removed = before - now_files
                if removed:
                    touched |= {
                        str(a.get("partition.dt")) for a in old_actions if (a["path"], a["deleted_records"]) in removed
                    }
        deliveries = []
        for value in sorted(touched):
            files = by_value.get(value)
            if not files:
                continue  # the partition was removed: nothing to report
            rows, _ = store.read_rows(key, [{"dt": value}], version=version)
            body = sorted(repr(tuple(r[c] for c in sorted(r) if c != "dt")) for r in rows.to_pylist())
            newest = max(int(str(f["modification_time"])) for f in files)
            deliveries.append(
                Delivery(
                    f"dt={value}",
                    value,
                    datetime.fromtimestamp(newest / 1000, ZoneInfo(self.timezone)),
                    fingerprint=_sha(body),
                    signature=f"v{version}",
                    files=len(files),
                    rows=rows.num_rows,
                    delta_version=version,
                )
            )
        return deliveries, version

    def describe(self, value: str) -> str:
        """What the producer holds for one partition right now (for "why is this waiting")."""
        if self.format == "csv_files":
            directory = self.location / f"dt={value}"
            if not directory.is_dir():
                return f"nothing delivered yet at {directory}"
            if not (directory / self.marker).is_file():
                return f"no {self.marker} marker in {directory} yet (delivery incomplete)"
            if not list(directory.glob(DATA_FILES)):
                return f"{directory} has a marker but no data files (rejected)"
            return f"delivered at {directory}; the sensor reports it on its next tick unless it was rejected"
        store, key = self._store()
        version = store.version(key)
        if version is None:
            return f"the producer's Delta table does not exist yet at {self.location}"
        if not store.read_rows(key, [{"dt": value}], version=version)[0].num_rows:
            return f"no dt={value} in the producer's Delta table (version {version})"
        return f"dt={value} is in the producer's Delta table (version {version}); reported on the next tick"

    # --- reading (the compiler's input path) ----------------------------------------------------------
    def read(self, spark: SparkSession, values: Sequence[str]) -> DataFrame:
        """The reported partitions as one DataFrame with the declared columns and ``dt``."""
        from pyspark.sql import functions as F

        # nothing to read (a weak dependency past its deadline): its shape, whether the producer has begun or not
        if not values:
            return spark.createDataFrame([], spark_schema(self.columns) + ", dt string")
        if self.format == "delta":
            store, key = self._store()
            if not store.exists(key):
                raise FileNotFoundError(f"{self.name}: no Delta table at {self.location}")
            df, _ = store.read(spark, key, partitions=[{"dt": v} for v in values])
            return df.select(*[F.col(f"`{name}`") for name, _ in self.columns], "dt")
        schema = spark_schema(self.columns)
        frames = []
        for value in values:
            paths = sorted(str(p) for p in (self.location / f"dt={value}").glob(DATA_FILES))
            if not paths:
                raise FileNotFoundError(f"{self.name}: no {DATA_FILES} under {self.location / f'dt={value}'}")
            frame = (
                spark.read.schema(schema)
                .option("header", True)
                .option("enforceSchema", False)
                .option("mode", "FAILFAST")
                .csv(paths)
            )
            frames.append(frame.withColumn("dt", F.lit(value)))
        out = frames[0]
        for frame in frames[1:]:
            out = out.unionByName(frame)
        return out


class ExternalResource(ConfigurableResource):  # type: ignore[misc]
    """Where external producers deliver (the embedded default simulates them under the landing area)."""

    root: str = Field(default="data/landing/external", description="root of the external tables' locations")

    def source(
        self,
        name: str,
        location: str,
        format: str,
        columns: Sequence[tuple[str, str]],
        *,
        timezone: str,
        first: str | None = None,
        marker: str = "_SUCCESS",
        producer: str = "",
    ) -> ExternalSource:
        """The external table ``name`` delivered at ``location`` (relative to the root, or absolute), with daily
        partitions from ``first`` in ``timezone``."""
        return ExternalSource(name, location, self.root, format, tuple(columns), timezone, first, marker, producer)
