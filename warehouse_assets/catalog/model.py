"""The warehouse catalog: every table declared once, beside its body, so a table's columns, partitions,
checks and SQL are read and changed in one place.

Two kinds of declaration live under ``warehouse_assets/catalog/tables/<layer>/``:

* ``<name>.yaml`` for ODS tables fed by CDC: the source database and shard tables, the columns with their
  types, the primary key and the column whose local hour partitions the table;
* ``<name>.sql`` for everything else: a YAML header in a leading ``/* --- ... --- */`` comment, then the
  Spark SQL body. The SQL names its inputs as ``layer.table``; the compiler hands it exactly the mapped
  upstream partitions under those names.

* ``ext/<name>.yaml`` for external tables: data produced outside the platform (an ad partner's files, a
  finance system's Delta table). They are never computed here; a sensor per producer reports each
  partition that has truly arrived, and downstream SQL reads them like any other input.

A table's asset group is its layer; ``domain: orders`` puts it in the layer's group of that domain (``dwd_orders``),
for a catalog whose layers are too large to draw as one graph.

Dependencies are found in the SQL itself (the tables it reads); a ``depends_on`` entry only adds offsets
to one of them: ``{set: [-1]}`` (T-1), ``{range: [0, 23]}`` (the 24 hours of a day; a set without
holes such as ``{set: [0, 1, 2, 3, 4, 5, 6]}`` is the same as its range),
``{range: [-29, 0]}`` (a 30-period sliding window). ``ignore_dq: true`` beside the offsets lets the table
run on that dependency even when the upstream partition failed a blocking data-quality check, and
``accept_tainted: true`` even when it is marked tainted (``warehouse taint``).

Data-quality checks sit beside the table, under ``checks:`` (SQL header or ODS yaml); each becomes one
per-partition Dagster asset check, blocking unless it says ``blocking: false``::

    checks:
      unique: [order_id]                  # or `true`: the primary key
      not_null: [order_id, user_id]
      range: {rate: [0, 1], amount: [0, null]}
      references: {user_id: dwd.order_detail.user_id}      # a dependency's mapped partitions
      row_count: {upstream: ods.order, min_ratio: 0.99, max_ratio: 1.0, min_rows: 1}
      anomaly: {metric: sum(gmv), max_deviation: 0.5, periods: 7, min_periods: 3}

Freshness SLAs (``sla:``) say by when a partition must be materialized, after its window ends:
``sla: {within: 1h, grace: 15m}`` (ODS hours) or ``sla: {deadline: "09:00"}`` (by 09:00 the next morning,
local time, for daily tables). Each becomes a non-blocking per-partition ``freshness`` check that the
``freshness_slas`` sensor evaluates once the partition's deadline passes
(:mod:`warehouse_assets.materialize.freshness`).
Late upstream data (changes to a partition already built from) rebuilds a derived partition as its late-data policy
says: ``late_data: {rebuild: every 15m, whole: after 48h, lookback: 3d}`` (the default: ``whole`` for a rebuild
that recomputes the whole partition), ``at_once``, ``daily 06:00`` or ``never``,
per table or, beside a dependency's offsets, for the late data arriving through it
(:class:`warehouse_assets.catalog.policies.LateDataPolicy`). ``incremental: false`` keeps those rebuilds whole even
where the SQL proves each key's rows local to that key (:mod:`warehouse_assets.catalog.key_locality`).
ODS tables also set the completeness threshold of their readiness:
``completeness: {threshold: 0.99995}``.
A table declared at a second site (``site: dc2``) reads and writes that site's lake; it reads the tables replicated
there by their replicas' names (``FROM dc2.dwd_order_detail``, :class:`ReplicaTable`) with the usual mappings.
Each kind of table is its own typed model, validated by pydantic as it is built (also by
``dataclasses.replace``): :class:`OdsTable`, :class:`DerivedTable` and :class:`ExternalTable` on the common
:class:`Table`; a kind's own fields are required on it and absent from the others. Each check kind is one
class of :mod:`warehouse_assets.catalog.checks`.
A table that reads itself needs a negative offset (``{set: [-1]}``, self T-1) and declares its
output ``columns`` (its first partition reads an empty T-1 of that shape); any other cycle is an error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass as plain_dataclass
from dataclasses import field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import InstanceOf, field_validator, model_validator
from pydantic.dataclasses import dataclass

from resources.column_types import is_spark_type
from warehouse_assets.catalog.calendars import MINUTE_PERIODS, PARTITION_COLUMNS, PERIOD_ORDER
from warehouse_assets.catalog.checks import Check, parse_checks
from warehouse_assets.catalog.dependencies import Dependency, TableState, name_tuple
from warehouse_assets.catalog.policies import DEFAULT_LATE_DATA, LateDataPolicy, Sla, usual_delay

LAYERS = ("ext", "ods", "dwd", "dws", "ads")
EXTERNAL_FORMATS = ("csv_files", "delta")
PERIOD_NOUN = {"hourly": "hour", "daily": "day", "weekly": "week", "monthly": "month"}
PERIOD_NOUN |= {period: f"{minutes}-minute window" for period, minutes in MINUTE_PERIODS.items()}
DEFAULT_COMPLETENESS = 0.99995


class CatalogError(ValueError):
    """A table declaration is wrong; the message names the table and its file."""


# the data kinds a table built from SQL may declare (its period of data against its period of processing)
TIME_SERIES, CUMULATIVE, SNAPSHOT, STATIC = "time_series", "cumulative", "snapshot", "static"
DERIVED_KINDS = (TIME_SERIES, CUMULATIVE, SNAPSHOT)
ODS_KINDS = (TIME_SERIES, SNAPSHOT)
# a snapshot ODS table's partition time: the binlog time of the change the row is (its source has no time column)
CHANGED_AT = "_changed_at"
# what the ingestion stores beside an ODS table's declared columns: each row's binlog time and position, the shard
# stream it came from and whether it is a DELETE's tombstone (SQL may read them: a snapshot orders changes by them)
ODS_CHANGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_es", "bigint"),
    ("_pos", "bigint"),
    ("_stream", "string"),
    ("_deleted", "boolean"),
)
# the one partition of a static table, as the dependency center, the gate and ``why`` name it: Dagster's asset is
# unpartitioned (its events carry no partition)
WHOLE = "whole"


@plain_dataclass(frozen=True)
class External:
    """Where and how an external producer delivers a table.

    ``csv_files``: ``<location>/dt=YYYY-MM-DD/part-*.csv`` (with a header) and a ``marker`` file written
    last; ``delta``: a Delta table partitioned by ``dt``. ``location`` is relative to the external root
    (``WAREHOUSE_EXTERNAL_ROOT``) or an absolute path.
    """

    format: str
    location: str
    producer: str = ""
    marker: str = "_SUCCESS"
    # when the producer usually delivers a day, in minutes after the day ends (earliest, latest): what the predicted
    # finish assumes until the table's own deliveries have taught it (a fresh stack, a new source); () unknown
    usual_delay_minutes: tuple[int, ...] = ()

    @classmethod
    def parse(cls, spec: Any) -> External:
        if not isinstance(spec, Mapping) or spec.get("format") not in EXTERNAL_FORMATS or not spec.get("location"):
            raise ValueError(f"external needs format ({' or '.join(EXTERNAL_FORMATS)}) and location")
        return cls(
            format=str(spec["format"]),
            location=str(spec["location"]),
            producer=str(spec.get("producer", "")),
            marker=str(spec.get("marker", "_SUCCESS")),
            usual_delay_minutes=usual_delay(spec.get("usual_delay"), "external.usual_delay"),
        )


_REGION_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# the years over which a region's zone must keep whole-hour offsets: its day must be a run of whole hours
_REGION_YEARS = range(2000, 2101)


def parse_regions(spec: Any) -> tuple[tuple[str, str], ...]:
    """``regions: {shanghai: Asia/Shanghai, los_angeles: America/Los_Angeles}``: each region's name and the IANA
    time zone whose midnights start its days, validated; none when ``spec`` is None."""
    if spec is None or spec == ():
        return ()
    if isinstance(spec, tuple):
        spec = dict(spec)
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError(
            "regions maps each region's name to its IANA time zone, e.g. {los_angeles: America/Los_Angeles}"
        )
    regions = []
    for name, zone in spec.items():
        if not isinstance(name, str) or not _REGION_NAME.match(name):
            raise ValueError(f"region {name!r}: a region is named in lower case, e.g. los_angeles")
        try:
            tz = ZoneInfo(str(zone))
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"region {name}: {zone!r} is not an IANA time zone (e.g. America/Los_Angeles)") from None
        odd = next(
            (
                at
                for year in _REGION_YEARS
                for month in (1, 4, 7, 10)
                if (offset := (at := datetime(year, month, 1, tzinfo=UTC)).astimezone(tz).utcoffset()) is not None
                and offset.total_seconds() % 3600
            ),
            None,
        )
        if odd is not None:
            raise ValueError(
                f"region {name}: {zone} is {odd.astimezone(tz):%z} on {odd:%Y-%m-%d}, not a whole number of hours from "
                "UTC: its days would not be whole hours of the hourly tables it reads"
            )
        regions.append((name, str(zone)))
    return tuple(regions)


# --- the tables: one typed model per kind, validated by pydantic ------------------------------------------------


_SIZE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[KMG]i?B)$", re.IGNORECASE)
_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}
MIN_FILE_SIZE, MAX_FILE_SIZE = 2**20, 2**31  # 1 MiB .. 2 GiB


def byte_size(value: Any, what: str) -> int:
    """``64MB`` / ``512KB`` / ``1GB`` (binary units) or a number of bytes, between 1 MiB and 2 GiB."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a size such as 64MB, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value).strip())
        if not match:
            raise ValueError(f"{what} must be a size such as 64MB or 512KB, got {value!r}")
        size = int(float(match["n"]) * _UNITS[match["unit"][0].lower()])
    if not MIN_FILE_SIZE <= size <= MAX_FILE_SIZE:
        raise ValueError(f"{what} must be between 1MB and 2GB, got {value!r}")
    return size


