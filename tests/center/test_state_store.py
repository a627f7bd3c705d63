"""The partition state store: kept incrementally from the event log, equal to a rebuild from the log, resumed from
its cursor after a restart, and read by the gate exactly as the instance is.

Events are written to a temp-dir instance as Dagster writes them (runless reports, runs created for a job with
their planned materializations, run start / success / failure / cancel events, in-run materializations and check
evaluations): no Spark, no code location.
"""

from __future__ import annotations

import functools
import random
import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSpec,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DailyPartitionsDefinition,
    Definitions,
    JobDefinition,
    MetadataValue,
    Output,
    asset,
    define_asset_job,
    instance_for_test,
    materialize,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.events import StepMaterializationData
from dagster._core.utils import make_new_run_id

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.center import state_store
from warehouse_assets.center.state_store import Change, PartitionState, PartitionStateStore, default_path
from warehouse_assets.explain.upstream import PartitionStates
from warehouse_assets.materialize.gate import decide
from warehouse_assets.materialize.validity import VALID

DAYS = DailyPartitionsDefinition(start_date="2026-03-01")
PARTITIONS = [f"2026-03-{d:02d}" for d in range(1, 9)]
A, B = AssetKey(["dwd", "a"]), AssetKey(["ods", "b"])  # A is built by runs; B only reported, as ODS hours and
# external deliveries are (runless materializations)
CHECK = "not_null"


@functools.cache
def job_of(key: AssetKey) -> JobDefinition:
    """The job building ``key``, whose runs are created here and their events reported (never executed)."""

    @asset(key=key, partitions_def=DAYS)
    def built() -> None: ...

    return Definitions(assets=[built], jobs=[define_asset_job("build", [key])]).resolve_job_def("build")


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    """The product's storage: run-sharded SQLite, whose cross-run index holds every event type the store reads."""
    (tmp_path / "home").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        yield instance


# --- writing events as Dagster does ------------------------------------------------------------------------------


def report(instance: DagsterInstance, key: AssetKey, partition: str, version: int | None = None) -> None:
    metadata = {"delta_version": version} if version is not None else {}
    instance.report_runless_asset_event(AssetMaterialization(key, partition=partition, metadata=metadata))


def materializations(instance: DagsterInstance, key: AssetKey, partition: str) -> list[int]:
    """Storage ids of the partition's materializations, newest first."""
    found = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=50)
    return [r.storage_id for r in found.records]


def verdict(instance: DagsterInstance, key: AssetKey, partition: str, passed: bool, target: int | None) -> None:
    """A check evaluation on the materialization ``target``, in a run of its own (as a check run reports it; a
    second runless verdict on one partition breaks a UNIQUE constraint on SQLite)."""
    data = (
        AssetCheckEvaluationTargetMaterializationData(storage_id=target, run_id="", timestamp=0.0) if target else None
    )
    evaluation = AssetCheckEvaluation(
        asset_key=key, check_name=CHECK, passed=passed, partition=partition, target_materialization_data=data
    )
    event = DagsterEvent(DagsterEventType.ASSET_CHECK_EVALUATION.value, "checks", event_specific_data=evaluation)
    instance.report_dagster_event(event, make_new_run_id())


def taint(
    instance: DagsterInstance,
    key: AssetKey,
    partition: str,
    target: int | None,
    reason: str = "wrong amounts",
    root: str = "ods/b 2026-03-01",
    passed: bool = False,
) -> None:
    """A ``valid`` verdict on the materialization ``target``: failed = a taint (reason, root, who as metadata), passed
    = valid again; logged in a run of its own, as the taint job logs it."""
    data = (
        AssetCheckEvaluationTargetMaterializationData(storage_id=target, run_id="", timestamp=0.0) if target else None
    )
    metadata = {} if passed else {"reason": reason, "root": root, "by": "oncall", "repair": ""}
    evaluation = AssetCheckEvaluation(
        asset_key=key,
        check_name=VALID,
        passed=passed,
        partition=partition,
        target_materialization_data=data,
        metadata=metadata,
    )
    event = DagsterEvent(DagsterEventType.ASSET_CHECK_EVALUATION.value, "taint_repair", event_specific_data=evaluation)
    instance.report_dagster_event(event, make_new_run_id())


