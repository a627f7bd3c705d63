"""The code location the backfill test loads: the warehouse's assets and checks with the in-process executor.

A stand-in for ``warehouse_assets.definitions`` that runs every step in the run's own process, so the
synchronous run launcher of the test executes runs in the test process and its one Spark session. The
checks are the real ones (quality and freshness): a backfill run includes every check of its assets, as it
does in the product. The lake and landing roots come from ``WAREHOUSE_LAKE_ROOT`` /
``WAREHOUSE_LANDING_ROOT``, set by the test before this module is imported; everything else is the default
the test session's Spark was started with.
"""

import os

from dagster import Definitions, in_process_executor

from resources import resources_from_env
from warehouse_assets.definitions import catalog
from warehouse_assets.materialize.compiler import build_assets, build_checks

_ROOTS = {k: os.environ[k] for k in ("WAREHOUSE_LAKE_ROOT", "WAREHOUSE_LANDING_ROOT") if k in os.environ}
defs = Definitions(
    assets=build_assets(catalog),
    asset_checks=build_checks(catalog),
    resources=resources_from_env(_ROOTS),
    executor=in_process_executor,
)
