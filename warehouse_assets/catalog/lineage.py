"""Column lineage, read from each table's SQL: which input columns every output column is computed from, and which
input columns decide what rows there are.

A derived table's SQL is qualified against the columns of the tables it reads (sqlglot's optimizer: ``SELECT *``
expanded, every column bound to its source) and walked scope by scope, through CTEs, derived tables, set operations
and subqueries:

* an output column's **value** comes from the columns its expression names, followed through CTEs and derived tables
  to the tables read (an aggregate's argument, a window function's arguments and ORDER BY, a scalar subquery's
  result and rows);
* the **rows** come from the columns read by filters (``WHERE``, ``HAVING``, ``QUALIFY``), join conditions, ``GROUP
  BY``, window ``PARTITION BY``, ``DISTINCT`` and an ordered ``LIMIT``, at any depth: a wrong join key or a filter on a
  wrong value changes which rows there are, and so every output column.

A column the walk cannot bind (a name no input has, a table function) depends on every column of every table the SQL
reads: it is never dropped, and :attr:`TableLineage.unresolved` says which and why (the build's log and metadata name
them, as ``warehouse lineage`` does).

Computed per table when something asks (a build, ``warehouse lineage``, ``warehouse taint --columns``), and for every
table when the code location loads, through a cache keyed by each table's SQL and its inputs' columns
(:mod:`warehouse_assets.catalog.lineage_cache`), so that a warm load parses no SQL. :class:`WarehouseLineage` keeps what
it computed for the catalog it was given.

:meth:`WarehouseLineage.impact` follows columns downstream: the tables whose columns are computed from, or whose rows
are decided by, some columns of a table, transitively; a table whose rows depend on them is affected in every column,
and so is every table reading it. The taint (``warehouse taint --columns``) follows only those tables' edges.
"""

from __future__ import annotations

import graphlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, build_scope, find_all_in_scope

from warehouse_assets.catalog.model import (
    ODS_CHANGE_COLUMNS,
    Catalog,
    DerivedTable,
    ExternalTable,
    OdsTable,
    ReplicaTable,
    StaticTable,
    Table,
)

log = logging.getLogger(__name__)

_UNBOUND = "*"  # the table of a column reference the walk could not bind: its column holds why
ROWS = "(rows)"  # the key of :attr:`TableLineage.unresolved` for the columns deciding the rows


class ColumnRef(NamedTuple):
    """One column of one table: ``ods.order.amount``."""

    table: str
    column: str

    def __str__(self) -> str:
        return f"{self.table}.{self.column}"


def _unbound(why: str) -> frozenset[ColumnRef]:
    return frozenset({ColumnRef(_UNBOUND, why)})


@dataclass(frozen=True)
class TableLineage:
    """The lineage of one table's columns, one step up: the input columns each is computed from."""

    table: str
    inputs: tuple[str, ...]  # the tables it reads
    columns: Mapping[str, frozenset[ColumnRef]]  # output column → the input columns its values are computed from
    rows: frozenset[ColumnRef]  # the input columns that decide which rows there are: every output depends on them
    # output column → why it could not be bound (it is given every column of the inputs); ROWS for the row columns
    unresolved: Mapping[str, str] = field(default_factory=dict)

    def reads(self) -> frozenset[ColumnRef]:
        """Every input column the table reads, for its values or its rows."""
        return frozenset(self.rows.union(*self.columns.values()))

    def upstream_of(self, column: str) -> frozenset[ColumnRef]:
        """What ``column``'s values are computed from (its rows aside)."""
        if column not in self.columns:
            raise ValueError(f"{self.table} has no column {column!r}; its columns: {', '.join(self.columns)}")
        return self.columns[column]

    def describe_unresolved(self) -> list[str]:
        """One line per column given every input column because the SQL could not be followed to it."""
        return [
            f"{self.table}.{column}: depends on every column of {', '.join(self.inputs) or 'its inputs'} ({why})"
            if column != ROWS
            else f"{self.table}: its rows depend on every column of {', '.join(self.inputs)} ({why})"
            for column, why in self.unresolved.items()
        ]