_TAG_WORD = re.compile(r"[A-Za-z0-9_.-]{1,50}")
_SITE = re.compile(r"[a-z][a-z0-9_]{0,39}")
_DOMAIN = _SITE  # within a Dagster group name


@dataclass(frozen=True, kw_only=True)
class Table:
    """What every table has, whatever builds it. The kinds: :class:`OdsTable`, :class:`DerivedTable`,
    :class:`ExternalTable`."""

    layer: str
    name: str
    period: str
    path: Path
    primary_key: tuple[str, ...] = ()
    description: str = ""
    owner: str = "warehouse-team"
    zorder: tuple[str, ...] = ()  # the columns a partition's files are Z-ordered by, in order
    # the size of the files Z-order writes (Delta's default when None): what a lookup can skip is bounded by the
    # number of files of its partition, so a table sets it from its partitions' size
    zorder_file_size: int | None = None
    deps: tuple[InstanceOf[Dependency], ...] = ()
    # ODS: source columns; external: delivered columns; derived: output (required if self-dependent)
    columns: tuple[tuple[str, str], ...] = ()
    checks: tuple[InstanceOf[Check], ...] = ()
    sla: InstanceOf[Sla] | None = None
    # the labels the Spark pool that builds it must have (``compute: {region: eu}``), in label order
    compute: tuple[tuple[str, str], ...] = ()
    # the sites (``WAREHOUSE_SITES``) each valid partition is replicated to, as one commit on the site's lake
    replicate_to: tuple[str, ...] = ()
    # the site (``WAREHOUSE_SITES``) a table is declared at: it reads and writes that site's lake, and reads the
    # replicas published there (empty: the first site, the lake root)
    site: str = ""
    # the business domain within its layer (``domain: orders``): its asset group is ``<layer>_<domain>``, so no
    # group of a large catalog holds thousands of tables (Dagster draws a group's graph whole)
    domain: str = ""

    @field_validator("domain", mode="before")
    @classmethod
    def _domain(cls, value: Any) -> str:
        if value is None or value == "":
            return ""
        if not isinstance(value, str) or not _DOMAIN.fullmatch(value):
            raise ValueError(f"domain is a lower-case name (letters, digits, '_'; e.g. orders), got {value!r}")
        return value

    @field_validator("replicate_to", mode="before")
    @classmethod
    def _sites(cls, value: Any) -> tuple[str, ...]:
        names = (value,) if isinstance(value, str) else tuple(value or ())
        for site in names:
            if not isinstance(site, str) or not _SITE.fullmatch(site):
                raise ValueError(
                    f"replicate_to names sites in lower case (a site or a list of them, e.g. dc2), got {value!r}"
                )
        return tuple(dict.fromkeys(names))

    @field_validator("site", mode="before")
    @classmethod
    def _site(cls, value: Any) -> str:
        if value is None or value == "":
            return ""
        if not isinstance(value, str) or not _SITE.fullmatch(value):
            raise ValueError(f"site is a site of WAREHOUSE_SITES, named in lower case (e.g. dc2), got {value!r}")
        return value

    @field_validator("primary_key", "zorder", mode="before")
    @classmethod
    def _column_names(cls, value: Any, info: Any) -> tuple[str, ...]:
        return name_tuple(value, info.field_name)

    @field_validator("zorder_file_size", mode="before")
    @classmethod
    def _file_size(cls, value: Any) -> int | None:
        return None if value is None else byte_size(value, "zorder.file_size")

    @model_validator(mode="after")
    def _file_size_needs_columns(self) -> Table:
        if self.zorder_file_size is not None and not self.zorder:
            raise ValueError("zorder.file_size needs zorder.by: the columns the files are Z-ordered by")
        return self

    @field_validator("compute", mode="before")
    @classmethod
    def _compute(cls, value: Any) -> tuple[tuple[str, str], ...]:
        if value is None or isinstance(value, tuple):
            return value or ()
        scalar = (str, int, float)
        if not isinstance(value, Mapping) or not all(isinstance(v, scalar) and str(v) for v in value.values()):
            raise ValueError(f"compute must map compute pool labels to values, e.g. {{region: eu}}, got {value!r}")
        labels = tuple(sorted((str(k), str(v)) for k, v in value.items()))
        for label, setting in labels:  # each becomes an asset tag: Dagster's tags allow these characters only
            if not (_TAG_WORD.fullmatch(label) and _TAG_WORD.fullmatch(setting)):
                raise ValueError(
                    f"compute: {label}: {setting}: labels and values are letters, digits, '-', '_' and '.' (at most 50)"
                )
        return labels

    @field_validator("description", mode="before")
    @classmethod
    def _text(cls, value: Any) -> str:
        return "" if value is None else str(value).strip()

    @field_validator("owner", mode="before")
    @classmethod
    def _owner(cls, value: Any) -> str:
        return str(value)

    @field_validator("columns", mode="before")
    @classmethod
    def _columns(cls, value: Any) -> Any:
        """``columns: {name: spark type}``, validated."""
        if value is None or isinstance(value, tuple):
            return value or ()
        if not isinstance(value, Mapping) or not value:
            raise ValueError("columns must map each column to a Spark type")
        for column, ctype in value.items():
            if not is_spark_type(ctype):
                raise ValueError(f"column {column}: unsupported type {ctype!r}")
        return tuple((str(k), str(v)) for k, v in value.items())

    @field_validator("checks", mode="before")
    @classmethod
    def _checks(cls, value: Any) -> Any:
        return value if isinstance(value, tuple) else parse_checks(value)

    @field_validator("sla", mode="before")
    @classmethod
    def _sla(cls, value: Any) -> Any:
        return value if value is None or isinstance(value, Sla) else Sla.parse(value)

    @model_validator(mode="after")
    def _deadline_is_daily(self) -> Table:
        if self.sla is not None and self.sla.deadline is not None and self.period != "daily":
            raise ValueError("sla.deadline (next morning) is for daily tables; use within for other periods")
        return self

    @cached_property  # read millions of times a day by the dependency center
    def fqn(self) -> str:
        return f"{self.layer}.{self.name}"

    @property
    def key(self) -> list[str]:
        return [self.layer, self.name]

    @property
    def group(self) -> str:
        """Its asset group: the layer, or the layer's group of its domain (``dwd_orders``). Not Dagster's nested
        group (``dwd/orders``): the 1.13 UI's group page does not open one (the '/' in its URL stays encoded). A
        table declared at another site is in that site's group, with the replicas it reads."""
        if self.site:
            return self.site
        return f"{self.layer}_{self.domain}" if self.domain else self.layer

    @property
    def partition_by(self) -> list[str]:
        return PARTITION_COLUMNS[self.period]

    @property
    def state_names(self) -> tuple[str, ...]:
        """The states its partitions pass through, in order (none: a partition is built once, whole)."""
        return ()

    @property
    def is_regional(self) -> bool:
        """Whether each day is one partition per region (:attr:`DerivedTable.regions`)."""
        return False

    @property
    def row_key(self) -> tuple[str, ...]:
        """The columns that identify one row of a partition: the primary key, unless the table keeps each change."""
        return self.primary_key

    @property
    def is_ods(self) -> bool:
        return isinstance(self, OdsTable)

    @property
    def is_external(self) -> bool:
        return isinstance(self, ExternalTable)

    @property
    def is_windows(self) -> bool:
        """An ODS table's completeness windows of a mini-batch period (no data of its own)."""
        return isinstance(self, OdsWindows)

    @property
    def is_source(self) -> bool:
        """Built outside the compiler: ODS (ingestion, and its completeness windows) and external tables (their
        producers)."""
        return not isinstance(self, DerivedTable | StaticTable)

    @property
    def is_static(self) -> bool:
        return isinstance(self, StaticTable)

    @property
    def is_replica(self) -> bool:
        return isinstance(self, ReplicaTable)


