"""Each site's replication lag told to people (``warehouse status``): source commit -> replica published, P50 and P90
over the partitions its replica runs published in the last day, read from their materializations' metadata."""

import statistics
from collections.abc import Mapping

from dagster import DagsterInstance

from warehouse_assets.catalog import Catalog
from warehouse_assets.materialize.replication import replicated, replication_lags


def replication_lines(instance: DagsterInstance, catalog: Catalog, sites: Mapping[str, str]) -> list[str]:
    """One line per configured site: its lag's P50/P90 and how many partitions they are over, or that none were
    published in the last day."""
    lags = replication_lags(instance, catalog)
    lines = []
    for site in sorted(sites):
        tables = sum(1 for t in replicated(catalog) if site in t.replicate_to)
        values = sorted(lags.get(site, []))
        if not values:
            lines.append(f"{site} ({sites[site]}): {tables} tables, no partition published in the last 24 h")
            continue
        p90 = statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
        lines.append(
            f"{site} ({sites[site]}): {tables} tables, lag P50 {statistics.median(values):.1f} s, P90 {p90:.1f} s "
            f"over {len(values)} partitions published in the last 24 h"
        )
    return lines
