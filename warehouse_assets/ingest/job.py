"""The ODS ingestion job: applies pending landing segments to every ODS table (or a chosen few), then reports
the hours its commits completed and judges their checks.

A backlog (the days ``make dev`` simulates before it starts, a source back after an outage) is applied in rounds,
one batch of each table per round, the oldest day of every table first: its downstream can build while the rest is
merged, instead of waiting for the tables ahead of it in the catalog to apply their whole backlog.

Reporting and judging in the run that committed the data is what makes an ODS handoff fast: the hour
reaches the dependency center with its verdicts as soon as the commit is done, instead of waiting for the readiness
sensor's next tick (the sensor daemon loops every 5 s at best) and then for a check run of its own to launch. The
``ods_readiness`` and ``ods_quality_checks`` sensors stay as the fallback for what a run does not see (source counts
published after the segments were ingested, a run that died between commit and report); they wait while an
ingestion run is in flight, and the already-reported filters of :func:`readiness_events` keep the two paths from
reporting an hour, or its late changes, twice.
"""

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from dagster import (
    AssetKey,
    Config,
    DagsterInstance,
    DagsterRunStatus,
    OpExecutionContext,
    Output,
    RunsFilter,
    in_process_executor,
    job,
    op,
)

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.landing import Landing, LandingResource
from resources.settings import current
from resources.spark import SparkResource
from warehouse_assets.catalog import Catalog, OdsTable, Table
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.catalog.lineage_events import Build, lineage_events
from warehouse_assets.ingest.merge import BatchReport, TableReport, committed_positions, ingest_next_batch
from warehouse_assets.ingest.readiness import (
    TaintedAt,
    changed_hours,
    readiness_events,
    reported_ingested_rows,
    unreported_changes,
)
from warehouse_assets.instance.lanes import INGEST_LANE, lane_tags

JOB = "ods_ingest"
IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def ingestion_in_flight(instance: DagsterInstance) -> str | None:
    """The id of an ``ods_ingest`` run queued or running (it will report and judge the hours it completes)."""
    runs = instance.get_runs(RunsFilter(job_name=JOB, statuses=IN_FLIGHT), limit=1)
    return runs[0].run_id if runs else None


class IngestConfig(Config):  # type: ignore[misc]
    tables: list[str] = []  # ODS tables (e.g. "ods.order"); empty = all
    # a backlog is applied in rounds, one batch of each table per round: the first round takes the oldest day
    # (288 five-minute segments per shard) of every table, so that day's hours of every table are reported, and its
    # downstream builds, while the rest is merged; the later rounds take up to three days at once, so the days after
    # are reported together and their downstream runs cover them in one range per table instead of one run a day
    first_batch_segments: int = 288
    max_segments_per_stream: int = 3 * 288
    # report the hours this run completed and judge their checks; the headless path reports on its own
    report_ready: bool = True


# Judges the reported hours of a table in the run (context, table, hour keys, Spark session, store) → (evaluations,
# failed). Handed in by whoever assembles the job: evaluating checks belongs to building, above ingestion.
JudgeHours = Callable[[OpExecutionContext, Table, Sequence[str], Any, DeltaStore], tuple[int, int]]


