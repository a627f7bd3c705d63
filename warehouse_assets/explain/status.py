"""``warehouse status TABLE [--range START END] [--as-of TIME]``: each partition's state at a glance, from the
dependency center's state store (the engine's view, with the events it has not applied yet): materialized or not (when,
by which run, which Delta version), valid, tainted (why, from where) or released (accepted as is: why, by whom), gone
from the lake (what the reconciliation found), and each declared check's verdict on it.

With ``--as-of``, the same as it was at that moment: the event log replayed up to it
(:func:`warehouse_assets.center.state_store.state_as_of`), and the Delta version of the table then, with the
``warehouse sql --as-of`` command that reads the data as it was."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from dagster import AssetKey, PartitionKeyRange

from warehouse_assets.catalog import (
    BY_PERIOD,
    WHOLE,
    Catalog,
    DerivedTable,
    Table,
    business_time,
    partition_values_of,
    partition_window,
    regional_keys_between,
)
from warehouse_assets.center.ledger import Ledger
from warehouse_assets.center.state_store import PartitionState, PartitionStateStore, StateView
from warehouse_assets.explain.eta import Prediction
from warehouse_assets.materialize.gate import table_partitions_in_range

DEFAULT_DAYS = 3  # without a range: the partitions that ended in the last days


def status_keys(
    catalog: Catalog, fqn: str, start: str | None, end: str | None, now: datetime | None = None
) -> list[str]:
    """The partitions START … END of ``fqn`` (inclusive), or by default those that ended in the last few days."""
    if fqn not in catalog.tables:
        raise ValueError(f"unknown table {fqn!r}; known: {', '.join(sorted(catalog.tables))}")
    if catalog[fqn].is_static:
        if {start, end} - {None, WHOLE}:
            raise ValueError(f"{fqn} is a static table: it has no partitions, so name no range")
        return [WHOLE]
    table = catalog[fqn]
    now = now or datetime.now(UTC)
    if isinstance(table, DerivedTable) and table.is_regional:
        return _regional_keys(table, start, end, now)
    pdef = BY_PERIOD[table.period]
    if start is None or end is None:
        keys = pdef.get_partition_keys(current_time=now)
        since = now - timedelta(days=DEFAULT_DAYS)
        recent = [k for k in keys[-400:] if pdef.time_window_for_partition_key(k).end > since]
        return recent or list(keys[-1:])
    for key in (start, end):
        if not pdef.has_partition_key(key):
            raise ValueError(f"{key!r} is not a partition of {fqn} ({catalog[fqn].period})")
    return list(pdef.get_partition_keys_in_range(PartitionKeyRange(start, end)))


def _regional_keys(table: DerivedTable, start: str | None, end: str | None, now: datetime) -> list[str]:
    """Each region's day of the days START … END, in date then region order; either end may name one region's day
    (``2026-03-06|utc``) to start or stop there. By default the regions' days that ended in the last few days."""
    if start is None or end is None:
        since = now - timedelta(days=DEFAULT_DAYS)
        ended = table_partitions_in_range(table, since - timedelta(days=2), now)
        return [k for k in ended if partition_window(table, k).end > since] or ended[-1:]
    return regional_keys_between(table, start, end)


def parse_moment(text: str, zone: ZoneInfo, flag: str = "--as-of") -> datetime:
    """A command's time (``flag``'s): ISO 8601 (``2026-11-20T09:00``, ``2026-11-20 09:00:30``, ``2026-11-20``), in
    the business time zone ``zone`` unless it names an offset. ValueError naming the flag and the text."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{flag} {text!r} is not a time: expected ISO 8601, e.g. 2026-11-20T09:00 (in the business time zone "
            f"{zone.key} unless it names an offset, e.g. 2026-11-20T01:00+00:00)"
        ) from None
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment


def as_of_lines(
    catalog: Catalog, store: PartitionStateStore, fqn: str, keys: Sequence[str], moment: datetime
) -> list[str]:
    """The status of ``keys`` in ``store`` replayed up to ``moment``: a header naming the moment, one line per
    partition, and the command reading the table's data as it was then (the Delta version the log knew)."""
    table = catalog[fqn]
    lines = status_lines(catalog, store, fqn, keys)
    lines[0] = f"as of {business_time(moment, 'seconds')}: {lines[0]}"
    version = store.latest_version(AssetKey(table.key))
    if version is None:
        lines.append(f"no Delta version of {fqn} was recorded by then")
        return lines
    where = ""
    if not table.is_static:
        first, last = partition_spec_range(table, keys)
        where = f" WHERE dt BETWEEN '{first}' AND '{last}'"
    lines.append(
        f"{fqn} was at Delta version {version} then; its data as it was: "
        f'warehouse sql --as-of {version} "SELECT * FROM {fqn}{where}"'
    )
    return lines


