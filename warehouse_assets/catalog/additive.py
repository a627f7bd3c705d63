"""Additive totals: whether a table's rows are sums and counts of its inputs' rows (one table's, or an equi-join's),
so that late changes to those inputs are absorbed from the changed rows alone, as incremental view maintenance does
(Databricks Enzyme, Materialize).

A table is **additive** when its SQL is one ``SELECT`` over catalog tables (CTEs and derived tables that merge into
it are fine), each read once, with:

* each table joined (inner or ``LEFT JOIN``) on equalities between its columns and those of the tables before it
  (``a.k = b.k AND ...``); no other join condition, and no ``RIGHT``, ``FULL``, ``CROSS`` or semi join;
* an optional ``WHERE`` and an optional ``GROUP BY`` of the joined tables' columns (the groups);
* select items that are a group column, a constant or a ``${...}`` parameter, or an expression whose every column
  reference sits inside one of ``sum(e)`` (``e`` integral or decimal: a maintained sum of doubles drifts from the
  recomputed one, so it is rebuilt whole), ``count(*)``, ``count(e)``, ``count_if(c)``, ``count(DISTINCT e)``,
  ``min(e)``, ``max(e)`` (one argument, of any type Spark orders); no ``FILTER`` in them;
* no subquery, window, ``HAVING``, ``DISTINCT``, ``LIMIT`` or set operation.

Each aggregate then is a sum over the joined rows, and a sum can be kept: the verdict names its *partials* (each
distinct aggregate call as a mergeable sum, plus a hidden count of each group's rows), a whole build stores them per
group, and a late-data rebuild adds to them the partials of the changed rows (the post-images counted +1, the
pre-images -1) and computes the select items again from them (:mod:`warehouse_assets.materialize.additive`). Over a
join, the change is the standard delta rule: one term per changed input, that input's images joined with the inputs
before it as they are now and those after it as the last build read them; the right side of a ``LEFT JOIN`` is not
linear (a row of it inserted or deleted flips rows of the left between matched and NULL-extended), so its term is
the join with it now minus the join with it then, over the left rows whose join key is among its changed keys. A
``sum(e)`` keeps a count of its non-null values beside it, so that a group's sum goes back to NULL once every value
is gone; a group whose row count reaches 0 is deleted.

``count(DISTINCT e)``, ``min(e)`` and ``max(e)`` are not sums of rows, but their *arrangement* is, as Materialize
keeps a distinct arrangement: per group and per non-null value of ``e``, its multiplicity (the rows holding it) is a
count, kept in a state table of its own per argument ``e`` (:meth:`Additivity.values_sql`; its own table so that the
value keeps ``e``'s type, which orders and compares it as Spark does). A change adds its images' +1/-1 to the
(group, value) pairs it touches: the distinct count moves by the pairs that went from 0 to present minus those that
went from present to 0, an extreme to the least (greatest) of itself and the values that became present, and only a
group whose extreme's pair went to 0 reads its remaining pairs for the new one. The current count and extremes sit
in the group's state row, as the sums do.

A key-local table is not additive (its key-scoped rebuild covers it), nor one declaring ``incremental: false``, one
reading itself, or one reading any table whose changes no change data feed records (static, external, completeness
windows). Anything else is rebuilt whole, and the verdict says why (as :class:`KeyLocality` does).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.merge_subqueries import merge_subqueries
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, build_scope, find_all_in_scope

from warehouse_assets.catalog.key_locality import MAX_KEYS, KeyLocality, _shown, key_locality
from warehouse_assets.catalog.lineage import WarehouseLineage, qualified_scope
from warehouse_assets.catalog.model import ODS_CHANGE_COLUMNS, Catalog, DerivedTable, OdsTable, Table

ROWS = "__rows"  # the hidden count of a group's rows: 0 deletes the group
STATE_SUFFIX = "__state"  # the side table of an additive table's partial states: its own name, with this after it
VALUE = "__v"  # a distinct value of an argument, in its value state table
MULTIPLICITY = "__m"  # the rows of the group holding that value
SUMMED = ("sum", "nonnull", "count_if", "rows")  # the partials that are sums of the rows' weights
VALUED = ("distinct", "min", "max")  # those kept from a value state table (of the (group, value) pairs)
# the input's changed row images a maintained rebuild takes (a pre- and a post-image per updated row); past them a
# whole rebuild costs less, as past key_locality.MAX_KEYS keys a key-scoped one's does
MAX_CHANGED_ROWS = 2 * MAX_KEYS
_SUMMABLE = {*exp.DataType.INTEGER_TYPES, *(t for t in exp.DataType.Type if "DECIMAL" in t.name)}
_NOT_DETERMINISTIC = (exp.Rand, exp.Randn, exp.CurrentTimestamp, exp.CurrentDate, exp.Uuid)


@dataclass(frozen=True)
class Partial:
    """One mergeable state: a sum over the input's rows, each row weighted (1 in a whole build, its image's +1/-1
    in a change)."""

    name: str  # its column in the state table
    # sum: of ``arg``; nonnull: rows where ``arg`` is not null; count_if: where ``arg`` holds; rows; distinct: the
    # distinct non-null values of ``arg``; min, max: its least and greatest (these three: see :data:`VALUED`)
    kind: str
    arg: str = ""  # the argument, as Spark SQL over the input's alias

    @property
    def summed(self) -> bool:
        return self.kind in SUMMED

    def sql(self, weight: str = "1") -> str:
        """The partial as a Spark aggregate of rows weighted by ``weight`` (a column or ``1``); a valued one only
        over a whole build's rows (its change comes from its value states)."""
        if self.kind in VALUED:
            if weight != "1":
                raise ValueError(f"{self.kind}({self.arg}) is not a sum of weighted rows")
            return f"count(DISTINCT {self.arg})" if self.kind == "distinct" else f"{self.kind}({self.arg})"
        if self.kind == "sum":
            return f"sum({self.arg})" if weight == "1" else f"sum(({self.arg}) * {weight})"
        if self.kind == "nonnull":
            return f"sum(CASE WHEN ({self.arg}) IS NOT NULL THEN {weight} ELSE 0 END)"
        if self.kind == "count_if":
            return f"sum(CASE WHEN {self.arg} THEN {weight} ELSE 0 END)"
        return f"sum({weight})"