def build_ingest_job(  # type: ignore[no-untyped-def]
    catalog: Catalog, judge_hours: JudgeHours, tainted_at: TaintedAt | None = None
):
    """The job; ``tainted_at`` reads the taints of hours whose changes it finds unreported (None: a lake nobody
    taints)."""
    known = {t.fqn for t in catalog.ods()}

    @op(name="ingest_ods", description="Merge new CDC segments into the ODS Delta tables.")
    def ingest_ods(
        context: OpExecutionContext,
        config: IngestConfig,
        spark: SparkResource,
        lake: DeltaLakeResource,
        landing: LandingResource,
    ) -> Output[dict[str, dict[str, int]]]:
        unknown = sorted(set(config.tables) - known)
        if unknown:
            raise ValueError(f"unknown ODS table(s) {unknown}; known: {sorted(known)}")
        session, store, land = spark.session(), lake.store(), landing.landing()
        summary: dict[str, dict[str, int]] = {}

        def log_batch(batch: BatchReport) -> None:
            context.log.info(
                f"{batch.table}: {batch.segments} segments, {batch.rows_in} records in = {batch.rows_applied} "
                f"applied + {batch.rows_quarantined} quarantined + {batch.rows_duplicate} duplicates + "
                f"{batch.rows_superseded} superseded + {batch.ddl_lines} ddl ({batch.seconds:.1f}s)"
                + (f"; new source column(s) added: {', '.join(batch.new_columns)}" if batch.new_columns else "")
            )

        tables = [t for t in catalog.ods() if not config.tables or t.fqn in config.tables]
        gate: dict[str, int | float] = {}

        def report_ready(table: Table, seen: dict[str, int], changed: Sequence[str] = ()) -> int:
            numbers = report_completed_hours(
                context,
                table,
                seen,
                session,
                store,
                land,
                judge_hours,
                changed,
                catalog.windows(table.fqn),
                tainted_at,
                reported.get(table.fqn),
            )
            for name, value in numbers.items():
                gate[name] = round(gate.get(name, 0) + value, 3)
            return int(numbers["hours_reported"])

        seen = {  # per table: how far each stream's ingested counts went before the next batch (its late changes)
            t.fqn: committed_positions(store, t, land.streams(t.source_database, t.source_tables)) for t in tables
        }
        hours = dict.fromkeys(seen, 0)
        reports = {t.fqn: TableReport(t.fqn) for t in tables}
        left, first_round = list(tables), True
        with ingestion_lineage(context, catalog, tables) as reported:
            while left:
                for table in list(left):
                    limit = config.first_batch_segments if first_round else config.max_segments_per_stream
                    batch = ingest_next_batch(session, store, land, table, max_segments_per_stream=limit)
                    if batch is None:
                        left.remove(table)
                        continue
                    reports[table.fqn].batches.append(batch)
                    log_batch(batch)
                    if config.report_ready:
                        # the hours this batch completed are reported and judged at once, before the next batch, and
                        # so are the reported hours whose partitions it changed
                        changed = changed_hours(batch.partitions_changed, land.timezone)
                        hours[table.fqn] += report_ready(table, seen[table.fqn], changed)
                        seen[table.fqn].update(
                            {s: max(seen[table.fqn].get(s, 0), p) for s, p in batch.positions.items()}
                        )
                first_round = False
            for table in tables:
                report = reports[table.fqn]
                summary[table.fqn] = {k: int(v) for k, v in report.metadata().items()}
                if config.report_ready:
                    if not report.batches:  # nothing applied, but source counts published since may complete an hour
                        hours[table.fqn] += report_ready(table, seen[table.fqn])
                    summary[table.fqn]["hours_reported"] = hours[table.fqn]
        flat: dict[str, int | float] = {
            f"{t}.{k}": v for t, m in summary.items() for k, v in m.items() if k != "seconds"
        }
        flat["rows_applied"] = sum(m["rows_applied"] for m in summary.values())
        flat["rows_quarantined"] = sum(m["rows_quarantined"] for m in summary.values())
        flat.update(gate)
        return Output(summary, metadata=flat)

    @job(
        name=JOB,
        executor_def=in_process_executor,
        tags={"warehouse/ingest": "ods", **lane_tags(INGEST_LANE)},
        description="Apply pending CDC landing segments to the ODS Delta tables (merge-into).",
    )
    def ods_ingest() -> None:
        ingest_ods()

    return ods_ingest


