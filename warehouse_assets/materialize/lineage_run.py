"""A derived table's build as an OpenLineage run: START before it, COMPLETE or FAIL after
(:mod:`warehouse_assets.catalog.lineage_events`). Off, the build runs as it is and nothing else is done."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from dagster import AssetExecutionContext

from resources.settings import current
from warehouse_assets.catalog import Catalog, DerivedTable
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.catalog.lineage_events import Build, lineage_events

T = TypeVar("T")


def with_lineage_events(
    context: AssetExecutionContext,
    catalog: Catalog,
    table: DerivedTable,
    lineage: WarehouseLineage | None,
    body: Iterator[T],
) -> Iterator[T]:
    """``body`` (the build's events), with the run's OpenLineage events around it when they are on."""
    events = lineage_events(current())
    if events is None:
        yield from body
        return
    build = describe_build(context, catalog, table, lineage)
    events.started(build)
    try:
        yield from body
    except GeneratorExit:  # the consumer stopped reading: neither an end nor a failure of the build
        raise
    except BaseException as exc:  # a cancelled run's interruption too: the catalog sees it end
        events.failed(build, exc)
        raise
    events.completed(build)


def describe_build(
    context: AssetExecutionContext, catalog: Catalog, table: DerivedTable, lineage: WarehouseLineage | None
) -> Build:
    lineage = lineage or WarehouseLineage(catalog)
    found = lineage.of(table.fqn)
    partitions: list[Any] = list(context.partition_keys) if context.assets_def.partitions_def is not None else []
    return Build(
        table=table.fqn,
        key=table.key,
        dagster_run_id=context.run_id,
        job_name=context.job_name or "",
        partitions=[str(p) for p in partitions],
        columns=lineage.columns(table.fqn),
        inputs=lineage.input_columns(table),
        lineage=found,
    )