def create_run(instance: DagsterInstance, keys: list[str], key: AssetKey = A) -> DagsterRun:
    """A run over ``keys`` (consecutive), created as the daemon creates it: planned materializations logged."""
    if len(keys) == 1:
        tags = {"dagster/partition": keys[0]}
    else:
        tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    return instance.create_run_for_job(job_of(key), tags=tags)


def start(instance: DagsterInstance, run: DagsterRun) -> None:
    instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_START.value, run.job_name), run.run_id)


def materialize_in(instance: DagsterInstance, run: DagsterRun, partition: str, key: AssetKey = A) -> None:
    data = StepMaterializationData(AssetMaterialization(key, partition=partition, metadata={"delta_version": 1}))
    event = DagsterEvent(DagsterEventType.ASSET_MATERIALIZATION.value, run.job_name, event_specific_data=data)
    instance.report_dagster_event(event, run.run_id)


def end(instance: DagsterInstance, run: DagsterRun, how: str) -> None:
    if how == "success":
        instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_SUCCESS.value, run.job_name), run.run_id)
    elif how == "failure":
        instance.report_run_failed(run)
    else:
        instance.report_run_canceled(run)


def random_history(
    instance: DagsterInstance, store: PartitionStateStore, rng: random.Random, steps: int
) -> list[Change]:
    """``steps`` random events (reports of B, verdicts on the latest or an older materialization, runs of A created,
    started, materializing some of their partitions, ending every way, taints and their clearing on the latest or an
    older materialization), with incremental updates after random batches. Returns the changes the updates
    reported."""
    created: list[DagsterRun] = []
    started: list[DagsterRun] = []
    targets: dict[str, list[str]] = {}
    changes: list[Change] = []
    for _ in range(steps):
        action = rng.choice(["report", "report", "verdict", "verdict", "create", "start", "end", "update", "taint"])
        if action == "report":
            report(instance, B, rng.choice(PARTITIONS), rng.choice([None, rng.randrange(100)]))
        elif action == "verdict":
            key, partition = rng.choice([A, B]), rng.choice(PARTITIONS)
            ids = materializations(instance, key, partition)
            target = rng.choice(ids) if ids and rng.random() < 0.8 else None  # mostly the latest one, not always
            verdict(instance, key, partition, rng.random() < 0.6, target)
        elif action == "taint":
            key, partition = rng.choice([A, B]), rng.choice(PARTITIONS)
            ids = materializations(instance, key, partition)
            target = rng.choice(ids) if ids and rng.random() < 0.8 else None
            taint(instance, key, partition, target, reason=f"bad {rng.randrange(9)}", passed=rng.random() < 0.3)
        elif action == "create":
            first = rng.randrange(len(PARTITIONS))
            keys = PARTITIONS[first : first + rng.randint(1, 3)]
            created.append(create_run(instance, keys))
            targets[created[-1].run_id] = keys
        elif action == "start" and created:
            run = created.pop(rng.randrange(len(created)))
            start(instance, run)
            started.append(run)
        elif action == "end" and (created or started):
            pool = started if started and rng.random() < 0.8 else created or started
            run = pool.pop(rng.randrange(len(pool)))
            how = rng.choice(["success", "failure", "canceled"])
            if pool is started and how != "canceled":
                for partition in targets[run.run_id]:
                    if rng.random() < 0.6:
                        materialize_in(instance, run, partition)
            end(instance, run, how)
        elif action == "update":
            changes.extend(store.update())
    return changes


