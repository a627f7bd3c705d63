"""The SLA forecast: a warning when a partition is predicted (:mod:`warehouse_assets.explain.eta`) to finish after
its freshness SLA's deadline, before that deadline; and the day's timeline of predictions as Markdown and Mermaid.

:func:`forecast_tick` is the ``sla_forecast`` sensor's rule: the warning is the ``sla_forecast`` check (non-blocking,
severity WARN, one per partition) naming the critical path. The freshness check itself still judges at the deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from warehouse_assets.catalog import BY_PERIOD, Catalog, DerivedTable, Table, regional_key
from warehouse_assets.explain.eta import (
    INGESTS,
    MATERIALIZED,
    QUEUED,
    RUNNING,
    RUNS,
    Prediction,
    Predictor,
    clock,
    minutes,
)
from warehouse_assets.materialize.freshness import FORECAST_CHECK_NAME, due_between
from warehouse_assets.materialize.freshness import deadline as sla_deadline

if TYPE_CHECKING:
    from dagster import AssetCheckEvaluation


# --- the SLA warning ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlaWarning:
    table: Table
    partition: str
    due: datetime
    prediction: Prediction
    now: float

    @property
    def late_by_s(self) -> float:
        """How far past the deadline the partition is predicted: the point prediction when it passes the deadline,
        else the pessimistic one (:attr:`Prediction.latest`) that raised the warning."""
        finish = self.prediction.finish
        return (finish if finish > self.due.timestamp() else self.prediction.latest) - self.due.timestamp()

    def describe(self) -> str:
        zone = self.due.tzinfo if isinstance(self.due.tzinfo, ZoneInfo) else ZoneInfo("UTC")
        prediction, due = self.prediction, f"{self.due:%Y-%m-%d %H:%M}"
        if prediction.finish > self.due.timestamp():
            said = f"predicted ready ~{clock(prediction.finish, zone)}, {minutes(self.late_by_s)} after its deadline"
            said += f" {due}"
        else:  # only the pessimistic finish passes it: the overdue source is what may make it late
            source = prediction.path[0]
            said = (
                f"{source.table} {source.partition} is {minutes(source.overdue_s)} past its usual lateness: as late "
                f"again, ready ~{clock(prediction.latest, zone)}, {minutes(self.late_by_s)} after its deadline {due} "
                f"(~{clock(prediction.finish, zone)} if it comes now)"
            )
        return f"{said}; critical path: {prediction.critical_path(zone)}"


def sla_warning(table: Table, partition: str, prediction: Prediction, now: float) -> SlaWarning | None:
    """A warning when the partition is predicted to miss its SLA and its deadline has not passed yet (at the deadline
    the freshness check judges it); None when it is predicted in time, already built, or without an SLA.

    The finish judged is the pessimistic one (:attr:`Prediction.latest`): with an overdue source on the critical
    path, the point prediction (the source a little after now) passes the deadline only minutes before it."""
    if table.sla is None or prediction.known:
        return None
    due = sla_deadline(table, partition)
    if now >= due.timestamp() or prediction.latest <= due.timestamp():
        return None
    return SlaWarning(table, partition, due, prediction, now)


def timeline_markdown(predictions: Sequence[Prediction], zone: ZoneInfo, title: str) -> str:
    """The predictions as a Mermaid Gantt chart (each partition's critical path, one section per partition) and a
    Markdown table: what the Dagster UI renders from ``MetadataValue.md``."""
    lines = ["```mermaid", "gantt", f"    title {title}", "    dateFormat YYYY-MM-DDTHH:mm", "    axisFormat %H:%M"]
    for prediction in predictions:
        lines.append(f"    section {prediction.table} {prediction.partition}")
        for step in prediction.path:
            # a task's label ends at its first colon: hourly keys (23:00) are written 23h00
            label = f"{step.table} {step.partition} {step.kind}".replace(":", "h")
            if step.start is None:  # materialized or arriving: a point in time
                tag = "done, milestone, " if step.kind == MATERIALIZED else "milestone, "
                lines.append(f"    {label} :{tag}{_stamp(step.finish, zone)}, 0d")
                continue
            tag = {RUNNING: "active, ", INGESTS: "", QUEUED: "", RUNS: "crit, "}[step.kind]
            length = max(1, round((step.finish - step.start) / 60))
            lines.append(f"    {label} :{tag}{_stamp(step.start, zone)}, {length}m")
    # the path's partitions, a self-dependent run of days as one span (each step's timing is the chart's, and the
    # warning's critical_path): with every step timed, a table reading a 60-day chain filled a screen per row
    lines += ["```", "", "| partition | predicted | critical path | set by |", "|---|---|---|---|"]
    for prediction in predictions:
        cells = (
            f"{prediction.table} {prediction.partition}",
            clock(prediction.finish, zone),
            prediction.chain(),
            prediction.path[0].describe(zone),
        )
        # a region's day (2026-03-02|utc) has Markdown's cell delimiter in its key
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def warning_evaluation(warning: SlaWarning, timeline: str | None = None) -> AssetCheckEvaluation:
    """The warning as Dagster records it: a failed, non-blocking ``sla_forecast`` evaluation of severity WARN on the
    partition, with the prediction, its critical path and (``timeline``) the day's picture in its metadata."""
    from dagster import AssetCheckEvaluation, AssetCheckSeverity, AssetKey, MetadataValue

    zone = warning.due.tzinfo if isinstance(warning.due.tzinfo, ZoneInfo) else ZoneInfo("UTC")
    metadata: dict[str, Any] = {
        "predicted_finish": warning.prediction.at(zone).isoformat(timespec="seconds"),
        "deadline": warning.due.isoformat(timespec="seconds"),
        "predicted_late_by_minutes": round(warning.late_by_s / 60, 1),
        "lead_minutes": round((warning.due.timestamp() - warning.now) / 60, 1),
        "critical_path": MetadataValue.text(warning.prediction.critical_path(zone)),
        "partition": warning.partition,
    }
    if timeline is not None:
        metadata["timeline"] = MetadataValue.md(timeline)
    return AssetCheckEvaluation(
        asset_key=AssetKey(warning.table.key),
        check_name=FORECAST_CHECK_NAME,
        passed=False,
        severity=AssetCheckSeverity.WARN,
        metadata=metadata,
        partition=warning.partition,
        blocking=False,
        description=warning.describe(),
    )


@dataclass
class ForecastTick:
    warnings: list[SlaWarning]
    predictions: list[Prediction]  # every partition predicted (those due within the horizon, not built)
    warned: dict[str, list[str]]  # table → partitions warned about whose deadline has not passed: the new cursor


def forecast_tick(
    catalog: Catalog,
    predictor: Predictor,
    warned: Mapping[str, Sequence[str]],
    horizon: timedelta,
    already_warned: Callable[[Table, str], bool] = lambda table, key: False,
) -> ForecastTick:
    """Predict every partition of an SLA table whose deadline falls within ``horizon`` after the predictor's now and
    that is not built; a warning for each predicted past its deadline, once per partition (``warned``: those of the
    previous ticks; ``already_warned``: what the instance holds, for a lost cursor)."""
    now = datetime.fromtimestamp(predictor.now, UTC)
    tick = ForecastTick([], [], {})
    for table in catalog:
        if table.sla is None:
            continue
        before = set(warned.get(table.fqn, ()))
        # only deadlines still ahead: a partition past its deadline has missed its SLA, which the freshness check
        # says once at the deadline; forecasting it would repeat that for every partition of a catch-up's past days
        for key, _ in due_between(table, now, now + horizon):
            prediction = predictor.predict(table.fqn, key)
            if prediction.known:
                continue
            tick.predictions.append(prediction)
            if key in before:
                tick.warned.setdefault(table.fqn, []).append(key)
                continue
            warning = sla_warning(table, key, prediction, predictor.now)
            if warning is None:
                continue
            tick.warned.setdefault(table.fqn, []).append(key)
            if not already_warned(table, key):
                tick.warnings.append(warning)
        # a warned partition stays warned until its deadline, also when a later tick predicts it in time (Dagster
        # keeps one run-less evaluation per partition: the first warning is the record)
        for key in before - set(tick.warned.get(table.fqn, ())):
            if sla_deadline(table, key) > now:
                tick.warned.setdefault(table.fqn, []).append(key)
    return tick


def day_predictions(catalog: Catalog, predictor: Predictor, day: str, layer: str = "ads") -> list[Prediction]:
    """The prediction of each daily table of ``layer`` for the day ``day`` (its partition key); of a table with regions,
    each region's day of that date."""
    try:  # a day not ended yet is no partition for Dagster, but it is predicted all the same
        datetime.strptime(day, BY_PERIOD["daily"].fmt)
    except ValueError as exc:
        raise ValueError(f"{day!r} is not a day's partition key (YYYY-MM-DD)") from exc
    tables = sorted((t for t in catalog if t.layer == layer and t.period == "daily"), key=lambda t: t.fqn)
    return [
        predictor.predict(t.fqn, key)
        for t in tables
        for key in (
            [regional_key(day, r) for r, _ in t.regions] if isinstance(t, DerivedTable) and t.is_regional else [day]
        )
    ]


def _stamp(at: float, zone: Any) -> str:
    return datetime.fromtimestamp(at, zone).strftime("%Y-%m-%dT%H:%M")
