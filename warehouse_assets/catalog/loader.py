"""Loading the catalog: every declaration file under ``tables/<layer>/`` read, typed and validated as a graph.

A file that cannot be loaded raises a :class:`CatalogError` naming the file and what is wrong in it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import sqlglot
import yaml
from pydantic import ValidationError
from sqlglot import exp

from warehouse_assets.catalog.calendars import BY_PERIOD, MINUTE_PERIODS, PERIOD_ORDER
from warehouse_assets.catalog.checks import CheckSpecError
from warehouse_assets.catalog.dependencies import LATEST, Dependency, parse_states
from warehouse_assets.catalog.model import (
    CHANGED_AT,
    CUMULATIVE,
    DEFAULT_COMPLETENESS,
    LAYERS,
    ODS_KINDS,
    PERIOD_NOUN,
    SNAPSHOT,
    STATIC,
    TIME_SERIES,
    Catalog,
    CatalogError,
    DerivedTable,
    ExternalTable,
    OdsTable,
    OdsWindows,
    ReplicaTable,
    StaticTable,
    Table,
    replica_name,
    windows_name,
)

TABLES_DIR = Path(__file__).parent / "tables"
# libyaml's safe loader (in PyYAML's wheels) parses ~10x faster than the pure-Python one: at 10,000 declarations
# that is most of the catalog's load time
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_HEADER = re.compile(r"^\s*/\*\s*---\s*\n(?P<yaml>.*?)\n\s*---\s*\*/", re.DOTALL)

_T = TypeVar("_T", bound=Table)
# the declaration's wording of a field, for pydantic's own errors (a missing field, a wrong type)
_DECLARED_AS = {
    "source_database": "source.database",
    "source_tables": "source.tables",
    "heartbeat_idle_grace_minutes": "idle_proof.heartbeat_grace_minutes",
    "completeness_threshold": "completeness.threshold",
    "usual_delay_minutes": "usual_delay",
    "zorder_file_size": "zorder.file_size",
}


def _fail(path: Path, message: str) -> CatalogError:
    return CatalogError(f"{path}: {message}")


def _build(kind: type[_T], path: Path, fields: Mapping[str, Any]) -> _T:
    """The typed table of ``kind``, or a :class:`CatalogError` naming the file and what is wrong."""
    try:
        return kind(path=path, **fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "value_error":
            raise _fail(path, str(error["ctx"]["error"])) from None
        where = ".".join(_DECLARED_AS.get(str(part), str(part)) for part in error["loc"])
        raise _fail(path, f"{where}: {error['msg']}, got {error.get('input')!r}") from None
    except (CheckSpecError, ValueError) as exc:  # raised outside pydantic's validators
        raise _fail(path, str(exc)) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        header = yaml.load(path.read_text(), Loader=_YAML_LOADER) or {}
    except yaml.YAMLError as exc:
        raise _fail(path, f"invalid YAML: {exc}") from exc
    if not isinstance(header, dict):
        raise _fail(path, "the declaration must be a YAML mapping")
    return header


def _header(path: Path, text: str) -> tuple[dict[str, Any], str]:
    match = _HEADER.match(text)
    if not match:
        raise _fail(path, "missing the /* --- yaml --- */ header with table, period and description")
    try:
        header = yaml.load(match.group("yaml"), Loader=_YAML_LOADER) or {}
    except yaml.YAMLError as exc:
        raise _fail(path, f"invalid YAML header: {exc}") from exc
    if not isinstance(header, dict):
        raise _fail(path, "the header must be a YAML mapping")
    return header, text[match.end() :].strip()


def _identity(header: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """``table: layer.name`` and ``period``, and the fields every kind shares."""
    fqn = header.get("table")
    if not isinstance(fqn, str) or fqn.count(".") != 1:
        raise _fail(path, f"'table' must be layer.name, got {fqn!r}")
    layer, name = fqn.split(".")
    if layer not in LAYERS:
        raise _fail(path, f"unknown layer {layer!r} (expected one of {', '.join(LAYERS)})")
    if path.parent.name != layer or path.stem != name:
        raise _fail(path, f"table {fqn} must live in tables/{layer}/{name}{path.suffix}")
    period = header.get("period")
    if header.get("kind") == STATIC and path.suffix == ".sql":
        if period is not None:
            raise _fail(path, "a static table has no period: its one partition is the whole table (drop period)")
        period = STATIC
    elif period not in BY_PERIOD:
        raise _fail(path, f"period must be one of {', '.join(BY_PERIOD)}, got {period!r}")
    shared: tuple[str, ...] = ("primary_key", "description", "owner", "domain", "zorder", "columns", "checks")
    shared += ("sla", "compute", "replicate_to", "site")
    fields = {"layer": layer, "name": name, "period": period} | {k: header[k] for k in shared if k in header}
    zorder = header.get("zorder")
    if isinstance(zorder, Mapping):  # zorder: {by: [columns], file_size: 8MB}
        unknown = sorted(set(zorder) - {"by", "file_size"})
        if unknown:
            raise _fail(path, f"zorder takes by and file_size, not {', '.join(map(str, unknown))}")
        if not zorder.get("by"):
            raise _fail(path, "zorder.by must list the columns the files are Z-ordered by")
        fields["zorder"] = zorder["by"]
        if zorder.get("file_size") is not None:
            fields["zorder_file_size"] = zorder["file_size"]
    return fields


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


def _load_sql(path: Path) -> DerivedTable | StaticTable:
    header, body = _header(path, path.read_text())
    fields = _identity(header, path)
    if fields["layer"] == "ext":
        raise _fail(path, "external tables are declared in YAML (tables/ext/<name>.yaml); nothing here computes them")
    if not body:
        raise _fail(path, "the SQL body is empty")
    try:
        reads = referenced_tables(body)
    except sqlglot.errors.ParseError as exc:
        raise _fail(path, f"the SQL does not parse: {exc}") from exc
    if header.get("kind") == STATIC:
        unknown = sorted(set(header) & {"depends_on", "states", "resets", "late_data", "regions", "incremental"})
        if unknown:
            raise _fail(path, f"{', '.join(unknown)} is for partitioned tables; a static table reads nothing")
        deps = tuple(Dependency(table) for table in sorted(reads))
        return _build(StaticTable, path, fields | {"deps": deps, "sql": body})
    declared = header.get("depends_on") or {}
    if not isinstance(declared, Mapping):
        raise _fail(path, "depends_on must map layer.table to its offsets")
    for dep in declared:
        if dep not in reads:
            raise _fail(path, f"{header['table']} declares a dependency on {dep} that its SQL never reads")
    try:
        deps = tuple(Dependency.parse(dep, declared.get(dep)) for dep in sorted(reads))
        states = parse_states(header.get("states"), deps)
    except ValueError as exc:
        raise _fail(path, str(exc)) from None
    kind = header.get("kind", TIME_SERIES)
    if kind == CUMULATIVE and header.get("resets") is not None:  # its T-1 does not reach back over a reset
        deps = tuple(
            replace(dep, within=dep.within or header["resets"])
            if dep.table == f"{fields['layer']}.{fields['name']}"
            else dep
            for dep in deps
        )
    extra = {"kind": kind, "resets": header.get("resets"), "late_data": header.get("late_data")}
    extra["regions"] = header.get("regions")
    if "incremental" in header:  # absent: the default; present, even empty, it must say true or false
        extra["incremental"] = header["incremental"]
    return _build(DerivedTable, path, fields | {"deps": deps, "sql": body, "states": states} | extra)


def _load_ods(path: Path) -> OdsTable:
    header = _read_yaml(path)
    fields = _identity(header, path)
    source = header.get("source") or {}
    if not isinstance(source, Mapping) or not source.get("database") or not source.get("tables"):
        raise _fail(path, "source needs database and tables (a regular expression of the shard tables)")
    kind = header.get("kind", TIME_SERIES)
    if kind not in ODS_KINDS:
        raise _fail(path, f"kind must be one of {', '.join(ODS_KINDS)} for an ODS table, got {kind!r}")
    if kind == SNAPSHOT:
        if header.get("partition_time"):
            raise _fail(
                path,
                f"a snapshot ODS table is partitioned by each change's binlog time ({CHANGED_AT}): drop "
                "partition_time, or drop kind: snapshot to mirror the table by that column",
            )
        if CHANGED_AT in (header.get("columns") or {}):
            raise _fail(
                path, f"{CHANGED_AT} is the change's binlog time, added to a snapshot ODS table: do not declare it"
            )
        fields["columns"] = {**(header.get("columns") or {}), CHANGED_AT: "timestamp"}
        fields |= {"partition_time": CHANGED_AT, "kind": SNAPSHOT}
    elif not header.get("partition_time"):
        raise _fail(
            path,
            "partition_time is required: the timestamp column whose local hour partitions the ODS table (e.g. "
            "create_time). A source table without a time column is declared kind: snapshot (each change kept "
            "in the hour of its binlog time, consolidated into a daily snapshot table)",
        )
    else:
        fields |= {"partition_time": str(header["partition_time"]), "kind": kind}
    fields |= {"source_database": str(source["database"]), "source_tables": str(source["tables"])}
    idle_proof = header.get("idle_proof") or {}
    if isinstance(idle_proof, Mapping) and idle_proof.get("heartbeat_grace_minutes") is not None:
        fields["heartbeat_idle_grace_minutes"] = idle_proof["heartbeat_grace_minutes"]
    completeness = header.get("completeness") or {}
    fields["completeness_threshold"] = (
        completeness.get("threshold", DEFAULT_COMPLETENESS) if isinstance(completeness, Mapping) else None
    )
    if header.get("usual_delay") is not None:
        fields["usual_delay_minutes"] = header["usual_delay"]
    # its checks are evaluated in batches by the ods_quality_checks sensor (sensors/ods.py)
    return _build(OdsTable, path, fields)


def _load_external(path: Path) -> ExternalTable:
    header = _read_yaml(path)
    return _build(ExternalTable, path, _identity(header, path) | {"external": header.get("external")})


def tables_dir() -> Path:
    """The folder of the table declarations: ``WAREHOUSE_CATALOG_DIR``, by default the product's own (``tables/``
    beside this module). A deployment, or a test of a running stack, keeps its tables elsewhere."""
    from resources.settings import current, variable  # as calendars.py: resources import the catalog at load

    configured = current().catalog_dir
    if not configured:
        return TABLES_DIR
    root = Path(configured).expanduser().resolve()
    if not root.is_dir():
        raise CatalogError(
            f"{variable('catalog_dir')}={configured!r}: {root} is no folder (expected a folder of table declarations, "
            "<layer>/<table>.sql or .yaml)"
        )
    return root


def load_catalog(root: Path | None = None) -> Catalog:
    """Load and validate every declaration under ``root`` (default: :func:`tables_dir`)."""
    root = tables_dir() if root is None else root
    catalog = Catalog()
    for path in sorted([*root.glob("*/*.sql"), *root.glob("*/*.yaml")]):
        table: Table
        if path.suffix == ".sql":
            table = _load_sql(path)
        elif path.parent.name == "ext":
            table = _load_external(path)
        else:
            table = _load_ods(path)
        if table.fqn in catalog.tables:
            raise _fail(path, f"{table.fqn} is declared twice (also in {catalog.tables[table.fqn].path})")
        catalog.tables[table.fqn] = table
    _add_replicas(catalog)
    _split_references(catalog)
    _read_ods_by_window(catalog)
    _validate_sites(catalog)
    _validate_graph(catalog)
    return catalog


def _add_replicas(catalog: Catalog) -> None:
    """One :class:`ReplicaTable` per replicated table and site, so the tables declared at the site depend on it, the
    dependency center tracks its partitions, and a taint's closure reaches it and what the site builds from it."""
    for table in list(catalog):
        for site in table.replicate_to:
            name = replica_name(site, table.fqn)
            if table.site or table.is_static or table.is_regional:
                raise _fail(
                    table.path,
                    f"replicate_to is for the first site's tables partitioned by time alone; {table.fqn} is "
                    + ("declared at site " + table.site if table.site else "static or split by region"),
                )
            if name in catalog.tables:
                raise _fail(table.path, f"{table.fqn}'s replica at {site} is {name}, declared in {catalog[name].path}")
            catalog.tables[name] = ReplicaTable(
                layer=site,
                name=name.split(".", 1)[1],
                site=site,
                source=table.fqn,
                period=table.period,
                path=table.path,
                primary_key=table.primary_key,
                columns=table.columns,
                deps=(Dependency(table.fqn),),
                description=f"{table.fqn} replicated to site {site}: each valid partition's Delta commit, verified.",
            )


