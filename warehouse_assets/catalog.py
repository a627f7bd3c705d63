"""The warehouse catalog: every table declared once, beside its body (design AD-3).

Two kinds of declaration live under ``warehouse_assets/tables/<layer>/``:

* ``<name>.yaml`` for ODS tables fed by CDC: the source database and shard tables, the columns with their
  types, the primary key and the column whose local hour partitions the table;
* ``<name>.sql`` for everything else: a YAML header in a leading ``/* --- ... --- */`` comment, then the
  Spark SQL body. The SQL names its inputs as ``layer.table``; the compiler hands it exactly the mapped
  upstream partitions under those names.

* ``ext/<name>.yaml`` for external tables: data produced outside the platform (an ad partner's files, a
  finance system's Delta table). They are never computed here; a sensor per producer reports each
  partition that has truly arrived, and downstream SQL reads them like any other input.

Dependencies are found in the SQL itself (seed 000's lineage); a ``depends_on`` entry only adds offsets
in the seeds' vocabulary: ``{set: [-1]}`` (T-1), ``{range: [0, 23]}`` (the 24 hours of a day; a set without
holes such as ``{set: [0, 1, 2, 3, 4, 5, 6]}`` is the same as its range),
``{range: [-29, 0]}`` (a 30-period sliding window). ``ignore_dq: true`` beside the offsets lets the table
run on that dependency even when the upstream partition failed a blocking data-quality check (seed 002).

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
``freshness_slas`` sensor evaluates once the partition's deadline passes (:mod:`warehouse_assets.freshness`).
ODS tables also set the completeness threshold of their readiness:
``completeness: {threshold: 0.99995}``.
A table that reads itself needs a negative offset (``{set: [-1]}``, self T-1) and declares its
output ``columns`` (its first partition reads an empty T-1 of that shape); any other cycle is an error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlglot
import yaml
from sqlglot import exp

from warehouse_assets.partitions import BY_PERIOD, PARTITION_COLUMNS

TABLES_DIR = Path(__file__).parent / "tables"
LAYERS = ("ext", "ods", "dwd", "dws", "ads")
EXTERNAL_FORMATS = ("csv_files", "delta")
PERIOD_ORDER = {"hourly": 0, "daily": 1, "weekly": 2, "monthly": 3}
SPARK_TYPES = {"bigint", "int", "tinyint", "smallint", "string", "timestamp", "date", "double", "boolean"}
_DECIMAL = re.compile(r"^decimal\(\d+,\s*\d+\)$")
_HEADER = re.compile(r"^\s*/\*\s*---\s*\n(?P<yaml>.*?)\n\s*---\s*\*/", re.DOTALL)


CHECK_KINDS = ("unique", "not_null", "range", "references", "row_count", "anomaly")
DEFAULT_COMPLETENESS = 0.99995
_DURATION = re.compile(r"^(?P<n>\d+)\s*(?P<unit>[mhd])$")
_CLOCK = re.compile(r"^(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)$")
_METRIC = re.compile(r"^(?:rows|count\(\*\)|(?P<fn>sum|avg|min|max)\((?P<col>[A-Za-z_][A-Za-z0-9_]*)\))$")


class CatalogError(ValueError):
    """A table declaration is wrong; the message names the table and its file."""


@dataclass(frozen=True)
class Check:
    """One data-quality check of a table: ``kind`` and its parameters (validated at load time)."""

    kind: str
    params: tuple[tuple[str, Any], ...] = ()
    blocking: bool = True

    @property
    def name(self) -> str:
        return self.kind

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)


@dataclass(frozen=True)
class Sla:
    """A freshness SLA: a partition is due ``within`` after its window ends (plus ``grace``), or by a local
    ``deadline`` (HH:MM) the day after its window ends."""

    within_minutes: int | None = None
    grace_minutes: int = 0
    deadline: str | None = None  # "HH:MM"

    def describe(self) -> str:
        if self.deadline is not None:
            return f"by {self.deadline} the next morning" + (
                f" + {self.grace_minutes} min" if self.grace_minutes else ""
            )
        return f"within {self.within_minutes} min of the window end + {self.grace_minutes} min grace"


@dataclass(frozen=True)
class Dependency:
    """One upstream table with the offsets that refine the default mapping (None = default)."""

    table: str
    start_offset: int | None = None
    end_offset: int | None = None
    ignore_dq: bool = False  # run even when the upstream partition failed a blocking check (seed 002)

    @property
    def key(self) -> list[str]:
        return self.table.split(".")


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Table:
    layer: str
    name: str
    period: str
    path: Path
    primary_key: tuple[str, ...] = ()
    description: str = ""
    owner: str = "warehouse-team"
    zorder: tuple[str, ...] = ()
    deps: tuple[Dependency, ...] = ()
    sql: str | None = None
    # ODS only
    source_database: str | None = None
    source_tables: str | None = None
    columns: tuple[tuple[str, str], ...] = ()  # ODS: source columns; derived: output (required if self-dependent)
    partition_time: str | None = None
    heartbeat_idle_grace_minutes: int | None = None  # ODS: heartbeats may prove an idle shard (see readiness)
    external: External | None = None  # external tables only
    completeness_threshold: float = DEFAULT_COMPLETENESS  # ODS: ingested rows / source rows for a ready hour
    checks: tuple[Check, ...] = ()
    sla: Sla | None = None

    @property
    def fqn(self) -> str:
        return f"{self.layer}.{self.name}"

    @property
    def key(self) -> list[str]:
        return [self.layer, self.name]

    @property
    def partition_by(self) -> list[str]:
        return PARTITION_COLUMNS[self.period]

    @property
    def is_ods(self) -> bool:
        return self.layer == "ods"

    @property
    def is_external(self) -> bool:
        return self.external is not None

    @property
    def is_source(self) -> bool:
        """Built outside the compiler: ODS (ingestion) and external tables (their producers)."""
        return self.is_ods or self.is_external


@dataclass
class Catalog:
    tables: dict[str, Table] = field(default_factory=dict)

    def __getitem__(self, fqn: str) -> Table:
        return self.tables[fqn]

    def __iter__(self) -> Any:
        return iter(self.tables.values())

    def ods(self) -> list[Table]:
        return [t for t in self.tables.values() if t.is_ods]

    def externals(self) -> list[Table]:
        return [t for t in self.tables.values() if t.is_external]

    def derived(self) -> list[Table]:
        return [t for t in self.tables.values() if not t.is_source]


def _fail(path: Path, message: str) -> CatalogError:
    return CatalogError(f"{path}: {message}")


def _as_tuple(value: Any, path: Path, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise _fail(path, f"{what} must be a list of column names")


def _parse_dependency(spec: Any, path: Path, dep: str) -> Dependency:
    ignore_dq = False
    if isinstance(spec, Mapping) and "ignore_dq" in spec:
        spec = dict(spec)
        flag = spec.pop("ignore_dq")
        if not isinstance(flag, bool):
            raise _fail(path, f"dependency {dep}: ignore_dq must be true or false, got {flag!r}")
        ignore_dq = flag
    start, end = _parse_offsets(spec, path, dep)
    return Dependency(dep, start, end, ignore_dq)


def _parse_offsets(spec: Any, path: Path, dep: str) -> tuple[int | None, int | None]:
    if spec is None or spec == {}:
        return None, None
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise _fail(path, f"dependency {dep}: expected one of {{set: [n, ...]}}, {{range: [a, b]}}, got {spec!r}")
    kind, values = next(iter(spec.items()))
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise _fail(path, f"dependency {dep}: {kind} needs a list of integers, got {values!r}")
    if kind == "set":
        return _contiguous_set(values, path, dep)
    if kind == "range":
        if len(values) != 2 or values[0] > values[1]:
            raise _fail(path, f"dependency {dep}: a range is [start, end] with start <= end, got {values}")
        return values[0], values[1]
    raise _fail(path, f"dependency {dep}: unknown offset kind {kind!r} (use set or range)")


def _contiguous_set(values: list[int], path: Path, dep: str) -> tuple[int, int]:
    """Seed 000 writes a week on its days as ``set: [0, 1, 2, 3, 4, 5, 6]``: a set without holes is that range.

    A set with holes (``[-7, -1]``) has no Dagster partition mapping: a time-window mapping is one window.
    """
    offsets = sorted(set(values))
    if not offsets:
        raise _fail(path, f"dependency {dep}: a set needs at least one offset, got []")
    holes = sorted(set(range(offsets[0], offsets[-1] + 1)) - set(offsets))
    if holes:
        raise _fail(
            path,
            f"dependency {dep}: set {values} has holes (missing {holes}); a dependency maps one contiguous"
            f" window of periods, so use a set without holes, a range [{offsets[0]}, {offsets[-1]}], or"
            f" read the periods you need from a table that has them",
        )
    return offsets[0], offsets[-1]


def _header(path: Path, text: str) -> tuple[dict[str, Any], str]:
    match = _HEADER.match(text)
    if not match:
        raise _fail(path, "missing the /* --- yaml --- */ header with table, period and description")
    try:
        header = yaml.safe_load(match.group("yaml")) or {}
    except yaml.YAMLError as exc:
        raise _fail(path, f"invalid YAML header: {exc}") from exc
    if not isinstance(header, dict):
        raise _fail(path, "the header must be a YAML mapping")
    return header, text[match.end() :].strip()


def _identity(header: Mapping[str, Any], path: Path) -> tuple[str, str, str]:
    fqn = header.get("table")
    if not isinstance(fqn, str) or fqn.count(".") != 1:
        raise _fail(path, f"'table' must be layer.name, got {fqn!r}")
    layer, name = fqn.split(".")
    if layer not in LAYERS:
        raise _fail(path, f"unknown layer {layer!r} (expected one of {', '.join(LAYERS)})")
    if path.parent.name != layer or path.stem != name:
        raise _fail(path, f"table {fqn} must live in tables/{layer}/{name}{path.suffix}")
    period = header.get("period")
    if period not in BY_PERIOD:
        raise _fail(path, f"period must be one of {', '.join(BY_PERIOD)}, got {period!r}")
    return layer, name, period


def referenced_tables(sql: str) -> set[str]:
    """The ``layer.table`` names a SQL body reads (CTE names excluded)."""
    tree = sqlglot.parse_one(sql, read="spark")
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    found = set()
    for table in tree.find_all(exp.Table):
        if table.name in ctes and not table.db:
            continue
        if table.db:
            found.add(f"{table.db}.{table.name}")
        else:
            found.add(table.name)
    return found


def _load_sql(path: Path) -> Table:
    header, body = _header(path, path.read_text())
    layer, name, period = _identity(header, path)
    if layer == "ext":
        raise _fail(path, "external tables are declared in YAML (tables/ext/<name>.yaml); nothing here computes them")
    if not body:
        raise _fail(path, "the SQL body is empty")
    try:
        reads = referenced_tables(body)
    except sqlglot.errors.ParseError as exc:
        raise _fail(path, f"the SQL does not parse: {exc}") from exc
    declared = header.get("depends_on") or {}
    if not isinstance(declared, Mapping):
        raise _fail(path, "depends_on must map layer.table to its offsets")
    for dep in declared:
        if dep not in reads:
            raise _fail(path, f"{layer}.{name} declares a dependency on {dep} that its SQL never reads")
    deps = tuple(_parse_dependency(declared.get(dep), path, dep) for dep in sorted(reads))
    columns = _declared_columns(header.get("columns"), path) if header.get("columns") is not None else ()
    fqn = f"{layer}.{name}"
    for dep in deps:
        if dep.table == fqn and (dep.end_offset is None or dep.end_offset >= 0):
            raise _fail(
                path,
                f"{fqn} reads itself: a self-dependency needs a negative offset, e.g. {{set: [-1]}} for T-1",
            )
    if any(dep.table == fqn for dep in deps) and not columns:
        raise _fail(
            path,
            f"{fqn} depends on itself: declare its output columns (columns: {{name: type}}), "
            "the first partition reads an empty T-1 of that shape",
        )
    return Table(
        layer=layer,
        name=name,
        period=period,
        path=path,
        primary_key=_as_tuple(header.get("primary_key"), path, "primary_key"),
        description=str(header.get("description", "")).strip(),
        owner=str(header.get("owner", "warehouse-team")),
        zorder=_as_tuple(header.get("zorder"), path, "zorder"),
        deps=deps,
        sql=body,
        checks=_parse_checks(header.get("checks"), path, period),
        sla=_parse_sla(header.get("sla"), path, period),
        columns=columns,
    )


def _columns(value: Any, path: Path, kind: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _fail(path, f"checks.{kind} needs a list of column names, got {value!r}")
    return list(value)


def _number(value: Any, path: Path, what: str, *, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, f"{what} must be a number, got {value!r}")
    return float(value)


def _parse_checks(spec: Any, path: Path, period: str) -> tuple[Check, ...]:
    """``checks:`` → validated :class:`Check` objects (table-level validation waits for the whole catalog)."""
    if spec is None:
        return ()
    if not isinstance(spec, Mapping):
        raise _fail(path, f"checks must map a check kind ({', '.join(CHECK_KINDS)}) to its parameters")
    checks = []
    for kind, value in spec.items():
        if kind not in CHECK_KINDS:
            raise _fail(path, f"unknown check {kind!r} (known: {', '.join(CHECK_KINDS)})")
        blocking = True
        if isinstance(value, Mapping) and "blocking" in value:
            value = dict(value)
            blocking = value.pop("blocking")
            if not isinstance(blocking, bool):
                raise _fail(path, f"checks.{kind}.blocking must be true or false")
        params: dict[str, Any] = {}
        if kind == "unique":
            params["columns"] = None if value is True else tuple(_columns(value, path, kind))
        elif kind == "not_null":
            params["columns"] = tuple(_columns(value, path, kind))
        elif kind == "range":
            if not isinstance(value, Mapping) or not value:
                raise _fail(path, "checks.range maps columns to [low, high] (null for an open end)")
            bounds = []
            for column, pair in value.items():
                if not isinstance(pair, list) or len(pair) != 2:
                    raise _fail(path, f"checks.range.{column} must be [low, high], got {pair!r}")
                low = _number(pair[0], path, f"checks.range.{column} low")
                high = _number(pair[1], path, f"checks.range.{column} high")
                if low is not None and high is not None and low > high:
                    raise _fail(path, f"checks.range.{column}: low {low} is above high {high}")
                bounds.append((str(column), low, high))
            params["bounds"] = tuple(bounds)
        elif kind == "references":
            if not isinstance(value, Mapping) or not value:
                raise _fail(path, "checks.references maps a column to layer.table.column")
            refs = []
            for column, target in value.items():
                if not isinstance(target, str) or target.count(".") != 2:
                    raise _fail(path, f"checks.references.{column} must be layer.table.column, got {target!r}")
                table, _, ref_column = target.rpartition(".")
                refs.append((str(column), table, ref_column))
            params["refs"] = tuple(refs)
        elif kind == "row_count":
            if not isinstance(value, Mapping):
                raise _fail(path, "checks.row_count needs {upstream, min_ratio, max_ratio} and/or min_rows")
            unknown = set(value) - {"upstream", "min_ratio", "max_ratio", "min_rows"}
            if unknown:
                raise _fail(path, f"checks.row_count: unknown parameter(s) {sorted(unknown)}")
            params["upstream"] = value.get("upstream")
            params["min_ratio"] = _number(value.get("min_ratio"), path, "checks.row_count.min_ratio")
            params["max_ratio"] = _number(value.get("max_ratio"), path, "checks.row_count.max_ratio")
            params["min_rows"] = _number(value.get("min_rows"), path, "checks.row_count.min_rows")
            ratios = params["min_ratio"] is not None or params["max_ratio"] is not None
            if ratios and not params["upstream"]:
                raise _fail(path, "checks.row_count: a ratio needs the upstream table it is measured against")
        elif kind == "anomaly":
            if not isinstance(value, Mapping) or "metric" not in value:
                raise _fail(path, "checks.anomaly needs metric (rows or sum(col)/avg(col)/min(col)/max(col))")
            metric = str(value["metric"]).replace(" ", "")
            if not _METRIC.match(metric):
                raise _fail(path, f"checks.anomaly.metric {metric!r}: use rows, sum(col), avg(col), min(col), max(col)")
            deviation = _number(value.get("max_deviation", 0.5), path, "checks.anomaly.max_deviation")
            periods, minimum = value.get("periods", 7), value.get("min_periods", 3)
            if not isinstance(periods, int) or not isinstance(minimum, int) or not 1 <= minimum <= periods:
                raise _fail(path, "checks.anomaly: periods and min_periods are integers, 1 <= min_periods <= periods")
            params.update(metric=metric, max_deviation=deviation, periods=periods, min_periods=minimum)
        checks.append(Check(str(kind), tuple(params.items()), blocking))
    return tuple(checks)


def _minutes(value: Any, path: Path, what: str) -> int:
    match = _DURATION.match(str(value).strip()) if value is not None else None
    if not match:
        raise _fail(path, f"{what} must be a duration like 90m, 1h or 2d, got {value!r}")
    return int(match.group("n")) * {"m": 1, "h": 60, "d": 1440}[match.group("unit")]


def _parse_sla(spec: Any, path: Path, period: str) -> Sla | None:
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or ("within" in spec) == ("deadline" in spec):
        raise _fail(path, "sla needs exactly one of within (e.g. 1h) or deadline (HH:MM the next morning)")
    grace = _minutes(spec.get("grace", "0m"), path, "sla.grace")
    if "deadline" in spec:
        deadline = str(spec["deadline"])
        if not _CLOCK.match(deadline):
            raise _fail(path, f"sla.deadline must be a local time HH:MM, got {deadline!r}")
        if period != "daily":
            raise _fail(path, "sla.deadline (next morning) is for daily tables; use within for other periods")
        return Sla(deadline=deadline, grace_minutes=grace)
    return Sla(within_minutes=_minutes(spec["within"], path, "sla.within"), grace_minutes=grace)


def _declared_columns(columns: Any, path: Path) -> tuple[tuple[str, str], ...]:
    """``columns: {name: spark type}`` of a declaration, validated."""
    if not isinstance(columns, Mapping) or not columns:
        raise _fail(path, "columns must map each column to a Spark type")
    for column, ctype in columns.items():
        if ctype not in SPARK_TYPES and not _DECIMAL.match(str(ctype)):
            raise _fail(path, f"column {column}: unsupported type {ctype!r}")
    return tuple((str(k), str(v)) for k, v in columns.items())


def _load_ods(path: Path) -> Table:
    try:
        header = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise _fail(path, f"invalid YAML: {exc}") from exc
    layer, name, period = _identity(header, path)
    if layer != "ods" or period != "hourly":
        raise _fail(path, "YAML declarations are for hourly ODS tables fed by CDC")
    source = header.get("source") or {}
    if not isinstance(source, Mapping) or not source.get("database") or not source.get("tables"):
        raise _fail(path, "source needs database and tables (a regular expression of the shard tables)")
    columns = dict(_declared_columns(header.get("columns"), path))
    pk = _as_tuple(header.get("primary_key"), path, "primary_key")
    partition_time = str(header.get("partition_time"))
    for col in [*pk, partition_time]:
        if col not in columns:
            raise _fail(path, f"{col!r} is not a declared column")
    if columns[partition_time] != "timestamp":
        raise _fail(path, f"partition_time {partition_time!r} must be a timestamp column")
    idle_proof = header.get("idle_proof") or {}
    grace = idle_proof.get("heartbeat_grace_minutes") if isinstance(idle_proof, Mapping) else None
    if grace is not None and (not isinstance(grace, int) or grace < 0):
        raise _fail(path, f"idle_proof.heartbeat_grace_minutes must be a non-negative integer, got {grace!r}")
    completeness = header.get("completeness") or {}
    threshold = completeness.get("threshold", DEFAULT_COMPLETENESS) if isinstance(completeness, Mapping) else None
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
        raise _fail(path, f"completeness.threshold must be a fraction in [0, 1] (e.g. 0.99995), got {threshold!r}")
    return Table(
        layer=layer,
        name=name,
        period=period,
        path=path,
        primary_key=pk,
        heartbeat_idle_grace_minutes=grace,
        completeness_threshold=float(threshold),
        # evaluated in batches by the ods_quality_checks sensor (sensors/ods_checks.py)
        checks=tuple(_parse_checks(header.get("checks"), path, period)),
        sla=_parse_sla(header.get("sla"), path, period),
        description=str(header.get("description", "")).strip(),
        owner=str(header.get("owner", "warehouse-team")),
        zorder=_as_tuple(header.get("zorder"), path, "zorder"),
        source_database=str(source["database"]),
        source_tables=str(source["tables"]),
        columns=tuple(columns.items()),
        partition_time=str(partition_time),
    )


def _load_external(path: Path) -> Table:
    try:
        header = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise _fail(path, f"invalid YAML: {exc}") from exc
    layer, name, period = _identity(header, path)
    if period != "daily":
        raise _fail(path, f"external tables are delivered per day: period must be daily, got {period!r}")
    spec = header.get("external") or {}
    if not isinstance(spec, Mapping) or spec.get("format") not in EXTERNAL_FORMATS or not spec.get("location"):
        raise _fail(path, f"external needs format ({' or '.join(EXTERNAL_FORMATS)}) and location")
    columns = _declared_columns(header.get("columns"), path)
    if any(column == "dt" for column, _ in columns):
        raise _fail(path, "dt is the partition column of every external table; do not declare it")
    return Table(
        layer=layer,
        name=name,
        period=period,
        path=path,
        primary_key=_as_tuple(header.get("primary_key"), path, "primary_key"),
        description=str(header.get("description", "")).strip(),
        owner=str(header.get("owner", "warehouse-team")),
        columns=columns,
        external=External(
            format=str(spec["format"]),
            location=str(spec["location"]),
            producer=str(spec.get("producer", "")),
            marker=str(spec.get("marker", "_SUCCESS")),
        ),
    )


def load_catalog(root: Path = TABLES_DIR) -> Catalog:
    """Load and validate every declaration under ``root``."""
    catalog = Catalog()
    files: Iterable[Path] = sorted([*root.glob("*/*.sql"), *root.glob("*/*.yaml")])
    for path in files:
        if path.suffix == ".sql":
            table = _load_sql(path)
        elif path.parent.name == "ext":
            table = _load_external(path)
        else:
            table = _load_ods(path)
        if table.fqn in catalog.tables:
            raise _fail(path, f"{table.fqn} is declared twice (also in {catalog.tables[table.fqn].path})")
        catalog.tables[table.fqn] = table
    _validate_graph(catalog)
    return catalog


def _validate_checks(catalog: Catalog) -> None:
    for table in catalog:
        deps = {d.table for d in table.deps}
        for check in table.checks:
            if check.kind == "unique" and check.param("columns") is None and not table.primary_key:
                raise _fail(table.path, f"{table.fqn}: checks.unique: true needs a primary_key")
            if check.kind == "references":
                for column, ref, _ in check.param("refs"):
                    if ref not in deps:
                        raise _fail(
                            table.path,
                            f"{table.fqn}: checks.references.{column} points at {ref}, which is not a dependency "
                            f"(references are checked against a dependency's mapped partitions)",
                        )
            if check.kind == "row_count" and check.param("upstream") and check.param("upstream") not in deps:
                raise _fail(
                    table.path, f"{table.fqn}: checks.row_count.upstream {check.param('upstream')} is not a dependency"
                )
            if check.kind == "anomaly" and table.is_ods:
                raise _fail(table.path, f"{table.fqn}: anomaly checks are for derived tables")


def _validate_graph(catalog: Catalog) -> None:
    _validate_checks(catalog)
    for table in catalog.derived():
        for dep in table.deps:
            if dep.table not in catalog.tables:
                raise _fail(table.path, f"{table.fqn} reads {dep.table}, which is not in the catalog")
            upstream = catalog.tables[dep.table]
            if PERIOD_ORDER[upstream.period] > PERIOD_ORDER[table.period]:
                raise _fail(
                    table.path,
                    f"{table.fqn} ({table.period}) cannot depend on the coarser {dep.table} ({upstream.period})",
                )
            crosses = upstream.period != table.period and dep.start_offset is not None
            if crosses and not _covers_whole_period(table.period, upstream.period, dep):
                raise _fail(
                    table.path,
                    f"{table.fqn}: offsets across periods must cover the whole {table.period} period of {dep.table}"
                    f" (range: [0, 23] for a day's hours, [0, 6] for a week's days; omit the offsets for the"
                    f" default roll-up, e.g. a month on its days)",
                )
    # cycles (a self-dependency is declared explicitly and excluded here)
    state: dict[str, int] = {}

    def visit(fqn: str, trail: list[str]) -> None:
        if state.get(fqn) == 2:
            return
        if state.get(fqn) == 1:
            cycle = " -> ".join([*trail[trail.index(fqn) :], fqn])
            raise _fail(catalog.tables[fqn].path, f"dependency cycle: {cycle}")
        state[fqn] = 1
        for dep in catalog.tables[fqn].deps:
            if dep.table != fqn:
                visit(dep.table, [*trail, fqn])
        state[fqn] = 2

    for fqn in catalog.tables:
        visit(fqn, [])


def _covers_whole_period(child: str, parent: str, dep: Dependency) -> bool:
    """``range: [0, 23]`` of hours under a day (or [0, 6] days under a week) is the default roll-up."""
    span = {("daily", "hourly"): 23, ("weekly", "daily"): 6}.get((child, parent))
    return span is not None and dep.start_offset == 0 and dep.end_offset == span
