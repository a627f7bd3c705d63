"""Getting data in: CDC capture into the landing area, batch preparation, the merge into ODS Delta tables with its
ops tables, when an ODS hour is complete, external producers' deliveries, and the jobs that run them.

Import from here (``from warehouse_assets.ingest import BatchReport``) however the modules split. Names resolve on
first use, so importing one module of the package does not import the others (the CLI's ``why`` starts no Spark).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warehouse_assets.ingest.capture import CaptureState, SegmentWriter, Source, load_state
    from warehouse_assets.ingest.deliveries import ExternalWatcher, external_source, watched_ago
    from warehouse_assets.ingest.job import build_ingest_job, ingestion_in_flight
    from warehouse_assets.ingest.maintenance import build_maintenance
    from warehouse_assets.ingest.merge import (
        BatchReport,
        ReconciliationError,
        TableReport,
        committed_positions,
        ingest_batch,
        ingest_table,
        pending_segments,
        prepare_changes,
    )
    from warehouse_assets.ingest.ops_tables import OPS_TABLES
    from warehouse_assets.ingest.preparation import InProcessPreparation, SparkPreparation
    from warehouse_assets.ingest.readiness import Readiness, readiness, readiness_events, ready_hours

_HOME = {
    "BatchReport": "merge",
    "CaptureState": "capture",
    "ExternalWatcher": "deliveries",
    "InProcessPreparation": "preparation",
    "OPS_TABLES": "ops_tables",
    "Readiness": "readiness",
    "ReconciliationError": "merge",
    "SegmentWriter": "capture",
    "Source": "capture",
    "SparkPreparation": "preparation",
    "TableReport": "merge",
    "build_ingest_job": "job",
    "build_maintenance": "maintenance",
    "committed_positions": "merge",
    "external_source": "deliveries",
    "ingest_batch": "merge",
    "ingest_table": "merge",
    "ingestion_in_flight": "job",
    "load_state": "capture",
    "pending_segments": "merge",
    "prepare_changes": "merge",
    "readiness": "readiness",
    "readiness_events": "readiness",
    "ready_hours": "readiness",
    "watched_ago": "deliveries",
}
__all__ = [
    "BatchReport",
    "CaptureState",
    "ExternalWatcher",
    "InProcessPreparation",
    "OPS_TABLES",
    "Readiness",
    "ReconciliationError",
    "SegmentWriter",
    "Source",
    "SparkPreparation",
    "TableReport",
    "build_ingest_job",
    "build_maintenance",
    "committed_positions",
    "external_source",
    "ingest_batch",
    "ingest_table",
    "ingestion_in_flight",
    "load_state",
    "pending_segments",
    "prepare_changes",
    "readiness",
    "readiness_events",
    "ready_hours",
    "watched_ago",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
