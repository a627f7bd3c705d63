"""A table's SQL as one partition's build runs it: the partition's variables substituted and every input renamed to
the temporary view the runner registers it under (the runner's and the additive maintainer's queries alike)."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from warehouse_assets.catalog import (
    Catalog,
    DerivedTable,
    OdsWindows,
    Table,
    business_zone,
    partition_values_of,
    partition_window,
)


def read_name(catalog: Catalog, table: str) -> str:
    """The table the SQL names for the dependency on ``table``: an ODS table's completeness windows are read as the
    ODS table itself."""
    upstream = catalog[table]
    return upstream.source if isinstance(upstream, OdsWindows) else table


def view_name(fqn: str, suffix: str = "") -> str:
    """The temporary view an input is registered under; ``suffix`` tells apart the views of the partitions of one
    ranged write, whose queries are planned before any of them runs."""
    return "__in_" + fqn.replace(".", "__") + suffix


def render_sql(table: Table, partition_key: str, catalog: Catalog | None = None, suffix: str = "") -> str:
    """The table's SQL with partition variables substituted and inputs renamed to their views (``catalog``: the
    tables the SQL names for completeness windows, :func:`read_name`; ``suffix``: :func:`view_name`'s). A table with
    regions also has ``${region}``, and its ``${ds}`` is the region's date; ``${start}`` and ``${end}`` are business
    time, as the data's timestamps."""
    assert isinstance(table, DerivedTable)
    window = partition_window(table, partition_key)
    start, end = window.start.astimezone(business_zone()), window.end.astimezone(business_zone())
    variables = {
        "ds": window.start.strftime("%Y-%m-%d"),
        "hour": window.start.strftime("%H"),
        "start": start.strftime("%Y-%m-%d %H:%M:%S"),
        "end": end.strftime("%Y-%m-%d %H:%M:%S"),
        "partition_key": partition_key,
        **({"region": partition_values_of(table, partition_key)["region"]} if table.is_regional else {}),
    }
    sql = table.sql
    for name, value in variables.items():
        sql = sql.replace("${" + name + "}", value)
    tree = sqlglot.parse_one(sql, read="spark")
    deps = {read_name(catalog, dep.table) if catalog else dep.table for dep in table.deps}
    deps |= {ref.table for ref in table.references}

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and f"{node.db}.{node.name}" in deps:
            alias = node.alias or node.name
            return exp.Table(
                this=exp.to_identifier(view_name(f"{node.db}.{node.name}", suffix)),
                alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)),
            )
        return node

    return tree.transform(swap).sql(dialect="spark")