def _validate_sites(catalog: Catalog) -> None:
    """A table reads the tables of its own site only: the first site's tables (no ``site``), or at a site the
    replicas published there and the tables declared there."""
    for table in catalog:
        if table.site and not isinstance(table, DerivedTable | ReplicaTable):
            raise _fail(table.path, f"site is for tables built from SQL; {table.fqn} is built at the first site")
        if table.is_replica:
            continue
        for dep in [*table.deps, *getattr(table, "references", ())]:
            upstream = catalog.tables.get(dep.table)
            if isinstance(upstream, ReplicaTable) and catalog[upstream.source].is_ods:
                # the run skips an ODS table's CDC tombstones by its kind, which a replica does not carry
                raise _fail(
                    table.path,
                    f"{table.fqn} reads {dep.table}, the replica of an ODS table: a site reads replicas of tables "
                    f"built from SQL (replicate a table that cleans {upstream.source})",
                )
            if upstream is None or upstream.site == table.site:
                continue
            here = f"at site {table.site}" if table.site else "at the first site (no site declared)"
            there = f"site {upstream.site}" if upstream.site else "the first site"
            hint = (
                f": read its replica {replica_name(table.site, upstream.fqn)} (replicate_to: {table.site} on it)"
                if table.site and not upstream.site
                else ""
            )
            raise _fail(table.path, f"{table.fqn} is {here} and reads {dep.table}, which is at {there}{hint}")


