"""External systems behind small interfaces: Spark, the Delta lake, the CDC landing area, external producers."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from resources.delta_lake import DeltaLakeResource
from resources.external import ExternalResource
from resources.landing import LandingResource
from resources.spark import SparkResource

ENV_PREFIX = "WAREHOUSE_"


def resources_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The warehouse's resources, configured by ``WAREHOUSE_*`` environment variables (see README).

    Defaults are the embedded warehouse: local Spark, ``data/lake`` and ``data/landing`` under the
    working directory.
    """
    env = os.environ if env is None else env

    def get(name: str, default: str) -> str:
        return env.get(ENV_PREFIX + name, default)

    timezone = get("TIMEZONE", "Asia/Shanghai")
    landing_root = get("LANDING_ROOT", "data/landing")
    spark_conf = {}
    for item in filter(None, get("SPARK_CONF", "").split(",")):
        key, _, value = item.partition("=")
        spark_conf[key.strip()] = value.strip()
    return {
        "spark": SparkResource(
            mode=get("SPARK_MODE", "local"),  # type: ignore[arg-type]
            master=get("SPARK_MASTER", "local[2]"),
            connect_url=get("SPARK_CONNECT_URL", "sc://127.0.0.1:15002"),
            driver_memory=get("SPARK_DRIVER_MEMORY", "4g"),
            timezone=timezone,
            conf=spark_conf,
        ),
        "lake": DeltaLakeResource(
            root=get("LAKE_ROOT", "data/lake"),
            time_travel_hours=int(get("TIME_TRAVEL_HOURS", "168")),
        ),
        "landing": LandingResource(
            root=landing_root,
            timezone=timezone,
            simulate_live=get("SIMULATE_LIVE", "0") == "1",
        ),
        "external": ExternalResource(root=get("EXTERNAL_ROOT", landing_root.rstrip("/") + "/external")),
    }


__all__ = ["DeltaLakeResource", "ExternalResource", "LandingResource", "SparkResource", "resources_from_env"]