# --- the store ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_updates_after_random_events_equal_a_rebuild_from_the_log(
    consolidated: DagsterInstance, tmp_path: Path, seed: int
) -> None:
    instance = consolidated
    store = PartitionStateStore(instance, tmp_path / "incremental.db")
    changes = random_history(instance, store, random.Random(seed), 90)
    tainted = next(p for p in PARTITIONS if materializations(instance, B, p))  # at least one taint stands at the end
    taint(instance, B, tainted, materializations(instance, B, tainted)[0])
    changes.extend(store.update())
    incremental = store.all_states()

    replayed = PartitionStateStore(instance, tmp_path / "replayed.db")
    replayed.rebuild()
    assert replayed.all_states() == incremental
    with pytest.MonkeyPatch.context() as patch:  # a replay in many small steps, each read in small pages
        patch.setattr(state_store, "SPAN", 7)
        patch.setattr(state_store, "PAGE", 2)
        replayed.rebuild()
    assert replayed.all_states() == incremental
    store.rebuild()
    assert store.all_states() == incremental
    # the updates on the way met every kind of change, both verdicts, and runs both started and failed
    assert set().union(*(c.fields for c in changes)) == {
        "materialized",
        "checks",
        "validity",
        "in_progress",
        "failed",
        "queued",
    }
    assert {c.state.checks.get(CHECK) for c in changes} >= {True, False}
    assert {c.state.tainted for c in changes if "validity" in c.fields} == {True, False}  # tainted, and cleared
    assert any(s.tainted for s in incremental)
    assert {c.state.in_progress for c in changes} == {c.state.failed for c in changes} == {True, False}


def test_a_verdict_counts_only_for_the_latest_materialization(instance: DagsterInstance) -> None:
    store = PartitionStateStore(instance)
    report(instance, A, "2026-03-02", version=4)
    [first] = materializations(instance, A, "2026-03-02")
    verdict(instance, A, "2026-03-02", False, first)
    [change] = store.update()
    assert change.fields == {"materialized", "checks"}
    assert change.state.checks == {CHECK: False} and change.state.delta_version == 4

    report(instance, A, "2026-03-02", version=5)  # a re-materialization clears the old verdicts...
    verdict(instance, A, "2026-03-02", False, first)  # ...and a late verdict on the old one does not count
    assert store.update()[0].fields == {"materialized", "checks"}
    [state] = store.states(A, ["2026-03-02"]).values()
    assert state.checks == {} and state.delta_version == 5 and state.run_id == ""  # a runless report


