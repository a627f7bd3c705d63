"""An external table of the catalog at its producer: the resource's plain source, given the table's declaration."""

from resources.external import ExternalResource, ExternalSource
from warehouse_assets.catalog import ExternalTable, Table
from warehouse_assets.partitions import periods


def external_source(external: ExternalResource, table: Table) -> ExternalSource:
    if not isinstance(table, ExternalTable):
        raise ValueError(f"{table.fqn} is not an external table")
    daily = periods().daily  # the process's (or a test's) settings, not those of import time
    return external.source(
        table.fqn,
        table.external.location,
        table.external.format,
        table.columns,
        timezone=daily.timezone,
        first=daily.get_first_partition_key(),
        marker=table.external.marker,
        producer=table.external.producer,
    )
