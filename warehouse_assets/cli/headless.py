"""The headless path: what ``warehouse ingest`` and ``warehouse materialize`` do without the daemon.

Each step runs in this process against the given instance, the way the daemon's jobs and sensors would: the
ingestion job, the readiness and external-delivery reports, then ranged runs of each derived table in dependency
order, so the runs and materializations show in the UI as if the daemon had made them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from warehouse_assets.cli.common import in_process_run_tags, say
from warehouse_assets.instance.lanes import INGEST_LANE, USER_LANE


def run_ingest(instance: Any, resources: dict[str, Any], tables: Sequence[str] = ()) -> dict[str, Any]:
    """Run the ``ods_ingest`` job in this process against ``instance``; returns its summary."""
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.ingest.job import build_ingest_job
    from warehouse_assets.materialize.hour_checks import judge_hours
    from warehouse_assets.materialize.validity import taint_times

    result = build_ingest_job(load_catalog(), judge_hours, taint_times).execute_in_process(
        instance=instance,
        resources=resources,
        run_config={"ops": {"ingest_ods": {"config": {"tables": list(tables)}}}},
        tags=in_process_run_tags(INGEST_LANE),
    )
    summary: dict[str, Any] = result.output_for_node("ingest_ods")
    return summary


def report_ready_hours(
    instance: Any, resources: dict[str, Any], tables: Sequence[str] | None = None, until: datetime | None = None
) -> int:
    """Report complete ODS hours not yet materialized, and their completeness windows (what the readiness sensor
    does).

    ``tables`` limits it to some ODS tables and ``until`` to the partitions ending by then (default: all).
    """
    from dagster import AssetKey

    from warehouse_assets.catalog import BY_PERIOD, Catalog, load_catalog
    from warehouse_assets.ingest.readiness import readiness_events

    catalog = load_catalog()
    store, landing = resources["lake"].store(), resources["landing"].landing()
    ods = [t for t in catalog.ods() if tables is None or t.fqn in tables]
    selected = Catalog({t.fqn: t for t in [*ods, *(w for o in ods for w in catalog.windows(o.fqn))]})
    period = {tuple(t.key): t.period for t in selected}
    cursor: dict[str, str] = {}
    reported = 0
    while True:  # the sensor's function reports at most MAX_EVENTS_PER_TICK hours per call
        events, advanced = readiness_events(
            store, landing, selected, cursor, lambda t: set(instance.get_materialized_partitions(AssetKey(t.key)))
        )
        for event in events:
            pdef = BY_PERIOD[period[tuple(event.asset_key.path)]]
            if until is None or pdef.time_window_for_partition_key(str(event.partition)).end <= until:
                instance.report_runless_asset_event(event)
                reported += 1
        if advanced == cursor:
            return reported
        cursor = advanced


def report_external_deliveries(instance: Any, resources: dict[str, Any]) -> int:
    """Report every external partition that has arrived and is not reported yet (what their sensors do)."""
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.ingest.deliveries import (
        DeliveryCursor,
        delivery_tick,
        external_source,
        last_reported,
        now_in_business_tz,
    )

    reported = 0
    for table in load_catalog().externals():
        source = external_source(resources["external"], table)
        tick, _ = delivery_tick(source, DeliveryCursor(), now_in_business_tz(), last_reported(instance, table.key))
        for line in tick.rejected:
            say(f"[ext   ] {line}")
        for event in tick.events:
            instance.report_runless_asset_event(event)
        reported += len(tick.events)
    return reported


def _held_back(catalog: Any, instance: Any, table: Any, keys: list[str]) -> dict[str, str]:
    """Partition key -> why the gate holds it back now (an external not arrived, an upstream partition skipped
    earlier in this range for that reason, a tainted one…). A table's own earlier partitions are not judged: one
    ranged run builds them in order."""
    from warehouse_assets.materialize.gate import InstanceStates, decide

    states = InstanceStates(instance)
    held: dict[str, str] = {}
    for key in keys:
        verdict = decide(catalog, table, key, states)
        reasons = [e.reason(table, key) for e in verdict.edges if e.dep.table != table.fqn and not e.ok]
        if reasons:
            held[key] = str(reasons[0])
    return held


def _contiguous(keys: list[str], skip: set[str]) -> list[list[str]]:
    """Runs of consecutive keys not in ``skip`` (each becomes one ranged run)."""
    runs: list[list[str]] = [[]]
    for key in keys:
        if key in skip:
            runs.append([])
        else:
            runs[-1].append(key)
    return [run for run in runs if run]


def _materialize_keys(
    instance: Any, resources: dict[str, Any], all_assets: list[Any], table: Any, keys: list[str], step: str
) -> bool:
    from dagster import AssetKey, materialize

    label = keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]}"
    say(f"{step} {table.fqn} {label} ({len(keys)} partition(s)) …")
    t0 = time.monotonic()
    one = table.is_regional  # a region's day: one partition of Dagster's dates × regions, not a range
    span = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    result = materialize(
        all_assets,
        instance=instance,
        resources=resources,
        selection=[AssetKey(table.key)],
        partition_key=keys[0] if one else None,
        tags={**in_process_run_tags(USER_LANE), **({} if one else span)},  # what the user asked for, run here
        raise_on_error=False,
    )
    if not result.success:
        failure = next((e for e in result.all_events if e.is_step_failure), None)
        error = failure.step_failure_data.error if failure and failure.step_failure_data else None
        message = error.message.strip() if error else "see the run in the UI"
        say(f"{step} {table.fqn} FAILED: {message}")
        return False
    events = result.get_asset_materialization_events()
    rows = events[0].materialization.metadata["rows"].value if events else 0  # one result covers the range
    say(f"{step} {table.fqn} done in {time.monotonic() - t0:.1f}s, {rows} rows written")
    return True


def build_static(instance: Any, resources: dict[str, Any], all_assets: list[Any], table: Any) -> bool:
    """Build a static table the range reads unless it is built from its SQL as it is now (the sensor's rule)."""
    from dagster import AssetKey, materialize

    from sensors.static import CODE_VERSION_TAG
    from warehouse_assets.materialize.compiler import code_version

    event = instance.get_latest_materialization_event(AssetKey(table.key))
    materialization = event.asset_materialization if event is not None else None
    if materialization is not None and (materialization.tags or {}).get(CODE_VERSION_TAG) == code_version(table):
        return True
    say(f"[static] {table.fqn} …")
    result = materialize(
        all_assets,
        instance=instance,
        resources=resources,
        selection=[AssetKey(table.key)],
        tags=in_process_run_tags(USER_LANE),
        raise_on_error=False,
    )
    if not result.success:
        say(f"[static] {table.fqn} FAILED: see the run in the UI")
    return bool(result.success)


def materialize_range(
    instance: Any,
    resources: dict[str, Any],
    start: datetime,
    end: datetime,
    tables: Sequence[str] = (),
    ingest: bool = True,
) -> bool:
    """The headless path: ingest, report ready hours, then build each derived table over the range."""
    from warehouse_assets.catalog import DerivedTable, load_catalog
    from warehouse_assets.materialize.compiler import build_assets, topological
    from warehouse_assets.materialize.gate import (
        backfill_partitions,
        nonexistent_upstream,
        span,
        table_partitions_in_range,
    )

    catalog = load_catalog()
    begun = time.monotonic()
    summary: dict[str, Any] = {}
    if ingest:
        say("[ingest] applying pending CDC segments to the ODS tables …")
        summary = run_ingest(instance, resources)
        for fqn, numbers in summary.items():
            say(
                f"[ingest]   {fqn:<16} {numbers['segments']:>6} segments  {numbers['rows_applied']:>8} applied  "
                f"{numbers['rows_quarantined']:>5} quarantined  {numbers['rows_duplicate']:>5} duplicates"
            )
    plan = [t for t in topological(catalog) if not tables or t.fqn in tables]
    sources = sorted({d.table for t in plan for d in t.deps if catalog[d.table].is_ods})
    # the ingestion run reported the hours its commits completed; this reports the rest (source counts that
    # arrived after the segments were applied, or a run without ingestion)
    reported = report_ready_hours(instance, resources, sources, until=end)
    by_run = sum(numbers.get("hours_reported", 0) for numbers in summary.values())
    say(
        f"[ready ] {by_run + reported} ODS hour partition(s) reported ready ({by_run} by the ingestion run, "
        f"{reported} of {', '.join(sources) or 'no table'} after it)"
    )
    arrived = report_external_deliveries(instance, resources)
    say(f"[ext   ] {arrived} external partition(s) reported arrived")
    all_assets = build_assets(catalog)
    for fqn in sorted({ref.table for t in plan if isinstance(t, DerivedTable) for ref in t.references}):
        if not build_static(instance, resources, all_assets, catalog[fqn]):
            return False
    now = min(end, datetime.now(UTC))  # existence judged as the backfill plan judges it
    buildable = backfill_partitions(catalog, start, end, current_time=now)
    for index, table in enumerate(plan, start=1):
        keys = buildable.get(table.fqn, [])
        unbuildable = [k for k in table_partitions_in_range(table, start, end) if k not in keys]
        if unbuildable:
            say(
                f"[{index}/{len(plan)}] {table.fqn}: {len(unbuildable)} partition(s) skipped ({unbuildable[0]} .. "
                f"{unbuildable[-1]}): they need partitions of "
                f"{', '.join(nonexistent_upstream(catalog, table, unbuildable[0], now))} "
                "before its first partition"
            )
        if not keys:
            say(f"[{index}/{len(plan)}] {table.fqn}: no whole {table.period} partition in the range, skipped")
            continue
        held = _held_back(catalog, instance, table, keys)
        if held:
            first = next(iter(held))
            say(
                f"[{index}/{len(plan)}] {table.fqn}: {len(held)} partition(s) skipped ({span(list(held))}), not "
                f"ready: {held[first]}"
            )
        # a table with regions: each region's day is a run of its own, as the dependency center runs it
        runs = [[k] for k in keys if k not in held] if table.is_regional else _contiguous(keys, set(held))
        for run_keys in runs:
            if not _materialize_keys(instance, resources, all_assets, table, run_keys, f"[{index}/{len(plan)}]"):
                return False
    say(f"[done  ] {len(plan)} table(s) in {time.monotonic() - begun:.1f}s")
    return True
