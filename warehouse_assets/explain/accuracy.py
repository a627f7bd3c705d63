"""How good were the predicted finishes? The recorded predictions (:mod:`warehouse_assets.explain.prediction_log`)
scored against the finishes in Dagster's event log: what ``warehouse eta --accuracy`` prints.

* **Error by horizon.** A prediction is for the partition's next materialization after it was made (its *finish*).
  For each horizon H (3 h, 1 h, 10 min before the finish) each finish contributes one sample: the latest prediction
  made between 2H and H before it, so that a partition predicted every tick counts once, as one predicted once. The
  error is predicted minus actual; its absolute value's P50 and P90 are given, and the P90 of the error as a share of
  the time the prediction looked ahead (the finish minus when it was made). The same figures over the partitions that
  did not miss their SLA are given apart (*on time*): a source held back without notice makes its hour and every
  reader of it late by more than any prediction made an hour before could know, and in a short span those few finishes
  set the P90 alone; how well such misses were seen coming is what the warnings below score.
* **SLA misses.** Each partition of an SLA table whose deadline passed within the span scored is a miss when its first
  materialization came after the deadline (or has not come). A miss is *warned* when the forecast sensor recorded a
  prediction past the deadline before it (the lead: deadline minus the first such prediction), past it as the sensor
  judges: the pessimistic finish when an overdue source starts the critical path; a warning about a partition
  materialized in time is a *false warning*. The span starts at ``since``: a stack that comes up behind (a catch-up)
  is scored from when it has caught up, by the caller's choice of ``since`` (``warehouse eta --accuracy --since``).

Everything but :func:`instance_accuracy` is a pure function of its inputs.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from warehouse_assets.explain.prediction_log import FORECAST, PredictionLog, Recorded

if TYPE_CHECKING:
    from dagster import DagsterInstance

    from warehouse_assets.catalog import Catalog

Node = tuple[str, str]
HORIZONS = (("3h", 3 * 3600.0), ("1h", 3600.0), ("10m", 600.0))  # name, seconds before the finish
PAGE = 1000


@dataclass(frozen=True)
class HorizonError:
    name: str
    seconds: float
    samples: int
    p50_s: float  # absolute error, NaN without samples
    p90_s: float
    p90_share: float  # P90 of |error| / how far ahead the prediction looked

    def line(self) -> str:
        if not self.samples:
            return f"  {_horizon(self.seconds):>8} before: no finish had a prediction made then"
        return (
            f"  {_horizon(self.seconds):>8} before: {self.samples:4d} finishes, error P50 {_span(self.p50_s)}, "
            f"P90 {_span(self.p90_s)} ({self.p90_share:.0%} of the time ahead)"
        )


@dataclass(frozen=True)
class Miss:
    table: str
    partition: str
    deadline: float
    finished: float | None  # first materialized at; None: not yet
    warned_at: float | None  # the forecast's first prediction past the deadline, made before it

    @property
    def lead_s(self) -> float | None:
        return None if self.warned_at is None else self.deadline - self.warned_at


@dataclass
class Accuracy:
    predictions: int
    finished: int  # predictions whose finish came
    horizons: list[HorizonError]
    deadlines: int  # SLA deadlines passed in the span
    misses: list[Miss] = field(default_factory=list)
    false_warnings: list[Miss] = field(default_factory=list)  # warned, materialized in time (``finished``)
    on_time: list[HorizonError] = field(default_factory=list)  # ``horizons`` without the partitions that missed

    @property
    def warned(self) -> list[Miss]:
        return [m for m in self.misses if m.warned_at is not None]

    def horizon(self, name: str) -> HorizonError:
        return next(h for h in self.horizons if h.name == name)

    def figures(self) -> dict[str, str]:
        """The figures a bench prints: the errors 1 h before the finish (P90 of the others too), the SLA counts."""
        hour = self.horizon("1h")
        leads = [m.lead_s for m in self.warned if m.lead_s is not None]
        return {
            "real_eta_err_p50_s": f"{hour.p50_s:.0f}",
            "real_eta_err_p90_s": f"{hour.p90_s:.0f}",
            "real_eta_err_p90_share": f"{hour.p90_share:.2f}",
            "real_eta_samples_1h": str(hour.samples),
            **{f"real_eta_err_p90_s_{h.name}": f"{h.p90_s:.0f}" for h in self.horizons if h.name != "1h"},
            **{
                f"real_eta_{k}_on_time": v
                for h in self.on_time
                if h.name == "1h"
                for k, v in (
                    ("samples_1h", str(h.samples)),
                    ("err_p90_s", f"{h.p90_s:.0f}"),
                    ("err_p90_share", f"{h.p90_share:.2f}"),
                )
            },
            "real_misses": str(len(self.misses)),
            "real_warned": str(len(self.warned)),
            "real_warned_lead_min_s": f"{min(leads):.0f}" if leads else "nan",
            "real_false_warnings": str(len(self.false_warnings)),
            "real_predictions": str(self.predictions),
        }

    def lines(self, zone: ZoneInfo) -> list[str]:
        out = [f"{self.predictions} predictions recorded, {self.finished} of them followed by their finish"]
        out += [h.line() for h in self.horizons]
        if self.misses:
            out.append("  the partitions that met their SLA (or were due after the span):")
            out += ["  " + h.line() for h in self.on_time]
        leads = [m.lead_s for m in self.warned if m.lead_s is not None]
        out.append(
            f"SLA: {self.deadlines} deadlines passed, {len(self.misses)} missed, {len(self.warned)} of them warned"
            + (f" (lead min {_span(min(leads))}, P50 {_span(statistics.median(leads))})" if leads else "")
            + f", {len(self.false_warnings)} false warnings"
        )
        for miss in self.misses:
            done = f"materialized {_at(miss.finished, zone)}" if miss.finished is not None else "not materialized"
            warned = f"warned {_span(miss.lead_s)} ahead" if miss.lead_s is not None else "NOT warned"
            out.append(f"  missed {miss.table} {miss.partition}: due {_at(miss.deadline, zone)}, {done}, {warned}")
        for wrong in self.false_warnings:
            out.append(
                f"  false warning {wrong.table} {wrong.partition}: due {_at(wrong.deadline, zone)}, "
                f"materialized {_at(wrong.finished, zone)}"
            )
        return out


def next_finish(finishes: Sequence[float], after: float) -> float | None:
    """The first of the ascending ``finishes`` after ``after``."""
    i = bisect.bisect_right(finishes, after)
    return finishes[i] if i < len(finishes) else None


def horizon_errors(
    recorded: Sequence[Recorded], finishes: Mapping[Node, Sequence[float]], since: float = float("-inf")
) -> list[HorizonError]:
    """Per horizon, the error of the latest prediction made between 2H and H before each finish after ``since``."""
    by_finish: dict[tuple[Node, float], list[Recorded]] = {}
    for r in recorded:
        actual = next_finish(finishes.get((r.table, r.partition), ()), r.made_at)
        if actual is not None and actual >= since:
            by_finish.setdefault(((r.table, r.partition), actual), []).append(r)
    out = []
    for name, seconds in HORIZONS:
        errors, shares = [], []
        for (_, actual), made in by_finish.items():
            inside = [r for r in made if actual - 2 * seconds <= r.made_at <= actual - seconds]
            if not inside:
                continue
            last = max(inside, key=lambda r: r.made_at)
            errors.append(abs(last.finish - actual))
            shares.append(abs(last.finish - actual) / (actual - last.made_at))
        out.append(
            HorizonError(
                name,
                seconds,
                len(errors),
                percentile(errors, 0.5),
                percentile(errors, 0.9),
                percentile(shares, 0.9),
            )
        )
    return out


def score(
    recorded: Sequence[Recorded],
    finishes: Mapping[Node, Sequence[float]],
    due: Mapping[Node, float],
    since: float = float("-inf"),
) -> Accuracy:
    """Score ``recorded`` against ``finishes`` (each partition's materializations, ascending) and the SLA deadlines
    ``due`` that passed in the span scored, from ``since``: the finishes after it (predictions made before it count
    for them) and those deadlines."""
    finished = sum(1 for r in recorded if next_finish(finishes.get((r.table, r.partition), ()), r.made_at) is not None)
    accuracy = Accuracy(len(recorded), finished, horizon_errors(recorded, finishes, since), len(due))
    first_warning: dict[Node, float] = {}
    for r in recorded:
        if r.source == FORECAST and r.warns:
            node = (r.table, r.partition)
            first_warning[node] = min(first_warning.get(node, r.made_at), r.made_at)
    for node, deadline in sorted(due.items(), key=lambda item: (item[1], item[0])):
        done = finishes.get(node, ())
        first = done[0] if done else None
        miss = Miss(node[0], node[1], deadline, first, first_warning.get(node))
        if first is None or first > deadline:
            accuracy.misses.append(miss)
        elif miss.warned_at is not None:
            accuracy.false_warnings.append(miss)
    missed = {(m.table, m.partition) for m in accuracy.misses}
    on_time = [r for r in recorded if (r.table, r.partition) not in missed]
    accuracy.on_time = horizon_errors(on_time, finishes, since)
    return accuracy


def instance_accuracy(
    instance: DagsterInstance, catalog: Catalog, since: datetime, now: datetime, log: PredictionLog | None = None
) -> Accuracy:
    """The finishes and SLA deadlines between ``since`` and ``now`` against the predictions recorded for them (made
    up to twice the longest horizon before ``since``), from the materializations in ``instance``'s event log."""
    from warehouse_assets.materialize.freshness import due_between

    own = log is None
    log = log or PredictionLog.of(instance)
    try:
        earliest = since.timestamp() - 2 * max(seconds for _, seconds in HORIZONS)
        recorded = [r for r in log.read(earliest, now.timestamp()) if r.table in catalog.tables]
    finally:
        if own:
            log.close()
    due = {
        (table.fqn, key): at.timestamp()
        for table in catalog
        if table.sla is not None
        for key, at in due_between(table, since, now)
    }
    nodes = {(r.table, r.partition) for r in recorded} | set(due)
    return score(recorded, materialized_at(instance, catalog, nodes), due, since.timestamp())


def materialized_at(instance: DagsterInstance, catalog: Catalog, nodes: set[Node]) -> dict[Node, list[float]]:
    """Each partition's materialization times in the event log, ascending (reports, for sources)."""
    from dagster import AssetKey, AssetRecordsFilter

    wanted: dict[str, list[str]] = {}
    for table, key in nodes:
        wanted.setdefault(table, []).append(key)
    out: dict[Node, list[float]] = {}
    for table, keys in wanted.items():
        for i in range(0, len(keys), PAGE):
            records_filter = AssetRecordsFilter(
                asset_key=AssetKey(catalog[table].key), asset_partitions=sorted(keys[i : i + PAGE])
            )
            cursor = None
            while True:
                page = instance.fetch_materializations(records_filter, limit=PAGE, cursor=cursor, ascending=True)
                for record in page.records:
                    if record.partition_key is not None:
                        out.setdefault((table, record.partition_key), []).append(record.timestamp)
                if not page.has_more:
                    break
                cursor = page.cursor
    return {node: sorted(times) for node, times in out.items()}


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (NaN for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _horizon(seconds: float) -> str:
    return f"{seconds / 3600:.0f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _span(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "-"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 90:
        return f"{sign}{seconds:.0f} s"
    if seconds < 5400:
        return f"{sign}{seconds / 60:.0f} min"
    return f"{sign}{seconds / 3600:.1f} h"


def _at(at: float | None, zone: ZoneInfo) -> str:
    return "-" if at is None else datetime.fromtimestamp(at, zone).strftime("%m-%d %H:%M")
