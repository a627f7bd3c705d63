"""The warehouse catalog: every table declared once, beside its body (design AD-3).

Two kinds of declaration live under ``warehouse_assets/tables/<layer>/``:

* ``<name>.yaml`` for ODS tables fed by CDC: the source database and shard tables, the columns with their
  types, the primary key and the column whose local hour partitions the table;
* ``<name>.sql`` for everything else: a YAML header in a leading ``/* --- ... --- */`` comment, then the
  Spark SQL body. The SQL names its inputs as ``layer.table``; the compiler hands it exactly the mapped
  upstream partitions under those names.

Dependencies are found in the SQL itself (seed 000's lineage); a ``depends_on`` entry only adds offsets
in the seeds' vocabulary: ``{set: [-1]}`` (T-1), ``{range: [0, 23]}`` (the 24 hours of a day),
``{range: [-29, 0]}`` (a 30-period sliding window). A table that reads itself needs a negative offset
(``{set: [-1]}``, self T-1) and declares its output ``columns`` (its first partition reads an empty T-1
of that shape); any other cycle is an error.
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
LAYERS = ("ods", "dwd", "dws", "ads")
PERIOD_ORDER = {"hourly": 0, "daily": 1, "weekly": 2, "monthly": 3}
SPARK_TYPES = {"bigint", "int", "tinyint", "smallint", "string", "timestamp", "date", "double", "boolean"}
_DECIMAL = re.compile(r"^decimal\(\d+,\s*\d+\)$")
_HEADER = re.compile(r"^\s*/\*\s*---\s*\n(?P<yaml>.*?)\n\s*---\s*\*/", re.DOTALL)


class CatalogError(ValueError):
    """A table declaration is wrong; the message names the table and its file."""


@dataclass(frozen=True)
class Dependency:
    """One upstream table with the offsets that refine the default mapping (None = default)."""

    table: str
    start_offset: int | None = None
    end_offset: int | None = None

    @property
    def key(self) -> list[str]:
        return self.table.split(".")


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


@dataclass
class Catalog:
    tables: dict[str, Table] = field(default_factory=dict)

    def __getitem__(self, fqn: str) -> Table:
        return self.tables[fqn]

    def __iter__(self) -> Any:
        return iter(self.tables.values())

    def ods(self) -> list[Table]:
        return [t for t in self.tables.values() if t.is_ods]

    def derived(self) -> list[Table]:
        return [t for t in self.tables.values() if not t.is_ods]


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


def _parse_offsets(spec: Any, path: Path, dep: str) -> tuple[int | None, int | None]:
    if spec is None or spec == {}:
        return None, None
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise _fail(path, f"dependency {dep}: expected one of {{set: [n]}}, {{range: [a, b]}}, got {spec!r}")
    kind, values = next(iter(spec.items()))
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise _fail(path, f"dependency {dep}: {kind} needs a list of integers, got {values!r}")
    if kind == "set":
        if len(values) != 1:
            raise _fail(path, f"dependency {dep}: a set maps one offset per dependency, got {values}")
        return values[0], values[0]
    if kind == "range":
        if len(values) != 2 or values[0] > values[1]:
            raise _fail(path, f"dependency {dep}: a range is [start, end] with start <= end, got {values}")
        return values[0], values[1]
    raise _fail(path, f"dependency {dep}: unknown offset kind {kind!r} (use set or range)")


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
    deps = tuple(Dependency(dep, *_parse_offsets(declared.get(dep), path, dep)) for dep in sorted(reads))
    columns = _columns(header.get("columns"), path) if header.get("columns") is not None else ()
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
        columns=columns,
    )


def _columns(columns: Any, path: Path) -> tuple[tuple[str, str], ...]:
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
    columns = dict(_columns(header.get("columns"), path))
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
    return Table(
        layer=layer,
        name=name,
        period=period,
        path=path,
        primary_key=pk,
        heartbeat_idle_grace_minutes=grace,
        description=str(header.get("description", "")).strip(),
        owner=str(header.get("owner", "warehouse-team")),
        zorder=_as_tuple(header.get("zorder"), path, "zorder"),
        source_database=str(source["database"]),
        source_tables=str(source["tables"]),
        columns=tuple(columns.items()),
        partition_time=str(partition_time),
    )


def load_catalog(root: Path = TABLES_DIR) -> Catalog:
    """Load and validate every declaration under ``root``."""
    catalog = Catalog()
    files: Iterable[Path] = sorted([*root.glob("*/*.sql"), *root.glob("*/*.yaml")])
    for path in files:
        table = _load_ods(path) if path.suffix == ".yaml" else _load_sql(path)
        if table.fqn in catalog.tables:
            raise _fail(path, f"{table.fqn} is declared twice (also in {catalog.tables[table.fqn].path})")
        catalog.tables[table.fqn] = table
    _validate_graph(catalog)
    return catalog


def _validate_graph(catalog: Catalog) -> None:
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