def table_lineage(table: str, sql: str, inputs: Mapping[str, Sequence[str]], added: Sequence[str] = ()) -> TableLineage:
    """The lineage of the table ``table`` whose SQL is ``sql``, reading the tables ``inputs`` (``layer.table`` → its
    columns). ``added``: columns the build adds to the SQL's output (a partition's ``dt``), computed from no input."""
    everything = frozenset(ColumnRef(t, c) for t, columns in inputs.items() for c in columns)
    try:
        found = _ScopeWalk(inputs).of(qualified_scope(sql, inputs))
        outputs, rows = found.outputs, found.rows
        if found.star:
            outputs = {**outputs, "*": _unbound("SELECT * of a source whose columns are unknown")}
    except (SqlglotError, ValueError) as exc:  # every column it names depends on everything: none is dropped
        why = f"the SQL could not be followed: {str(exc).splitlines()[0]}"
        named = [name for name in _output_names(sql) if name not in added]
        unknown = {**dict.fromkeys(named, everything), **dict.fromkeys(added, frozenset[ColumnRef]())}
        return TableLineage(table, tuple(inputs), unknown, everything, {**dict.fromkeys(named, why), ROWS: why})
    unresolved: dict[str, str] = {}
    columns: dict[str, frozenset[ColumnRef]] = {}
    for name, refs in outputs.items():
        columns[name], problem = _bound(refs, everything)
        if problem:
            unresolved[name] = problem
    bound_rows, problem = _bound(rows, everything)
    if problem:
        unresolved[ROWS] = problem
    for name in added:  # the build sets them (the partition's values), whatever the SQL said
        columns[name] = frozenset()
    return TableLineage(table, tuple(inputs), columns, bound_rows, unresolved)


def qualified_scope(sql: str, inputs: Mapping[str, Sequence[str]]) -> Scope:
    """The root scope of ``sql`` qualified against the columns of the tables it reads (``layer.table`` → its
    columns): ``SELECT *`` expanded, every column bound to its source's alias. SqlglotError if it is not a query."""
    tree = sqlglot.parse_one(sql, read="spark")
    schema: dict[str, object] = {}
    for fqn, names in inputs.items():
        layer, name = fqn.split(".", 1)
        tables = schema.setdefault(layer, {})
        assert isinstance(tables, dict)
        tables[name] = {c: "string" for c in names}  # types change neither lineage nor key locality
    qualified = qualify(
        tree,
        dialect="spark",
        schema=schema,
        validate_qualify_columns=False,
        quote_identifiers=False,
        identify=False,
    )
    root = build_scope(qualified)
    if root is None:
        raise SqlglotError("the SQL is not a query")
    return root


def _output_names(sql: str) -> list[str]:
    """The names of the columns a query selects, as written (none if it does not parse)."""
    try:
        tree = sqlglot.parse_one(sql, read="spark")
    except SqlglotError:
        return []
    return [s.alias_or_name for s in tree.selects if s.alias_or_name] if isinstance(tree, exp.Query) else []


def _bound(refs: frozenset[ColumnRef], everything: frozenset[ColumnRef]) -> tuple[frozenset[ColumnRef], str]:
    """``refs`` with an unbound reference replaced by every input column, and why it was unbound ("" if none was)."""
    problems = sorted({ref.column for ref in refs if ref.table == _UNBOUND})
    if not problems:
        return refs, ""
    return frozenset(ref for ref in refs if ref.table != _UNBOUND) | everything, "; ".join(problems)


@dataclass
class _Scoped:
    outputs: dict[str, frozenset[ColumnRef]]  # in the order of the select list
    rows: frozenset[ColumnRef]
    star: bool = False  # a ``*`` left unexpanded: its columns are unknown