def _read_ods_by_window(catalog: Catalog) -> None:
    """A mini-batch table (a ``5min``, ``10min`` or ``15min`` period) reads an ODS table window by window: its
    dependency waits for the ODS table's completeness windows of its period (:class:`OdsWindows`, added here once per
    ODS table and period), not for the ODS hour, so each window runs as soon as the source's changes in it are in.
    The SQL still names the ODS table, whose rows of the window it reads."""
    for table in catalog.derived():
        if table.period not in MINUTE_PERIODS:
            continue
        on_windows: dict[str, str] = {}
        for dep in table.deps:
            upstream = catalog.tables.get(dep.table)
            if isinstance(upstream, OdsTable):
                on_windows[dep.table] = windows = windows_name(dep.table, table.period)
                if windows not in catalog.tables:
                    catalog.tables[windows] = OdsWindows(
                        layer=upstream.layer,
                        name=windows.split(".", 1)[1],
                        period=table.period,
                        path=upstream.path,
                        source=upstream.fqn,
                        domain=upstream.domain,  # beside its ODS table in the asset graph
                        description=(
                            f"Completeness of {upstream.fqn} per {PERIOD_NOUN[table.period]}: a partition is reported "
                            f"once the changes ingested in each of its 5-minute windows reach "
                            f"{upstream.completeness_threshold:.3%} of the source's count. No data of its own: "
                            f"the mini-batch tables reading {upstream.fqn} wait for it."
                        ),
                    )
                elif not isinstance(catalog.tables[windows], OdsWindows):
                    raise _fail(
                        table.path,
                        f"{table.fqn} reads {dep.table} per {table.period}, whose completeness windows are named "
                        f"{windows}, but a table of that name is declared in {catalog.tables[windows].path}",
                    )
        if on_windows:
            catalog.tables[table.fqn] = replace(
                table,
                deps=_renamed(table.deps, on_windows),
                states=tuple(replace(st, deps=_renamed(st.deps, on_windows)) for st in table.states),
            )


