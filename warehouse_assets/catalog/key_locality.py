"""Key locality: whether a table's rows for one value of its primary key are computed only from input rows carrying
that value, so that late changes to a few keys can rebuild those keys' rows instead of the whole partition.

A table is **key-local** when its SQL proves, scope by scope (through CTEs, derived tables and set operations), that:

* each primary-key column is carried straight from one input column (or a ``coalesce`` of input columns joined as
  equal, as ``JOIN ... USING`` qualifies to), not computed, and not from the optional side of an outer join;
* every table it reads is joined on the key: the ``ON``/``WHERE`` equalities put one of its columns in each key
  column's equivalence class, so a key's rows only ever meet rows of the same key;
* a ``GROUP BY`` groups by exactly the key; an aggregate without one spans the whole partition;
* each window's ``PARTITION BY`` includes the key;
* nothing else reads across keys: no subquery (scalar, ``IN``, ``EXISTS``), ``LIMIT``, sample, pivot, lateral
  view or table function;
* it does not read itself (a T-1 or window of itself): its rows are the next partition's input, so the changed keys
  would have to follow the chain of later partitions, which one partition's proof does not cover;
* it does not declare ``incremental: false``.

Filters on a row's own columns, ``DISTINCT``, ``HAVING`` and aggregates within a group keep a key's rows to that key.
Anything else is whole-partition, with the reason: the proof is conservative, a table it cannot follow is rebuilt
whole as before. The verdict names, for each input, the columns the key is carried from: a key-scoped rebuild
filters each input by the changed keys on those columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.scope import Scope, find_all_in_scope

from warehouse_assets.catalog.lineage import qualified_scope
from warehouse_assets.catalog.model import DerivedTable

# The limits of a key-scoped rebuild: past either bound a whole rebuild is cheaper than finding and replacing the
# keys' rows one by one, or the keys, collected to the driver and broadcast, grow too large to carry. Below
# SMALL_PARTITION rows either way is one small Spark job: the share is not looked at. The runner applies them to the
# keys it finds; the late-data rule to the changes recorded, to pick the rule. The share decides for large
# partitions, from a 10-million-row day on local Spark: by key against whole, 2 % of its rows rebuilt 3.5x (a
# row-local table) and 2.6x (a GROUP BY) faster with the keys named in a replaceWhere (1.5x and 2.7x as a MERGE,
# which at 5 % lost, 0.67x, and 1.8x); 5 % is not measured with the replaceWhere, whose predicate's analysis grows
# with the keys, so the share stays below the MERGE's crossover near 3 %. The absolute bound only keeps the
# broadcast in tens of megabytes
MAX_KEYS = 1_000_000
MAX_SHARE = 0.025  # of the rows the partition held after its last build
SMALL_PARTITION = 10_000

_SHOWN = 90  # characters of SQL a reason quotes
_QUERIES = (exp.Select, exp.SetOperation, exp.Subquery)  # what a scope the walk follows may be


@dataclass(frozen=True)
class KeyLocality:
    """Whether late changes to some keys of ``table`` may rebuild only those keys' rows, and how."""

    table: str
    key: tuple[str, ...]  # the output columns identifying a key: the primary key
    # input table → its columns carrying the key, in the key's order (empty when not key-local)
    carried_from: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    reason: str = ""  # why the table is rebuilt whole ("" when it is key-local)

    @property
    def key_local(self) -> bool:
        return not self.reason

    def describe(self) -> str:
        """``key-scoped rebuilds: by user_id (from dwd.order_detail.user_id)``, or ``whole-partition rebuilds: `` and
        why."""
        if not self.key_local:
            return f"whole-partition rebuilds: {self.reason}"
        key = self.key[0] if len(self.key) == 1 else f"({', '.join(self.key)})"
        sources = ", ".join(f"{table}.{column}" for table, columns in self.carried_from.items() for column in columns)
        return f"key-scoped rebuilds: by {key} (from {sources})"


