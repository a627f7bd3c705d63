"""The dependency center: the partition state store kept from Dagster's event log, the reverse index of the exact
mappings, the resolver that turns each change into the runs that became possible, the engine process that submits
them, and `why` a partition waits.

Import from here (``from warehouse_assets.center import Change``) however the modules split. Names resolve on first
use, so importing one module of the package does not import the others (the CLI's ``why`` starts no Spark).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warehouse_assets.center.engine import Engine, GraphQLSubmitter, assemble_engine
    from warehouse_assets.center.late_data import LOOKBACK
    from warehouse_assets.center.resolver import Resolver, RunPlan, Trigger
    from warehouse_assets.center.reverse_index import ReverseIndex
    from warehouse_assets.center.state_store import Change, PartitionState, PartitionStateStore
    from warehouse_assets.center.why import WhyReport, build_why_job, explain

_HOME = {
    "Change": "state_store",
    "Engine": "engine",
    "GraphQLSubmitter": "engine",
    "LOOKBACK": "late_data",
    "PartitionState": "state_store",
    "PartitionStateStore": "state_store",
    "Resolver": "resolver",
    "ReverseIndex": "reverse_index",
    "RunPlan": "resolver",
    "Trigger": "resolver",
    "WhyReport": "why",
    "assemble_engine": "engine",
    "build_why_job": "why",
    "explain": "why",
}
__all__ = [
    "Change",
    "Engine",
    "GraphQLSubmitter",
    "LOOKBACK",
    "PartitionState",
    "PartitionStateStore",
    "Resolver",
    "ReverseIndex",
    "RunPlan",
    "Trigger",
    "WhyReport",
    "assemble_engine",
    "build_why_job",
    "explain",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
