"""External systems behind small interfaces: Spark, the Delta lake, the CDC landing area, external producers.

The resources load when first named (``from resources import DeltaLakeResource``): a command that needs only one
module of this package (``warehouse sql``'s ``resources.lake_sql``) does not import Dagster through the others."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resources.delta_lake import DeltaLakeResource
    from resources.external import ExternalResource
    from resources.landing import LandingResource
    from resources.settings import Settings
    from resources.spark import SparkResource

_HOMES = {
    "DeltaLakeResource": "resources.delta_lake",
    "ExternalResource": "resources.external",
    "LandingResource": "resources.landing",
    "Settings": "resources.settings",
    "SparkResource": "resources.spark",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'resources' has no attribute {name!r}")


def resources_from_env(settings: Settings | Mapping[str, str] | None = None) -> dict[str, Any]:
    """The warehouse's resources, configured by ``settings`` (default: the process's, see ``resources.settings``).

    A mapping is read as environment variables (``{"WAREHOUSE_LAKE_ROOT": ...}``). Defaults are the embedded
    warehouse: local Spark, ``data/lake`` and ``data/landing`` under the working directory.
    """
    from resources.delta_lake import DeltaLakeResource
    from resources.external import ExternalResource
    from resources.landing import LandingResource
    from resources.settings import Settings, current
    from resources.spark import SparkResource

    if settings is None:
        settings = current()
    elif not isinstance(settings, Settings):
        settings = Settings.from_env(settings)
    return {
        "spark": SparkResource(
            mode=settings.spark_mode,
            master=settings.spark_master,
            connect_url=settings.spark_connect_url,
            driver_memory=settings.spark_driver_memory,
            timezone=settings.timezone,
            conf=settings.spark_conf,
            lake_root=settings.lake_root,
        ),
        "lake": DeltaLakeResource(root=settings.lake_root, time_travel_hours=settings.time_travel_hours),
        "landing": LandingResource(
            root=settings.landing_root, timezone=settings.timezone, simulate_live=settings.simulate_live
        ),
        "external": ExternalResource(root=settings.external_dir),
    }


__all__ = [
    "DeltaLakeResource",
    "ExternalResource",
    "LandingResource",
    "Settings",
    "SparkResource",
    "resources_from_env",
]
