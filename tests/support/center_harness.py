"""The dependency center as the engine runs it, stepped at pinned times: how tests ask what the engine starts.

The engine (``warehouse engine``) steps the resolver every fraction of a second and submits the plans through the
webserver; here the same store and resolver are stepped at the times a test chooses, over the test's instance, and
each plan counts as submitted. A plan of the taint job (a late failed verdict's) is executed here, in process, as
the code location would run it. Built at the first tick, as the engine starts: what was reported before it is read
then.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from dagster import DagsterInstance

from warehouse_assets.catalog import Catalog
from warehouse_assets.center.plans import RunPlan
from warehouse_assets.center.resolver import Resolver
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.center.taint import build_taint_job
from warehouse_assets.materialize.compiler import max_partitions_per_run


class CenterTicker:
    """``tick(at)``: the partitions the engine requests at ``at``, by table (of ``tables``, default all)."""

    def __init__(
        self,
        instance: DagsterInstance,
        catalog: Catalog,
        tables: Sequence[str] | None = None,
        store_path: Path | None = None,  # another engine's store beside the instance's default one
    ):
        self.instance, self.catalog, self.store_path = instance, catalog, store_path
        self.tables = list(tables) if tables is not None else [t.fqn for t in catalog.derived()]
        self.resolver: Resolver | None = None
        self.plans: list[RunPlan] = []  # the last tick's
        self.jobs: list[RunPlan] = []  # every job run planned (the taint job's), executed

    def tick(self, at: datetime) -> dict[str, list[str]]:
        if self.resolver is None:
            store = PartitionStateStore(self.instance, self.store_path)
            self.resolver = Resolver(
                self.catalog, ReverseIndex.build(self.catalog, current_time=at), store, max_partitions_per_run
            )
        self.plans = self.resolver.step(at)
        for plan in self.plans:
            if plan.job:
                run = build_taint_job(self.catalog).execute_in_process(
                    run_config=json.loads(plan.run_config), instance=self.instance, tags=plan.tags
                )
                assert run.success, plan
                self.jobs.append(plan)
            self.resolver.submitted(plan.request_id)
        requested: dict[str, list[str]] = {t: [] for t in self.tables}
        for plan in self.plans:
            if plan.table in requested and not plan.job:
                requested[plan.table].extend(plan.partitions)
        return {t: sorted(keys) for t, keys in requested.items()}

    def runs(self, table: str) -> list[list[str]]:
        """The last tick's runs of ``table``: each run's partitions."""
        return [list(plan.partitions) for plan in self.plans if plan.table == table and not plan.job]

    def close(self) -> None:
        if self.resolver is not None:
            self.resolver.close()
            self.resolver.store.close()
