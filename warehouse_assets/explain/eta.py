"""When will a partition be ready? A predicted finish, the critical path that sets it, and an early SLA warning.

The prediction walks the partition's exact upstream partitions (the reverse index's arithmetic, as the gate reads
them) down to what is already known, and adds up, along the chain that ends last:

* a **materialized** partition is ready when it was materialized (a tainted one, or one whose blocking checks failed,
  is built again: it counts as not built);
* a **source** partition (an ODS hour, an external delivery) arrives at its window's end plus the delay its table's
  recent partitions took to be reported (the median; once the partition is later than that, the median of the
  recent delays longer than what it has waited so far; once it is later than every one of them, a little after now).
  A catch-up's reports (a day or more late, or a backlog delivered together with later partitions) teach no delay:
  :func:`usual_delays`. A source later than every delay it had (its *usual lateness*, the default delay while it
  has too few) is *overdue*: when it comes nobody knows, so besides the point prediction (a little after now) the
  prediction carries a pessimistic finish (:attr:`Prediction.latest`), the source taking as long again past its
  usual lateness as it already has; the SLA warning reads that one;
* a source hour that has **landed** (every shard's segments through its end, and the source's count of it, are in the
  landing area: :mod:`warehouse_assets.explain.landed`) is no longer late at its source: it waits for the ingestion,
  and is ready when the ingestion run that takes it ends (the run in progress if it landed before that run started,
  else the next one), each taking the ingestion's expected run time, at the earliest now. Only an hour not landed
  can be overdue, and so can a landed one that an ingestion run started since has not made ready (what it lacks is
  at the source again);
* a **running** partition ends its run's start plus the table's expected run time (at the earliest now);
* a **queued** partition starts when the runs ahead of it in Dagster's queue (by priority, then age) have left a
  slot free, on the instance's ``max_concurrent_runs`` slots, and its lane has room (the coordinator's
  ``tag_concurrency_limits``: a rebuild waits for the rebuild lane, not for any slot, and a run its lane holds back
  does not hold back the runs behind it), each run taking its table's expected time;
* any other partition starts when its last upstream partition is ready, at the earliest once its own window has
  ended (it does not exist before), now, and once the runs queued now have left a slot free; it takes its table's
  expected run time.

A table's expected run time is the median of its recent successful runs (``recent``, start to end: what a waiting
downstream sees); failed runs do not count; with fewer than ``min_runs`` of them the figure is not trusted and a
default is used instead. Airflow's deadline alerts take the mean of one DAG's last runs; the median resists the one
slow run of a noisy table, and the chain is what no single DAG's figure gives.

The critical path is the chain of partitions that sets the time: from the partition back through, at each step, the
upstream partition that is ready last, down to a partition whose time is known or learned (a source's arrival, a run
in progress or queued). When a partition's predicted finish passes its freshness SLA's deadline
(:func:`warehouse_assets.materialize.freshness.deadline`) before that deadline,
:func:`warehouse_assets.explain.forecast.forecast_tick` raises a warning: the ``sla_forecast`` check (non-blocking,
severity WARN, one per partition) naming the path, with the day's timeline of predictions as Markdown and a Mermaid
chart in its metadata. The freshness check itself still judges at the deadline.

Everything here but the ``instance_*`` readers and :class:`CatalogGraph` is a pure function of (graph, states,
history, queue, now): tests pin all of them.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from warehouse_assets.catalog import Table
from warehouse_assets.ingest.job import JOB as INGEST_JOB
from warehouse_assets.materialize.freshness import deadline as sla_deadline

Node = tuple[str, str]  # (table fqn, partition key)

MIN_RUNS = 3  # successful runs before a table's own figure is trusted
RECENT = 10  # the runs (and source deliveries) a figure is taken from, newest first
DEFAULT_RUN_S = 300.0  # a table's run time until it has MIN_RUNS successful runs and no table of the instance has
DEFAULT_ARRIVAL_S = 600.0  # a source's delay after its window end until it has MIN_RUNS reported partitions
OVERDUE_STEP_S = 300.0  # a source later than all its history: expected this long after now
CATCH_UP_DELAY_S = 24 * 3600.0  # a report at least this late (and at least a period late) replays the past

MATERIALIZED, ARRIVES, RUNNING, QUEUED, RUNS = "materialized", "arrives", "running", "queued", "runs"
INGESTS = "ingests"  # a source hour landed, waiting for the ingestion run that takes it
INGESTION = f"job:{INGEST_JOB}"  # the ingestion's runs, as the history and the queue name them


# --- inputs ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """A partition as the prediction sees it now."""

    ready_at: float | None = None  # materialized (and usable) at; None: not built
    started_at: float | None = None  # a run that builds it has been running since
    queued: bool = False  # a run that builds it is queued


NOT_BUILT = Seen()


class PartitionGraph(Protocol):
    """The exact upstream partitions of a partition, and its window's end."""

    def upstream(self, node: Node) -> Sequence[Node]: ...

    def is_source(self, table: str) -> bool: ...

    def window_end(self, node: Node) -> float: ...