@dataclass(frozen=True, kw_only=True)
class OdsTable(Table):
    """An hourly ODS table fed by CDC from ``source_database``'s shard tables (``source_tables``, a regular
    expression), partitioned by the local hour of ``partition_time``.

    ``kind: time_series`` (the default) mirrors the source: one live row per key, in the hour of its
    ``partition_time``. ``kind: snapshot`` is for a source without a time column (a product catalogue, a config
    table): each change is kept as a row of its own, ``_changed_at`` (its binlog time) its partition time, a
    DELETE as a row flagged ``_deleted``; a daily snapshot table consolidates the hours into the picture of each
    day (yesterday's picture, then the day's changes, the newest per key)."""

    source_database: str
    source_tables: str
    partition_time: str
    kind: str = TIME_SERIES
    heartbeat_idle_grace_minutes: int | None = None  # heartbeats may prove an idle shard (see readiness)
    completeness_threshold: float = DEFAULT_COMPLETENESS  # ingested rows / source rows for a ready hour
    # when its hours usually land, in minutes after the hour ends (earliest, latest): what the predicted finish
    # assumes until the table's own hours have taught it (a fresh stack); () unknown
    usual_delay_minutes: tuple[int, ...] = ()

    @property
    def changelog(self) -> bool:
        """Each change is a row of its own (a DELETE too, flagged ``_deleted``): a snapshot's change stream."""
        return self.kind == SNAPSHOT

    @property
    def row_key(self) -> tuple[str, ...]:
        # a snapshot's changelog holds each change of a key: one row per key and binlog time
        return (*self.primary_key, CHANGED_AT) if self.changelog else self.primary_key

    @field_validator("heartbeat_idle_grace_minutes", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"idle_proof.heartbeat_grace_minutes must be a non-negative integer, got {value!r}")
        return value

    @field_validator("usual_delay_minutes", mode="before")
    @classmethod
    def _usual_delay(cls, value: Any) -> tuple[int, ...]:
        return usual_delay(value)

    @field_validator("completeness_threshold", mode="before")
    @classmethod
    def _threshold(cls, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ValueError(f"completeness.threshold must be a fraction in [0, 1] (e.g. 0.99995), got {value!r}")
        return float(value)

    @model_validator(mode="after")
    def _hourly_on_declared_columns(self) -> OdsTable:
        if self.layer != "ods" or self.period != "hourly":
            raise ValueError("YAML declarations are for hourly ODS tables fed by CDC")
        if self.kind not in ODS_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ODS_KINDS)} for an ODS table, got {self.kind!r}")
        if (self.kind == SNAPSHOT) != (self.partition_time == CHANGED_AT):
            raise ValueError(f"{CHANGED_AT} is the partition time of a snapshot ODS table, and only of one")
        if not self.primary_key:
            raise ValueError("primary_key is required: the columns that identify a source row")
        columns = dict(self.columns)
        if not columns:
            raise ValueError("columns must map each column to a Spark type")
        for col in [*self.primary_key, self.partition_time]:
            if col not in columns:
                raise ValueError(f"{col!r} is not a declared column")
        if columns[self.partition_time] != "timestamp":
            raise ValueError(f"partition_time {self.partition_time!r} must be a timestamp column")
        return self