@contextmanager
def ingestion_lineage(
    context: OpExecutionContext, catalog: Catalog, tables: Sequence[OdsTable]
) -> Iterator[dict[str, list[str]]]:
    """The ingestion of ``tables`` as OpenLineage runs, one per ODS table (from its CDC source to it): START now,
    COMPLETE with the hours it reported (which the block appends to the lists it is given), or FAIL. Off: lists that
    nobody reads, and nothing else."""
    reported: dict[str, list[str]] = {t.fqn: [] for t in tables}
    events = lineage_events(current())
    if events is None:
        yield reported
        return
    lineage = WarehouseLineage(catalog)  # an ODS table's columns are declared: no SQL is read
    builds = [
        Build(
            t.fqn,
            t.key,
            context.run_id,
            JOB,
            [],
            lineage.columns(t.fqn),
            {},
            source=f"{t.source_database}.{t.source_tables}",
        )
        for t in tables
    ]
    for build in builds:
        events.started(build)
    try:
        yield reported
    except BaseException as exc:
        for build in builds:
            events.failed(build, exc)
        raise
    for build in builds:
        events.completed(replace(build, partitions=reported[build.table]))


def report_completed_hours(
    context: OpExecutionContext,
    table: Table,
    before: dict[str, int],
    session: object,
    store: DeltaStore,
    landing: Landing,
    judge_hours: JudgeHours,
    changed: Sequence[str] = (),
    windows: Sequence[Table] = (),
    tainted_at: TaintedAt | None = None,
    reported: list[str] | None = None,
) -> dict[str, int | float]:
    """Reports, in this run, every hour of ``table`` that is ready now and was not reported (and every reported
    hour whose ingested count grew since the streams' positions ``before`` this run's batch, or whose partition
    the batch changed: ``changed``, hour keys), then logs its checks' verdicts; returns the numbers for the run's
    metadata. An hour not reported yet is reported only once it is complete, whatever changed it. The table's
    completeness ``windows`` (of the mini-batch tables reading it) are reported with its hours. ``tainted_at``: see
    :func:`~warehouse_assets.ingest.readiness.unreported_changes`. ``reported``: gets the hours reported appended."""
    instance, started = context.instance, time.monotonic()
    key = AssetKey(table.key)
    done = instance.get_materialized_partitions(key)
    cursor: dict[str, object] = {table.fqn: {"last": max(done) if done else None, "seen": before}}
    # reported again once, in the first call: the later ones see this call's reports as done
    changed = [*changed, *unreported_changes(instance, store, table, landing.timezone, done, tainted_at)]
    again: dict[str, Sequence[str]] | None = {table.fqn: sorted({k for k in changed if k in done})}
    keys: list[str] = []
    windows_reported = 0
    while True:  # at most MAX_EVENTS_PER_TICK hours per call
        events, advanced = readiness_events(
            store,
            landing,
            Catalog({table.fqn: table, **{w.fqn: w for w in windows}}),
            cursor,
            lambda t: set(instance.get_materialized_partitions(AssetKey(t.key))),
            reported_rows=reported_ingested_rows(instance),
            changed=again,
            tainted=(lambda t, hours: tainted_at(instance, t, hours)) if tainted_at is not None else None,
        )
        again = None
        for event in events:
            context.log_event(event)
            if event.asset_key == key:
                keys.append(str(event.partition))
            else:
                windows_reported += 1
        if not events or advanced == cursor:
            break
        cursor = advanced
    report_s = time.monotonic() - started
    evaluations = failed = 0
    if reported is not None:
        reported.extend(keys)
    if keys:
        context.log.info(f"{table.fqn}: {len(keys)} hour(s) ready, {keys[0]} .. {keys[-1]}")
        if table.checks:
            evaluations, failed = judge_hours(context, table, keys, session, store)
    return {
        "hours_reported": len(keys),
        **({"windows_reported": windows_reported} if windows else {}),
        "check_evaluations": evaluations,
        "checks_failed": failed,
        "report_s": report_s,
        "judge_s": time.monotonic() - started - report_s,
    }
