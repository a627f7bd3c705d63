"""The code location: gathers what the catalog compiles and adds project-wide settings. Nothing else."""

from __future__ import annotations

import os

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus, Definitions

from resources import resources_from_env
from sensors.external import build_external_sensors
from sensors.freshness import build_freshness_sensor
from sensors.landing import build_landing_sensor
from sensors.ods_checks import build_ods_checks_sensor
from sensors.ods_readiness import build_readiness_sensor
from sensors.simulated_source import simulated_source
from sensors.zorder import build_zorder
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.compiler import build_assets, build_checks
from warehouse_assets.maintenance import build_maintenance
from warehouse_assets.ods import build_ingest_job
from warehouse_assets.why import build_why_job


def build_definitions(catalog: Catalog) -> Definitions:
    """Everything the catalog compiles to, plus the project-wide sensors, jobs and resources."""
    ingest_job = build_ingest_job(catalog)
    maintenance_job, maintenance_schedule = build_maintenance(catalog)
    zorder_job, zorder_sensor = build_zorder(catalog)
    ods_checks_job, ods_checks_sensor = build_ods_checks_sensor(catalog)
    automation_sensor = AutomationConditionSensorDefinition(
        "warehouse_automation",
        target=AssetSelection.all() | AssetSelection.all_asset_checks(),
        default_status=DefaultSensorStatus.RUNNING,
        # seconds between automation evaluations: the largest share of the upstream → downstream handoff
        # latency (bench/handoff_latency.py); each evaluation costs a pass over the whole graph
        minimum_interval_seconds=int(os.environ.get("WAREHOUSE_AUTOMATION_INTERVAL", "15")),
        use_user_code_server=True,  # evaluates the Python condition UpstreamPartitionsExist (automation.py)
        description="Runs each partition as soon as every mapped upstream partition is ready.",
    )
    return Definitions(
        assets=build_assets(catalog),
        asset_checks=build_checks(catalog),
        jobs=[ingest_job, build_why_job(catalog), maintenance_job, zorder_job, ods_checks_job],
        schedules=[maintenance_schedule],
        sensors=[
            build_landing_sensor(catalog, ingest_job),
            build_readiness_sensor(catalog),
            ods_checks_sensor,
            automation_sensor,
            simulated_source,
            zorder_sensor,
            *build_external_sensors(catalog),
            build_freshness_sensor(catalog),
        ],
        resources=resources_from_env(),
    )


catalog = load_catalog()
defs = build_definitions(catalog)