def partition_spec_range(table: Table, keys: Sequence[str]) -> tuple[str, str]:
    """The first and last ``dt`` value (local day of the window start) of the partitions ``keys``."""
    days = [partition_values_of(table, k)["dt"] for k in keys]
    return min(days), max(days)


def status_lines(
    catalog: Catalog,
    states: StateView | PartitionStateStore,
    fqn: str,
    keys: Sequence[str],
    ledger: Ledger | None = None,
    predict: Callable[[str, str], Prediction] | None = None,
) -> list[str]:
    """One line per partition; with the dependency center's ``ledger``, the partitions behind their inputs (late data
    waiting for its policy) say so; with ``predict`` (table, partition → its prediction), a partition not built says
    when it is expected and through which chain."""
    table = catalog[fqn]
    found = states.states(AssetKey(table.key), keys)
    stale = ledger.stale(fqn, keys) if ledger is not None else {}
    zone = ZoneInfo(BY_PERIOD["daily"].timezone)  # the business timezone, one for every period
    tainted = sum(1 for s in found.values() if s.tainted)
    done = sum(1 for s in found.values() if s.materialized)
    behind = f", {len(stale)} stale" if stale else ""
    gone = sum(1 for s in found.values() if s.missing is not None)
    behind += f", {gone} missing from the lake" if gone else ""
    width = max([18, *(len(k) for k in keys)])  # a region's day is longer than an hour
    out = [f"{fqn} ({table.period}): {len(keys)} partition(s), {done} materialized, {tainted} tainted{behind}"]
    for key in keys:
        line = _line(found[key], [c.name for c in table.checks])
        if key in stale and found[key].materialized:
            line += f"  {stale[key].describe(zone)}"
        if predict is not None and not found[key].materialized:
            prediction = predict(fqn, key)
            sla = prediction.against_sla(table)
            line += f"  {prediction.short(zone)}" + (f", {sla}" if sla else "")
        out.append(f"  {key:<{width}} {line}")
    return out


def _line(state: PartitionState, checks: Sequence[str]) -> str:
    if state.in_progress:
        run = "in progress"
    elif state.missing is not None:
        version = f", Delta v{state.delta_version}" if state.delta_version is not None else ""
        when = business_time(state.timestamp or 0)
        run = f"MISSING from the lake: {state.missing} (was materialized {when}{version}); to be built again"
    elif not state.materialized:
        run = "failed" if state.failed else "missing"
    else:
        when = business_time(state.timestamp or 0)  # its offset named: the UI shows instants in UTC
        by = f"run {state.run_id[:8]}" if state.run_id else "reported"
        version = f", Delta v{state.delta_version}" if state.delta_version is not None else ""
        run = f"materialized {when} ({by}{version})"
    if not state.materialized:
        return run
    validity = (
        state.taint.describe()
        if state.taint is not None
        else f"released, {state.released}"
        if state.released
        else "valid"
    )
    if state.state:
        validity += f", {state.state}"
    if state.degraded:
        validity += f", degraded (built without {state.degraded})"
    verdicts = []
    for name in checks:
        verdict = state.checks.get(name)
        verdicts.append(f"{name} {'—' if verdict is None else 'passed' if verdict else 'FAILED'}")
    return f"{run}  {validity}" + (f"  checks: {', '.join(verdicts)}" if verdicts else "")