class States(Protocol):
    def seen(self, table: str, keys: Sequence[str]) -> Mapping[str, Seen]: ...


# when a source partition had landed whole in the landing area (epoch seconds), None: not (yet), or not a landed kind
LandedAt = Callable[[str, str], float | None]


@dataclass(frozen=True)
class RunTime:
    """One finished run of a table: how long it took and whether it succeeded."""

    seconds: float
    succeeded: bool = True


@dataclass(frozen=True)
class Estimate:
    seconds: float
    runs: int  # successful runs it is taken from
    trusted: bool  # at least ``min_runs`` of them; else ``seconds`` is the default


@dataclass(frozen=True)
class History:
    """What the instance says happened: per table its recent runs (newest first), per source table the delays after
    their window's end with which its recent partitions were reported (newest first)."""

    runs: Mapping[str, Sequence[RunTime]] = field(default_factory=dict)
    arrivals: Mapping[str, Sequence[float]] = field(default_factory=dict)
    # the start of the newest successful ingestion run: what had landed before it, it ingested
    ingested_before: float | None = None
    # per source table, delays its catalog entry declares (external.usual_delay), used until it has its own
    declared_delays: Mapping[str, Sequence[float]] = field(default_factory=dict)
    min_runs: int = MIN_RUNS
    recent: int = RECENT
    default_run_s: float = DEFAULT_RUN_S
    default_arrival_s: float = DEFAULT_ARRIVAL_S

    def run_time(self, table: str) -> Estimate:
        """The table's expected run time: the median of its last ``recent`` successful runs, failed ones left out;
        with fewer, what a table of this warehouse typically takes (:meth:`typical_run_s`)."""
        good = self._good(table)
        if len(good) < self.min_runs:
            return Estimate(self.typical_run_s, len(good), False)
        return Estimate(statistics.median(good), len(good), True)

    @functools.cached_property
    def typical_run_s(self) -> float:
        """The median of the trusted tables' run times (jobs such as the ingestion left out): a table new to the
        instance is expected to run as long as this warehouse's tables usually do, not a fixed five minutes that
        overstates a small query's run many times on a fresh stack; ``default_run_s`` while no table is trusted."""
        figures = [
            statistics.median(good)
            for table in self.runs
            if not table.startswith("job:") and len(good := self._good(table)) >= self.min_runs
        ]
        return statistics.median(figures) if figures else self.default_run_s

    def _good(self, table: str) -> list[float]:
        return [r.seconds for r in self.runs.get(table, ()) if r.succeeded][: self.recent]

    def lateness(self, table: str) -> float:
        """The latest a source's partitions usually arrive after their window's end: the longest of its last
        ``recent`` usual delays (or of what its table declares), the default delay while it has neither."""
        delays = self._delays(table)
        return max(delays) if delays else self.default_arrival_s

    def arrival_delay(self, table: str, waited: float) -> float:
        """How long after its window's end a source partition is expected, having waited ``waited`` seconds since
        then without arriving (negative: the window has not ended)."""
        delays = self._delays(table)
        if not delays:  # nothing to learn from: the default, and once past it, soon after now
            return self.default_arrival_s if waited <= self.default_arrival_s else waited + OVERDUE_STEP_S
        later = [d for d in delays if d > waited]
        if later:
            return statistics.median(later)
        return waited + OVERDUE_STEP_S  # later than ever: soon, but nobody knows when

    def _delays(self, table: str) -> list[float]:
        """The delays to learn from: the table's own last ``recent`` ones once it has ``min_runs``; before that, what
        its producer is declared to usually take (spread evenly over the declared span, as if learned), else none."""
        delays = list(self.arrivals.get(table, ()))[: self.recent]
        if len(delays) >= self.min_runs:
            return delays
        return list(self.declared_delays.get(table, ()))


