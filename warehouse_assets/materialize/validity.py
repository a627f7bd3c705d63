"""Partition validity: every partition is ``valid`` or ``tainted``, and a taint says who, when, why and from where.

A taint is a failed evaluation of the per-partition check ``valid`` that every table carries, targeting the
partition's materialization it condemns, with the reason, the root partition it was tainted from, who marked it and
the backfill repairing it as metadata. Why a check evaluation rather than a store of our own:

* it is an event in Dagster's instance, so the event log stays the one source of truth: the dependency center's
  state store reads it by storage id with the other verdicts, and a rebuild of the store from the log gives the
  same validity;
* it shows where on-call engineers look: the asset's partition, its checks, the check's history, with the reason
  and the root as metadata;
* it targets one materialization, as every verdict does: a new materialization (the repair) leaves it behind, and
  the partition is judged again by its blocking checks on the new data, exactly as Dagster's own ``is_current``.

A tainted partition nobody can rebuild (an ODS hour its source never sends again) can be *released*: a passed ``valid``
verdict on the same materialization with ``validity: released``, the reason and who: its data is accepted as is, the
gate lets its downstream build, and the UI and ``warehouse status`` show the release where they showed the taint.

So a partition is tainted while the latest ``valid`` verdict on its latest materialization failed. A rebuild that
passes its blocking checks logs a passed ``valid`` verdict (the runner, the ODS hours' judge), so the UI shows the
partition valid again; until its checks pass, its downstream waits (the gate waits for blocking verdicts).

Taints are logged inside a run (the ``taint_repair`` job's, :mod:`warehouse_assets.center.taint`), never run-less:
Dagster 1.13 keeps one run-less evaluation per check and partition and rejects a second, while a partition may be
tainted, repaired and tainted again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSpec,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
)

from warehouse_assets.catalog import WHOLE, partitions_def_of

if TYPE_CHECKING:
    from dagster._core.storage.event_log.base import EventLogStorage

    from warehouse_assets.catalog import Table

VALID = "valid"  # the check every table carries: failed = tainted
# an observation's metadata marking a partition's latest materialization gone from the lake (its files deleted, the
# table restored to an older version): {LAKE: GONE, "reason": what was found, "materialization": its storage id}
LAKE, GONE = "lake", "missing"
RELEASED = "released"  # a passed ``valid`` verdict's validity when it lifts a taint without new data
# on a repair backfill, and so on its runs: the run of the taint job that launched it
TAINT_TAG = "warehouse/taint"


@dataclass(frozen=True)
class Taint:
    """Why a partition is tainted: ``root`` is the partition it was tainted from (``ods.order 2026-01-05-13:00``,
    with the failed check when a late verdict tainted it), ``repair`` the backfill rebuilding it, if any."""

    reason: str
    root: str
    by: str
    at: float  # epoch seconds
    repair: str = ""

    def describe(self) -> str:
        return f"tainted: {self.reason}, from {self.root}"

    def metadata(self) -> dict[str, str]:
        return {"validity": "tainted", "reason": self.reason, "root": self.root, "by": self.by, "repair": self.repair}

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "root": self.root, "by": self.by, "at": self.at, "repair": self.repair}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Taint:
        return cls(str(value["reason"]), str(value["root"]), str(value["by"]), float(value["at"]), value["repair"])

    @classmethod
    def of(cls, evaluation: AssetCheckEvaluation, at: float) -> Taint:
        """The taint a failed ``valid`` evaluation records (logged ``at``)."""
        meta = {k: v.value for k, v in evaluation.metadata.items()}
        return cls(
            reason=str(meta.get("reason") or evaluation.description or "marked tainted"),
            root=str(meta.get("root") or f"{evaluation.asset_key.to_user_string()} {evaluation.partition}"),
            by=str(meta.get("by") or ""),
            at=at,
            repair=str(meta.get("repair") or ""),
        )


def valid_spec(table: Table) -> AssetCheckSpec:
    """The table's ``valid`` check: non-blocking for Dagster, because the gate reads validity itself (a taint must
    hold back runs in other runs, and a tainted upstream may be accepted per dependency)."""
    return AssetCheckSpec(
        VALID,
        asset=AssetKey(table.key),
        description="Failed = tainted: the partition's data is known bad (reason, root and who in the metadata); "
        "passed once a rebuild passed its blocking checks. Marked by `warehouse taint` or the taint_repair job.",
        blocking=False,
        partitions_def=None if table.is_static else partitions_def_of(table),
        metadata={"kind": "validity"},
    )


def target_data(storage_id: int, run_id: str, timestamp: float) -> Any:
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationTargetMaterializationData,
    )

    return AssetCheckEvaluationTargetMaterializationData(storage_id=storage_id, run_id=run_id, timestamp=timestamp)


def taint_evaluation(
    table: Table, partition: str, taint: Taint, target: tuple[int, str, float] | None
) -> AssetCheckEvaluation:
    """The event marking ``partition`` tainted, on its materialization ``target`` (storage id, run id, time)."""
    return AssetCheckEvaluation(
        asset_key=AssetKey(table.key),
        check_name=VALID,
        passed=False,
        partition=_dagster_partition(partition),
        target_materialization_data=target_data(*target) if target else None,
        metadata={**taint.metadata(), "partition": partition},
        blocking=False,
        description=taint.describe(),
    )


def valid_evaluation(table: Table, partition: str, target: Any, detail: str) -> AssetCheckEvaluation:
    """A passed ``valid`` verdict on the materialization ``target`` (a record, or the target data itself)."""
    data = getattr(target, "storage_id", None)
    return AssetCheckEvaluation(
        asset_key=AssetKey(table.key),
        check_name=VALID,
        passed=True,
        partition=_dagster_partition(partition),
        target_materialization_data=target_data(target.storage_id, target.run_id, target.timestamp)
        if data is not None
        else None,
        metadata={"validity": "valid", "partition": partition},
        blocking=False,
        description=detail,
    )


def release_evaluation(
    table: Table, partition: str, target: tuple[int, str, float], reason: str, by: str, lifted: Taint
) -> AssetCheckEvaluation:
    """The event releasing ``partition`` (its data accepted as is) on its materialization ``target``, lifting the
    taint ``lifted``."""
    return AssetCheckEvaluation(
        asset_key=AssetKey(table.key),
        check_name=VALID,
        passed=True,
        partition=_dagster_partition(partition),
        target_materialization_data=target_data(*target),
        metadata={
            "validity": RELEASED,
            "reason": reason,
            "by": by,
            "lifted": lifted.describe(),
            "partition": partition,
        },
        blocking=False,
        description=f"released, accepted as is: {reason} (by {by}); it was {lifted.describe()}",
    )


def released_note(evaluation: AssetCheckEvaluation) -> str | None:
    """``accepted as is: REASON (by WHO)`` for a release, None for any other ``valid`` verdict."""
    meta = {k: v.value for k, v in evaluation.metadata.items()}
    if not evaluation.passed or meta.get("validity") != RELEASED:
        return None
    return f"accepted as is: {meta.get('reason')} (by {meta.get('by')})"


def _dagster_partition(partition: str) -> str | None:
    """The partition Dagster's event names: none for a static table's one partition (its asset is unpartitioned)."""
    return None if partition == WHOLE else partition


def tainted_in_instance(instance: DagsterInstance, table: Table, keys: Sequence[str]) -> dict[str, Taint]:
    """Partition → its taint, for those of ``keys`` whose latest ``valid`` verdict on their latest materialization
    failed, read from the instance (the run guard's view; the dependency center reads its state store).

    A run that checks a partition logs its check as planned before it builds: while a repair rebuilds a tainted
    partition, and for good when that run fails before its build, Dagster's latest execution of the check is that
    plan, not a verdict. The verdict that holds is then the latest one given, if it was on the latest build."""
    if not keys:
        return {}
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    check = AssetCheckKey(AssetKey(table.key), VALID)
    storage = instance.event_log_storage
    if table.is_static:  # unpartitioned: its latest verdict, if it is on the latest materialization
        latest = instance.fetch_materializations(AssetKey(table.key), limit=1).records
        taint = _failed_verdict_on(storage, check, None, latest[0].storage_id if latest else None)
        return {WHOLE: taint} if taint is not None else {}

    wanted = set(keys)
    found: dict[str, Taint] = {}
    for info in storage.get_asset_check_partition_info([check], partition_keys=sorted(wanted)):
        if info.partition_key not in wanted:
            continue
        status = info.latest_execution_status
        if status == AssetCheckExecutionRecordStatus.PLANNED:
            taint = _failed_verdict_on(storage, check, info.partition_key, info.latest_materialization_storage_id)
        elif status == AssetCheckExecutionRecordStatus.FAILED and info.is_current:
            taint = _taint_logged_at(storage, info.latest_check_event_storage_id)
        else:
            taint = None
        if taint is not None:
            found[str(info.partition_key)] = taint
    return dict(sorted(found.items()))


def _failed_verdict_on(
    storage: EventLogStorage, check: AssetCheckKey, partition: str | None, materialization: int | None
) -> Taint | None:
    """The taint of the partition's latest verdict (plans skipped), if it failed on the ``materialization`` given."""
    from dagster._core.event_api import PartitionKeyFilter
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    verdicts = storage.get_asset_check_execution_history(
        check,
        limit=1,
        status={AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED},
        partition_filter=PartitionKeyFilter(key=partition),
    )
    if not verdicts or verdicts[0].status != AssetCheckExecutionRecordStatus.FAILED or verdicts[0].event is None:
        return None
    event = verdicts[0].event
    evaluation = event.dagster_event.asset_check_evaluation_data if event.dagster_event else None
    target = evaluation.target_materialization_data if evaluation is not None else None
    if evaluation is None or target is None or materialization is None or target.storage_id != materialization:
        return None
    return Taint.of(evaluation, event.timestamp)


def _taint_logged_at(storage: EventLogStorage, event_id: int) -> Taint | None:
    """The taint a failed verdict logged as event ``event_id`` records: its metadata (reason, root) is in the event."""
    logs = storage.get_logs_for_all_runs_by_log_id(
        after_cursor=event_id - 1, dagster_event_type=DagsterEventType.ASSET_CHECK_EVALUATION, limit=1
    )
    entry = logs.get(event_id)
    evaluation = entry.dagster_event.asset_check_evaluation_data if entry and entry.dagster_event else None
    return Taint.of(evaluation, entry.timestamp) if entry is not None and evaluation is not None else None


def taint_times(instance: DagsterInstance, table: Table, keys: Sequence[str]) -> dict[str, float]:
    """Partition → when it was tainted, for those of ``keys`` tainted now (:func:`tainted_in_instance`)."""
    return {key: taint.at for key, taint in tainted_in_instance(instance, table, keys).items()}


def gone_in_instance(instance: DagsterInstance, table: Table, keys: Sequence[str]) -> dict[str, str]:
    """Partition → what was found, for those of ``keys`` whose latest materialization was marked gone from the lake
    and not built since, read from the instance (the run guard's view; the dependency center reads its state store)."""
    if not keys:
        return {}
    key = AssetKey(table.key)
    partitions = None if table.is_static else list(keys)
    marks: dict[str, tuple[int, str]] = {}
    for record in instance.fetch_observations(
        AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=1000
    ).records:
        observation = record.asset_observation
        meta = {k: v.value for k, v in observation.metadata.items()} if observation is not None else {}
        partition = WHOLE if record.partition_key is None else record.partition_key
        if meta.get(LAKE) == GONE and partition not in marks:  # newest first: the latest mark of each partition
            marks[partition] = (record.storage_id, str(meta.get("reason") or "its files are gone from the lake"))
    found = {}
    for partition, (storage_id, reason) in marks.items():
        since = AssetRecordsFilter(
            asset_key=key, asset_partitions=None if partition == WHOLE else [partition], after_storage_id=storage_id
        )
        if not instance.fetch_materializations(since, limit=1).records:
            found[partition] = reason
    return found