def key_locality(table: DerivedTable, inputs: Mapping[str, Sequence[str]]) -> KeyLocality:
    """The verdict for ``table``, whose inputs have the columns ``inputs`` (``layer.table`` → its columns)."""
    key = table.primary_key

    def whole(reason: str) -> KeyLocality:
        return KeyLocality(table.fqn, key, reason=reason)

    if not table.incremental:
        return whole("declared incremental: false")
    own = next((dep for dep in table.deps if dep.table == table.fqn), None)
    if own is not None:
        window = (
            f"a T{own.start_offset}"
            if own.start_offset == own.end_offset
            else f"a window [{own.start_offset}, {own.end_offset}]"
        )
        return whole(f"reads {window} of itself (each partition is built on the one before)")
    if not key:
        return whole("declares no primary_key: no key to rebuild by")
    try:
        walk = _KeyWalk(inputs)
        walk.scope(qualified_scope(table.sql, inputs), key)
    except _NotKeyLocal as exc:
        return whole(str(exc))
    except (SqlglotError, ValueError) as exc:
        return whole(f"the SQL could not be followed: {str(exc).splitlines()[0]}")
    return KeyLocality(table.fqn, key, dict(sorted(walk.carried.items())))


class _NotKeyLocal(Exception):
    """Why a scope's rows for a key may depend on rows of other keys."""


