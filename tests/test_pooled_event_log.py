"""The test instances' pooled SQLite event log (tests/support/instances.py): one engine, and what it stores is what
another instance opened on the same home reads, as a `warehouse` command run in process opens DAGSTER_HOME."""

from __future__ import annotations

from dagster import AssetKey, AssetMaterialization, DagsterInstance, instance_for_test

from tests.support.instances import memory_backed_dir, pooled_event_log


def test_the_pooled_event_log_keeps_one_engine_and_another_instance_reads_what_it_stored() -> None:
    key = AssetKey(["ods", "src"])
    with (
        memory_backed_dir("pooled-") as home,
        instance_for_test(temp_dir=str(home), overrides=pooled_event_log(home)) as instance,
    ):
        storage = instance.event_log_storage
        with storage.index_connection() as first, storage.index_connection() as second:  # type: ignore[attr-defined]
            assert first.engine is second.engine  # the stock log creates an engine for each connection
        for hour in range(3):
            instance.report_runless_asset_event(AssetMaterialization(key, partition=f"2026-01-01-0{hour}:00"))
        with DagsterInstance.from_config(str(home)) as other:
            assert len(other.get_materialized_partitions(key)) == 3