@dataclass(frozen=True)
class Join:
    """An input joined to the inputs before it, on equalities of columns."""

    input: str
    alias: str
    left: bool  # a LEFT JOIN (else an inner one)
    on: str  # the condition, as Spark SQL over the aliases
    keys: tuple[tuple[str, str, str], ...]  # each equality: its own column, the other side's alias and column


@dataclass(frozen=True)
class Additivity:
    """Whether late changes to ``table``'s inputs are absorbed from the changed rows, and the queries that do it."""

    table: str
    reason: str = ""  # why its partitions are rebuilt whole ("" when additive)
    input: str = ""  # the table it reads first (its FROM)
    alias: str = ""  # that input's alias in the queries below
    joins: tuple[Join, ...] = ()  # the tables joined to it, in order
    group_by: tuple[str, ...] = ()  # the columns it groups by (none: one total per partition)
    group_sources: tuple[str, ...] = ()  # the alias each of them is a column of
    group_outputs: tuple[str, ...] = ()  # the output column carrying each of them
    partials: tuple[Partial, ...] = ()
    where: str = ""  # the filter on the input's rows, as Spark SQL
    select: tuple[str, ...] = ()  # the select items computed from a state row (``__g0``... the groups)

    @property
    def additive(self) -> bool:
        return not self.reason

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every table it reads, in the order of the joins."""
        return (self.input, *(j.input for j in self.joins))

    @property
    def aliases(self) -> tuple[str, ...]:
        return (self.alias, *(j.alias for j in self.joins))

    def describe(self) -> str:
        if not self.additive:
            return f"not additive: {self.reason}"
        kept = "sum/count, distinct counts and extremes" if self.values else "sum/count"
        return f"additive: {kept} maintained from the changed rows of {', '.join(self.inputs)}"

    @property
    def values(self) -> tuple[str, ...]:
        """The arguments whose distinct values are kept, each in a value state table (its index names it)."""
        return tuple(dict.fromkeys(p.arg for p in self.partials if p.kind in VALUED))

    @property
    def group_columns(self) -> tuple[str, ...]:
        """The state table's columns naming a group, one per :attr:`group_by` column."""
        return tuple(f"__g{i}" for i in range(len(self.group_by)))

    def state_sql(self, weight: str = "1", whole: bool = True) -> str:
        """The partials of each group of the joined rows, each row weighted by ``weight`` (a constant, or a column of
        one input's: its images' weights), the table's ``${...}`` parameters left in and the inputs named as in the
        table's SQL; ``whole``: the valued partials too (a whole build's), else the summed ones only."""
        partials = [p for p in self.partials if whole or p.summed]
        return self._grouped([f"{p.sql(weight)} AS {p.name}" for p in partials])

    def values_sql(self, n: int, weight: str = "1") -> str:
        """The multiplicity of each (group, non-null value) pair of the :attr:`values` argument ``n``: its rows,
        each weighted by ``weight``."""
        arg = self.values[n]
        return self._grouped([f"{arg} AS {VALUE}", f"sum({weight}) AS {MULTIPLICITY}"], f"({arg}) IS NOT NULL", arg)

    def _grouped(self, items: list[str], condition: str = "", by: str = "") -> str:
        sources = self.group_sources or (self.alias,) * len(self.group_by)
        columns = [f"{a}.{c}" for a, c in zip(sources, self.group_by, strict=True)]
        groups = [f"{c} AS {g}" for c, g in zip(columns, self.group_columns, strict=True)]
        sql = f"SELECT {', '.join([*groups, *items])} FROM {self.input} AS {self.alias}"
        for j in self.joins:
            sql += f" {'LEFT JOIN' if j.left else 'JOIN'} {j.input} AS {j.alias} ON {j.on}"
        where = f"({self.where}) AND {condition}" if self.where and condition else self.where or condition
        sql += f" WHERE {where}" if where else ""
        keys = [*columns, *([by] if by else [])]
        if keys:
            sql += f" GROUP BY {', '.join(keys)}"
        return sql

    def final_sql(self, states: str) -> str:
        """The table's select items from the state rows of the view ``states``, one output row per state row."""
        return f"SELECT {', '.join(self.select)} FROM {states}"