class _KeyWalk:
    """Follows the key down the scopes of one qualified query, collecting each table's columns that carry it."""

    def __init__(self, inputs: Mapping[str, Sequence[str]]) -> None:
        self._inputs = set(inputs)
        self.carried: dict[str, tuple[str, ...]] = {}

    def scope(self, scope: Scope, key: Sequence[str]) -> None:
        """Proves that ``scope``'s rows for a value of its output columns ``key`` come from rows with that value."""
        query = scope.expression
        for clause in ("limit", "offset"):  # on a SELECT, a UNION or a parenthesised query alike
            if query.args.get(clause):
                raise _NotKeyLocal(f"{clause.upper()} keeps rows across keys")
        if isinstance(query, exp.SetOperation):  # each branch's rows by its own columns at the key's positions
            names = [s.alias_or_name for s in query.selects]
            missing = [k for k in key if k not in names]
            if missing:
                raise _NotKeyLocal(f"the key {', '.join(missing)} is not a column the query selects")
            for branch in scope.set_operation_scopes:
                assert isinstance(branch.expression, exp.Query)
                selects = branch.expression.selects
                self.scope(branch, [selects[names.index(k)].alias_or_name for k in key])
        elif isinstance(query, exp.Subquery):  # a parenthesised query: the query inside
            inner = [*scope.subquery_scopes, *scope.derived_table_scopes, *scope.set_operation_scopes]
            if not inner:
                raise _NotKeyLocal(f"cannot read the subquery {_shown(query)}")
            self.scope(inner[0], key)
        elif isinstance(query, exp.Select):
            self._select(scope, query, key)
        else:  # the SQL's own root: its sources are checked before they are walked
            raise _NotKeyLocal(f"{_shown(query)} is not a query of tables")

    def _select(self, scope: Scope, query: exp.Select, key: Sequence[str]) -> None:
        if scope.subquery_scopes:
            raise _NotKeyLocal(f"the subquery ({_shown(scope.subquery_scopes[0].expression)}) reads across keys")
        group = query.args.get("group")
        if group is None:
            aggregate = next(_aggregates(query), None)
            if aggregate is not None:
                raise _NotKeyLocal(f"{_shown(aggregate)} aggregates the whole partition, across keys (no GROUP BY)")
        classes = _Equalities(scope, query)
        key_classes = [self._key_class(scope, query, name, classes) for name in key]
        roots = [root for root, _ in key_classes]
        if group is not None:
            self._grouped_by_key(group, key, roots, classes)
        for window in find_all_in_scope(query, exp.Window):
            partition = {classes.root(c) for c in window.args.get("partition_by") or [] if isinstance(c, exp.Column)}
            if not set(roots) <= partition:
                raise _NotKeyLocal(f"window function {_shown(window)} spans keys")
        for alias, (node, source) in scope.selected_sources.items():
            if isinstance(source, Scope) and not isinstance(source.expression, _QUERIES):
                raise _NotKeyLocal(f"reads {_shown(source.expression)}: literal rows or a table function carry no key")
            # the key expression's own column where it reads this source; else any of its columns joined as equal
            carriers = [own.get(alias) or classes.column_of(alias, root) for root, own in key_classes]
            if not all(carriers):
                joined = ", ".join(classes.joined.get(alias, [])) or "no column"
                raise _NotKeyLocal(f"joins {_named(alias, source)} on {joined}, not on the key {', '.join(key)}")
            self._source(node, source, [c for c in carriers if c])

    def _key_class(
        self, scope: Scope, query: exp.Select, name: str, classes: _Equalities
    ) -> tuple[tuple[str, str], dict[str, str]]:
        """The equivalence class of the key column ``name`` (its root), and the column it reads of each source."""
        selected = next((s for s in query.selects if s.alias_or_name == name), None)
        if selected is None:
            raise _NotKeyLocal(f"the key {name} is not a column the query selects")
        value = selected.unalias()
        columns = (
            [value]
            if isinstance(value, exp.Column)
            else [value.this, *value.expressions]
            if isinstance(value, exp.Coalesce)
            else []
        )
        unbound = [c.sql(dialect="spark") for c in value.find_all(exp.Column) if c.table not in scope.sources]
        if unbound:
            raise _NotKeyLocal(f"the key {name} reads {unbound[0]}, not a column of any table it reads")
        if not columns or not all(isinstance(c, exp.Column) for c in columns):
            if not any(value.find_all(exp.Column)):
                raise _NotKeyLocal(f"the key {name} is the constant {_shown(value)}: one key for the whole partition")
            raise _NotKeyLocal(f"the key {name} is computed ({_shown(value)}), not carried from an input column")
        roots = {classes.root(c) for c in columns}
        if len(roots) > 1:
            raise _NotKeyLocal(f"the key {name} is {_shown(value)}, of columns not joined as equal")
        sides = {c.table for c in columns}
        # a key from the optional side of an outer join is null where that side is missing, whatever the key's value
        if sides <= classes.optional and not set(scope.selected_sources) <= sides:
            raise _NotKeyLocal(
                f"the key {name} comes from {', '.join(sorted(sides))}, the optional side of an outer join"
            )
        return roots.pop(), {c.table: c.name for c in columns}

    @staticmethod
    def _grouped_by_key(
        group: exp.Group, key: Sequence[str], roots: list[tuple[str, str]], classes: _Equalities
    ) -> None:
        # ROLLUP, CUBE and GROUPING SETS are no column: their subtotals are rows over several keys
        grouped = group.expressions
        found = {classes.root(g) for g in grouped if isinstance(g, exp.Column)}
        if not grouped or len(found) != len(grouped) or found != set(roots):
            shown = ", ".join(_shown(g) for g in grouped) or _shown(group)
            raise _NotKeyLocal(f"groups by {shown}, not by the key {', '.join(key)} carried from an input column")

    def _source(self, node: exp.Expr, source: exp.Expr | Scope, carriers: list[str]) -> None:
        if isinstance(source, Scope):
            self.scope(source, carriers)
            return
        if not isinstance(source, exp.Table):
            raise _NotKeyLocal(f"reads {_shown(node)}, which carries no key")
        if source.args.get("sample") or source.args.get("pivots"):
            raise _NotKeyLocal(f"{_shown(source)} samples or pivots rows across keys")
        name = f"{source.db}.{source.name}"
        if name not in self._inputs:
            raise _NotKeyLocal(f"reads {source.sql(dialect='spark')}, not a table of the catalog")
        found = tuple(carriers)
        if self.carried.setdefault(name, found) != found:  # one filter per input: reading it twice by two keys is not
            raise _NotKeyLocal(
                f"reads {name} twice, the key carried by {', '.join(self.carried[name])} and by {', '.join(found)}"
            )


