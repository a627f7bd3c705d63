"""External producers behind one small interface: what they delivered, and reading it.

Two kinds of producer deliver tables the platform does not compute (declared in ``tables/ext/``):

* ``csv_files`` — ``<location>/dt=YYYY-MM-DD/part-*.csv`` with a header, then a marker file (``_SUCCESS``)
  written last. A delivery is the directory; it has arrived when the marker and at least one data file
  are there. Its content fingerprint is the hash of the data files; its time is the marker's mtime.
* ``delta`` — a Delta table partitioned by ``dt`` that the producer writes on its own schedule. A delivery
  is a ``dt`` touched by a new table version; its fingerprint is the hash of that ``dt``'s rows, its time
  the newest modification time of the ``dt``'s files.

Partition values come from the outside world, so they are validated (design §6.7): :func:`key_problem`.
The sensors in :mod:`sensors.external` decide what to report; downstream SQL reads the reported
partitions through :meth:`ExternalSource.read`, never by polling the producer itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import pyarrow as pa
from dagster import ConfigurableResource
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pydantic import Field

from resources.delta_lake import DeltaStore
from warehouse_assets.catalog import ExternalTable, Table
from warehouse_assets.partitions import BUSINESS_TZ, daily

if TYPE_CHECKING:  # imported in read(): `warehouse why` describes deliveries without PySpark
    from pyspark.sql import DataFrame, SparkSession

_KEY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
DATA_FILES = "part-*.csv"


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


def key_problem(value: str, delivered_at: datetime, now: datetime) -> str | None:
    """Why a delivered partition value cannot be reported (None when it can, now or once its day is over)."""
    if not _KEY.match(value):
        return f"malformed partition value {value!r} (expected dt=YYYY-MM-DD)"
    try:
        start = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=ZoneInfo(daily.timezone))
    except ValueError:
        return f"malformed partition value {value!r}: not a calendar date"
    first = daily.get_first_partition_key()
    if first is not None and value < first:
        return f"partition {value} is before the first partition {first}"
    if start > now:
        return f"partition {value} is in the future (now {now.astimezone(start.tzinfo):%Y-%m-%d %H:%M})"
    if delivered_at < start:
        when = delivered_at.astimezone(start.tzinfo)
        return f"partition {value} is future-dated: delivered at {when:%Y-%m-%d %H:%M}, before its day began"
    return None


def is_due(value: str, now: datetime) -> bool:
    """The day is over, so the partition exists in Dagster's daily partitions definition."""
    return daily.time_window_for_partition_key(value).end <= now


def _sha(parts: Iterable[str | bytes]) -> str:
    digest = hashlib.sha1()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def spark_schema(table: Table) -> str:
    return ", ".join(f"`{name}` {ctype}" for name, ctype in table.columns)