@dataclass(frozen=True)
class Report:
    """A source partition's first report: its window (start, end) and when it was reported, epoch seconds."""

    start: float
    end: float
    at: float

    @property
    def delay(self) -> float:
        return self.at - self.end


def usual_delays(reports: Sequence[Report]) -> list[float]:
    """The delays after their window's end with which a source's partitions usually arrive, newest report first,
    without a catch-up's reports.

    A stack started on past data (the dev stack replays its simulated days), or a source back after an outage,
    reports a backlog at once: hours of days ago, a whole day's hours in one ingestion batch. Their delays say how long
    the backlog was, not when the source's next partition will come; learned, they predicted every partition of the
    next day days late, each an SLA warning. So a report is a catch-up, and teaches nothing, when it came

    * a day or more after its window ended (and at least one period of the table: a monthly source may deliver days
      after its month), or
    * after a later partition's window had ended too, and that later partition was reported with it (within half a
      period, before or after): the source was delivering faster than time passes, a backlog. The newest partition of
      a backlog still counts (what it waited is what a live partition waits), and so does a late one that came alone.

    For example, hourly reports of 10:00-11:00 at 11:05 and of 11:00-12:00 at 12:04 teach 5 and 4 minutes; hours
    00:00 to 09:00 reported all at 11:30 teach only 09:00-10:00's 90 minutes.
    """
    usual: list[float] = []
    for report in sorted(reports, key=lambda r: r.at, reverse=True):
        period = report.end - report.start
        if report.delay >= max(CATCH_UP_DELAY_S, period):
            continue
        if any(report.end < later.end <= report.at and abs(later.at - report.at) < period / 2 for later in reports):
            continue
        usual.append(report.delay)
    return usual


@dataclass(frozen=True)
class QueuedRun:
    """A run in Dagster's queue (or in progress), with the partitions it builds, in the queue's order, and the tags
    the coordinator's limits count (its lane)."""

    table: str  # a table's fqn, or ``job:<name>`` for a run of no single table (an ingestion)
    partitions: tuple[str, ...]
    started_at: float | None = None  # in progress since; None: queued
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TagLimit:
    """One of the run coordinator's ``tag_concurrency_limits``: at most ``limit`` runs in progress carrying the tag
    ``key`` with the value ``value`` (None: any value; ``per_value``: each value counted apart)."""

    key: str
    value: str | None
    limit: int
    per_value: bool = False

    def full(self, run: QueuedRun, active: Sequence[QueuedRun]) -> bool:
        """Whether this limit holds ``run`` back while ``active`` are in progress."""
        mine = run.tags.get(self.key)
        if mine is None or (self.value is not None and mine != self.value):
            return False
        same = [
            a
            for a in active
            if self.key in a.tags and (self.value is None and not self.per_value or a.tags[self.key] == mine)
        ]
        return len(same) >= self.limit


def tag_limits(config: Sequence[Mapping[str, Any]]) -> tuple[TagLimit, ...]:
    """The run coordinator's ``tag_concurrency_limits`` as :class:`TagLimit`."""
    out = []
    for entry in config:
        value = entry.get("value")
        per_value = isinstance(value, Mapping) and bool(value.get("applyLimitPerUniqueValue"))
        out.append(
            TagLimit(str(entry["key"]), value if isinstance(value, str) else None, int(entry["limit"]), per_value)
        )
    return tuple(out)