def _renamed(deps: tuple[Dependency, ...], names: Mapping[str, str]) -> tuple[Dependency, ...]:
    return tuple(replace(dep, table=names.get(dep.table, dep.table)) for dep in deps)


def _split_references(catalog: Catalog) -> None:
    """A dependency on a static table is a reference: the whole table, read by every partition. It has no offsets,
    mode or states (``ignore_dq`` and ``accept_tainted`` keep their meaning)."""
    for table in catalog.derived():
        references = [dep for dep in table.deps if dep.table in catalog.tables and catalog[dep.table].is_static]
        if not references:
            continue
        for ref in references:
            plain = Dependency(ref.table, ignore_dq=ref.ignore_dq, accept_tainted=ref.accept_tainted)
            if ref != plain:
                raise _fail(
                    table.path,
                    f"{table.fqn} reads the static table {ref.table}: it has no partitions, so its dependency takes "
                    "no offsets, mode or states (only ignore_dq and accept_tainted)",
                )
        named = {ref.table for ref in references}
        for state in table.states:
            if named - {dep.table for dep in state.deps}:
                raise _fail(
                    table.path, f"{table.fqn}: state {state.name} leaves out a static table; each state reads it"
                )
        catalog.tables[table.fqn] = replace(
            table,
            deps=tuple(dep for dep in table.deps if dep.table not in named),
            references=tuple(references),
            states=tuple(
                replace(state, deps=tuple(d for d in state.deps if d.table not in named)) for state in table.states
            ),
        )


