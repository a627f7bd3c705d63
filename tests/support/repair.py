"""Taint and repair in tests as the product does it: the ``taint_repair`` job executed on the test's instance, then its
backfill run by Dagster's own backfill daemon iteration over the code location, with runs executed synchronously in
the test process (and its one Spark session). A backfill launched as the UI launches one runs the same way."""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import AssetKey, DagsterInstance, PartitionKeyRange

from warehouse_assets.catalog import Catalog, Table, partitions_def_of
from warehouse_assets.center.taint import build_taint_job

ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)

# runs go straight to a launcher that executes them in this process (the daemon would launch each in its own)
SYNC_RUNS = {
    "run_launcher": {
        "module": "dagster._core.launcher.sync_in_memory_run_launcher",
        "class": "SyncInMemoryRunLauncher",
    },
    "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
}


def apply_taint(instance: DagsterInstance, catalog: Catalog, table: str, start: str, end: str, reason: str) -> Any:
    """``warehouse taint TABLE START END --reason REASON --apply``: the job's output (counts, backfill, lines)."""
    config = {"table": table, "start": start, "end": end, "reason": reason, "apply": True, "by": "test"}
    result = build_taint_job(catalog).execute_in_process(
        run_config={"ops": {"taint_and_repair": {"config": config}}}, instance=instance
    )
    assert result.success
    return result.output_for_node("taint_and_repair")


@contextmanager
def code_location(instance: DagsterInstance, module: str = "tests.support.backfill_location") -> Iterator[Any]:
    """The warehouse's code location (tests/support/backfill_location.py: the lake and landing of the environment)
    loaded in process, as the backfill daemon sees it; ``module``: another module of definitions."""
    from dagster._core.definitions.reconstruct import ReconstructableJob
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

    sys.modules.pop(module, None)
    importlib.import_module(module)  # resources from the environment as it is now
    # A run executes the definitions Dagster last reconstructed for its job (a cache of one, process-wide) when its
    # code pointer and selection are the same: the module's name, not what this import of it holds. Forgotten here,
    # else a first run selecting what the last run of an earlier load selected would build with that load's resources
    # (another module's lake)
    ReconstructableJob.get_repository_definition.cache_clear()
    ReconstructableJob.get_definition.cache_clear()
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name=module, working_directory=str(ROOT)),
        location_name="warehouse",
    )
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget([origin])) as workspace:
        yield workspace


def run_backfill(instance: DagsterInstance, workspace: Any, backfill_id: str, iterations: int = 60) -> Any:
    """The backfill daemon's iterations until the backfill is done; the finished backfill."""
    return iterate_backfill(instance, workspace, backfill_id, iterations)[0]


def iterate_backfill(instance: DagsterInstance, workspace: Any, backfill_id: str, limit: int = 60) -> tuple[Any, int]:
    """:func:`run_backfill`, and how many of the daemon's iterations it took."""
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._daemon.backfill import execute_backfill_iteration

    for done in range(limit + 1):
        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None
        if backfill.status != BulkActionStatus.REQUESTED:
            return backfill, done
        if done == limit:
            break
        errors = [e for e in execute_backfill_iteration(workspace, log) if e is not None]
        assert not errors, errors[0].to_string()
    raise AssertionError(f"the backfill {backfill_id} does not finish")


def key_ranges(table: Table, keys: list[str]) -> list[PartitionKeyRange]:
    """``keys`` as Dagster's ranges of them, as the UI selects them: one range of a table's period, and of a table with
    regions one range of dates per region (Dagster holds one dimension of a date × region grid fixed)."""
    pdef = partitions_def_of(table)
    return list(pdef.subset_with_partition_keys(keys).get_partition_key_ranges(pdef))


def launch_backfill(
    instance: DagsterInstance,
    workspace: Any,
    catalog: Catalog,
    backfill_id: str,
    plan: dict[str, list[str]],
    title: str,
) -> tuple[Any, int, float]:
    """Launch ``plan`` (table -> its partition keys, a range each) as the UI's GraphQL
    ``launchPartitionBackfill(partitionsByAssets: [...])`` does, and run the backfill daemon's iterations
    until it is done. Returns the finished backfill, the iterations and the seconds it took."""
    from dagster._core.definitions.selector import (
        PartitionRangeSelector,
        PartitionsByAssetSelector,
        PartitionsSelector,
    )
    from dagster._core.execution.backfill import PartitionBackfill

    selectors = [
        PartitionsByAssetSelector(
            asset_key=AssetKey(catalog[fqn].key),
            partitions=PartitionsSelector(
                ranges=[PartitionRangeSelector(start=r.start, end=r.end) for r in key_ranges(catalog[fqn], keys)]
            ),
        )
        for fqn, keys in plan.items()
    ]
    backfill = PartitionBackfill.from_partitions_by_assets(
        backfill_id=backfill_id,
        asset_graph=workspace.create_request_context().asset_graph,
        backfill_timestamp=time.time(),
        tags={},
        dynamic_partitions_store=instance,
        partitions_by_assets=selectors,
        title=title,
        description=None,
        run_config=None,
    )
    instance.add_backfill(backfill)
    began = time.monotonic()
    finished, iterations = iterate_backfill(instance, workspace, backfill_id)
    return finished, iterations, time.monotonic() - began
