"""The predicted finish fed from the running warehouse: the exact upstream partitions from the reverse index, each
partition's state from the dependency center's store, the runs' history and the run queue from Dagster's instance
(:mod:`warehouse_assets.explain.eta` is the model; this module only reads what it needs)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from warehouse_assets.catalog import (
    BY_PERIOD,
    WHOLE,
    Catalog,
    ExternalTable,
    OdsTable,
    partition_window,
    partitions_def_of,
    upstream_partitions,
)
from warehouse_assets.explain.eta import (
    INGESTION,
    RECENT,
    History,
    Node,
    Predictor,
    Queue,
    QueuedRun,
    Report,
    RunTime,
    Seen,
    TagLimit,
    tag_limits,
    usual_delays,
)

if TYPE_CHECKING:
    from dagster import DagsterInstance

    from resources.landing import Landing
    from warehouse_assets.center.reverse_index import ReverseIndex
    from warehouse_assets.center.state_store import PartitionState

# a declared delivery span read as this many delays evenly over it: once a delivery is later than some of them, the
# rest still spread its expected arrival over the span's remainder (as the median of the later learned delays does)
DECLARED_POINTS = 9
# how far past now the dependency windows are read: a partition not yet ended (tomorrow's day, this month) needs
# upstream partitions that do not exist yet, which the prediction still has to time
LOOKAHEAD = timedelta(days=40)


# --- the warehouse's graph and state, read for the prediction ---------------------------------------------------


class CatalogGraph:
    """The exact upstream partitions from the reverse index's arithmetic (Dagster's mapping where the index has no
    answer: a window reaching before the warehouse start), windows read up to ``now`` + :data:`LOOKAHEAD`."""

    def __init__(self, catalog: Catalog, index: ReverseIndex, now: datetime):
        self.catalog, self.index = catalog, index
        self.horizon = now + LOOKAHEAD
        self._ends: dict[Node, float] = {}
        self._upstream: dict[Node, list[Node]] = {}

    def upstream(self, node: Node) -> list[Node]:
        if node not in self._upstream:
            self._upstream[node] = self._read_upstream(node)
        return self._upstream[node]

    def _read_upstream(self, node: Node) -> list[Node]:
        fqn, key = node
        table = self.catalog[fqn]
        out: list[Node] = []
        for dep in table.deps:
            keys = self.index.upstream_of(fqn, dep.table, key, current_time=self.horizon)
            if keys is None:
                keys = upstream_partitions(self.catalog, table, dep, key, current_time=self.horizon).keys
            out.extend((dep.table, k) for k in keys)
        out.extend((ref.table, WHOLE) for ref in getattr(table, "references", ()))
        return out

    def is_source(self, table: str) -> bool:
        return self.catalog[table].is_source

    def window_end(self, node: Node) -> float:
        if node[1] == WHOLE:  # a static table: no window
            return float("-inf")
        if node not in self._ends:
            self._ends[node] = partition_window(self.catalog[node[0]], node[1]).end.timestamp()
        return self._ends[node]


class StoreStates:
    """:class:`Seen` from the dependency center's partition state store (a view), run start times from the
    instance."""

    def __init__(self, catalog: Catalog, view: Any, instance: DagsterInstance | None = None):
        self.catalog, self.view, self.instance = catalog, view, instance

    def seen(self, table: str, keys: Sequence[str]) -> dict[str, Seen]:
        from dagster import AssetKey

        found = self.view.states(AssetKey(self.catalog[table].key), keys)
        return {k: self._seen(s) for k, s in found.items()}

    def _seen(self, state: PartitionState) -> Seen:
        usable = state.materialized and not state.tainted and not any(v is False for v in state.checks.values())
        if usable and state.timestamp is not None:
            return Seen(ready_at=state.timestamp)
        if state.in_progress:
            started = None
            if self.instance is not None and state.latest_run:
                record = self.instance.get_run_record_by_id(state.latest_run)
                started = record.start_time if record is not None else None
            return Seen(started_at=started if started is not None else 0.0)
        return Seen(queued=state.queued)


def instance_history(instance: DagsterInstance, catalog: Catalog, now: datetime, days: int = 14) -> History:
    """Each table's recent finished runs (one query for all: runs of a single asset, their start to end) and each
    source table's usual report delays (its latest materializations, one query per source table; a catch-up's reports
    left out, :func:`usual_delays`)."""
    from dagster import AssetKey, AssetRecordsFilter, DagsterRunStatus, RunsFilter

    from warehouse_assets.center.reverse_index import calendar_of

    records = instance.get_run_records(
        RunsFilter(
            statuses=[DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE],
            created_after=now - timedelta(days=days),
        ),
        limit=5000,
    )  # newest first
    by_key = {AssetKey(t.key): t.fqn for t in catalog}
    runs: dict[str, list[RunTime]] = {}
    ingested_before: float | None = None
    for record in records:
        selection = list(record.dagster_run.asset_selection or ())
        if record.start_time is None or record.end_time is None:
            continue
        if len(selection) != 1 or selection[0] not in by_key:  # an ingestion's: what it holds a slot for
            name = f"job:{record.dagster_run.job_name}"
        else:
            name = by_key[selection[0]]
        if "dagster/asset_partition_range_start" in record.dagster_run.tags:
            continue  # a range's run time is many partitions', not what one partition waits
        succeeded = record.dagster_run.status == DagsterRunStatus.SUCCESS
        if name == INGESTION and succeeded:
            ingested_before = max(ingested_before, record.start_time) if ingested_before else record.start_time
        runs.setdefault(name, []).append(RunTime(record.end_time - record.start_time, succeeded))
    arrivals: dict[str, list[float]] = {}
    for table in catalog:
        if not table.is_source:
            continue
        found = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(table.key)), limit=RECENT * 3
        ).records  # newest first; a re-report (late data) of a partition is not its arrival: the first one is
        # the process's calendar of the period: Dagster parses a key per question, which cost most of a `why`
        calendar = calendar_of(BY_PERIOD[table.period])
        calendar.cover(now.timestamp())
        first: dict[str, float] = {}
        for reported in found:
            key = reported.partition_key
            if key is not None and calendar.locate(key) is not None:
                first[key] = min(first.get(key, reported.timestamp), reported.timestamp)
        at = {key: calendar.position[key] for key in first}
        reports = [Report(calendar.starts[i], calendar.ends[i], first[key]) for key, i in at.items()]
        arrivals[table.fqn] = usual_delays(reports)[:RECENT]
    return History(
        runs=runs, arrivals=arrivals, ingested_before=ingested_before, declared_delays=declared_delays(catalog)
    )


def declared_delays(catalog: Catalog) -> dict[str, list[float]]:
    """Each source table's declared usual delivery span (an external producer's day, an ODS table's hour) as delays
    to learn from: ``DECLARED_POINTS`` of them, evenly from its earliest to its latest (as a uniform delivery over the
    span; one declared delay: that one)."""
    spans = {
        t.fqn: t.external.usual_delay_minutes if isinstance(t, ExternalTable) else t.usual_delay_minutes
        for t in catalog
        if isinstance(t, ExternalTable | OdsTable)
    }
    out = {}
    for fqn, span in spans.items():
        if span:
            first, last = span[0] * 60.0, span[-1] * 60.0
            step = (last - first) / (DECLARED_POINTS - 1)
            out[fqn] = [first + i * step for i in range(DECLARED_POINTS)]
    return out


def instance_queue(instance: DagsterInstance, catalog: Catalog) -> Queue:
    """The runs in progress and queued, in the order Dagster's queue launches them (priority, then age), with the tags
    the run coordinator limits (the lanes), its slots and its tag limits."""
    from dagster import DagsterRunStatus, PartitionKeyRange, RunsFilter

    slots: int | None = None
    limits: tuple[TagLimit, ...] = ()
    config = getattr(instance.run_coordinator, "get_run_queue_config", None)
    if config is not None:
        queue_config = config()
        # a paused queue (0) is taken as one slot: the prediction assumes it resumes
        slots = None if queue_config.max_concurrent_runs == -1 else max(1, queue_config.max_concurrent_runs)
        limits = tag_limits(queue_config.tag_concurrency_limits or ())
    limited = {limit.key for limit in limits}
    by_key = {tuple(t.key): t for t in catalog}
    records = instance.get_run_records(
        RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.QUEUED])
    )
    runs: list[tuple[tuple[int, float], QueuedRun]] = []
    for record in records:
        run = record.dagster_run
        tags = run.tags
        try:
            priority = int(tags.get("dagster/priority", "0"))
        except ValueError:
            priority = 0
        started = record.start_time if run.status != DagsterRunStatus.QUEUED else None
        if run.status != DagsterRunStatus.QUEUED and started is None:
            started = record.create_timestamp.timestamp()
        order = (-priority, record.create_timestamp.timestamp())
        lane = {k: v for k, v in tags.items() if k in limited}
        selection = list(run.asset_selection or ())
        table = by_key.get(tuple(selection[0].path)) if len(selection) == 1 else None
        if table is None:  # a run of no single table (an ingestion) still takes a slot, and its lane
            runs.append((order, QueuedRun(f"job:{run.job_name}", (), started, lane)))
            continue
        keys: tuple[str, ...] = ()
        if "dagster/partition" in tags:
            keys = (tags["dagster/partition"],)
        elif "dagster/asset_partition_range_start" in tags:
            span = PartitionKeyRange(
                tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]
            )
            keys = tuple(partitions_def_of(table).get_partition_keys_in_range(span))
        runs.append((order, QueuedRun(table.fqn, keys, started, lane)))
    return Queue([r for _, r in sorted(runs, key=lambda r: r[0])], slots, limits)


def instance_predictor(
    instance: DagsterInstance,
    catalog: Catalog,
    view: Any,
    now: datetime,
    index: ReverseIndex | None = None,
    landing: Landing | None = None,
) -> Predictor:
    """A predictor over the instance at ``now``: the store's states, the instance's history and queue, and (with
    ``landing``) the source hours landed there, waiting for the ingestion."""
    from warehouse_assets.center.reverse_index import ReverseIndex
    from warehouse_assets.explain.landed import LandedHours

    index = index or ReverseIndex.build(catalog, current_time=now)
    return Predictor(
        CatalogGraph(catalog, index, now),
        StoreStates(catalog, view, instance),
        instance_history(instance, catalog, now),
        now.timestamp(),
        instance_queue(instance, catalog),
        LandedHours(instance, catalog, landing) if landing is not None else None,
    )
