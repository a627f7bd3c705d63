"""A run coordinator that launches a run at once when the queue is empty and the run fits the concurrency limits.

Dagster's ``QueuedRunCoordinator`` only queues: its daemon dequeues every ``dequeue_interval_seconds`` (whole
seconds, and its loop sleeps in 0.5 s steps), so every run pays ~1 s before it launches. The
default coordinator launches at once but ignores every limit. :class:`ImmediateRunCoordinator` is the queued one
with a fast path: in ``submit_run`` (the webserver's ``launchRun``, a sensor's or backfill's request in the daemon)
it launches the run itself when

- the daemon's next pass would launch it too: the runs in progress and the queued runs ahead of it (by priority,
  then age, skipping those a tag limit holds back, as the daemon does) leave room under ``max_concurrent_runs``,
  and no ``tag_concurrency_limits`` entry is full for its tags — so it never takes a slot a queued run would get;
- no op concurrency pool is configured (the daemon's pool accounting is not public: such runs go through it);
- with compute pools (``WAREHOUSE_SPARK_POOLS``, instance/pools.py), an eligible pool has room: the limits the
  daemon reads from :meth:`ImmediateRunCoordinator.get_run_queue_config` are capped by the pools' free capacity.

Otherwise it queues the run exactly as ``QueuedRunCoordinator`` does, and Dagster's daemon launches it when a slot
frees. The decision and the run's move to STARTING happen under a file lock in the instance's directory, so
submissions of the processes of one host (webserver, daemon) cannot both take the last slot. The daemon's own
dequeuer does not take that lock; since the fast path leaves room for every queued run it counted, the two can
exceed a limit only if a run is queued and a slot frees while a daemon pass is between reading the slots and
launching (milliseconds), and only across hosts if the webserver and the daemon run on different ones.

Configured in ``dagster_home/dagster.yaml`` with the ``QueuedRunCoordinator``'s settings::

    run_coordinator:
      module: warehouse_assets.instance.run_coordinator
      class: ImmediateRunCoordinator
      config: {max_concurrent_runs: 2, tag_concurrency_limits: [...]}
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterRun,
    DagsterRunStatus,
    QueuedRunCoordinator,
    RunsFilter,
    SubmitRunContext,
)
from dagster._core.events import EngineEventData
from dagster._core.launcher import LaunchRunContext
from dagster._core.run_coordinator.queued_run_coordinator import RunQueueConfig
from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES
from dagster._utils.error import serializable_error_info_from_exc_info
from dagster._utils.tags import TagConcurrencyLimitsCounter

from warehouse_assets.instance.file_lock import held
from warehouse_assets.instance.pools import Pool, pools_from_env, queue_limits

log = logging.getLogger(__name__)
LOCK_FILE = ".run_coordinator.lock"
PRIORITY_TAG = "dagster/priority"  # the tag the daemon orders its queue by


def _priority(run: DagsterRun) -> int:
    try:
        return int(run.tags.get(PRIORITY_TAG, "0"))
    except ValueError:
        return 0


class ImmediateRunCoordinator(QueuedRunCoordinator):  # type: ignore[misc]
    """``QueuedRunCoordinator`` that launches a run in ``submit_run`` when the queue is empty and limits allow."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pools: tuple[Pool, ...] = pools_from_env()  # none configured: the one endpoint, nothing capped

    def get_run_queue_config(self) -> RunQueueConfig:
        """The configured limits; with compute pools, capped by the room they have (instance/pools.py), so that a
        run no pool can take stays queued, for this fast path and the daemon's passes alike."""
        config = super().get_run_queue_config()
        if not self._pools:
            return config
        limit, pool_limits = queue_limits(self._instance, self._pools, config.max_concurrent_runs)
        return config._replace(
            max_concurrent_runs=limit, tag_concurrency_limits=[*(config.tag_concurrency_limits or []), *pool_limits]
        )

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        if run.status != DagsterRunStatus.NOT_STARTED:
            return super().submit_run(context)  # already submitted: the parent logs and skips it
        with self._decision_lock():
            starting = self._fits(run)
            if starting:
                # STARTING before the lock is released: the next decision counts this run as in progress
                self._instance.report_dagster_event(
                    DagsterEvent(event_type_value=DagsterEventType.PIPELINE_STARTING.value, job_name=run.job_name),
                    run_id=run.run_id,
                )
        if not starting:
            return super().submit_run(context)
        # launched outside the lock: a first launch may wait for the warm worker to import the code location
        started = self._instance.get_run_by_id(run.run_id) or run
        try:
            self._instance.run_launcher.launch_run(LaunchRunContext(dagster_run=started, workspace=context.workspace))
        except Exception:  # as DagsterInstance.launch_run does: the run fails with the launcher's error
            error = serializable_error_info_from_exc_info(sys.exc_info())
            self._instance.report_engine_event(error.message, started, EngineEventData.engine_error(error))
            self._instance.report_run_failed(started)
            raise
        return self._instance.get_run_by_id(run.run_id) or started

    def _fits(self, run: DagsterRun) -> bool:
        """Would the daemon's next pass launch ``run``? The queued runs go first, by priority then age, as the
        daemon orders them; a queued run that a tag limit holds back does not hold ``run`` back."""
        config = self.get_run_queue_config()
        instance = self._instance
        if config.should_block_op_concurrency_limited_runs and instance.event_log_storage.get_concurrency_keys():
            return False
        active = instance.get_runs(RunsFilter(statuses=ACTIVE_RUN_STATUSES))
        slots = config.max_concurrent_runs - len(active) if config.max_concurrent_runs != -1 else None
        tags = TagConcurrencyLimitsCounter(list(config.tag_concurrency_limits or []), list(active))
        queued = list(reversed(instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED]))))  # oldest first
        for candidate in sorted([*queued, run], key=_priority, reverse=True):  # stable: FIFO within a priority
            if slots is not None and slots <= 0:
                return False
            if tags.is_blocked(candidate):
                if candidate.run_id == run.run_id:
                    return False
                continue
            if candidate.run_id == run.run_id:
                return True
            tags.update_counters_with_launched_item(candidate)
            slots = None if slots is None else slots - 1
        return False

    @contextlib.contextmanager
    def _decision_lock(self) -> Iterator[None]:
        with held(Path(self._instance.root_directory) / LOCK_FILE):
            yield