# a run the engine submits now: a partition's first build, in no background lane
SUBMITTED_TAGS = {"warehouse/lane": "first_build"}


@dataclass(frozen=True)
class Queue:
    """The runs in progress and queued (queued ones in the order the queue launches them), the slots and the tag
    limits (the lanes)."""

    runs: Sequence[QueuedRun] = ()
    slots: int | None = None  # the instance's max_concurrent_runs; None: unlimited
    limits: Sequence[TagLimit] = ()

    def __post_init__(self) -> None:
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"a queue needs at least one slot (or None: unlimited), got slots={self.slots}")

    def starts(self, history: History, now: float) -> tuple[dict[Node, float], float]:
        """When each queued partition's run is expected to start, and when a run submitted now (a first build,
        behind every queued run) would start.

        As the coordinator launches them: at each moment a run ends, the queued runs in the queue's order, each once a
        slot is free and no tag limit it counts in is full (its lane busy); a run its lane holds back does not hold
        back the runs behind it. A run in progress ends its start plus its table's expected time, at the earliest now.
        """
        ends = [
            (max(now, r.started_at + history.run_time(r.table).seconds), r)
            for r in self.runs
            if r.started_at is not None
        ]
        submitted = QueuedRun("", (), tags=SUBMITTED_TAGS)
        waiting = [*(r for r in self.runs if r.started_at is None), submitted]
        starts: dict[Node, float] = {}
        at, free = now, now
        while waiting:
            active = [r for end, r in ends if end > at]
            for run in list(waiting):
                if self.slots is not None and len(active) >= self.slots:
                    break
                if any(limit.full(run, active) for limit in self.limits):
                    continue
                waiting.remove(run)
                if run is submitted:  # only asked when: it takes nothing from the runs queued before it
                    free = at
                    continue
                starts.update(((run.table, k), at) for k in run.partitions)
                ends.append((at + history.run_time(run.table).seconds, run))
                active.append(run)
            later = [end for end, _ in ends if end > at]
            if not later:  # nothing left to end: what still waits can never start (a limit of 0): say now
                break
            at = min(later)
        starts.update(((run.table, k), at) for run in waiting for k in run.partitions)
        return starts, (at if submitted in waiting else free)


# --- the prediction -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One partition on a critical path: how its time is set."""

    table: str
    partition: str
    kind: str  # materialized | arrives | ingests | running | queued | runs
    finish: float  # ready at (epoch seconds)
    start: float | None = None  # its run starts (ingests: the ingestion's; running, queued, runs)
    run: Estimate | None = None  # the run time used (ingests, running, queued, runs)
    overdue_s: float = 0.0  # a source (arrives) waited this long past its usual lateness

    def describe(self, zone: ZoneInfo) -> str:
        at = clock(self.finish, zone)
        if self.kind == MATERIALIZED:
            return f"{self.table} {self.partition} materialized {at}"
        if self.kind == ARRIVES:
            return f"{self.table} {self.partition} arrives ~{at}"
        assert self.start is not None and self.run is not None
        figure = minutes(self.run.seconds) + (
            f" (median of {self.run.runs} runs)"
            if self.run.trusted
            else f" (typical here: {self.run.runs} successful runs known)"
        )
        if self.kind == INGESTS:
            return (
                f"{self.table} {self.partition} landed, ingested by the run from ~{clock(self.start, zone)} "
                f"({INGEST_JOB} {figure}), ready ~{at}"
            )
        start = {RUNNING: "running since ", QUEUED: "queued, starts ~", RUNS: "runs ~"}[self.kind]
        return f"{self.table} {self.partition} {start}{clock(self.start, zone)} for {figure}, ready ~{at}"