@dataclass(frozen=True, kw_only=True)
class DerivedTable(Table):
    """A table the compiler builds from its Spark SQL (``sql``), on the mapped partitions of ``deps``."""

    sql: str
    states: tuple[InstanceOf[TableState], ...] = ()  # in order; empty: a partition is built once, whole
    # the static tables it reads, whole, in every partition (no offsets: a static table has no partitions)
    references: tuple[InstanceOf[Dependency], ...] = ()
    # time_series: each partition from its inputs; cumulative: each adds its own data to the previous partition's,
    # starting afresh at the start of each ``resets`` period (Monday, Monday + Tuesday, ...)
    kind: str = TIME_SERIES
    resets: str | None = None
    late_data: InstanceOf[LateDataPolicy] = DEFAULT_LATE_DATA
    # false: late data rebuilds whole partitions even where the SQL proves a key's rows local to that key
    # (:mod:`warehouse_assets.catalog.key_locality`), e.g. while a key-scoped rebuild of the table is distrusted
    incremental: bool = True
    # regional days: each day is one partition per region, [its zone's midnight, the next one), built as soon as that
    # region's day is complete; (region, IANA zone) in declared order
    regions: tuple[tuple[str, str], ...] = ()

    @field_validator("regions", mode="before")
    @classmethod
    def _regions(cls, value: Any) -> tuple[tuple[str, str], ...]:
        return parse_regions(value)

    @property
    def is_regional(self) -> bool:
        return bool(self.regions)

    @property
    def partition_by(self) -> list[str]:
        return [*PARTITION_COLUMNS[self.period], "region"] if self.regions else PARTITION_COLUMNS[self.period]

    def zone_of(self, region: str) -> str:
        """The IANA zone of ``region``; ValueError naming the table's regions when it has no such region."""
        for name, zone in self.regions:
            if name == region:
                return zone
        known = ", ".join(name for name, _ in self.regions) or "none: it is not regional"
        raise ValueError(f"{self.fqn} has no region {region!r} (its regions: {known})")

    @model_validator(mode="after")
    def _regional_days(self) -> DerivedTable:
        if not self.regions:
            return self
        if self.period != "daily":
            raise ValueError(
                f"regions split a day into one partition per region: period must be daily, got {self.period}"
            )
        if self.kind != TIME_SERIES or self.states:
            raise ValueError("a table with regions is a time series without states: each region's day from its hours")
        if self.sla is not None:
            raise ValueError("a table with regions declares no sla: its deadline is a business day's, not a region's")
        if any(check.kind == "anomaly" for check in self.checks):
            raise ValueError(
                "a table with regions declares no anomaly check: its trailing periods are business days, not a region's"
            )
        for dep in self.deps:
            if dep.table == self.fqn or dep.start_offset is not None or dep.weak or dep.within is not None:
                raise ValueError(
                    f"a table with regions reads each region's day from exactly the hours in it: {dep.table} takes no "
                    "offsets, mode or within"
                )
        return self

    @field_validator("incremental", mode="before")
    @classmethod
    def _incremental(cls, value: Any) -> bool:
        if not isinstance(value, bool):  # pydantic would take "no" or 0 for false: a typo must not pass as one
            raise ValueError(
                f"incremental must be true or false (false: late data rebuilds whole partitions), got {value!r}"
            )
        return value

    @field_validator("late_data", mode="before")
    @classmethod
    def _late_data(cls, value: Any) -> Any:
        return (
            DEFAULT_LATE_DATA
            if value is None
            else value
            if isinstance(value, LateDataPolicy)
            else (LateDataPolicy.parse(value))
        )

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(state.name for state in self.states)

    def late_data_policy(self, dep: Dependency) -> LateDataPolicy:
        """The policy of late data arriving through ``dep``: its own, or the table's."""
        return dep.late_data if dep.late_data is not None else self.late_data

    @model_validator(mode="after")
    def _kind(self) -> DerivedTable:
        if self.kind not in DERIVED_KINDS:
            raise ValueError(
                f"kind must be one of {', '.join(DERIVED_KINDS)} for a table built from SQL, got {self.kind!r}"
            )
        if self.kind == SNAPSHOT:
            own = [dep for dep in self.deps if dep.table == self.fqn]
            if [(d.start_offset, d.end_offset, d.within) for d in own] != [(-1, -1, None)] or not self.primary_key:
                raise ValueError(
                    f"kind snapshot is the whole picture each {PERIOD_NOUN[self.period]}: the previous "
                    f"partition's ({self.fqn}: {{set: [-1]}}) with the period's changes applied, the newest per "
                    "primary_key (declare it)"
                )
        if self.kind != CUMULATIVE:
            if self.resets is not None:
                raise ValueError("resets is for kind: cumulative (the period its accumulation starts afresh)")
            return self
        coarser = [p for p, order in PERIOD_ORDER.items() if order > PERIOD_ORDER[self.period]]
        if self.resets not in coarser:
            raise ValueError(
                f"kind cumulative needs resets: the period whose start begins a new accumulation, one of "
                f"{', '.join(coarser) or '(none: nothing is coarser than ' + self.period + ')'}; got {self.resets!r}"
            )
        own = [dep for dep in self.deps if dep.table == self.fqn]
        if [(d.start_offset, d.end_offset) for d in own] != [(-1, -1)]:
            raise ValueError(
                f"kind cumulative adds each {self.period} partition to the previous one: the table reads itself at "
                f"T-1 ({self.fqn}: {{set: [-1]}})"
            )
        if own[0].within not in (None, self.resets):
            raise ValueError(f"{self.fqn} resets {self.resets}: its T-1 cannot be within {own[0].within}")
        return self

    @model_validator(mode="after")
    def _self_dependency(self) -> DerivedTable:
        own = [dep for dep in self.deps if dep.table == self.fqn]
        for dep in own:
            if dep.end_offset is None or dep.end_offset >= 0:
                raise ValueError(
                    f"{self.fqn} reads itself: a self-dependency needs a negative offset, e.g. {{set: [-1]}} for T-1"
                )
            if dep.weak:
                raise ValueError(
                    f"{self.fqn} reads itself: a self-dependency is strict (mode {dep.mode} would build a partition "
                    "on a T-1 that is not there)"
                )
        if own and self.states:
            raise ValueError(f"{self.fqn} reads itself: a self-dependent table has no states (each day builds on T-1)")
        if own and not self.columns:
            raise ValueError(
                f"{self.fqn} depends on itself: declare its output columns (columns: {{name: type}}), "
                "the first partition reads an empty T-1 of that shape"
            )
        return self


