"""The repair commands check what they are asked before they launch a run: a request that cannot be done is a clear
error on the terminal, not a failed run in the UI with a Dagster traceback."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

import pytest
from dagster import AssetKey, DagsterInstance

from warehouse_assets.catalog import load_catalog
from warehouse_assets.center.state_store import PartitionState
from warehouse_assets.center.taint import releasable
from warehouse_assets.cli.repair import release_command
from warehouse_assets.materialize.validity import Taint

HOUR = "2026-03-02-10:00"


class View:
    """A state view holding the given partitions of ``ods.order``, every other one never built."""

    def __init__(self, states: dict[str, PartitionState]):
        self.known = states

    def states(self, asset_key: AssetKey | str, keys: Iterable[str]) -> dict[str, PartitionState]:
        return {k: self.known.get(k, PartitionState("ods/order", k)) for k in keys}


def test_a_release_of_a_partition_not_tainted_says_so_and_launches_no_run(
    consolidated: DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(table="ods.order", start=HOUR, end=None, reason="accepted", by="me")
    assert release_command(args, consolidated, {}) == 2
    err = capsys.readouterr().err
    assert err == f"error: ods.order {HOUR}: no partition there is tainted, nothing to release\n"
    assert consolidated.get_runs_count() == 0  # no failed run left in the UI


def test_a_release_of_an_unknown_table_says_so_and_launches_no_run(
    consolidated: DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(table="ods.nope", start=HOUR, end=None, reason="accepted", by="me")
    assert release_command(args, consolidated, {}) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "ods.nope" in err and "dagster" not in err
    assert consolidated.get_runs_count() == 0


def test_releasable_finds_the_tainted_built_partitions_of_the_range() -> None:
    catalog = load_catalog()
    taint = Taint("amounts 100x", f"ods.order {HOUR}", "me", 0.0)
    tainted = PartitionState("ods/order", HOUR, storage_id=7, taint=taint)
    keys, found = releasable(catalog, View({HOUR: tainted}), "ods.order", HOUR, "2026-03-02-11:00")  # type: ignore[arg-type]
    assert keys == [HOUR, "2026-03-02-11:00"] and found == {HOUR: tainted}


def test_a_repair_run_that_fails_on_purpose_prints_its_own_words(
    consolidated: DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    from warehouse_assets.cli.repair import _run_taint_job

    config = {"table": "dwd.order_detail", "start": "2026-03-02", "end": "2026-03-02", "action": "reingest"}
    assert _run_taint_job(config, consolidated, {}, lake=False) == 1
    said = capsys.readouterr().err.strip().splitlines()[-1]  # after the step's failure, as Dagster logs it
    assert said.startswith(
        "error: dwd.order_detail is not an ODS table: only ODS hours are re-ingested from the landing area (run "
    ), said
