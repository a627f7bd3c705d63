"""What the warehouse is: the tables (typed models, loaded from ``tables/<layer>/``), the periods' calendars,
the exact partition mappings between tables and the data-quality check declarations.

Import from here (``from warehouse_assets.catalog import Table``) however the modules below split.
"""

from typing import Any

from warehouse_assets.catalog import calendars
from warehouse_assets.catalog.calendars import (
    BY_PERIOD,
    MINUTE_PERIODS,
    PARTITION_COLUMNS,
    Periods,
    business_time,
    business_zone,
    first_monday,
    first_month,
    periods,
)
from warehouse_assets.catalog.checks import CHECK_KINDS, Check, CheckSpecError, Outcome, parse_checks
from warehouse_assets.catalog.keys import PartitionKeyError, check_partition_key
from warehouse_assets.catalog.loader import TABLES_DIR, load_catalog, referenced_tables
from warehouse_assets.catalog.mappings import (
    MappedPartitions,
    UpstreamPartitions,
    anchored,
    anchored_upstream,
    mapped_upstream,
    partition_mapping,
    upstream_partitions,
    weak_deadline,
)
from warehouse_assets.catalog.model import (
    ANY,
    CHANGED_AT,
    DEADLINE,
    DEFAULT_LATE_DATA,
    LATEST,
    LAYERS,
    ODS_CHANGE_COLUMNS,
    PERIOD_NOUN,
    PERIOD_ORDER,
    SNAPSHOT,
    STATIC,
    STRICT,
    WHOLE,
    Catalog,
    CatalogError,
    Dependency,
    DerivedTable,
    External,
    ExternalTable,
    LateDataPolicy,
    OdsTable,
    OdsWindows,
    Sla,
    StaticTable,
    Table,
    TableState,
    UnknownTable,
    windows_name,
)

__all__ = [
    "ANY",
    "DEFAULT_LATE_DATA",
    "LateDataPolicy",
    "CHANGED_AT",
    "SNAPSHOT",
    "STATIC",
    "WHOLE",
    "LATEST",
    "DEADLINE",
    "STRICT",
    "BY_PERIOD",
    "CHECK_KINDS",
    "LAYERS",
    "ODS_CHANGE_COLUMNS",
    "MINUTE_PERIODS",
    "PARTITION_COLUMNS",
    "PERIOD_NOUN",
    "PERIOD_ORDER",
    "TABLES_DIR",
    "Catalog",
    "CatalogError",
    "Check",
    "CheckSpecError",
    "Dependency",
    "DerivedTable",
    "External",
    "ExternalTable",
    "MappedPartitions",
    "OdsTable",
    "OdsWindows",
    "Outcome",
    "PartitionKeyError",
    "Periods",
    "Sla",
    "StaticTable",
    "Table",
    "TableState",
    "UnknownTable",
    "UpstreamPartitions",
    "business_time",
    "business_zone",
    "check_partition_key",
    "first_monday",
    "first_month",
    "load_catalog",
    "anchored",
    "anchored_upstream",
    "mapped_upstream",
    "parse_checks",
    "partition_mapping",
    "periods",
    "referenced_tables",
    "upstream_partitions",
    "weak_deadline",
    "windows_name",
]


def __getattr__(name: str) -> Any:
    # the current process's definitions (``hourly``, ``START`` ...) follow the settings: resolved when used
    return getattr(calendars, name)
