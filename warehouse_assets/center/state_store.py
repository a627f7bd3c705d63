"""The partition state store: what the gate needs to know about every (table, partition), kept from Dagster's event log.

One row per (asset key, partition): its latest materialization (storage id, run, time, Delta version from the
materialization's metadata), the verdicts of the checks evaluated on *that* materialization (a verdict on an older
one does not count, as Dagster's ``is_current``), its validity (a taint: a failed ``valid`` verdict on that
materialization, with reason, root, who and the repairing backfill, :mod:`warehouse_assets.materialize.validity`), the
latest run that targets it, whether that run is in progress (started, not ended) and whether it failed without
materializing the partition. External deliveries and ODS hours
are runless materializations of their asset keys, so they are rows like any other.

:meth:`PartitionStateStore.update` reads only the event records after its cursor (a storage id of the event log) and
returns what changed, partition by partition: the dependency center reacts to those changes. The rows and the cursor
are committed in one SQLite transaction, next to the instance by default (``$DAGSTER_HOME/storage/
partition_states.db``), so a restart resumes from the cursor; :meth:`PartitionStateStore.rebuild` drops everything
and replays the log from the start. The store is a :class:`warehouse_assets.materialize.gate.PartitionStateReader`.

Where it differs from the instance's own view, and why:

* in progress means a run that targets the partition has *started* (Dagster's status also counts a queued run);
* a check verdict stays until the next verdict or materialization: a check run planned or crashed after a failed
  verdict does not clear it (Dagster then reports the check in progress or execution-failed, which a gate reading
  the instance lets through);
* an asset wipe deletes events without logging one: :meth:`PartitionStateStore.rebuild` after a wipe;
* on Postgres, concurrent writers can commit storage ids out of order, so a reader can pass an id whose event
  commits later: the store re-reads :data:`OVERLAP` ids behind its cursor whenever new events arrive and applies
  the ones it had not seen. SQLite storage has one writer at a time: no overlap.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import AssetKey, AssetMaterialization, DagsterEventType, DagsterInstance, EventLogEntry

from resources.settings import current
from warehouse_assets.catalog import WHOLE
from warehouse_assets.catalog.lineage_events import LineageEvents, lineage_events
from warehouse_assets.center.state_cache import GENERATION_SCHEMA, RowCache
from warehouse_assets.materialize.gate import DEGRADED, READ_AFTER, STATE, backfill_running, per_partition
from warehouse_assets.materialize.validity import GONE, LAKE, VALID, Taint, released_note

if TYPE_CHECKING:
    from warehouse_assets.catalog import Table

# The event types the state depends on, read one type per query: Dagster warns on several types in one query, and
# each (type, id > cursor) read is an index range scan. All of them are mirrored into the cross-run index of
# run-sharded SQLite storage, so the ids are one sequence on every storage.
MATERIALIZED = DagsterEventType.ASSET_MATERIALIZATION
CHECKED = DagsterEventType.ASSET_CHECK_EVALUATION
PLANNED = DagsterEventType.ASSET_MATERIALIZATION_PLANNED
OBSERVED = DagsterEventType.ASSET_OBSERVATION  # the lake reconciliation's "its files are gone" (:data:`GONE`)
RUN_STARTED = DagsterEventType.RUN_START
RUN_ENDED = {
    DagsterEventType.RUN_SUCCESS: False,  # the run's end → whether it failed
    DagsterEventType.RUN_FAILURE: True,
    DagsterEventType.RUN_CANCELED: True,
}
EVENT_TYPES = (MATERIALIZED, CHECKED, PLANNED, OBSERVED, RUN_STARTED, *RUN_ENDED)

SPAN = 20_000  # storage ids read per step: a replay of a long log commits (and holds in memory) a step at a time
PAGE = 5_000  # records per query
_STATES_KEPT = 200_000  # states kept by the rows they were read from (a few hundred bytes each)


@dataclass(frozen=True)
class PartitionState:
    """One partition as the gate sees it."""

    asset_key: str  # AssetKey.to_user_string(): ``dwd/orders``
    partition: str
    storage_id: int | None = None  # of its latest materialization; None: never materialized
    run_id: str | None = None  # the run that materialized it ("" for a runless report)
    timestamp: float | None = None
    delta_version: int | None = None
    checks: Mapping[str, bool] = field(default_factory=dict)  # check → passed, on the latest materialization only
    latest_run: str | None = None  # the latest run that targets it
    in_progress: bool = False  # that run has started and not ended
    failed: bool = False  # that run ended failed or canceled without materializing it
    taint: Taint | None = None  # a failed ``valid`` verdict on the latest materialization
    degraded: str | None = None  # what the latest materialization was built without, past a dependency's deadline
    state: str | None = None  # the state the latest materialization reached, of a table with states
    # the storage id of the start of the run that wrote the latest materialization (the materialization's own for a
    # report outside a run): upstream data materialized after it may not have been read, even when the
    # materialization came later
    read_from: int | None = None
    queued: bool = False  # the latest run that targets it is created and not started: it will read what is there then
    released: str | None = None  # a taint lifted without new data: "accepted as is: REASON (by WHO)"
    # its latest materialization's data is gone from the lake (files deleted, the table restored to an older
    # version): what the reconciliation found; it counts as not materialized until it is built again
    missing: str | None = None
    # its rows after the latest materialization, and how many of them that materialization changed (a late report's
    # new changes, a key-scoped rebuild's keys, every row of a whole write); None where it recorded none. What a
    # reader's late-data rebuild will touch, estimated before its run
    rows: int | None = None
    changed: int | None = None

    @property
    def materialized(self) -> bool:
        return self.storage_id is not None and self.missing is None

    @property
    def tainted(self) -> bool:
        return self.taint is not None


@dataclass(frozen=True)
class Change:
    """A partition whose state an update changed, and which fields of it (``materialized``, ``checks``, ...)."""

    asset_key: str
    partition: str
    fields: frozenset[str]
    state: PartitionState
    before: PartitionState | None = None  # its state before the update


def transition(before: PartitionState, after: PartitionState) -> tuple[str, dict[str, Any]] | None:
    """The change of state a catalog is told of (``ready``, ``tainted``, ``repaired``, ``released``), with what the
    store knows of it; None for a change no one outside acts on (a run queued, a check's verdict)."""
    if after.storage_id is not None and after.storage_id != before.storage_id:
        detail = {"run_id": after.run_id or "", "delta_version": after.delta_version}
        return ("repaired" if before.taint is not None or before.missing is not None else "ready"), detail
    if after.taint is not None and before.taint is None:
        return "tainted", {"reason": after.taint.reason, "root": after.taint.root, "by": after.taint.by}
    if after.taint is None and before.taint is not None:  # lifted without new data
        return ("released", {"note": after.released}) if after.released else ("repaired", {})
    return None


# what the gate reads, by the name a change reports; a change of anything else is no news
_FIELDS = {
    "materialized": "storage_id",
    "checks": "checks",
    "validity": "taint",
    "in_progress": "in_progress",
    "failed": "failed",
    "queued": "queued",
    "missing": "missing",
}
_COLUMNS = (
    "asset_key, partition, storage_id, run_id, timestamp, delta_version, checks, latest_run, in_progress, failed,"
    " taint, degraded, state, read_from, queued, released, missing, rows, changed"
)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS partitions ({_COLUMNS}, PRIMARY KEY (asset_key, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS run_targets (run_id, asset_key, partition, PRIMARY KEY (run_id, asset_key, partition))
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS run_starts (run_id PRIMARY KEY, storage_id INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cursor (id INTEGER PRIMARY KEY CHECK (id = 0), storage_id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS applied (storage_id INTEGER PRIMARY KEY);
"""

# How far behind its cursor the store re-reads on storages with concurrent writers (PostgreSQL, MySQL): their ids
# come from a sequence taken before the insert commits, so an event can become visible after a later id was read
# later. The ids applied within the overlap are remembered, so a re-read applies only the late ones.
OVERLAP = 500


def default_path(instance: DagsterInstance) -> Path:
    return Path(instance.root_directory) / "storage" / "partition_states.db"


class _GateReader:
    """The gate's ``PartitionStateReader`` over ``states``: shared by the store and its view."""

    def states(self, asset_key: AssetKey | str, keys: Iterable[str]) -> dict[str, PartitionState]:
        raise NotImplementedError

    def materialized(self, table: Table, keys: Sequence[str]) -> set[str]:
        return {k for k, s in self.states(AssetKey(table.key), keys).items() if s.materialized}

    def in_progress(self, table: Table, keys: Sequence[str]) -> set[str]:
        return {k for k, s in self.states(AssetKey(table.key), keys).items() if s.in_progress}

    def failed_blocking_checks(self, table: Table, keys: Sequence[str]) -> dict[str, list[str]]:
        if not keys or not any(c.blocking for c in table.checks):
            return {}
        return failed_blocking_checks(table, self.states(AssetKey(table.key), keys))

    def tainted(self, table: Table, keys: Sequence[str]) -> dict[str, Taint]:
        return {k: s.taint for k, s in self.states(AssetKey(table.key), keys).items() if s.taint is not None}

    def reached_states(self, table: Table, keys: Sequence[str]) -> dict[str, str | None]:
        return {k: s.state for k, s in self.states(AssetKey(table.key), keys).items()}

    def repair_running(self, backfill_id: str) -> bool:
        raise NotImplementedError


class PartitionStateStore(_GateReader):
    """Every partition's state, maintained incrementally from ``instance``'s event log and persisted at ``path``."""

    def __init__(self, instance: DagsterInstance, path: Path | None = None, overlap: int | None = None):
        self.instance = instance
        # SQLite storage has one writer at a time: its ids are visible in order
        sqlite = "sqlite" in type(instance.event_log_storage).__module__
        self.overlap = overlap if overlap is not None else 0 if sqlite else OVERLAP
        self.path = path or default_path(instance)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)  # transactions are explicit (BEGIN / COMMIT)
        # readers (``warehouse why``) never wait for the writer, and a commit is durable against a crash of the
        # process: losing the last commits to a power cut only replays them from the log
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(partitions)")}
        for column in (
            "taint",
            "degraded",
            "state",
            "read_from",
            "queued",
            "released",
            "missing",
            "rows",
            "changed",
        ):  # a store written before them: none was ever logged before it either
            if column not in columns:
                self._db.execute(f"ALTER TABLE partitions ADD COLUMN {column}")
        self._db.executescript(GENERATION_SCHEMA)
        # the rows read and written, while no one else writes the file
        self._kept: RowCache[PartitionState] = RowCache(self._db)
        self.records_read = 0  # event records the last update read: its cost
        self._states: dict[tuple[object, ...], PartitionState] = {}  # rows read → their states, see _state_of
        # the catalog's subscription to the partitions' changes of state (None: OpenLineage is off)
        self.events: LineageEvents | None = lineage_events(current())

    def close(self) -> None:
        self._db.close()

    def repair_running(self, backfill_id: str) -> bool:
        return backfill_running(self.instance, backfill_id)

    @property
    def cursor(self) -> int:
        row = self._db.execute("SELECT storage_id FROM cursor").fetchone()
        return row[0] if row else -1

    # --- maintenance -------------------------------------------------------------------------------------------

    def update(self, through: int | None = None, until: float | None = None, publish: bool = True) -> list[Change]:
        """Apply the events stored since the cursor (up to storage id ``through``, and of those only the ones logged
        at or before ``until``, epoch seconds, if given); the partitions whose state changed, in event order. Their
        changes of state go to the OpenLineage transport when it is on (``publish``)."""
        self.records_read = 0
        changes: dict[tuple[str, str], Change] = {}
        storage = self.instance.event_log_storage
        last = storage.get_maximum_record_id() or -1
        last = last if through is None else min(last, through)
        while (head := min(last, self.cursor + SPAN)) > self.cursor:
            for change in self._apply_step(self.cursor, head, until):
                previous = changes.pop((change.asset_key, change.partition), None)
                fields = change.fields | (previous.fields if previous else frozenset())
                before = previous.before if previous else change.before
                changes[(change.asset_key, change.partition)] = replace(change, fields=fields, before=before)
        if publish and self.events is not None:
            self._publish(self.events, changes.values())
        return list(changes.values())

    @staticmethod
    def _publish(events: LineageEvents, changes: Iterable[Change]) -> None:
        for change in changes:
            found = transition(change.before, change.state) if change.before is not None else None
            if found is not None:
                state, detail = found
                fqn = change.asset_key.replace("/", ".")
                events.state_changed(fqn, change.partition, state, detail)

    def rebuild(self) -> list[Change]:
        """Drop every row and the cursor, and replay the whole event log."""
        with self._transaction():
            self._db.execute("DELETE FROM partitions")
            self._db.execute("DELETE FROM run_targets")
            self._db.execute("DELETE FROM run_starts")
            self._db.execute("DELETE FROM cursor")
            self._db.execute("DELETE FROM applied")
        self._kept.drop()
        return self.update(publish=False)  # a replay: the catalog was told of these when they happened

    def changes_since(self, after: int) -> list[Change]:
        """The partitions materialized or checked by the events after storage id ``after`` up to the cursor, in their
        current state: what a consumer of :meth:`update`'s changes that stopped at ``after`` (a crash between the
        store's commit and its own) has missed. Runs that started or ended meanwhile are not among them."""
        touched: dict[tuple[str, str], set[str]] = {}
        for _, entry in self._read(after, self.cursor):
            event = entry.dagster_event
            if event is not None and event.event_type == MATERIALIZED:
                m = event.step_materialization_data.materialization
                asset_key, partition, name = m.asset_key, m.partition, "materialized"
            elif event is not None and event.event_type == CHECKED:
                e = event.asset_check_evaluation_data
                asset_key, partition = e.asset_key, e.partition
                name = "validity" if e.check_name == VALID else "checks"
            elif event is not None and event.event_type == OBSERVED:
                o = event.asset_observation_data.asset_observation
                if o.metadata.get(LAKE) is None or o.metadata[LAKE].value != GONE:
                    continue
                asset_key, partition, name = o.asset_key, o.partition, "missing"
            else:
                continue
            touched.setdefault((asset_key.to_user_string(), _partition(partition)), set()).add(name)
        return [Change(a, p, frozenset(fields), self.states(a, [p])[p]) for (a, p), fields in touched.items()]

    def _read(self, after: int, head: int) -> list[tuple[int, EventLogEntry]]:
        """The records of the event types the state depends on with ``after`` < storage id <= ``head``, in order.

        ``get_logs_for_all_runs_by_log_id`` is the one cross-run read by storage id (an ``id > N`` index scan) that
        covers check evaluations and planned materializations: ``fetch_materializations`` needs an asset key (a
        query per asset), ``fetch_run_status_changes`` covers run events only, and the storage's
        ``get_event_records`` refuses an integer cursor on run-sharded SQLite for non-asset types. Reads stop at
        ``head``, fixed before the first one, so that a type read later cannot see past a type read earlier.
        """
        storage = self.instance.event_log_storage
        records: list[tuple[int, EventLogEntry]] = []
        for event_type in EVENT_TYPES:
            cursor = after
            while True:
                page = storage.get_logs_for_all_runs_by_log_id(
                    after_cursor=cursor, dagster_event_type=event_type, limit=PAGE
                )
                records.extend((i, e) for i, e in page.items() if i <= head)
                if len(page) < PAGE or max(page) >= head:
                    break
                cursor = max(page)
        self.records_read += len(records)
        return sorted(records, key=lambda r: r[0])

    def _apply_step(self, after: int, head: int, until: float | None = None) -> list[Change]:
        step = _Step(self)
        with self._transaction():
            records = self._read(max(-1, after - self.overlap), head) if self.overlap else self._read(after, head)
            if self.overlap:
                recent = after - self.overlap
                seen = {
                    i for (i,) in self._db.execute("SELECT storage_id FROM applied WHERE storage_id > ?", (recent,))
                }
                records = [(i, e) for i, e in records if i not in seen]
                self._db.executemany("INSERT OR IGNORE INTO applied VALUES (?)", [(i,) for i, _ in records])
                self._db.execute("DELETE FROM applied WHERE storage_id <= ?", (head - self.overlap,))
            for storage_id, entry in records:
                if until is None or entry.timestamp <= until:
                    step.apply(storage_id, entry)
            generations = self._write(step.touched.values())
            self._db.execute("INSERT OR REPLACE INTO cursor VALUES (0, ?)", (head,))
        self._kept.written(*generations, step.touched.values())
        return step.changes()

    def put(self, states: Sequence[PartitionState]) -> None:
        """Write ``states`` as their partitions' rows in one transaction, as an update writes the rows its events
        touched: for a writer that knows the states without an event log (a bench's simulated runs)."""
        with self._transaction():
            generations = self._write(states)
        self._kept.written(*generations, states)

    def _write(self, states: Iterable[PartitionState]) -> tuple[int, int]:
        """Write the rows (inside the caller's transaction); the file's generation before and after."""
        before = self._kept.file_generation()
        self._db.executemany(
            f"INSERT OR REPLACE INTO partitions ({_COLUMNS}) VALUES ({', '.join('?' * 19)})", map(_to_row, states)
        )
        return before, self._kept.file_generation()

    def view(self) -> StateView:
        """The current state without committing anything: the stored rows and, in memory, the events after the
        cursor (those the engine has not applied yet, or all of them when no engine runs)."""
        step = _ViewStep(self)
        head = self.instance.event_log_storage.get_maximum_record_id() or -1
        if head > self.cursor:  # one query when the engine is up to date, one per event type otherwise
            for storage_id, entry in self._read(self.cursor, head):
                step.apply(storage_id, entry)
        return StateView(self, step)

    def _targets(self, run_id: str) -> list[tuple[str, str]]:
        return self._db.execute("SELECT asset_key, partition FROM run_targets WHERE run_id = ?", (run_id,)).fetchall()

    def _started_at(self, run_id: str) -> int | None:
        found = self._db.execute("SELECT storage_id FROM run_starts WHERE run_id = ?", (run_id,)).fetchone()
        return int(found[0]) if found else None

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    # --- reading -----------------------------------------------------------------------------------------------

    def states(self, asset_key: AssetKey | str, keys: Iterable[str]) -> dict[str, PartitionState]:
        """The state of each of ``keys`` of the asset; a partition nothing ever happened to is the default state. Rows
        kept since an earlier read are not read again while the file's generation says no one changed it."""
        name = asset_key.to_user_string() if isinstance(asset_key, AssetKey) else asset_key
        kept = self._kept.rows_of(name)
        wanted = list(dict.fromkeys(keys))
        missing = [k for k in wanted if k not in kept]
        if not missing:
            return {k: kept[k] for k in wanted}
        found: dict[str, PartitionState] = {}
        for chunk in _chunks(missing, 500):  # SQLite's bound on query parameters
            marks = ", ".join("?" * len(chunk))
            query = f"SELECT {_COLUMNS} FROM partitions WHERE asset_key = ? AND partition IN ({marks})"
            found.update((r[1], self._state_of(r)) for r in self._db.execute(query, (name, *chunk)))
        read = {k: found.get(k) or PartitionState(name, k) for k in missing}
        self._kept.keep(name, read)
        return {k: kept[k] if k in kept else read[k] for k in wanted}

    def _state_of(self, row: tuple[object, ...]) -> PartitionState:
        """The state of a row read, the same object for the same row: the resolver reads each upstream window again
        on every call, and most of its rows have not changed since (a state is immutable)."""
        state = self._states.get(row)
        if state is None:
            if len(self._states) >= _STATES_KEPT:
                self._states.clear()
            state = self._states[row] = _from_row(row)
        return state

    def newest_built(self, asset_key: AssetKey | str) -> str | None:
        """The latest partition of the asset that holds data (keys of one period sort as their times)."""
        name = asset_key.to_user_string() if isinstance(asset_key, AssetKey) else asset_key
        found = self._db.execute(
            "SELECT partition FROM partitions WHERE asset_key = ? AND storage_id IS NOT NULL AND missing IS NULL"
            " AND partition != ?"
            " ORDER BY partition DESC LIMIT 1",
            (name, WHOLE),
        ).fetchone()
        return str(found[0]) if found else None

    def partitions_of(self, asset_key: AssetKey | str) -> list[str]:
        """The partitions of the asset that the store has a row of (something happened to them)."""
        name = asset_key.to_user_string() if isinstance(asset_key, AssetKey) else asset_key
        return [str(r[0]) for r in self._db.execute("SELECT partition FROM partitions WHERE asset_key = ?", (name,))]

    def latest_version(self, asset_key: AssetKey | str) -> int | None:
        """The newest Delta version a materialization of the asset recorded: the table's version as the log knows it."""
        name = asset_key.to_user_string() if isinstance(asset_key, AssetKey) else asset_key
        found = self._db.execute("SELECT max(delta_version) FROM partitions WHERE asset_key = ?", (name,)).fetchone()
        return int(found[0]) if found and found[0] is not None else None

    def all_states(self) -> list[PartitionState]:
        """Every row, ordered by asset key and partition (to compare two stores)."""
        return [_from_row(r) for r in self._db.execute(f"SELECT {_COLUMNS} FROM partitions ORDER BY 1, 2")]


# how far past the last event logged by a moment the replay reads: events are stamped when they happen and stored
# in order of arrival, so one logged a moment earlier may have a slightly later storage id
AS_OF_OVERLAP = 500


def state_as_of(instance: DagsterInstance, moment: datetime, now: datetime | None = None) -> PartitionStateStore:
    """Every partition's state as it was at ``moment``: the event log replayed up to it into a store in memory (the
    rebuild of the store, stopped at that moment). ValueError naming the moment when it is in the future or before
    the log's first event (nothing was known then)."""
    now = now or datetime.now(UTC)
    if moment > now:
        raise ValueError(
            f"{moment.isoformat(sep=' ', timespec='minutes')} is in the future (now is "
            f"{now.astimezone(moment.tzinfo).isoformat(sep=' ', timespec='minutes')})"
        )
    storage = instance.event_log_storage

    def first_from(storage_id: int) -> tuple[int, float] | None:
        """The storage id and time of the first event stored at or after ``storage_id``."""
        page = storage.get_logs_for_all_runs_by_log_id(after_cursor=storage_id - 1, limit=1)
        return next(((i, e.timestamp) for i, e in page.items()), None)

    first = first_from(0)
    if first is None:
        raise ValueError("the instance's event log is empty: there is no state to show at any time")
    if moment.timestamp() < first[1]:
        logged = datetime.fromtimestamp(first[1], UTC).astimezone(moment.tzinfo)
        raise ValueError(
            f"{moment.isoformat(sep=' ', timespec='minutes')} is before the instance's first event "
            f"({logged.isoformat(sep=' ', timespec='seconds')}): nothing was known then"
        )
    # the last event logged by the moment, by bisection over storage ids (a few indexed reads, whatever the log)
    low, high, head = first[0], storage.get_maximum_record_id() or first[0], first[0]
    while low <= high:
        found = first_from((low + high) // 2)
        if found is None or found[1] > moment.timestamp():
            high = (low + high) // 2 - 1
        else:
            head, low = found[0], found[0] + 1
    store = PartitionStateStore(instance, Path(":memory:"))
    store.update(through=head + AS_OF_OVERLAP, until=moment.timestamp())
    return store


def failed_blocking_checks(table: Table, states: Mapping[str, PartitionState]) -> dict[str, list[str]]:
    """Partition → the blocking checks of ``table`` that failed on its latest materialization, from its state."""
    blocking = [c.name for c in table.checks if c.blocking]
    if not blocking:  # most tables: no partition to look at
        return {}
    failed = {k: [name for name in blocking if s.checks.get(name) is False] for k, s in states.items()}
    return {k: sorted(v) for k, v in sorted(failed.items()) if v}


class _Step:
    """The events of one step applied to the rows they touch, each row read from the store once."""

    def __init__(self, store: PartitionStateStore):
        self.store = store
        self.touched: dict[tuple[str, str], PartitionState] = {}
        self.before: dict[tuple[str, str], PartitionState] = {}

    def row(self, asset_key: AssetKey | str, partition: str) -> PartitionState:
        key = (asset_key if isinstance(asset_key, str) else asset_key.to_user_string(), partition)
        if key not in self.touched:
            self.touched[key] = self.before[key] = self.store.states(key[0], [key[1]])[key[1]]
        return self.touched[key]

    def set(self, row: PartitionState, /, **fields: object) -> None:
        self.touched[(row.asset_key, row.partition)] = replace(row, **fields)  # type: ignore[arg-type]

    def apply(self, storage_id: int, entry: EventLogEntry) -> None:
        event = entry.dagster_event
        if event is None:
            return
        if event.event_type == MATERIALIZED:
            m = event.step_materialization_data.materialization
            started = self.started_at(entry.run_id) if entry.run_id else None
            self.set(
                self.row(m.asset_key, _partition(m.partition)),
                storage_id=storage_id,
                run_id=entry.run_id,
                timestamp=entry.timestamp,
                delta_version=written_version(m.metadata, m.partition),
                checks={},  # verdicts on the previous materialization no longer count
                taint=None,  # nor does a taint: the new data is judged by its own checks
                released=None,
                missing=None,  # new data in the lake
                degraded=per_partition(m.metadata, DEGRADED, m.partition) if m.partition else None,
                state=per_partition(m.metadata, STATE, m.partition) if m.partition else None,
                failed=False,
                read_from=_read_from(started, storage_id, m),
                **dict(zip(("rows", "changed"), written_counts(m.metadata, m.partition), strict=True)),
            )
        elif event.event_type == CHECKED:
            e = event.asset_check_evaluation_data
            current = self.row(e.asset_key, _partition(e.partition))
            target = e.target_materialization_data.storage_id if e.target_materialization_data else None
            if target != current.storage_id:  # a verdict on an older materialization does not count
                return
            if e.check_name == VALID:  # validity: failed = tainted, passed = valid again
                taint = None if e.passed else Taint.of(e, entry.timestamp)
                self.set(current, taint=taint, released=released_note(e))
            else:
                self.set(current, checks={**current.checks, e.check_name: e.passed})
        elif event.event_type == OBSERVED:
            o = event.asset_observation_data.asset_observation
            meta = {k: v.value for k, v in o.metadata.items()}
            if meta.get(LAKE) != GONE:
                return
            current = self.row(o.asset_key, _partition(o.partition))
            if meta.get("materialization") != current.storage_id:  # found gone before a newer build: not this one
                return
            self.set(current, missing=str(meta.get("reason") or "its files are gone from the lake"))
        elif event.event_type == PLANNED:
            planned = event.asset_materialization_planned_data
            subset = planned.partitions_subset
            keys = list(subset.get_partition_keys()) if subset else [_partition(planned.partition)]
            self.add_targets(entry.run_id, [(planned.asset_key.to_user_string(), k) for k in keys])
            for k in keys:
                row = self.row(planned.asset_key, k)
                self.set(row, latest_run=entry.run_id, in_progress=False, failed=False, queued=True)
        elif event.event_type == RUN_STARTED:
            self.add_start(entry.run_id, storage_id)
            for current in self._of_run(entry.run_id):
                self.set(current, in_progress=True, failed=False, queued=False)
        elif event.event_type in RUN_ENDED:
            for current in self._of_run(entry.run_id):
                failed = RUN_ENDED[event.event_type] and current.run_id != entry.run_id
                self.set(current, in_progress=False, failed=failed, queued=False)
            self.drop_targets(entry.run_id)
            self.drop_start(entry.run_id)

    # the partitions each run targets, from its planned events: in the store's file

    def add_targets(self, run_id: str, targets: list[tuple[str, str]]) -> None:
        self.store._db.executemany(
            "INSERT OR IGNORE INTO run_targets VALUES (?, ?, ?)", [(run_id, *t) for t in targets]
        )

    def drop_targets(self, run_id: str) -> None:
        self.store._db.execute("DELETE FROM run_targets WHERE run_id = ?", (run_id,))

    def targets(self, run_id: str) -> list[tuple[str, str]]:
        return self.store._targets(run_id)

    # where each run in progress started in the log: what its materializations may have read

    def add_start(self, run_id: str, storage_id: int) -> None:
        self.store._db.execute("INSERT OR REPLACE INTO run_starts VALUES (?, ?)", (run_id, storage_id))

    def drop_start(self, run_id: str) -> None:
        self.store._db.execute("DELETE FROM run_starts WHERE run_id = ?", (run_id,))

    def started_at(self, run_id: str) -> int | None:
        return self.store._started_at(run_id)

    def _of_run(self, run_id: str) -> list[PartitionState]:
        """The partitions ``run_id`` targets whose latest run it still is."""
        rows = [self.row(a, p) for a, p in self.targets(run_id)]
        return [r for r in rows if r.latest_run == run_id]

    def changes(self) -> list[Change]:
        out = []
        for (asset_key, partition), state in self.touched.items():
            old = self.before[(asset_key, partition)]
            fields = frozenset(n for n, f in _FIELDS.items() if getattr(state, f) != getattr(old, f))
            if fields:
                out.append(Change(asset_key, partition, fields, state, old))
        return out


class _ViewStep(_Step):
    """A step that writes nothing: run targets of the events it applies are kept in memory."""

    def __init__(self, store: PartitionStateStore):
        super().__init__(store)
        self._added: dict[str, list[tuple[str, str]]] = {}
        self._dropped: set[str] = set()
        self._starts: dict[str, int | None] = {}

    def add_targets(self, run_id: str, targets: list[tuple[str, str]]) -> None:
        self._added.setdefault(run_id, []).extend(targets)

    def drop_targets(self, run_id: str) -> None:
        self._dropped.add(run_id)

    def targets(self, run_id: str) -> list[tuple[str, str]]:
        if run_id in self._dropped:
            return []
        return list(dict.fromkeys([*self.store._targets(run_id), *self._added.get(run_id, [])]))

    def add_start(self, run_id: str, storage_id: int) -> None:
        self._starts[run_id] = storage_id

    def drop_start(self, run_id: str) -> None:
        self._starts[run_id] = None

    def started_at(self, run_id: str) -> int | None:
        return self._starts[run_id] if run_id in self._starts else self.store._started_at(run_id)


class StateView(_GateReader):
    """The store's rows with the events after its cursor applied in memory: the current state for a reader
    (``warehouse why``) that must not move the cursor the engine resolves from. A gate reader."""

    def __init__(self, store: PartitionStateStore, step: _Step):
        self.store, self._step = store, step

    def states(self, asset_key: AssetKey | str, keys: Iterable[str]) -> dict[str, PartitionState]:
        name = asset_key.to_user_string() if isinstance(asset_key, AssetKey) else asset_key
        stored = self.store.states(name, keys)
        return {k: self._step.touched.get((name, k), s) for k, s in stored.items()}

    def repair_running(self, backfill_id: str) -> bool:
        return self.store.repair_running(backfill_id)


class _Transaction:
    """BEGIN ... COMMIT, or ROLLBACK on an exception: the rows and the cursor land together or not at all."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if kind else "COMMIT")


def _to_row(s: PartitionState) -> tuple[object, ...]:
    return (
        s.asset_key,
        s.partition,
        s.storage_id,
        s.run_id,
        s.timestamp,
        s.delta_version,
        json.dumps(dict(sorted(s.checks.items()))),
        s.latest_run,
        int(s.in_progress),
        int(s.failed),
        json.dumps(s.taint.to_json()) if s.taint is not None else None,
        s.degraded,
        s.state,
        s.read_from,
        int(s.queued),
        s.released,
        s.missing,
        s.rows,
        s.changed,
    )


def _from_row(r: Sequence[object]) -> PartitionState:
    (
        asset_key,
        partition,
        storage_id,
        run_id,
        timestamp,
        version,
        checks,
        latest_run,
        in_progress,
        failed,
        taint,
        lack,
        reached,
        read_from,
        queued,
        released,
        missing,
        rows,
        changed,
    ) = r
    return PartitionState(
        str(asset_key),
        str(partition),
        storage_id,  # type: ignore[arg-type]
        run_id,  # type: ignore[arg-type]
        timestamp,  # type: ignore[arg-type]
        version,  # type: ignore[arg-type]
        {} if checks == "{}" else json.loads(str(checks)),  # most partitions have no verdict: skip the parser
        latest_run,  # type: ignore[arg-type]
        bool(in_progress),
        bool(failed),
        Taint.from_json(json.loads(str(taint))) if taint is not None else None,
        str(lack) if lack is not None else None,
        str(reached) if reached is not None else None,
        read_from,  # type: ignore[arg-type]
        bool(queued),
        str(released) if released is not None else None,
        str(missing) if missing is not None else None,
        rows,  # type: ignore[arg-type]
        changed,  # type: ignore[arg-type]
    )


def written_version(metadata: Mapping[str, Any], partition: str | None) -> int | None:
    """The Delta version that wrote ``partition``, from its materialization's metadata: a ranged run lists the version
    that wrote each of its partitions (``partitions``: one commit for all of them, or one per piece of a range too long
    for one); its ``delta_version`` is the last one."""
    listed = metadata.get("partitions")
    for entry in listed.value if listed is not None and isinstance(listed.value, list) else []:
        if (
            isinstance(entry, dict)
            and entry.get("partition") == partition
            and isinstance(entry.get("delta_version"), int)
        ):
            return int(entry["delta_version"])
    version = metadata.get("delta_version")
    return version.value if version is not None and isinstance(version.value, int) else None


def written_counts(metadata: Mapping[str, Any], partition: str | None) -> tuple[int | None, int | None]:
    """The rows of ``partition`` after a materialization and how many of them it changed, from its metadata: a
    derived build lists each partition it wrote (``partitions``: its ``rows``, and ``keys_rebuilt`` when only the
    changed keys' rows were replaced; a whole write changed every row); an ODS hour's report gives its ``rows`` and,
    for late changes, the ``changed_rows`` it reports."""
    listed = metadata.get("partitions")
    for entry in listed.value if listed is not None and isinstance(listed.value, list) else []:
        if isinstance(entry, dict) and entry.get("partition") == partition:
            rows = entry.get("rows") if isinstance(entry.get("rows"), int) else None
            keys = entry.get("keys_rebuilt")
            return rows, keys if isinstance(keys, int) else rows
    rows_value, changed_value = metadata.get("rows"), metadata.get("changed_rows")
    rows = rows_value.value if rows_value is not None and isinstance(rows_value.value, int) else None
    changed = changed_value.value if changed_value is not None and isinstance(changed_value.value, int) else None
    return rows, changed


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _partition(key: str | None) -> str:
    """The store's key of an event's partition: an unpartitioned asset's events (a static table's) carry none, and
    its one partition is the whole table."""
    return WHOLE if key is None else key


def _read_from(started: int | None, storage_id: int, materialization: AssetMaterialization) -> int:
    """Where a materialization's reading of its inputs began: its run's start, or, for a run that waited for an
    upstream materialization before reading (a repair waiting for a re-ingested hour), that one."""
    begun = started if started is not None else storage_id
    waited = per_partition(materialization.metadata, READ_AFTER, materialization.partition or "")
    return max(begun, int(waited)) if waited else begun
