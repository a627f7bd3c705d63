"""A table's column lineage as Markdown, for the asset's page in the open-source Dagster UI.

The UI hides ``dagster/column_lineage`` from every metadata table (Dagster+ draws it), so the same lineage goes in a
Markdown entry too: one row per output column with the input columns its values are computed from, then the input
columns that decide which rows there are, as ``warehouse lineage`` prints them. Dagster 1.13's UI renders a Markdown
entry inline only under 1,000 characters (``MetadataEntry.tsx``: ``expandSmallValues && mdStr.length < 1000``), else
behind a "[Show Markdown]" button; a longer lineage first names each input table once per row (``t.{a, b}``), then is
split into several entries of whole rows, each shown inline. :func:`column_lineage_metadata` is what a build's
materialization carries: Dagster's own ``dagster/column_lineage`` and these entries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dagster import AssetKey, MetadataValue, TableColumnDep, TableColumnLineage

from warehouse_assets.catalog.lineage import ColumnRef, TableLineage

if TYPE_CHECKING:
    from warehouse_assets.catalog.model import Catalog

INLINE_LIMIT = 1000  # the UI's: a Markdown entry this long or longer goes behind a button
LABEL = "column_lineage"
_HEADER = "| column | computed from |\n| --- | --- |"


def _full(refs: Iterable[ColumnRef]) -> str:
    return ", ".join(str(ref) for ref in sorted(refs))


def _grouped(refs: Iterable[ColumnRef]) -> str:
    by_table: dict[str, list[str]] = {}
    for ref in sorted(refs):
        by_table.setdefault(ref.table, []).append(ref.column)
    return ", ".join(f"{t}.{c[0]}" if len(c) == 1 else f"{t}.{{{', '.join(c)}}}" for t, c in by_table.items())


def lineage_lines(lineage: TableLineage, grouped: bool = False) -> list[str]:
    """The Markdown rows: a table row per output column, then the rows' columns and what could not be followed."""
    name = _grouped if grouped else _full
    lines = [f"| `{column}` | {name(refs) or '(no input column)'} |" for column, refs in lineage.columns.items()]
    rows = name(lineage.rows) or "every row of its inputs (no filter, join or grouping)"
    lines.append(f"\n**rows decided by:** {rows}")
    lines.extend(f"\n**unresolved:** {line}" for line in lineage.describe_unresolved())
    return lines


def lineage_markdown(lineage: TableLineage) -> list[str]:
    """The lineage as Markdown entries, each under the UI's inline limit where a row allows it."""
    lines = lineage_lines(lineage)
    if len("\n".join([_HEADER, *lines])) >= INLINE_LIMIT:
        lines = lineage_lines(lineage, grouped=True)
    parts: list[str] = []
    current = _HEADER
    for line in lines:
        if len(current) + 1 + len(line) >= INLINE_LIMIT and current != _HEADER:
            parts.append(current)
            current = _HEADER if line.startswith("|") else ""
        current = f"{current}\n{line}" if current else line.lstrip("\n")
    parts.append(current)
    return parts


def lineage_metadata(lineage: TableLineage) -> dict[str, MetadataValue]:
    """The Markdown entries by label: ``column_lineage``, then ``column_lineage (2)``… when it is split."""
    parts = lineage_markdown(lineage)
    return {LABEL if i == 0 else f"{LABEL} ({i + 1})": MetadataValue.md(part) for i, part in enumerate(parts)}


def column_lineage_metadata(lineage: TableLineage, catalog: Catalog) -> dict[str, Any]:
    """What a materialization carries of its table's column lineage: every output column with the input columns its
    values are computed from (Dagster's ``dagster/column_lineage``, which Dagster+ draws as a column graph and the
    open-source UI lists in the run's log); the input columns that decide the rows (filters, join keys, groupings), on
    which every column depends; and the columns the SQL could not be followed to, named (they are given every input
    column). The same as Markdown (``column_lineage``), which the open-source UI shows on the asset's page."""
    deps = {
        column: [
            TableColumnDep(asset_key=AssetKey(catalog[ref.table].key), column_name=ref.column) for ref in sorted(refs)
        ]
        for column, refs in lineage.columns.items()
    }
    metadata: dict[str, Any] = {"dagster/column_lineage": TableColumnLineage(deps_by_column=deps)}
    metadata.update(lineage_metadata(lineage))
    if lineage.rows:
        metadata["rows_depend_on"] = ", ".join(str(ref) for ref in sorted(lineage.rows))
    if lineage.unresolved:
        metadata["column_lineage_unresolved"] = MetadataValue.md(
            "\n".join(f"- {line}" for line in lineage.describe_unresolved())
        )
    return metadata
