"""Building partitions: the compiler (catalog → Dagster assets and checks), the run guard and partition writes, the
data-quality checks and freshness SLAs, and the gate every part of the product asks "may this partition run now".

Import from here (``from warehouse_assets.build import InstanceStates``) however the modules split. Names resolve on
first use, so importing one module of the package does not import the others (the CLI's ``why`` starts no Spark).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warehouse_assets.build.compiler import build_assets, build_checks, max_partitions_per_run, topological
    from warehouse_assets.build.freshness import build_freshness_checks, deadline, deadline_tick, judge_now
    from warehouse_assets.build.gate import (
        InstanceStates,
        Verdict,
        backfill_partitions,
        decide,
        nonexistent_upstream,
        partitions_in_range,
    )
    from warehouse_assets.build.hour_checks import build_ods_checks_job, judge_hours, unchecked_hours
    from warehouse_assets.build.quality import Outcome, evaluation, latest_materialization
    from warehouse_assets.build.runner import check_ods_hours, run_table
    from warehouse_assets.build.zorder import build_zorder_job, zordered_tables

_HOME = {
    "InstanceStates": "gate",
    "Outcome": "quality",
    "Verdict": "gate",
    "backfill_partitions": "gate",
    "build_assets": "compiler",
    "build_checks": "compiler",
    "build_freshness_checks": "freshness",
    "build_ods_checks_job": "hour_checks",
    "build_zorder_job": "zorder",
    "check_ods_hours": "runner",
    "deadline": "freshness",
    "deadline_tick": "freshness",
    "decide": "gate",
    "evaluation": "quality",
    "judge_hours": "hour_checks",
    "judge_now": "freshness",
    "latest_materialization": "quality",
    "max_partitions_per_run": "compiler",
    "nonexistent_upstream": "gate",
    "partitions_in_range": "gate",
    "run_table": "runner",
    "topological": "compiler",
    "unchecked_hours": "hour_checks",
    "zordered_tables": "zorder",
}
__all__ = [
    "InstanceStates",
    "Outcome",
    "Verdict",
    "backfill_partitions",
    "build_assets",
    "build_checks",
    "build_freshness_checks",
    "build_ods_checks_job",
    "build_zorder_job",
    "check_ods_hours",
    "deadline",
    "deadline_tick",
    "decide",
    "evaluation",
    "judge_hours",
    "judge_now",
    "latest_materialization",
    "max_partitions_per_run",
    "nonexistent_upstream",
    "partitions_in_range",
    "run_table",
    "topological",
    "unchecked_hours",
    "zordered_tables",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