def test_a_taint_holds_on_its_materialization_until_a_new_one_or_a_passed_valid_verdict(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    store = PartitionStateStore(instance)
    report(instance, B, "2026-03-02")
    [first] = materializations(instance, B, "2026-03-02")
    taint(instance, B, "2026-03-02", first, reason="duplicated rows", root="ods/b 2026-03-02")
    [change] = store.update()
    assert change.fields == {"materialized", "validity"}
    assert change.state.taint is not None
    assert (change.state.taint.reason, change.state.taint.root, change.state.taint.by) == (
        "duplicated rows",
        "ods/b 2026-03-02",
        "oncall",
    )
    assert change.state.taint.describe() == "tainted: duplicated rows, from ods/b 2026-03-02"
    assert change.state.checks == {}  # validity is not one of the declared checks

    report(instance, B, "2026-03-02")  # the repair: new data, judged by its own checks
    taint(instance, B, "2026-03-02", first)  # a taint of the old materialization no longer counts
    [change] = store.update()
    assert change.fields == {"materialized", "validity"} and not change.state.tainted
    [latest, _] = materializations(instance, B, "2026-03-02")
    taint(instance, B, "2026-03-02", latest)
    assert store.update()[0].state.tainted
    taint(instance, B, "2026-03-02", latest, passed=True)  # judged valid again on the same data
    [change] = store.update()
    assert change.fields == {"validity"} and not change.state.tainted

    replayed = PartitionStateStore(instance, tmp_path / "replayed.db")
    replayed.rebuild()
    assert replayed.all_states() == store.all_states()


def test_a_store_written_before_validity_opens_and_keeps_its_rows(instance: DagsterInstance, tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:  # the schema of a store written by the previous version
        old.executescript(
            "CREATE TABLE partitions (asset_key, partition, storage_id, run_id, timestamp, delta_version, checks, "
            "latest_run, in_progress, failed, PRIMARY KEY (asset_key, partition)) WITHOUT ROWID;"
            "INSERT INTO partitions VALUES ('ods/b', '2026-03-01', 5, '', 1.0, 3, '{}', NULL, 0, 0);"
        )
    store = PartitionStateStore(instance, path)
    assert store.states(B, ["2026-03-01"])["2026-03-01"] == PartitionState(
        "ods/b", "2026-03-01", 5, "", 1.0, 3, {}, None, False, False, None
    )


def test_each_partition_keeps_its_rows_and_what_its_latest_materialization_changed(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """What a reader's late-data rebuild will touch, known before it runs: a key-scoped build's keys, every row of a
    whole one (a ranged run lists each partition it wrote), a late report's new changes; nothing where none is said."""
    store = PartitionStateStore(instance, tmp_path / "counts.db")
    written = [
        {"partition": "2026-03-01", "rows": 800},
        {"partition": "2026-03-02", "rows": 900, "keys_rebuilt": 7},
    ]
    instance.report_runless_asset_event(
        AssetMaterialization(A, partition="2026-03-01", metadata={"partitions": written})
    )
    instance.report_runless_asset_event(
        AssetMaterialization(A, partition="2026-03-02", metadata={"partitions": written})
    )
    late = {"rows": 120, "late_changes": True, "changed_rows": 3}
    instance.report_runless_asset_event(AssetMaterialization(B, partition="2026-03-01-10:00", metadata=late))
    instance.report_runless_asset_event(AssetMaterialization(B, partition="2026-03-01-11:00", metadata={"rows": 50}))
    store.update()
    derived = store.states(A, ["2026-03-01", "2026-03-02"])
    assert [(s.rows, s.changed) for s in derived.values()] == [(800, 800), (900, 7)]
    hours = store.states(B, ["2026-03-01-10:00", "2026-03-01-11:00"])
    assert [(s.rows, s.changed) for s in hours.values()] == [(120, 3), (50, None)]


def test_a_row_read_again_is_the_state_made_before_and_a_changed_row_a_new_one(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """The resolver reads every upstream window again on each call: an unchanged row gives the state already built
    from it, a materialization since gives the new state, never the one kept."""
    store = PartitionStateStore(instance, tmp_path / "kept.db")
    report(instance, A, "2026-03-01", version=1)
    store.update()
    first = store.states(A, ["2026-03-01", "2026-03-02"])
    again = store.states(A, ["2026-03-01", "2026-03-02"])
    assert again["2026-03-01"] is first["2026-03-01"]
    assert not again["2026-03-02"].materialized
    report(instance, A, "2026-03-01", version=2)
    report(instance, A, "2026-03-02", version=1)
    store.update()
    after = store.states(A, ["2026-03-01", "2026-03-02"])
    assert after["2026-03-01"].delta_version == 2
    assert after["2026-03-01"].storage_id != first["2026-03-01"].storage_id
    assert after["2026-03-02"].materialized


def test_a_run_is_queued_from_its_creation_in_progress_from_its_start_to_its_end_and_failed_if_it_did_not_materialize(
    instance: DagsterInstance,
) -> None:
    store = PartitionStateStore(instance)
    run = create_run(instance, ["2026-03-02", "2026-03-03"])
    assert {(c.partition, c.fields, c.state.queued, c.state.in_progress) for c in store.update()} == {
        ("2026-03-02", frozenset({"queued"}), True, False),
        ("2026-03-03", frozenset({"queued"}), True, False),
    }
    start(instance, run)
    assert {(c.partition, c.fields, c.state.queued) for c in store.update()} == {
        ("2026-03-02", frozenset({"in_progress", "queued"}), False),
        ("2026-03-03", frozenset({"in_progress", "queued"}), False),
    }
    materialize_in(instance, run, "2026-03-02")
    end(instance, run, "failure")
    assert store.update()
    states = store.states(A, ["2026-03-02", "2026-03-03", "2026-03-04"])
    assert (states["2026-03-02"].materialized, states["2026-03-02"].failed) == (True, False)
    assert (states["2026-03-03"].materialized, states["2026-03-03"].failed) == (False, True)
    assert not any(s.in_progress or s.queued for s in states.values())
    assert states["2026-03-04"] == PartitionState("dwd/a", "2026-03-04")  # nothing ever happened to it

    retry = create_run(instance, ["2026-03-03"])
    start(instance, retry)
    [change] = store.update()
    assert change.fields == {"in_progress", "failed"} and change.state.in_progress and not change.state.failed


def test_a_real_run_records_its_delta_version_and_its_check_verdict(instance: DagsterInstance) -> None:
    @asset(
        key=A,
        partitions_def=DAYS,
        check_specs=[AssetCheckSpec(CHECK, asset=A, blocking=False, partitions_def=DAYS)],
    )
    def built() -> Iterator[Output[None] | AssetCheckResult]:
        yield Output(None, metadata={"delta_version": MetadataValue.int(7)})
        yield AssetCheckResult(check_name=CHECK, passed=True)

    store = PartitionStateStore(instance)
    assert materialize([built], instance=instance, partition_key="2026-03-05").success
    [change] = store.update()
    state = change.state
    assert (state.partition, state.delta_version, state.checks, state.in_progress) == (
        "2026-03-05",
        7,
        {CHECK: True},
        False,
    )
    assert state.run_id == state.latest_run != ""


def test_a_restart_resumes_from_the_cursor_and_reads_only_new_events(instance: DagsterInstance) -> None:
    path = default_path(instance)
    store = PartitionStateStore(instance)
    for partition in PARTITIONS:
        report(instance, B, partition)
    store.update()
    cursor, before = store.cursor, store.all_states()
    store.close()

    report(instance, B, PARTITIONS[0], version=9)
    report(instance, A, PARTITIONS[1])
    restarted = PartitionStateStore(instance, path)
    assert restarted.cursor == cursor and restarted.all_states() == before
    changes = restarted.update()
    assert restarted.records_read == 2
    assert {(c.asset_key, c.partition) for c in changes} == {("ods/b", PARTITIONS[0]), ("dwd/a", PARTITIONS[1])}
    assert restarted.states(B, [PARTITIONS[0]])[PARTITIONS[0]].delta_version == 9


def test_an_event_committed_after_a_later_one_was_read_is_applied_once_it_appears(
    consolidated: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: an event's id is taken before its insert commits, so a reader can see a later id first."""
    store = PartitionStateStore(consolidated, overlap=50)
    for partition in PARTITIONS[:3]:
        report(consolidated, B, partition)
    late = materializations(consolidated, B, PARTITIONS[1])[0]
    storage = consolidated.event_log_storage
    read = storage.get_logs_for_all_runs_by_log_id
    hidden = {"on": True}

    def not_yet_committed(*args: Any, **kwargs: Any) -> Any:
        return {i: e for i, e in read(*args, **kwargs).items() if not (hidden["on"] and i == late)}

    monkeypatch.setattr(storage, "get_logs_for_all_runs_by_log_id", not_yet_committed)
    assert {c.partition for c in store.update()} == {PARTITIONS[0], PARTITIONS[2]}
    assert store.cursor > late and not store.states(B, [PARTITIONS[1]])[PARTITIONS[1]].materialized
    hidden["on"] = False  # it commits
    report(consolidated, B, PARTITIONS[3])
    assert {c.partition for c in store.update()} == {PARTITIONS[1], PARTITIONS[3]}  # the late one, and only once
    assert store.states(B, [PARTITIONS[1]])[PARTITIONS[1]].storage_id == late
    report(consolidated, B, PARTITIONS[4])
    assert {c.partition for c in store.update()} == {PARTITIONS[4]}
    rebuilt = PartitionStateStore(consolidated, Path(store.path).with_name("rebuilt.db"))
    rebuilt.rebuild()
    assert rebuilt.all_states() == store.all_states()


def test_an_update_reads_the_new_events_only_whatever_the_history(consolidated: DagsterInstance) -> None:
    instance = consolidated
    store = PartitionStateStore(instance)
    random_history(instance, store, random.Random(7), 60)
    store.update()
    assert store.records_read > 0
    assert store.update() == [] and store.records_read == 0
    report(instance, B, PARTITIONS[2])
    run = create_run(instance, PARTITIONS[3:5])  # two planned materializations
    start(instance, run)
    store.update()
    assert store.records_read == 4  # the report, two planned materializations, the run start


# --- the gate reads the store as it reads the instance -----------------------------------------------------------

NOW = datetime(2026, 3, 12, 12, tzinfo=ZoneInfo("Asia/Shanghai"))
TABLES = {
    "dwd/raw.sql": ("period: daily\nchecks:\n  not_null: [id]\n", "SELECT 1 AS id, 2 AS v"),
    "dwd/day.sql": ("period: daily\n", "SELECT id, v FROM dwd.raw"),
    "ads/wk.sql": ("period: daily\ndepends_on:\n  dwd.raw: {range: [-2, 0]}\n", "SELECT id, v FROM dwd.raw"),
}


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    root = tmp_path / "catalog"
    for rel, (header, sql) in TABLES.items():
        layer, name = rel[:-4].split("/")
        (root / layer).mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"/* ---\ntable: {layer}.{name}\n{header}--- */\n{sql}\n")
    return load_catalog(root)


def test_the_gate_decides_the_same_on_the_store_as_on_the_instance(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    raw = AssetKey(catalog["dwd.raw"].key)
    for partition in ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-05", "2026-03-06"]:
        report(instance, raw, partition)
    [latest] = materializations(instance, raw, "2026-03-02")
    verdict(instance, raw, "2026-03-02", False, latest)  # a failed blocking check
    verdict(instance, raw, "2026-03-03", True, materializations(instance, raw, "2026-03-03")[0])
    [old] = materializations(instance, raw, "2026-03-05")
    verdict(instance, raw, "2026-03-05", False, old)
    report(instance, raw, "2026-03-05")  # re-materialized since its failed verdict: no longer failed
    start(instance, create_run(instance, ["2026-03-04"], raw))  # 03-04 in progress; 03-07 .. missing
    taint(instance, raw, "2026-03-06", materializations(instance, raw, "2026-03-06")[0])

    store = PartitionStateStore(instance)
    store.update()
    on_instance = PartitionStates(
        instance, catalog, DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing"), current_time=NOW
    )
    seen = set()
    for fqn in ["dwd.day", "ads.wk"]:
        for day in range(1, 10):
            partition = f"2026-03-{day:02d}"
            expected = decide(catalog, catalog[fqn], partition, on_instance, current_time=NOW)
            got = decide(catalog, catalog[fqn], partition, store, current_time=NOW)
            assert got.may_run == expected.may_run and got.reasons == expected.reasons, (fqn, partition)
            for mine, theirs in zip(got.edges, expected.edges, strict=True):
                states = [mine.state(k) for k in mine.upstream.keys]
                assert states == [theirs.state(k) for k in theirs.upstream.keys]
                seen.update(states)
    assert seen == {"ok", "missing", "in progress", "check failed", "tainted"}