@dataclass(frozen=True, kw_only=True)
class StaticTable(Table):
    """The static kind: one unpartitioned reference table (country codes, a city's tier), whose SQL spells
    out its rows (``SELECT * FROM VALUES ...``). Dagster's asset has no partitions; it is built when it has never
    been, and again when its SQL changes (the ``static_tables`` sensor). Every partition of a table that reads it
    needs it built and valid (the gate: its one partition, :data:`WHOLE`); a new version is read by the partitions
    built from then on, and the ones built before are rebuilt only when it is marked tainted (the taint closure
    holds every partition of the tables that read it)."""

    sql: str

    @property
    def kind(self) -> str:
        return STATIC

    @property
    def partition_by(self) -> list[str]:
        return []

    @model_validator(mode="after")
    def _reference_data(self) -> StaticTable:
        if self.period != STATIC:
            raise ValueError("a static table has no period: its one partition is the whole table (drop period)")
        if self.deps:
            raise ValueError(
                "a static table holds reference data its SQL spells out (SELECT * FROM VALUES ...): it reads no "
                f"table, got {', '.join(d.table for d in self.deps)}"
            )
        for what, value in (("sla", self.sla), ("zorder", self.zorder), ("checks", self.checks)):
            if value:
                raise ValueError(f"{what} is for partitioned tables; a static table is one small whole table")
        if not self.columns:
            raise ValueError("a static table declares its columns (columns: {name: type}), which its SQL must produce")
        return self