def state_key(table: Table, values: int | None = None) -> list[str]:
    """The key of the Delta table beside ``table`` that keeps its partial states (not a catalog table, not an asset);
    ``values``: that of the (group, value) pairs of its :attr:`Additivity.values` argument of that index."""
    return [*table.key[:-1], table.key[-1] + STATE_SUFFIX + ("" if values is None else f"_{values}")]


def rebuild_verdict(locality: KeyLocality, additive: Additivity) -> str:
    """How late data rebuilds a table, in words: by key, by group from the changed rows, or whole and why."""
    if locality.key_local:
        return locality.describe()
    if additive.additive:
        return additive.describe()
    return f"{locality.describe()}; {additive.describe()}"


class _NotAdditive(Exception):
    """Why a table's rows are not sums and counts of one input's rows."""


def additivity(
    table: DerivedTable, inputs: Mapping[str, Mapping[str, str]], feeds: Collection[str] | None = None
) -> Additivity:
    """The verdict for ``table``, whose inputs have the columns ``inputs`` (``layer.table`` → column → Spark type,
    "" when unknown); ``feeds``: the inputs whose changes a change data feed records (all of them without)."""

    def whole(reason: str) -> Additivity:
        return Additivity(table.fqn, reason=reason)

    if not table.incremental:
        return whole("declared incremental: false")
    if table.fqn in inputs or any(dep.table == table.fqn for dep in table.deps):
        return whole("reads itself (each partition is built on the one before)")
    if table.states:
        return whole("passes through states")
    names = {name: tuple(columns) for name, columns in inputs.items()}
    try:
        if key_locality(table, names).key_local:
            return whole("key-local: its key-scoped rebuild replaces the changed keys' rows")
    except Exception:  # a key proof that fails proves nothing either way: the additive proof decides
        pass
    missing = sorted(n for n in inputs if feeds is not None and n not in feeds)
    if missing:
        return whole(f"reads {missing[0]}, whose changes no change data feed records")
    try:
        return _prove(table.fqn, table.sql, inputs)
    except _NotAdditive as exc:
        return whole(str(exc))
    except (SqlglotError, ValueError) as exc:
        return whole(f"the SQL could not be followed: {str(exc).splitlines()[0]}")


