"""Dagster instance plugins, named in ``dagster_home/dagster.yaml``: the warm run launcher (each run forked from a
pre-imported process) and the run coordinator that launches a run in the call that submits it when it fits the
limits. Every Dagster process loads them, so they import none of the product.

Import from here (``from warehouse_assets.instance import ImmediateRunCoordinator``) however the modules split. Names
resolve on first use, so importing one module of the package does not import the others (the CLI's ``why`` starts no
Spark).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warehouse_assets.instance.run_coordinator import ImmediateRunCoordinator
    from warehouse_assets.instance.warm_launcher import WarmRunLauncher

_HOME = {
    "ImmediateRunCoordinator": "run_coordinator",
    "WarmRunLauncher": "warm_launcher",
}
__all__ = [
    "ImmediateRunCoordinator",
    "WarmRunLauncher",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