class _ScopeWalk:
    """The lineage of each scope of one qualified query, each scope walked once."""

    def __init__(self, inputs: Mapping[str, Sequence[str]]) -> None:
        self._done: dict[int, _Scoped] = {}
        self._known = {table: set(columns) for table, columns in inputs.items()}

    def of(self, scope: Scope) -> _Scoped:
        key = id(scope)
        if key not in self._done:
            self._done[key] = self._walk(scope)
        return self._done[key]

    def _walk(self, scope: Scope) -> _Scoped:
        query = scope.expression
        if isinstance(query, exp.SetOperation):
            return self._set_operation(scope, query)
        if isinstance(query, exp.Subquery):  # a parenthesised query: the query inside
            inner = [*scope.subquery_scopes, *scope.derived_table_scopes, *scope.set_operation_scopes]
            return self.of(inner[0]) if inner else _Scoped({}, _unbound(f"unreadable subquery {query.sql()[:60]}"))
        if not isinstance(query, exp.Select):
            return _Scoped({}, _unbound(f"unsupported query {type(query).__name__}"))
        return self._select(scope, query)

    def _set_operation(self, scope: Scope, query: exp.SetOperation) -> _Scoped:
        branches = [self.of(branch) for branch in scope.set_operation_scopes]
        if not branches:
            return _Scoped({}, _unbound("a set operation without branches"))
        names = list(branches[0].outputs)
        outputs: dict[str, frozenset[ColumnRef]] = {}
        for i, name in enumerate(names):  # by position, named by the first branch
            refs: set[ColumnRef] = set()
            for branch in branches:
                values = list(branch.outputs.values())
                refs |= values[i] if i < len(values) else _unbound("a set operation's branches differ in columns")
            outputs[name] = frozenset(refs)
        rows = frozenset().union(*(b.rows for b in branches))
        if query.args.get("distinct"):  # UNION (DISTINCT): duplicates are found by every column
            rows |= frozenset().union(*outputs.values())
        return _Scoped(outputs, rows, any(b.star for b in branches))

    def _select(self, scope: Scope, query: exp.Select) -> _Scoped:
        subqueries = {id(s.expression): s for s in scope.subquery_scopes}
        outputs: dict[str, frozenset[ColumnRef]] = {}
        rows: set[ColumnRef] = set()
        star = False
        for selected in query.selects:
            if isinstance(selected, exp.Star) or (isinstance(selected, exp.Column) and selected.is_star):
                star = True  # a source's columns were unknown: qualify could not expand it
                continue
            outputs[selected.alias_or_name] = self._refs(scope, selected, subqueries)
            for window in find_all_in_scope(selected, exp.Window):  # each window partition is a grouping
                for part in window.args.get("partition_by") or []:
                    rows |= self._refs(scope, part, subqueries)
        clauses: list[exp.Expr] = [
            query.args[key] for key in ("where", "group", "having", "qualify") if query.args.get(key)
        ]
        for join in query.args.get("joins") or []:
            if join.args.get("on") is not None:
                clauses.append(join.args["on"])
            for name in join.args.get("using") or []:  # a column of both sides
                rows |= self._named_in_sources(scope, name.name)
        if query.args.get("limit") is not None and query.args.get("order") is not None:
            clauses.append(query.args["order"])  # which rows a LIMIT keeps
        for clause in clauses:
            rows |= self._refs(scope, clause, subqueries)
        if query.args.get("distinct"):
            rows |= frozenset().union(*outputs.values())
        for _, source in scope.selected_sources.values():
            if isinstance(source, Scope):  # a derived table's or a CTE's rows are this query's rows
                rows |= self.of(source).rows
        return _Scoped(outputs, frozenset(rows), star)

    def _refs(self, scope: Scope, node: exp.Expr, subqueries: Mapping[int, Scope]) -> frozenset[ColumnRef]:
        """The input columns ``node`` reads in ``scope``: its columns bound to their sources, and a subquery's result
        and rows."""
        refs: set[ColumnRef] = set()
        for found in find_all_in_scope(node, exp.Column, exp.Select, exp.SetOperation):
            if isinstance(found, exp.Column):
                if not found.is_star:
                    refs |= self._bind(scope, found)
            elif found is not node:
                sub = subqueries.get(id(found))
                if sub is None:
                    refs |= _unbound(f"unreadable subquery {found.sql()[:60]}")
                    continue
                inner = self.of(sub)
                refs |= inner.rows.union(*inner.outputs.values())
                if inner.star:
                    refs |= _unbound("SELECT * of a source whose columns are unknown")
        return frozenset(refs)

    def _bind(self, scope: Scope, column: exp.Column) -> frozenset[ColumnRef]:
        """The input columns ``column`` stands for: a table's column, or what a CTE's or derived table's column is
        computed from; looked up in the enclosing scopes too (a correlated subquery)."""
        name, alias = column.name, column.table
        here: Scope | None = scope
        while here is not None:
            if alias and alias in here.sources:
                return self._from_source(here.sources[alias], alias, name)
            here = here.parent
        if not alias:
            return _unbound(f"column {name} is not a column of any table it reads")
        return _unbound(f"{alias}.{name}: no source named {alias}")

    def _from_source(self, source: exp.Expr | Scope, alias: str, name: str) -> frozenset[ColumnRef]:
        if isinstance(source, exp.Table):
            fqn = f"{source.db}.{source.name}"
            if fqn not in self._known:
                return _unbound(f"{source.sql()} is not a table it reads (layer.table)")
            if name not in self._known[fqn]:  # qualify binds a lone source's unknown names to it: not a column
                return _unbound(f"{fqn} has no column {name}")
            return frozenset({ColumnRef(fqn, name)})
        if isinstance(source, Scope):
            if isinstance(source.expression, exp.Values):  # literal rows: computed from nothing
                return frozenset()
            inner = self.of(source)
            if name in inner.outputs:
                return inner.outputs[name]
            return _unbound(f"{alias}.{name} is not a column of {alias}")
        return _unbound(f"{alias}.{name} comes from a table function")

    def _named_in_sources(self, scope: Scope, name: str) -> frozenset[ColumnRef]:
        refs: set[ColumnRef] = set()
        for alias, (_, source) in scope.selected_sources.items():
            found = self._from_source(source, alias, name)
            if not any(ref.table == _UNBOUND for ref in found):
                refs |= found
        return frozenset(refs) or _unbound(f"USING ({name}): no side has it")