def _prove(fqn: str, sql: str, inputs: Mapping[str, Mapping[str, str]]) -> Additivity:
    qualified = qualified_scope(sql, {name: tuple(types) for name, types in inputs.items()})
    scope: Scope | None = qualified
    if qualified.cte_scopes or qualified.derived_table_scopes:  # inlined where they are plain selects of the table
        scope = build_scope(merge_subqueries(qualified.expression))
    query = scope.expression if scope else None
    if isinstance(query, exp.SetOperation):
        raise _NotAdditive(f"{type(query).__name__.upper()} of queries: a set operation is not maintained")
    if not isinstance(query, exp.Select) or scope is None:
        raise _NotAdditive("the SQL is not one SELECT")
    schema = _sqlglot_schema(inputs)
    annotate_types(query, schema=schema, dialect="spark")
    _shape(scope, query)
    alias, name = _source(query.args["from_"].this)
    joins = _joins(query, alias)
    group = query.args.get("group")
    grouped = list(group.expressions) if group else []
    if group is not None and (not grouped or not all(isinstance(g, exp.Column) for g in grouped)):
        shown = ", ".join(_shown(g) for g in grouped) or _shown(group)
        raise _NotAdditive(f"groups by {shown}: only input columns are groups")
    by = tuple(dict.fromkeys((g.table, g.name) for g in grouped))
    where = query.args.get("where")
    if where is not None and any(where.find_all(*_NOT_DETERMINISTIC)):
        raise _NotAdditive(f"{_shown(where)} is not deterministic")
    partials: dict[tuple[str, str], Partial] = {("rows", ""): Partial(ROWS, "rows")}
    select = [_item(s, by, partials) for s in query.selects]
    outputs = []
    for source, column in by:
        carrying = next((s.alias_or_name for s in query.selects if _is_column(s.unalias(), source, column)), None)
        if carrying is None:
            raise _NotAdditive(f"groups by {column}, which it does not select: its rows cannot be found by group")
        outputs.append(carrying)
    return Additivity(
        fqn,
        input=name,
        alias=alias,
        joins=joins,
        group_by=tuple(c for _, c in by),
        group_sources=tuple(a for a, _ in by),
        group_outputs=tuple(outputs),
        partials=tuple(partials.values()),
        where=where.this.sql(dialect="spark") if where is not None else "",
        select=tuple(select),
    )


def _source(node: exp.Expr) -> tuple[str, str]:
    """The alias and the catalog name of a table the query reads."""
    if not isinstance(node, exp.Table) or not node.db:
        raise _NotAdditive(f"reads {_shown(node)}, not a catalog table")
    if node.args.get("sample") or node.args.get("pivots"):
        raise _NotAdditive(f"{_shown(node)} samples or pivots rows")
    return node.alias_or_name, f"{node.db}.{node.name}"