@dataclass(frozen=True)
class ExternalSource:
    """One external table at its producer's location."""

    table: ExternalTable
    root: str  # the external root; the table's location is relative to it (or absolute)

    @property
    def location(self) -> Path:
        loc = Path(self.table.external.location).expanduser()
        return loc if loc.is_absolute() else Path(self.root).expanduser().resolve() / loc

    @property
    def format(self) -> str:
        return self.table.external.format

    # --- deliveries -----------------------------------------------------------------------------------
    def file_deliveries(self) -> list[Delivery]:
        """Every directory with a marker, in name order (directories without a marker are still arriving)."""
        if not self.location.is_dir():
            return []
        found = []
        expected = [name for name, _ in self.table.columns]
        for directory in sorted(p for p in self.location.iterdir() if p.is_dir()):
            marker = directory / self.table.external.marker
            if not marker.is_file():
                continue
            data = sorted(directory.glob(DATA_FILES))
            stat = marker.stat()
            value = directory.name[3:] if directory.name.startswith("dt=") else directory.name
            delivered = datetime.fromtimestamp(stat.st_mtime, ZoneInfo(BUSINESS_TZ))
            signature = _sha(
                [str(stat.st_mtime_ns), *(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in data)]
            )
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

    def delta_table(self, version: int | None = None) -> DeltaTable | None:
        try:
            return DeltaTable(str(self.location), version=version)
        except TableNotFoundError:
            return None

    def delta_deliveries(
        self, since_version: int | None, recheck: Sequence[str] = ()
    ) -> tuple[list[Delivery], int | None]:
        """Partitions touched by versions after ``since_version`` (plus ``recheck``), and the current version."""
        table = self.delta_table()
        if table is None:
            return [], since_version
        version = table.version()
        if version == since_version and not recheck:
            return [], version
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        by_value: dict[str, list[dict[str, object]]] = {}
        for action in actions:
            by_value.setdefault(str(action.get("partition.dt")), []).append(action)
        touched = set(recheck)
        if since_version is None:
            touched |= set(by_value)
        elif version != since_version:
            old = self.delta_table(since_version)
            if old is None:  # the old version is gone (log cleaned up): look at everything
                touched |= set(by_value)
            else:
                before = {str(a["path"]) for a in pa.table(old.get_add_actions(flatten=True)).to_pylist()}
                now_paths = {str(a["path"]) for a in actions}
                touched |= {str(a.get("partition.dt")) for a in actions if a["path"] not in before}
                removed = before - now_paths
                if removed:
                    old_actions = pa.table(old.get_add_actions(flatten=True)).to_pylist()
                    touched |= {str(a.get("partition.dt")) for a in old_actions if a["path"] in removed}
        deliveries = []
        for value in sorted(touched):
            files = by_value.get(value)
            if not files:
                continue  # the partition was removed: nothing to report
            rows = table.to_pyarrow_table(filters=[("dt", "=", value)])
            body = sorted(repr(tuple(r[c] for c in sorted(r) if c != "dt")) for r in rows.to_pylist())
            newest = max(int(str(f["modification_time"])) for f in files)
            deliveries.append(
                Delivery(
                    f"dt={value}",
                    value,
                    datetime.fromtimestamp(newest / 1000, ZoneInfo(BUSINESS_TZ)),
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
            if not (directory / self.table.external.marker).is_file():
                return f"no {self.table.external.marker} marker in {directory} yet (delivery incomplete)"
            if not list(directory.glob(DATA_FILES)):
                return f"{directory} has a marker but no data files (rejected)"
            return f"delivered at {directory}; the sensor reports it on its next tick unless it was rejected"
        table = self.delta_table()
        if table is None:
            return f"the producer's Delta table does not exist yet at {self.location}"
        if not table.to_pyarrow_table(filters=[("dt", "=", value)]).num_rows:
            return f"no dt={value} in the producer's Delta table (version {table.version()})"
        return f"dt={value} is in the producer's Delta table (version {table.version()}); reported on the next tick"

    # --- reading (the compiler's input path) ----------------------------------------------------------
    def read(self, spark: SparkSession, values: Sequence[str]) -> DataFrame:
        """The reported partitions as one DataFrame with the declared columns and ``dt``."""
        from pyspark.sql import functions as F

        if self.format == "delta":
            store = DeltaStore(str(self.location.parent))
            if not store.exists(self.location.name):
                raise FileNotFoundError(f"{self.table.fqn}: no Delta table at {self.location}")
            df, _ = store.read(spark, self.location.name, partitions=[{"dt": v} for v in values])
            return df.select(*[F.col(f"`{name}`") for name, _ in self.table.columns], "dt")
        schema = spark_schema(self.table)
        frames = []
        for value in values:
            paths = sorted(str(p) for p in (self.location / f"dt={value}").glob(DATA_FILES))
            if not paths:
                raise FileNotFoundError(f"{self.table.fqn}: no {DATA_FILES} under {self.location / f'dt={value}'}")
            frame = (
                spark.read.schema(schema)
                .option("header", True)
                .option("enforceSchema", False)
                .option("mode", "FAILFAST")
                .csv(paths)
            )
            frames.append(frame.withColumn("dt", F.lit(value)))
        if not frames:
            return spark.createDataFrame([], schema + ", dt string")
        out = frames[0]
        for frame in frames[1:]:
            out = out.unionByName(frame)
        return out


class ExternalResource(ConfigurableResource):  # type: ignore[misc]
    """Where external producers deliver (the embedded default simulates them under the landing area)."""

    root: str = Field(default="data/landing/external", description="root of the external tables' locations")

    def source(self, table: Table) -> ExternalSource:
        if not isinstance(table, ExternalTable):
            raise ValueError(f"{table.fqn} is not an external table")
        return ExternalSource(table, self.root)
