"""The runs the dependency center plans: :class:`RunPlan` (contiguous partitions of one table, or a run of a job),
the :class:`Trigger` that made it possible, its queue priority (:func:`run_priority`) and the tags it is submitted
with. The resolver (:mod:`warehouse_assets.center.resolver`) makes them, the ledger keeps them until their runs exist,
and the engine submits them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from warehouse_assets.instance.lanes import FIRST_BUILD_LANE, REBUILD_LANE, lane_tags
from warehouse_assets.materialize.gate import LATE_CHANGES_TAG

REQUEST_TAG = "warehouse/request"  # the request a run was submitted for: how a restart finds what it submitted
TRIGGER_TAG = "warehouse/trigger"  # the change that made the run's partitions ready, in words
PARTITIONS_TAG = "warehouse/partitions"  # a ranged run's partitions in words (Dagster's two range tags are apart)
PRIORITY_TAG = "dagster/priority"  # Dagster's queue launches higher priorities first, then the oldest


def run_priority(
    table: str,
    first_partition_end: datetime | None,
    now: datetime | None,
    rebuild: bool = False,
    hourly: bool = False,
) -> int:
    """The queue priority of the engine's run of ``table`` whose first partition's window ends at
    ``first_partition_end``.

    Older partitions first (by the days since their window ended), and among those of the same day the hours first,
    then deeper layers first: a catch-up finishes the oldest day's chain up to its figures (ADS) before it starts the
    next day's, instead of building every day's DWD before any DWS; and when a day closes, its last hour, watched live,
    is not queued behind the closed day's chain, which takes minutes anyway. A ``rebuild`` (every partition of the run
    was built before: late data, a later state, a late upstream past its deadline) goes after every first build: late
    changes to yesterday arrive all day, and the new hours must not wait behind yesterday's chain being built again.
    Always below zero, so that a run a user launches (priority 0: the UI's Materialize, a backfill) goes before the
    engine's."""
    rank = {"dwd": 1, "dws": 2, "ads": 3}.get(table.split(".", 1)[0], 3) + (4 if hourly else 0)
    age = 0 if first_partition_end is None or now is None else max(0, (now - first_partition_end).days)
    return (-200 if rebuild else -100) + 10 * min(age, 9) + rank


CLOCK = "clock"  # a Trigger's field: the partition's window ended, nothing upstream changed
DEADLINE_PASSED = "deadline"  # a Trigger's field: a dependency's deadline passed, nothing upstream changed
LOST_RETRY = "lost_retry"  # a Trigger's field: the run failed and Dagster could not launch its retry
STOPPED = "stopped"  # a Trigger's field: a stop of the stack canceled the run
LATE_DUE = "late_due"  # a Trigger's field: the late-data policy's time for a stale partition's rebuild came
DECLARED = "declared"  # a Trigger's field: the table was added to the catalog, or its declaration changed
# a trigger's fields as the run's tag says them: a run is planned only once nothing upstream is in progress, so an
# in-progress change that triggers one is a run that ended
CHANGE_WORDS = {
    "checks": "checked",
    "in_progress": "run ended",
    "queued": "run ended",
    "failed": "run failed",
    "missing": "gone from the lake",
    CLOCK: "window ended",
    DEADLINE_PASSED: "deadline passed",
    LOST_RETRY: "its retry could not be launched",
    STOPPED: "its run was canceled by a stop",
    LATE_DUE: "late data's rebuild due",
    DECLARED: "table declared",
}


@dataclass(frozen=True)
class Trigger:
    """The change that made a partition ready: which partition, its latest materialization, what changed."""

    table: str  # fqn
    partition: str
    storage_id: int | None  # of the partition's latest materialization when the change was read
    run_id: str | None  # the run that materialized it ("" for a runless report)
    fields: frozenset[str]  # ``materialized``, ``checks``, ``in_progress``, ``failed``, or ``clock``

    def describe(self) -> str:
        """In words, for the run's tag and the engine's log: ``dws.user_order_daily 2026-11-20 (materialized)``."""
        return f"{self.table} {self.partition} ({', '.join(sorted(CHANGE_WORDS.get(f, f) for f in self.fields))})"

    def to_json(self) -> list[object]:
        return [self.table, self.partition, self.storage_id, self.run_id, sorted(self.fields)]

    @classmethod
    def from_json(cls, value: Sequence[object]) -> Trigger:
        table, partition, storage_id, run_id, fields = value
        assert isinstance(fields, list)
        return cls(str(table), str(partition), storage_id, run_id, frozenset(fields))  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunPlan:
    """One run to request: contiguous partitions of one table, in time order, and the change that triggered it; or,
    with ``job``, a run of that job with ``run_config`` (the taint job after a late failed verdict)."""

    table: str  # fqn
    partitions: tuple[str, ...]
    trigger: Trigger
    request_id: str = ""  # set when the plan is recorded: the key of its submission
    job: str = ""
    run_config: str = ""  # JSON
    priority: int | None = None  # in Dagster's queue (:func:`run_priority`); None: by its layer alone
    rebuild: bool = False  # every partition was built before: the run goes in the rebuild lane
    late_changes: tuple[tuple[str, int], ...] = ()  # partition → the late changes its rebuild absorbs

    @property
    def queue_priority(self) -> int:
        return self.priority if self.priority is not None else run_priority(self.table, None, None)

    @property
    def tags(self) -> dict[str, str]:
        """Dagster's partition tags of the run and its queue priority, the request, the triggering change in words,
        and a ranged run's partitions in words: few and short, as they are what the Runs page shows of a run."""
        first, last = self.partitions[0], self.partitions[-1]
        if self.job:
            tags = {}  # a job of ops: no partitions of its own
        elif first == last:
            tags = {"dagster/partition": first}
        else:
            tags = {
                "dagster/asset_partition_range_start": first,
                "dagster/asset_partition_range_end": last,
                PARTITIONS_TAG: f"{first} … {last} ({len(self.partitions)})",
            }
        return {
            **tags,
            PRIORITY_TAG: str(self.queue_priority),
            REQUEST_TAG: self.request_id,
            TRIGGER_TAG: self.trigger.describe(),
            # its lane of run slots (warehouse_assets/instance/lanes.py); a job plan is a repair (the taint job)
            **lane_tags(REBUILD_LANE if self.rebuild or self.job else FIRST_BUILD_LANE),
            **({LATE_CHANGES_TAG: json.dumps(dict(self.late_changes))} if self.late_changes else {}),
        }

    def to_json(self) -> str:
        return json.dumps(
            [
                self.table,
                self.partitions,
                self.trigger.to_json(),
                self.job,
                self.run_config,
                self.priority,
                self.rebuild,
                self.late_changes,
            ]
        )

    @classmethod
    def from_json(cls, text: str, request_id: str) -> RunPlan:
        fields: list[Any] = json.loads(text)
        table, partitions, trigger = fields[:3]
        # plans recorded before jobs, priorities and lanes have fewer fields
        defaults: list[Any] = ["", "", None, False, []]
        job, run_config, priority, rebuild, late = [*fields[3:], *defaults[len(fields) - 3 :]]
        return cls(
            table,
            tuple(partitions),
            Trigger.from_json(trigger),
            request_id,
            job,
            run_config,
            priority,
            bool(rebuild),
            tuple((str(p), int(n)) for p, n in late),
        )