def _joins(query: exp.Select, first: str) -> tuple[Join, ...]:
    """The joined tables, each on equalities of its columns with the columns of tables joined before it: what the
    delta rule maintains (a term per changed table, its matches found by those keys)."""
    joins: list[Join] = []
    seen = [first]
    for join in query.args.get("joins") or []:
        alias, name = _source(join.this)
        shown = _shown(join.this)
        side, kind = (join.side or "").upper(), (join.kind or "").upper()
        if side in ("RIGHT", "FULL") or kind in ("CROSS", "SEMI", "ANTI") or join.method:
            how = " ".join(w for w in (join.method, side, kind) if w).upper()
            raise _NotAdditive(f"{how} JOIN {shown}: only inner joins and LEFT JOINs are maintained")
        if join.args.get("using"):
            raise _NotAdditive(f"joins {shown} USING columns: only ON equalities of columns are maintained")
        on = join.args.get("on")
        keys = []
        for part in on.flatten() if isinstance(on, exp.And) else [on]:
            pair = _equality(part, alias, seen)
            if pair is None:
                condition = _shown(on) if on is not None else "no condition"
                raise _NotAdditive(
                    f"joins {shown} on {condition}: only equalities of its columns with the columns of the tables "
                    "joined before it are maintained"
                )
            keys.append(pair)
        joins.append(Join(name, alias, side == "LEFT", on.sql(dialect="spark"), tuple(keys)))
        seen.append(alias)
    names = [_source(query.args["from_"].this)[1], *(j.input for j in joins)]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise _NotAdditive(f"reads {twice} twice: each input's change is one term of the join")
    return tuple(joins)


def _equality(node: exp.Expr | None, alias: str, before: list[str]) -> tuple[str, str, str] | None:
    """``own.c = other.d`` (either way round) as (c, other, d), for a column ``own`` of the joined table ``alias``
    and ``other`` an alias before it; None for anything else."""
    if not isinstance(node, exp.EQ):
        return None
    a, b = node.this, node.expression
    if not isinstance(a, exp.Column) or not isinstance(b, exp.Column):
        return None
    if a.table == alias and b.table in before:
        return a.name, b.table, b.name
    if b.table == alias and a.table in before:
        return b.name, a.table, a.name
    return None


def _shape(scope: Scope, query: exp.Select) -> None:
    """Refuses what reads across rows otherwise than a group's sums: the clauses the proof does not follow."""
    if scope.subquery_scopes or scope.cte_scopes or scope.derived_table_scopes:
        inner = [*scope.subquery_scopes, *scope.cte_scopes, *scope.derived_table_scopes][0].expression
        raise _NotAdditive(f"reads the subquery ({_shown(inner)}), which does not merge into one SELECT")
    for clause in ("having", "qualify", "limit", "offset", "distinct"):
        if query.args.get(clause):
            raise _NotAdditive(f"{clause.upper()} is not maintained from changed rows")
    window = next(find_all_in_scope(query, exp.Window), None)
    if window is not None:
        raise _NotAdditive(f"window function {_shown(window)} reads across rows")
    if not scope.selected_sources or query.args.get("from_") is None:
        raise _NotAdditive("reads no catalog table")
    if query.args.get("laterals"):
        raise _NotAdditive(f"{_shown(query.args['laterals'][0])} explodes rows")


def _item(item: exp.Expr, by: tuple[tuple[str, str], ...], partials: dict[tuple[str, str], Partial]) -> str:
    """The select item computed from a state row: each aggregate replaced by its partials, each group column by the
    state's column for it."""
    value = item.copy()
    for aggregate in list(value.find_all(exp.AggFunc)):
        if isinstance(aggregate.parent, exp.AggFunc):
            continue  # an aggregate inside an aggregate: Spark refuses it, and the outer one is looked at
        aggregate.replace(_final(aggregate, partials))
    for column in list(value.find_all(exp.Column)):
        if column.name in {p.name for p in partials.values()}:  # a state's own column, put in above
            continue
        if (column.table, column.name) not in by:
            raise _NotAdditive(
                f"{_shown(item)} reads {column.name} outside an aggregate, not a group column"
                if by
                else f"{_shown(item)} reads {column.name} outside an aggregate (no GROUP BY: one row per partition)"
            )
        column.replace(exp.column(f"__g{by.index((column.table, column.name))}"))
    if any(value.find_all(*_NOT_DETERMINISTIC)):
        raise _NotAdditive(f"{_shown(item)} is not deterministic")
    return value.sql(dialect="spark")


