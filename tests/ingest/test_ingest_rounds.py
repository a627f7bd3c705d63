"""A backlog is ingested in rounds, the oldest day of every ODS table first: that day's hours of every table are
reported (and their downstream can build) before any later day is merged, instead of one table's whole backlog after
another's. `make dev` starts on three simulated days: its first figures come from the first round."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
from pyspark.sql import SparkSession

from resources import resources_from_env
from simulator.cdc import SimulationConfig, simulate
from warehouse_assets.catalog import load_catalog
from warehouse_assets.ingest.job import build_ingest_job
from warehouse_assets.materialize.hour_checks import judge_hours

DAY = datetime(2026, 3, 2)


def test_the_oldest_day_of_every_table_is_reported_before_a_later_day_is_merged(
    spark: SparkSession, tmp_path: Path
) -> None:
    simulate(tmp_path / "landing", DAY, DAY + timedelta(days=3), SimulationConfig(seed=3, scale=0.01))
    resources = resources_from_env(
        {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"), "WAREHOUSE_LANDING_ROOT": str(tmp_path / "landing")}
    )
    catalog = load_catalog()
    # in-memory instance storage (the run needs no other process): its ~1,400 hour reports and verdicts cost a few
    # seconds instead of minutes of SQLite commits
    with DagsterInstance.ephemeral() as instance:
        run = build_ingest_job(catalog, judge_hours).execute_in_process(instance=instance, resources=resources)
        assert run.success
        first, later = {}, {}  # per ODS table: storage ids of its hours' reports, the first day and the later ones
        for table in catalog.ods():
            records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(table.key)), limit=500)
            for record in records.records:
                if record.asset_materialization.metadata["late_changes"].value:  # type: ignore[union-attr]
                    # a first-day hour reported again: a later day's batch changed its rows (an order paid the
                    # next day); the order asserted is that of the hours' first reports
                    continue
                day = first if str(record.partition_key).startswith(f"{DAY:%Y-%m-%d}") else later
                day.setdefault(table.fqn, []).append(record.storage_id)
    tables = {t.fqn for t in catalog.ods()}
    assert set(first) == set(later) == tables  # every table reported every day
    assert all(len(ids) == 24 for ids in first.values())
    # the first day of every table, then the others: no table's later day before another's first
    assert max(max(ids) for ids in first.values()) < min(min(ids) for ids in later.values())
    # the two later days in one batch per table (up to three days a batch after the first)
    summary = run.output_for_node("ingest_ods")
    assert {fqn: numbers["batches"] for fqn, numbers in summary.items()} == dict.fromkeys(tables, 2)