@dataclass(frozen=True, kw_only=True)
class ExternalTable(Table):
    """A daily table produced outside the platform, reported by its producer's sensor as it arrives."""

    external: InstanceOf[External]

    @field_validator("external", mode="before")
    @classmethod
    def _external(cls, value: Any) -> Any:
        return value if isinstance(value, External) else External.parse(value)

    @model_validator(mode="after")
    def _daily_with_columns(self) -> ExternalTable:
        if self.period != "daily":
            raise ValueError(f"external tables are delivered per day: period must be daily, got {self.period!r}")
        if not self.columns:
            raise ValueError("columns must map each column to a Spark type")
        if any(column == "dt" for column, _ in self.columns):
            raise ValueError("dt is the partition column of every external table; do not declare it")
        return self


@dataclass(frozen=True, kw_only=True)
class OdsWindows(Table):
    """The completeness of an ODS table per window of a mini-batch period (``5min``, ``10min``, ``15min``): a partition
    is reported once every 5-minute window in it is complete (ingested >= the ODS table's threshold of the source's
    count). It holds no data of its own: a mini-batch table's reads of ``source`` (the ODS table) wait for it. The
    catalog adds one for each ODS table and mini-batch period some table reads it at (:func:`windows_name`)."""

    source: str  # the ODS table, layer.name

    @model_validator(mode="after")
    def _minute_period(self) -> OdsWindows:
        if self.period not in MINUTE_PERIODS:
            raise ValueError(f"completeness windows are of a mini-batch period ({', '.join(MINUTE_PERIODS)})")
        return self


