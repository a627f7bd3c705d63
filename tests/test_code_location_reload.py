"""A code location loaded again in the same process runs what its module holds now.

The end-to-end modules load the warehouse's code location (tests/support/repair.py ``code_location``) with the roots
of their own lake in the environment, one after another on one xdist worker. A run of the second load must build
with the second load's resources, even when it selects what the last run of the first load selected."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dagster import AssetKey, instance_for_test
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

from tests.support.repair import SYNC_RUNS, code_location, run_backfill

# a code location whose one asset writes a file under the folder the environment names when the module is imported
LOCATION = """
import os
from pathlib import Path

from dagster import Definitions, StaticPartitionsDefinition, asset, in_process_executor

FOLDER = Path(os.environ["TEST_LOCATION_FOLDER"])


@asset(partitions_def=StaticPartitionsDefinition(["only"]))
def marker() -> None:
    (FOLDER / "built").write_text("built")


defs = Definitions(assets=[marker], executor=in_process_executor)
"""


def test_a_reloaded_code_location_builds_with_the_resources_of_its_new_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "reloaded_location.py").write_text(LOCATION)
    monkeypatch.syspath_prepend(str(tmp_path))
    with instance_for_test(overrides=SYNC_RUNS) as instance:
        for name in ("first", "second"):
            folder = tmp_path / name
            folder.mkdir()
            monkeypatch.setenv("TEST_LOCATION_FOLDER", str(folder))
            with code_location(instance, "reloaded_location") as workspace:
                backfill = PartitionBackfill.from_asset_partitions(
                    backfill_id=name,
                    asset_graph=workspace.create_request_context().asset_graph,
                    partition_names=["only"],
                    asset_selection=[AssetKey("marker")],
                    backfill_timestamp=time.time(),
                    tags={},
                    dynamic_partitions_store=instance,
                    all_partitions=False,
                    title=None,
                    description=None,
                    run_config=None,
                )
                instance.add_backfill(backfill)
                assert run_backfill(instance, workspace, name).status == BulkActionStatus.COMPLETED_SUCCESS
            assert (folder / "built").is_file(), f"the {name} load's run built with an earlier load's resources"
