"""``warehouse lineage TABLE.COLUMN [--up|--down]``: where a column's values come from, or what they reach;
``warehouse lineage TABLE``: what it reads and how late data rebuilds it; ``warehouse lineage --keys``: that, for every
table.

``--up`` (the default) prints the columns it is computed from, table by table up to the sources, then the columns that
decide the rows of each table on the way (filters, join keys, groupings); ``--down`` prints every table built from it,
transitively: the columns computed from it, or every column where the rows depend on it. A table's rebuilds are
key-scoped when its SQL proves each key's rows come from input rows of that key alone
(:mod:`warehouse_assets.catalog.key_locality`), maintained from the changed rows when it proves the table sums and
counts of its inputs (:mod:`warehouse_assets.catalog.additive`), else whole-partition, and the reasons are printed.
Reads the catalog only.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warehouse_assets.catalog import Catalog
    from warehouse_assets.catalog.lineage import ColumnRef, WarehouseLineage


def add_lineage_parser(sub: Any) -> None:
    lineage = sub.add_parser(
        "lineage",
        help="column lineage: what a column is computed from (--up) or reaches (--down); a table's late-data rebuilds",
    )
    lineage.add_argument(
        "name",
        nargs="?",
        help="layer.table.column, e.g. ads.daily_gmv.gmv; or layer.table: what it reads, how late data rebuilds it",
    )
    direction = lineage.add_mutually_exclusive_group()
    direction.add_argument(
        "--up", dest="down", action="store_false", help="the columns it is computed from, up to the sources (default)"
    )
    direction.add_argument("--down", dest="down", action="store_true", help="the columns and tables built from it")
    direction.add_argument(
        "--keys", action="store_true", help="every table's late-data rebuilds: key-scoped (by which key) or whole, why"
    )
    lineage.set_defaults(down=False)


def run_lineage(args: argparse.Namespace) -> int:
    from warehouse_assets.catalog import LAYERS, load_catalog
    from warehouse_assets.catalog.lineage import WarehouseLineage

    catalog = load_catalog()
    lineage = WarehouseLineage(catalog)
    try:
        if args.keys != (args.name is None):
            raise ValueError("name a column (layer.table.column) or a table (layer.table), or list every table: --keys")
        if args.keys:
            lines = rebuild_lines(catalog, lineage)
        elif args.name.count(".") == 1 and args.name.split(".")[0] in LAYERS:
            if args.down:
                raise ValueError("--down follows a column: name one as layer.table.column")
            lines = table_lines(catalog, lineage, catalog.lookup(args.name).fqn)
        else:
            ref = lineage.column(args.name)
            lines = downstream_lines(lineage, ref) if args.down else upstream_lines(lineage, ref)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def table_lines(catalog: Catalog, lineage: WarehouseLineage, fqn: str) -> list[str]:
    """``fqn``, the tables it reads and how late data rebuilds it."""
    from warehouse_assets.catalog import DerivedTable
    from warehouse_assets.catalog.additive import WarehouseTypes, rebuild_verdict
    from warehouse_assets.catalog.key_locality import key_locality

    table = catalog[fqn]
    if not isinstance(table, DerivedTable):  # a source, or a static table spelling its rows out
        return [fqn, "  reads no table: late data does not rebuild it"]
    inputs = lineage.input_columns(table)
    verdict = rebuild_verdict(key_locality(table, inputs), WarehouseTypes(catalog, lineage).verdict(table))
    return [fqn, f"  reads {', '.join(inputs)}", f"  {verdict}"]


def rebuild_lines(catalog: Catalog, lineage: WarehouseLineage) -> list[str]:
    """Every table late data rebuilds, layer by layer, with how: key-scoped, additive or whole-partition, and why."""
    from warehouse_assets.catalog import LAYERS
    from warehouse_assets.catalog.additive import WarehouseTypes, rebuild_verdict
    from warehouse_assets.catalog.key_locality import key_locality

    tables = sorted(catalog.derived(), key=lambda t: (LAYERS.index(t.layer), t.name))
    types = WarehouseTypes(catalog, lineage)
    verdicts = [(key_locality(table, lineage.input_columns(table)), types.verdict(table)) for table in tables]
    width = max((len(t.fqn) for t in tables), default=0)
    lines = [f"{k.table:<{width}}  {rebuild_verdict(k, a)}" for k, a in verdicts]
    scoped = sum(k.key_local for k, _ in verdicts)
    additive = sum(a.additive for _, a in verdicts)
    whole = len(verdicts) - scoped - additive
    return [*lines, f"{scoped} of {len(verdicts)} tables key-scoped, {additive} additive, {whole} whole-partition"]


def upstream_lines(lineage: WarehouseLineage, ref: ColumnRef) -> list[str]:
    """``ref`` and the columns it is computed from, indented by step, up to the sources; then what decides the rows of
    each table on the way, and the columns the SQL could not be followed to."""
    lines = [f"{ref}"]
    expanded: set[ColumnRef] = set()
    tables: list[str] = []
    stack = [(ref, 0)]
    while stack:  # depth first, inputs in name order
        current, depth = stack.pop()
        if depth:
            seen = current in expanded and lineage.of(current.table).inputs
            lines.append(f"{'  ' * depth}<- {current}" + (" (above)" if seen else ""))
            if seen:
                continue
        expanded.add(current)
        table = lineage.of(current.table)
        if table.inputs and current.table not in tables:
            tables.append(current.table)
        inputs = sorted(table.upstream_of(current.column), reverse=True)
        if not inputs and depth == 0:
            what = "a column of a source (ingested or delivered)" if not table.inputs else "computed from no column"
            lines.append(f"  ({what})")
        stack.extend((found, depth + 1) for found in inputs if found != current)
    for name in tables:
        table = lineage.of(name)
        rows = ", ".join(sorted(str(r) for r in table.rows)) or "every row of its inputs (no filter, join or grouping)"
        lines.append(f"rows of {name}: {rows}")
        lines.extend(f"unresolved: {line}" for line in table.describe_unresolved())
    return lines


def downstream_lines(lineage: WarehouseLineage, ref: ColumnRef) -> list[str]:
    """Every table built from ``ref``, in dependency order, with the columns it reaches there; then the tables built
    from its table that it does not reach."""
    impact = lineage.impact(ref.table, [ref.column])
    reached = [table for table in impact.tables if table != ref.table]
    lines = [f"{ref}"]
    lines += [f"  -> {table:<28} {impact.describe(table)}" for table in reached]
    if not reached:
        lines.append("  (no table reads it)")
    untouched = sorted(lineage.downstream_tables(ref.table) - set(reached) - {ref.table})
    if untouched:
        lines.append(f"built from {ref.table} without reading it: {', '.join(untouched)}")
    for table in reached:
        lines.extend(f"unresolved: {line}" for line in lineage.of(table).describe_unresolved())
    return lines