@dataclass(frozen=True)
class Prediction:
    table: str
    partition: str
    finish: float  # epoch seconds
    path: tuple[Step, ...]  # the critical path, from where it starts to the partition itself

    @property
    def known(self) -> bool:
        """Already materialized: nothing is predicted."""
        return self.path[-1].kind == MATERIALIZED

    @property
    def latest(self) -> float:
        """The finish if the overdue source the critical path starts at (if any) takes as long again past its usual
        lateness as it already has: predicted a little after now, it may as well come much later, and a warning
        that waits for the point prediction to pass the deadline comes only minutes before it. The lateness of a
        source past all its history grows with how long it has been silent, so the bound grows too, and warns
        while there is still time to act; an hour that is late by its usual minutes never reaches it."""
        first = self.path[0]
        if first.kind != ARRIVES:
            return self.finish
        return self.finish + max(0.0, first.overdue_s - OVERDUE_STEP_S)

    def at(self, zone: ZoneInfo) -> datetime:
        return datetime.fromtimestamp(self.finish, zone)

    def critical_path(self, zone: ZoneInfo) -> str:
        return " → ".join(step.describe(zone) for step in self.path)

    def line(self, zone: ZoneInfo) -> str:
        return f"predicted ready ~{clock(self.finish, zone)}; critical path: {self.critical_path(zone)}"

    def chain(self) -> str:
        """The path's partitions, a table's consecutive ones (a self-dependent run of days) as one span."""
        groups: list[list[Step]] = []
        for step in self.path:
            if groups and groups[-1][0].table == step.table:
                groups[-1].append(step)
            else:
                groups.append([step])
        return " → ".join(
            f"{g[0].table} {g[0].partition}"
            if len(g) == 1
            else f"{g[0].table} {g[0].partition}…{g[-1].partition} ({len(g)})"
            for g in groups
        )

    def short(self, zone: ZoneInfo) -> str:
        """The finish and the path's partitions, without how each is timed: one line of ``warehouse status``."""
        return f"predicted ready ~{clock(self.finish, zone)} (critical path: {self.chain()})"

    def against_sla(self, table: Table) -> str:
        """The prediction against the partition's SLA deadline, in words; '' without an SLA."""
        if table.sla is None:
            return ""
        due = sla_deadline(table, self.partition)
        late = self.finish - due.timestamp()
        if late > 0:
            return f"SLA deadline {due:%Y-%m-%d %H:%M}: predicted {minutes(late)} late"
        return f"SLA deadline {due:%Y-%m-%d %H:%M}: predicted {minutes(-late)} early"