# --- the warehouse: every table's columns and lineage, computed when asked ------------------------------------


@dataclass(frozen=True)
class ColumnImpact:
    """What some columns of one table reach downstream: each table whose columns are computed from them (which), or
    whose rows depend on them (every column), transitively, and the edges they travel along."""

    table: str
    columns: tuple[str, ...]
    # table → its affected columns; None: every column (its rows depend on them, or on a table whose rows do)
    tables: Mapping[str, frozenset[str] | None]
    why: Mapping[str, str]  # table → how they reach it, in words
    edges: frozenset[tuple[str, str]]  # (upstream, downstream) read through affected columns

    def follows(self, upstream: str, downstream: str) -> bool:
        """Whether ``downstream`` reads affected columns of ``upstream`` (a partition closure follows only those)."""
        return (upstream, downstream) in self.edges

    def describe(self, table: str) -> str:
        found = self.tables[table]
        what = "every column" if found is None else ", ".join(sorted(found))
        return f"{what} ({self.why[table]})" if table in self.why else what


class LineageStore(Protocol):
    """Where computed lineage is kept between processes, by what decides it."""

    def get(
        self, table: str, sql: str, inputs: Mapping[str, Sequence[str]], added: Sequence[str]
    ) -> TableLineage | None: ...

    def put(
        self, table: str, sql: str, inputs: Mapping[str, Sequence[str]], added: Sequence[str], lineage: TableLineage
    ) -> None: ...