def _validate_graph(catalog: Catalog) -> None:
    for table in catalog:
        for check in table.checks:
            problem = check.problem_in(table)
            if problem:
                raise _fail(table.path, problem)
    for derived in catalog.derived():
        for dep in derived.deps:
            if dep.table not in catalog.tables:
                raise _fail(derived.path, f"{derived.fqn} reads {dep.table}, which is not in the catalog")
            upstream = catalog.tables[dep.table]
            if derived.is_regional and upstream.period != "hourly":
                raise _fail(
                    derived.path,
                    f"{derived.fqn} has regions: each region's day is read from the hours in it, so it reads hourly "
                    f"tables only; {dep.table} is {upstream.period}",
                )
            if upstream.is_regional and (
                derived.period != "daily" or derived.is_regional or dep.start_offset is not None or dep.weak
            ):
                raise _fail(
                    derived.path,
                    f"{derived.fqn} reads {dep.table}, which has regions: a daily table without regions reads a day of "
                    "it whole (every region's day of that date), without offsets or mode",
                )
            if dep.states is not None:
                known = upstream.state_names
                unknown = [name for name in dep.states if name not in known]
                if unknown:
                    has = f"its states are {', '.join(known)}" if known else "it declares no states"
                    raise _fail(derived.path, f"{derived.fqn} accepts state {', '.join(unknown)} of {dep.table}: {has}")
            if dep.within is not None and (
                upstream.period != derived.period
                or PERIOD_ORDER[dep.within] <= PERIOD_ORDER[derived.period]
                or (dep.end_offset or 0) > 0
            ):
                raise _fail(
                    derived.path,
                    f"{derived.fqn}: within {dep.within} keeps a window of {dep.table} inside a coarser period of the "
                    f"table's own ({derived.period}); it is for a dependency of the same period whose offsets end at "
                    "0 at the latest",
                )
            if PERIOD_ORDER[upstream.period] > PERIOD_ORDER[derived.period]:
                # offsets count the coarser upstream's periods back from the one holding the partition's start
                if dep.end_offset is not None and dep.end_offset > 0:
                    raise _fail(
                        derived.path,
                        f"{derived.fqn} ({derived.period}) reads the coarser {dep.table} ({upstream.period}): its "
                        f"offsets count {upstream.period} periods back from the one holding each partition's start "
                        f"({{set: [-1]}}: the previous one, {{set: [0]}}: its own, which ends after it), so they end "
                        f"at 0 at the latest",
                    )
                if dep.mode == LATEST and dep.start_offset is not None and dep.start_offset >= 0:
                    raise _fail(
                        derived.path,
                        f"{derived.fqn}: latest over the coarser {dep.table} needs a window reaching back before the "
                        f"{upstream.period} period holding the partition (e.g. {{range: [-2, 0], latest: true}})",
                    )
                continue
            crosses = upstream.period != derived.period and dep.start_offset is not None
            if crosses and not _covers_whole_period(derived.period, upstream.period, dep):
                raise _fail(
                    derived.path,
                    f"{derived.fqn}: offsets across periods must cover the whole {derived.period} period of"
                    f" {dep.table} (range: [0, 23] for a day's hours, [0, 6] for a week's days; omit the offsets"
                    f" for the default roll-up, e.g. a month on its days)",
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