class Predictor:
    """Predictions over one view of the warehouse at ``now``; partitions shared by several predictions are timed once
    (a sensor tick predicting a day's tables, a bench predicting at one moment)."""

    def __init__(
        self,
        graph: PartitionGraph,
        states: States,
        history: History,
        now: float,
        queue: Queue | None = None,
        landed: LandedAt | None = None,
    ):
        self.graph, self.states, self.history, self.now = graph, states, history, now
        queue = queue or Queue()
        self._queued_start, self._queue_free = queue.starts(history, now)
        self._landed = landed
        # the ingestion run in progress (the landing sensor launches one at a time): it takes what landed before it
        self._ingesting = max(
            (r.started_at for r in queue.runs if r.table == INGESTION and r.started_at is not None), default=None
        )
        self._seen: dict[Node, Seen] = {}
        self._upstream: dict[Node, Sequence[Node]] = {}
        self._step: dict[Node, Step] = {}
        self._via: dict[Node, Node | None] = {}

    def predict(self, table: str, partition: str) -> Prediction:
        target = (table, partition)
        self._discover(target)
        self._time(target)
        path: list[Step] = []
        node: Node | None = target
        while node is not None:
            path.append(self._step[node])
            node = self._via[node]
        return Prediction(table, partition, self._step[target].finish, tuple(reversed(path)))

    def _discover(self, target: Node) -> None:
        """Read the state of every partition the target waits for, breadth first, one query per table and level;
        a partition that is built, running or queued ends its branch."""
        frontier = [target] if target not in self._seen else []
        while frontier:
            wanted: dict[str, list[str]] = {}
            for table, key in frontier:
                wanted.setdefault(table, []).append(key)
            for table, keys in wanted.items():
                found = self.states.seen(table, keys)
                self._seen.update(((table, k), found.get(k, NOT_BUILT)) for k in keys)
            following: dict[Node, None] = {}
            for node in frontier:
                seen = self._seen[node]
                if seen.ready_at is not None or seen.started_at is not None or seen.queued:
                    continue
                if self.graph.is_source(node[0]):
                    continue
                ups = self._upstream[node] = self.graph.upstream(node)
                following.update((u, None) for u in ups if u not in self._seen)
            frontier = list(following)

    def _time(self, target: Node) -> None:
        """Each discovered partition's finish, upstream first (iteratively: a self-dependent chain can be long)."""
        stack: list[tuple[Node, bool]] = [(target, False)]
        while stack:
            node, expanded = stack.pop()
            if node in self._step:
                continue
            ups = self._upstream.get(node, ())
            if not expanded and any(u not in self._step for u in ups):
                stack.append((node, True))
                stack.extend((u, False) for u in ups if u not in self._step)
                continue
            self._step[node], self._via[node] = self._finish(node, ups)

    def _finish(self, node: Node, ups: Sequence[Node]) -> tuple[Step, Node | None]:
        table, key = node
        seen, now = self._seen[node], self.now
        if seen.ready_at is not None:
            return Step(table, key, MATERIALIZED, seen.ready_at), None
        run = self.history.run_time(table)
        if seen.started_at is not None:
            return Step(table, key, RUNNING, max(now, seen.started_at + run.seconds), seen.started_at, run), None
        if seen.queued:
            start = self._queued_start.get(node, self._queue_free)
            return Step(table, key, QUEUED, start + run.seconds, start, run), None
        if self.graph.is_source(table):
            end = self.graph.window_end(node)
            # an hour not ended has not landed whole: the landing area is read only for those that have
            landed = self._landed(table, key) if self._landed is not None and end <= now else None
            ingested = self.history.ingested_before
            if landed is not None and (ingested is None or ingested < landed):
                return self._ingests(table, key, landed), None
            arrival = end + self.history.arrival_delay(table, now - end)
            overdue = max(0.0, now - end - self.history.lateness(table))
            return Step(table, key, ARRIVES, max(arrival, now), overdue_s=overdue), None
        last = max(ups, key=lambda u: self._step[u].finish, default=None)
        ready = self._step[last].finish if last is not None else now
        # a partition exists, and so runs, once its window has ended, however early its upstream was ready
        start = max(ready, self.graph.window_end(node), self._queue_free)
        return Step(table, key, RUNS, start + run.seconds, start, run), last

    def _ingests(self, table: str, key: str, landed: float) -> Step:
        """A source partition landed at ``landed``, not ingested yet: ready when the ingestion run that takes it ends.
        The run in progress takes it if it landed before that run started; else the next one, launched when that run
        ends (or now, with none in progress). Each takes the ingestion's expected run time; it ends at the earliest
        now."""
        run, now, running = self.history.run_time(INGESTION), self.now, self._ingesting
        if running is not None and running >= landed:
            start = running
        elif running is not None:
            start = max(now, running + run.seconds)
        else:
            start = now
        return Step(table, key, INGESTS, max(now, start + run.seconds), start, run)


def predict(
    graph: PartitionGraph,
    states: States,
    history: History,
    now: float,
    table: str,
    partition: str,
    queue: Queue | None = None,
    landed: LandedAt | None = None,
) -> Prediction:
    """The predicted finish of one partition at ``now``, with its critical path."""
    return Predictor(graph, states, history, now, queue, landed).predict(table, partition)


# --- words ----------------------------------------------------------------------------------------------------------


def clock(at: float, zone: Any) -> str:
    return datetime.fromtimestamp(at, zone).strftime("%m-%d %H:%M")


def minutes(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds // 3600:.0f} h {seconds % 3600 / 60:.0f} min"