class WarehouseLineage:
    """The columns and the column lineage of every table of ``catalog``, computed once each when first asked (read
    from ``cache`` where it holds them)."""

    def __init__(self, catalog: Catalog, cache: LineageStore | None = None):
        self._catalog = catalog
        self._cache = cache
        self._lineage: dict[str, TableLineage] = {}
        self._readers: dict[str, list[str]] | None = None

    def columns(self, fqn: str) -> tuple[str, ...]:
        """The columns of the table as stored: an ODS table's with its change columns and partition columns, a
        derived table's as its SQL (or declaration) makes them and the build adds its partition columns."""
        table = self._catalog.lookup(fqn)
        if isinstance(table, ReplicaTable):  # a copy of its source's files: the source's columns
            return self.columns(table.source)
        if isinstance(table, OdsTable):
            return (*_declared(table), *(c for c, _ in ODS_CHANGE_COLUMNS), *table.partition_by)
        if isinstance(table, ExternalTable | StaticTable) or table.columns:
            return tuple(dict.fromkeys([*_declared(table), *table.partition_by]))
        return tuple(self.of(fqn).columns)

    def of(self, fqn: str) -> TableLineage:
        """The lineage of one table's columns: a table built outside the warehouse (ODS, external) or spelling its
        rows out (static) reads no table."""
        if fqn not in self._lineage:
            for name in self._missing_upstream(fqn):
                self._lineage[name] = self._compute(name)
        return self._lineage[fqn]

    def all(self) -> list[TableLineage]:
        """Every table's lineage, upstream first."""
        order = _upstream_first({t.fqn: self._reads(t) - {t.fqn} for t in self._catalog})
        for fqn in order:  # each table's inputs come before it: no search for what is missing above it
            if fqn not in self._lineage:
                self._lineage[fqn] = self._compute(fqn)
        return [self._lineage[fqn] for fqn in order]

    def upstream(self, ref: ColumnRef) -> frozenset[ColumnRef]:
        """Every column, at any depth, that ``ref``'s values are computed from (what decides the rows of the tables
        on the way aside: each :attr:`TableLineage.rows`)."""
        found: set[ColumnRef] = set()
        stack = [ref]
        while stack:
            current = stack.pop()
            for up in self.of(current.table).upstream_of(current.column):
                if up not in found and up != current:
                    found.add(up)
                    stack.append(up)
        return frozenset(found)

    def column(self, name: str) -> ColumnRef:
        """``layer.table.column`` as a :class:`ColumnRef`, validated against the catalog."""
        parts = name.strip().split(".")
        if len(parts) != 3:
            raise ValueError(f"{name!r}: name a column as layer.table.column, e.g. ods.order.amount")
        table = self._catalog.lookup(f"{parts[0]}.{parts[1]}").fqn
        self.check_columns(table, [parts[2]])
        return ColumnRef(table, parts[2])

    def check_columns(self, fqn: str, columns: Iterable[str]) -> None:
        known = self.columns(fqn)
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise ValueError(f"{fqn} has no column {', '.join(unknown)}; its columns: {', '.join(known)}")

    def readers(self, fqn: str) -> list[str]:
        """The tables that read ``fqn`` (itself included if it reads itself)."""
        if self._readers is None:
            readers: dict[str, list[str]] = {}
            for table in self._catalog:
                for read in sorted(self._reads(table)):
                    readers.setdefault(read, []).append(table.fqn)
            self._readers = readers
        return self._readers.get(fqn, [])

    def impact(self, fqn: str, columns: Sequence[str]) -> ColumnImpact:
        """What ``columns`` of ``fqn`` reach downstream (see :class:`ColumnImpact`)."""
        if not columns:
            raise ValueError("name at least one column")
        self.check_columns(fqn, columns)
        affected: dict[str, frozenset[str] | None] = {fqn: frozenset(columns)}
        why: dict[str, str] = {}
        edges: set[tuple[str, str]] = set()
        reachable = self.downstream_tables(fqn)
        for table in _upstream_first({t: self._catalog_reads(t) & reachable - {t} for t in reachable}):
            reads = self._catalog_reads(table)
            if table == fqn or not reads & affected.keys():
                continue  # nothing it reads is affected: its SQL need not be read
            whole = sorted(u for u in reads & affected.keys() if affected[u] is None)
            if len(whole) == len(reads & affected.keys()):  # only tables whose rows are affected: every column
                affected[table], why[table] = None, f"reads {', '.join(whole)}, whose rows are affected"
                edges.update((upstream, table) for upstream in [*whole, *([table] if table in reads else [])])
                continue
            lineage = self.of(table)
            while True:  # a table reading itself: until its own affected columns stop growing
                found, reason, through = self._affected_by(lineage, affected)
                if (found is not None and not found) or (table in affected and affected[table] == found):
                    break
                affected[table] = found
            if table in affected:
                why[table] = reason
                edges.update((upstream, table) for upstream in through)
        return ColumnImpact(fqn, tuple(columns), affected, why, frozenset(edges))

    def _affected_by(
        self, lineage: TableLineage, affected: Mapping[str, frozenset[str] | None]
    ) -> tuple[frozenset[str] | None, str, set[str]]:
        """The columns of ``lineage``'s table the ``affected`` columns reach (None: every one; an empty set: none),
        how, and the inputs they come through."""
        hit: set[ColumnRef] = set()
        whole: list[str] = []  # inputs whose rows are affected
        for upstream in lineage.inputs:
            if upstream not in affected:
                continue
            found = affected[upstream]
            if found is None:
                whole.append(upstream)
            else:
                hit.update(ColumnRef(upstream, c) for c in found)
        read = {ref for ref in lineage.reads() if ref in hit}
        through = set(whole) | {ref.table for ref in read}
        if whole:
            return None, f"reads {', '.join(whole)}, whose rows are affected", through
        by_rows = sorted(str(ref) for ref in lineage.rows if ref in hit)
        if by_rows:
            return None, f"its rows depend on {', '.join(by_rows)}", through
        columns = frozenset(name for name, refs in lineage.columns.items() if refs & hit)
        if not columns:
            return frozenset(), "", set()
        return columns, f"computed from {', '.join(sorted(str(ref) for ref in read))}", through

    def downstream_tables(self, fqn: str) -> set[str]:
        """``fqn`` and every table built from it, directly or not."""
        found, queue = {fqn}, [fqn]
        while queue:
            for reader in self.readers(queue.pop()):
                if reader not in found:
                    found.add(reader)
                    queue.append(reader)
        return found

    def _catalog_reads(self, fqn: str) -> set[str]:
        return self._reads(self._catalog[fqn])

    @staticmethod
    def _reads(table: Table) -> set[str]:
        refs = table.references if isinstance(table, DerivedTable) else ()
        return {dep.table for dep in (*table.deps, *refs)}

    def input_columns(self, table: DerivedTable) -> dict[str, tuple[str, ...]]:
        """The columns of each table ``table`` reads, in name order (itself too, if it reads itself)."""
        return {name: self.columns(name) for name in sorted(self._reads(table))}

    def _missing_upstream(self, fqn: str) -> list[str]:
        """``fqn`` and the tables above it whose lineage naming their columns is not computed yet, upstream first
        (found iteratively: a chain of thousands of tables is no recursion)."""
        graph: dict[str, set[str]] = {}
        queue = [fqn]
        while queue:
            name = queue.pop()
            if name in graph or name in self._lineage:
                continue
            # an input's columns come from its lineage unless they are declared (a source's, a self-dependent one's)
            graph[name] = {
                read
                for read in self._reads(self._catalog.lookup(name)) - {name}
                if read not in self._lineage
                and isinstance(self._catalog[read], DerivedTable)
                and not self._catalog[read].columns
            }
            queue.extend(graph[name])
        return _upstream_first(graph)

    def _compute(self, fqn: str) -> TableLineage:
        table = self._catalog.lookup(fqn)
        if isinstance(table, ReplicaTable):  # each column copied from its source's, every row of it
            copied = {c: frozenset({ColumnRef(table.source, c)}) for c in self.columns(table.source)}
            return TableLineage(fqn, (table.source,), copied, frozenset())
        if not isinstance(table, DerivedTable):  # reads no table: each column is its own
            return TableLineage(fqn, (), {c: frozenset() for c in self.columns(fqn)}, frozenset())
        inputs = self.input_columns(table)
        if self._cache is not None:
            found = self._cache.get(fqn, table.sql, inputs, table.partition_by)
            if found is not None:
                return found
        lineage = table_lineage(fqn, table.sql, inputs, added=table.partition_by)
        if self._cache is not None:
            self._cache.put(fqn, table.sql, inputs, table.partition_by, lineage)
        if lineage.unresolved:
            for line in lineage.describe_unresolved():
                log.warning("column lineage: %s", line)
        return lineage


def _upstream_first(graph: Mapping[str, set[str]]) -> list[str]:
    """The tables of ``graph`` (table → the tables it reads), each after those it reads; ties in name order, so that
    what is printed from it reads the same every time."""
    order = graphlib.TopologicalSorter(graph)
    order.prepare()
    found: list[str] = []
    while order.is_active():
        ready = sorted(order.get_ready())
        found.extend(ready)
        order.done(*ready)
    return found


def _declared(table: Table) -> list[str]:
    return [name for name, _ in table.columns]