def _final(aggregate: exp.AggFunc, partials: dict[tuple[str, str], Partial]) -> exp.Expr:
    """The aggregate's value from its partials (registered in ``partials``)."""

    def partial(kind: str, arg: exp.Expr | None) -> str:
        text = arg.sql(dialect="spark") if arg is not None else ""
        found = partials.get((kind, text))
        if found is None:
            found = partials[(kind, text)] = Partial(f"__a{len(partials)}", kind, text)
        return found.name

    if isinstance(aggregate.parent, exp.Filter):
        raise _NotAdditive(f"{_shown(aggregate.parent)}: FILTER is not maintained")
    arg = aggregate.this
    if isinstance(aggregate, exp.Count | exp.Min | exp.Max) and isinstance(arg, exp.Distinct):
        if len(arg.expressions) != 1:
            raise _NotAdditive(f"{_shown(aggregate)}: only distinct values of one argument are kept")
        if any(arg.expressions[0].find_all(exp.AggFunc, *_NOT_DETERMINISTIC)):
            raise _NotAdditive(f"{_shown(aggregate)} nests an aggregate or is not deterministic")
        kind = "distinct" if isinstance(aggregate, exp.Count) else type(aggregate).__name__.lower()
        found = partial(kind, arg.expressions[0])
        return sqlglot.parse_one(f"coalesce({found}, 0)" if kind == "distinct" else found, read="spark")
    if isinstance(aggregate, exp.Min | exp.Max) and not aggregate.expressions:  # min(a, b) is least(): not kept
        if any(arg.find_all(exp.AggFunc, *_NOT_DETERMINISTIC)):
            raise _NotAdditive(f"{_shown(aggregate)} nests an aggregate or is not deterministic")
        return exp.column(partial(type(aggregate).__name__.lower(), arg))
    if isinstance(aggregate, exp.Count) and not aggregate.expressions:
        if isinstance(arg, exp.Star) or arg is None:
            return sqlglot.parse_one(f"coalesce({partial('rows', None)}, 0)", read="spark")
        return sqlglot.parse_one(f"coalesce({partial('nonnull', arg)}, 0)", read="spark")
    if isinstance(aggregate, exp.CountIf):
        return sqlglot.parse_one(f"coalesce({partial('count_if', arg)}, 0)", read="spark")
    if isinstance(aggregate, exp.Sum):
        if any(arg.find_all(exp.AggFunc)):
            raise _NotAdditive(f"{_shown(aggregate)} nests an aggregate")
        if arg.type is None or arg.type.this == exp.DataType.Type.UNKNOWN:
            raise _NotAdditive(f"{_shown(aggregate)}: the type of {_shown(arg)} is not known")
        if arg.type.this not in _SUMMABLE:
            raise _NotAdditive(
                f"{_shown(aggregate)} sums {arg.type.sql(dialect='spark').lower()} values, whose maintained sum "
                "drifts from a recomputed one (only integral and decimal sums are kept)"
            )
        total, present = partial("sum", arg), partial("nonnull", arg)
        return sqlglot.parse_one(f"CASE WHEN {present} > 0 THEN {total} END", read="spark")
    raise _NotAdditive(f"{_shown(aggregate)} is not a sum, a count, a distinct count or an extreme")


def _is_column(node: exp.Expr, source: str, name: str) -> bool:
    return isinstance(node, exp.Column) and node.table == source and node.name == name


