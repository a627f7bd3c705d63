"""A tiny code location for the warm launcher's tests: runs that succeed at once, crash, or wait to be killed."""

from __future__ import annotations

import os
import time

from dagster import DailyPartitionsDefinition, Definitions, asset, define_asset_job, in_process_executor

DAYS = DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-05")


@asset
def quick() -> int:
    return 1


@asset(partitions_def=DAYS)
def daily() -> int:
    return 1


@asset
def crashing() -> int:
    os._exit(3)  # the worker process dies mid-step, as a segfault or an OOM kill would end it


@asset
def waiting() -> int:
    time.sleep(300)  # killed by the test long before
    return 1


defs = Definitions(
    assets=[quick, daily, crashing, waiting],
    jobs=[
        define_asset_job("quick_job", [quick]),
        define_asset_job("crashing_job", [crashing]),
        define_asset_job("waiting_job", [waiting]),
    ],
    executor=in_process_executor,  # steps in the run worker itself, as the warehouse runs them (WAREHOUSE_RUN_EXECUTOR)
)
