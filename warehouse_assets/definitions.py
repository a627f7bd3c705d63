"""The code location: gathers what the catalog compiles and adds project-wide settings. Nothing else."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from dagster import (
    BetaWarning,
    Definitions,
    ExecutorDefinition,
    PreviewWarning,
    SensorDefinition,
    in_process_executor,
    multiprocess_executor,
)

from resources import resources_from_env
from resources.delta_replica import ReplicaSitesResource
from resources.settings import Settings, current, dagster_home, using
from sensors.center import build_dependency_center_sensor
from sensors.external import build_external_sensors
from sensors.freshness import build_forecast_sensor, build_freshness_sensor
from sensors.ods import build_landing_sensor, build_ods_checks_sensor, build_readiness_sensor
from sensors.replication import build_replication_sensor
from sensors.static import build_static_sensor
from sensors.zorder import build_zorder_sensor
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.catalog.lineage_cache import lineage_at_load
from warehouse_assets.center.taint import build_taint_job
from warehouse_assets.explain.why import build_why_job
from warehouse_assets.ingest.job import build_ingest_job
from warehouse_assets.ingest.maintenance import build_maintenance
from warehouse_assets.materialize.compiler import build_assets, build_checks
from warehouse_assets.materialize.hour_checks import build_ods_checks_job, judge_hours
from warehouse_assets.materialize.replication import REPLICA_RESOURCE, build_replica_assets
from warehouse_assets.materialize.validity import taint_times
from warehouse_assets.materialize.zorder import build_zorder_job

# Deliberate uses of Dagster 1.13 features marked beta or preview (single-run backfill policies, partitioned
# asset checks): the project pins Dagster, so the warning every process
# prints for each table says nothing new, and it buried the run logs.
warnings.filterwarnings("ignore", category=BetaWarning)
warnings.filterwarnings("ignore", category=PreviewWarning)

EXECUTORS = {"in_process": in_process_executor, "multiprocess": multiprocess_executor}


def run_executor(settings: Settings) -> ExecutorDefinition:
    """How a run executes its steps, from ``WAREHOUSE_RUN_EXECUTOR`` (default ``in_process``).

    In-process runs every step of a run in the run's own process, one after another, with one Spark session.
    The multiprocess executor starts a Python process per step, and each one imports Dagster, PySpark and the
    code location again (about 7 s of CPU): on the embedded 2-core machine that start-up cost more than the
    Spark work of a day. Choose ``multiprocess`` on a large cluster to run a run's independent tables at once.
    """
    return EXECUTORS[settings.run_executor]


def dev_sensors(simulate_live: bool) -> list[SensorDefinition]:
    """The embedded default's simulated-source clock, only when ``warehouse dev`` simulates the sources.

    Imported here, not at the top: the simulators are a dev tool outside the product (``simulator/``), and a
    production code location never loads them.
    """
    if not simulate_live:
        return []
    from simulator.sensor import simulated_source

    return [simulated_source]


def build_definitions(catalog: Catalog, settings: Settings | None = None) -> Definitions:
    """Everything the catalog compiles to, plus the project-wide sensors, jobs and resources.

    ``settings`` default to the process's; other settings (another timezone, in a test) hold while building,
    so every partitions definition, sensor and resource follows them.
    """
    with using(settings or current()) as chosen:
        return _build(catalog, chosen)


def load_lineage(catalog: Catalog, settings: Settings) -> WarehouseLineage | None:
    """Every table's column lineage for the asset pages, from the lineage cache (``WAREHOUSE_LINEAGE_CACHE_DIR``, by
    default under ``DAGSTER_HOME``); None when ``WAREHOUSE_LINEAGE_AT_LOAD=0``."""
    if not settings.lineage_at_load:
        return None
    return lineage_at_load(catalog, settings.lineage_cache_dir or dagster_home())[0]


def _build(catalog: Catalog, settings: Settings) -> Definitions:
    ingest_job = build_ingest_job(catalog, judge_hours, taint_times)
    maintenance_job, maintenance_schedule = build_maintenance(catalog)
    zorder_job, ods_checks_job = build_zorder_job(catalog), build_ods_checks_job(catalog)
    resources = resources_from_env(settings) | {REPLICA_RESOURCE: ReplicaSitesResource(roots=settings.site_roots)}
    return Definitions(
        assets=[
            *build_assets(catalog, load_lineage(catalog, settings)),
            *build_replica_assets(catalog, settings.site_roots),
        ],
        asset_checks=build_checks(catalog),
        jobs=[
            ingest_job,
            build_why_job(catalog),
            build_taint_job(catalog, lake=True),
            maintenance_job,
            zorder_job,
            ods_checks_job,
        ],
        schedules=[maintenance_schedule],
        sensors=[
            build_landing_sensor(catalog, ingest_job),
            build_readiness_sensor(catalog),
            build_ods_checks_sensor(catalog, ods_checks_job),
            *dev_sensors(settings.simulate_live),
            build_zorder_sensor(catalog, zorder_job),
            *build_external_sensors(catalog),
            build_freshness_sensor(catalog),
            build_forecast_sensor(catalog),
            build_dependency_center_sensor(catalog),
            *build_static_sensor(catalog),
            *build_replication_sensor(catalog),
        ],
        resources=resources,
        executor=run_executor(settings),
    )


# a full collection once per this many collections of the middle generation (Python's default: 10)
FULL_COLLECTIONS_HELD_BACK = 1000


@contextmanager
def full_collections_held_back() -> Iterator[None]:
    """Python's full garbage collections held back while the code location loads, and what the load built kept out
    of later ones. The load allocates millions of objects (Dagster's definitions of every table) that live as long as
    the code server, and each full collection their allocation triggered traversed all of them again: at 10,000
    tables 3 of a 15 s load. The young collections still run and free the load's short-lived cycles (pausing the
    collector altogether kept them: +210 MB at 10,000 tables). Frozen afterwards (``gc.freeze``), the definitions are
    skipped by the collections the code server's sensor ticks trigger too."""
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTIONS_HELD_BACK)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, full)
    gc.freeze()  # only after a load that succeeded: a failed one leaves nothing worth keeping out of the collector


with full_collections_held_back():
    catalog = load_catalog()
    defs = build_definitions(catalog)
    defs.get_repository_def()  # resolved here, full collections held back: the code server asks for it next