class WarehouseTypes:
    """The column types of the catalog's tables: declared (ODS, external, static, or a table's ``columns``), else
    inferred from the table's SQL over its inputs' types (sqlglot's type annotation; "" where it cannot tell)."""

    def __init__(self, catalog: Catalog, lineage: WarehouseLineage | None = None):
        self.catalog = catalog
        self.lineage = lineage or WarehouseLineage(catalog)
        self._types: dict[str, dict[str, str]] = {}
        self._verdicts: dict[str, Additivity] = {}

    def columns(self, fqn: str) -> dict[str, str]:
        """Column → Spark type of the table ``fqn`` as stored (its partition columns too)."""
        pending = [fqn]
        while pending:  # the inputs first, without recursion: a chain of thousands of tables is no stack
            name = pending[-1]
            if name in self._types:
                pending.pop()
                continue
            table = self.catalog.lookup(name)
            missing = [] if table.columns or not isinstance(table, DerivedTable) else self._missing(table)
            if missing:
                pending.extend(missing)
                continue
            self._types[name] = self._own(table)
            pending.pop()
        return self._types[fqn]

    def input_types(self, table: DerivedTable) -> dict[str, dict[str, str]]:
        """The column types of each table ``table`` reads."""
        return {name: self.columns(name) for name in self.lineage.input_columns(table)}

    def verdict(self, table: DerivedTable) -> Additivity:
        """The table's :func:`additivity`, proven once (a proof that cannot be followed says so)."""
        found = self._verdicts.get(table.fqn)
        if found is None:
            try:
                inputs = self.input_types(table)
                feeds = [n for n in inputs if isinstance(self.catalog.lookup(n), OdsTable | DerivedTable)]
                found = additivity(table, inputs, feeds)
            except Exception as exc:  # as the key proof: a proof that fails is no proof, rebuilt whole
                found = Additivity(table.fqn, reason=f"the SQL could not be followed: {exc!r}")
            self._verdicts[table.fqn] = found
        return found

    def _missing(self, table: DerivedTable) -> list[str]:
        reads = {dep.table for dep in (*table.deps, *table.references)} - {table.fqn}
        return [name for name in sorted(reads) if name not in self._types]

    def _own(self, table: Table) -> dict[str, str]:
        partitions = {c: "string" for c in table.partition_by}
        if isinstance(table, OdsTable):
            return {**dict(table.columns), **dict(ODS_CHANGE_COLUMNS), **partitions}
        if table.columns or not isinstance(table, DerivedTable):
            return {**dict(table.columns), **{c: t for c, t in partitions.items() if c not in dict(table.columns)}}
        inputs = {name: self._types[name] for name in sorted({d.table for d in (*table.deps, *table.references)})}
        return {**_inferred(table.sql, inputs), **partitions}


def _sqlglot_schema(inputs: Mapping[str, Mapping[str, str]]) -> dict[str, object]:
    """``inputs``' typed columns (``layer.table`` → column → type) as sqlglot's nested schema; "unknown" where the
    type is not known."""
    schema: dict[str, object] = {}
    for fqn, types in inputs.items():
        layer, name = fqn.split(".", 1)
        tables = schema.setdefault(layer, {})
        assert isinstance(tables, dict)
        tables[name] = {c: t or "unknown" for c, t in types.items()}
    return schema


def _inferred(sql: str, inputs: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The output column types of ``sql`` over ``inputs``' typed columns ("" where sqlglot cannot tell)."""
    schema = _sqlglot_schema(inputs)
    try:
        tree = qualify(sqlglot.parse_one(sql, read="spark"), dialect="spark", schema=schema, quote_identifiers=False)
        tree = annotate_types(tree, schema=schema, dialect="spark")
    except (SqlglotError, ValueError):
        return {}
    if not isinstance(tree, exp.Query):
        return {}
    out = {}
    for item in tree.selects:
        known = item.type is not None and item.type.this != exp.DataType.Type.UNKNOWN
        out[item.alias_or_name] = item.type.sql(dialect="spark").lower() if known and item.type else ""
    return out