@dataclass(frozen=True, kw_only=True)
class ReplicaTable(Table):
    """A table replicated to a site (``replicate_to``), as the tables declared at that site read it: named
    ``<site>.<layer>_<table>`` (``dc2.dwd_order_detail``), with the source's period, columns and key, and the source as
    its one dependency, partition for partition. Its asset is ``<site>/<layer>/<table>``; its partitions are reported
    by the replica runs (the ``replication`` sensor's) and its data is at ``<layer>/<table>`` under the site's lake
    root. The catalog adds one for each replicated table and site (:func:`replica_name`)."""

    source: str  # the replicated table, layer.name

    @property
    def key(self) -> list[str]:
        return [self.site, *self.source.split(".")]

    @model_validator(mode="after")
    def _at_a_site(self) -> ReplicaTable:
        if not self.site or len(self.deps) != 1 or self.deps[0].table != self.source:
            raise ValueError("a replica is at a site and depends on its source alone")
        return self


def replica_name(site: str, source: str) -> str:
    """The replica of ``source`` at ``site`` as SQL names it: ``dwd.order_detail`` at dc2, ``dc2.dwd_order_detail``."""
    return f"{site}." + source.replace(".", "_", 1)


def windows_name(ods: str, period: str) -> str:
    """The completeness windows of the ODS table ``ods`` at ``period``: ``ods.order`` at 5min is ``ods.order_5min``."""
    return f"{ods}_{period}"