class _Equalities:
    """The columns of one select scope's sources known equal wherever both sources are in a row it produces: the
    conjuncts ``a.x = b.y`` of its join conditions and ``WHERE``, across two sources (an equality within one source
    says nothing about which rows of another it meets), as equivalence classes of (source alias, column). An outer
    join may leave a source out of a row: :attr:`optional` names those."""

    def __init__(self, scope: Scope, query: exp.Select) -> None:
        self._parent: dict[tuple[str, str], tuple[str, str]] = {}
        self.joined: dict[str, list[str]] = {}  # source alias → its columns equated with another source's
        self.optional: set[str] = set()  # the aliases an outer join may leave missing (null) in a row
        seen = list(scope.selected_sources)  # FROM, then each join, in order
        conditions = [query.args["where"].this] if query.args.get("where") else []
        for join in query.args.get("joins") or []:
            alias = join.this.alias_or_name
            before = seen[: seen.index(alias)]
            if join.side in ("LEFT", "FULL") and join.kind not in ("SEMI", "ANTI"):
                self.optional.add(alias)
            if join.side in ("RIGHT", "FULL"):
                self.optional.update(before)
            if join.args.get("on") is not None:
                conditions.append(join.args["on"])
        for condition in conditions:
            for conjunct in _conjuncts(condition):
                if not isinstance(conjunct, exp.EQ | exp.NullSafeEQ):
                    continue
                left, right = conjunct.this.unnest(), conjunct.expression.unnest()
                if isinstance(left, exp.Column) and isinstance(right, exp.Column) and left.table != right.table:
                    for column in (left, right):
                        self.joined.setdefault(column.table, []).append(column.name)
                    self._parent[self._find((left.table, left.name))] = self._find((right.table, right.name))

    def _find(self, member: tuple[str, str]) -> tuple[str, str]:
        while self._parent.get(member, member) != member:
            member = self._parent[member]
        return member

    def root(self, column: exp.Expr) -> tuple[str, str]:
        """The class of a column of this scope (a column equated with none is a class of its own)."""
        assert isinstance(column, exp.Column)
        return self._find((column.table, column.name))

    def column_of(self, alias: str, root: tuple[str, str]) -> str:
        """A column of the source ``alias`` in the class ``root`` ("" if none is)."""
        members = {member for member in [*self._parent, root] if member[0] == alias and self._find(member) == root}
        return min(members)[1] if members else ""


def _conjuncts(condition: exp.Expr) -> Iterator[exp.Expr]:
    condition = condition.unnest()
    if isinstance(condition, exp.And):
        for part in condition.flatten():
            yield from _conjuncts(part)
    else:
        yield condition


def _aggregates(query: exp.Select) -> Iterator[exp.Expr]:
    """The aggregate calls of the select scope ``query`` that are not window functions."""
    for found in find_all_in_scope(query, exp.AggFunc):
        if not isinstance(found.parent, exp.Window):
            yield found


def _named(alias: str, source: exp.Expr | Scope) -> str:
    """A source as a reason names it: ``dwd.lesson_snapshot``, or ``r (reading ext.fx_rate)`` for a query's alias."""
    if isinstance(source, exp.Table):
        return f"{source.db}.{source.name}"
    query = source.expression if isinstance(source, Scope) else source
    reads = sorted({f"{t.db}.{t.name}" for t in query.find_all(exp.Table) if t.db})
    return f"{alias} (reading {', '.join(reads)})" if reads else alias


def _shown(node: exp.Expr) -> str:
    """``node`` as the author wrote it, near enough: without the aliases qualification added, cut short."""

    def unqualified(found: exp.Expr) -> exp.Expr:
        if isinstance(found, exp.Column) and not found.is_star:
            return exp.column(found.name)
        if isinstance(found, exp.Table) and found.alias == found.name:
            found.set("alias", None)
        return found

    def unnamed(found: exp.Expr) -> exp.Expr:
        if not isinstance(found, exp.Alias):
            return found
        added = found.alias.startswith("_col_") or (
            isinstance(found.this, exp.Column) and found.alias == found.this.name
        )
        return found.this if added else found

    # two passes: a node a transform replaces is not walked into
    shown = node.copy().transform(unqualified).transform(unnamed)
    text = shown.sql(dialect="spark", normalize_functions="lower")
    return text if len(text) <= _SHOWN else f"{text[: _SHOWN - 3]}..."