@plain_dataclass
class Catalog:
    tables: dict[str, Table] = field(default_factory=dict)

    def __getitem__(self, fqn: str) -> Table:
        return self.tables[fqn]

    def __iter__(self) -> Iterator[Table]:
        return iter(self.tables.values())

    def ods(self) -> list[OdsTable]:
        return [t for t in self.tables.values() if isinstance(t, OdsTable)]

    def externals(self) -> list[ExternalTable]:
        return [t for t in self.tables.values() if isinstance(t, ExternalTable)]

    def windows(self, ods: str | None = None) -> list[OdsWindows]:
        """The completeness windows (of the ODS table ``ods`` only, if given)."""
        return [t for t in self.tables.values() if isinstance(t, OdsWindows) and ods in (None, t.source)]

    def replicas(self) -> list[ReplicaTable]:
        return [t for t in self.tables.values() if isinstance(t, ReplicaTable)]

    def derived(self) -> list[DerivedTable]:
        return [t for t in self.tables.values() if isinstance(t, DerivedTable)]

    def statics(self) -> list[StaticTable]:
        return [t for t in self.tables.values() if isinstance(t, StaticTable)]

    def referencing(self, fqn: str) -> list[DerivedTable]:
        """The tables that read the static table ``fqn``."""
        return [t for t in self.derived() if any(ref.table == fqn for ref in t.references)]

    def lookup(self, name: str) -> Table:
        """The table named ``name`` (``layer.table``); :class:`UnknownTable` suggesting the closest names if none is."""
        if name in self.tables:
            return self.tables[name]
        raise UnknownTable(name, self.closest(name), sorted(self.tables))

    def closest(self, name: str, n: int = 3) -> list[str]:
        """The table names closest to ``name``: those whose table part is ``name`` (the layer left out), then the
        nearest spellings of either the whole name or its table part."""
        wanted = name.strip().lower()
        exact = [fqn for fqn, t in self.tables.items() if t.name.lower() == wanted.rsplit(".", 1)[-1]]
        by_name: dict[str, str] = {t.name: fqn for fqn, t in self.tables.items()}
        near = difflib.get_close_matches(wanted, list(self.tables), n=n, cutoff=0.6)
        bare = wanted.rsplit(".", 1)[-1]
        near += [by_name[m] for m in difflib.get_close_matches(bare, list(by_name), n=n, cutoff=0.6)]
        return list(dict.fromkeys([*exact, *near]))[:n]


class UnknownTable(ValueError):
    """A table name the catalog does not know, with the closest names it does."""

    def __init__(self, name: str, suggestions: list[str], known: list[str]):
        self.name, self.suggestions = name, suggestions
        layered = "" if "." in name else " (tables are named layer.table)"
        hint = f"did you mean {' or '.join(suggestions)}?" if suggestions else f"known tables: {', '.join(known)}"
        super().__init__(f"unknown table {name!r}{layered}: {hint}")
