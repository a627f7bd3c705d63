"""The dependency center's ledger: what the resolver decided and still owes, beside the partition state store.

The state store (:mod:`warehouse_assets.center.state_store`) says what *is*: each partition's state, rebuilt from
Dagster's event log at any time. The ledger says what the center *decided*, which no event records: the requests it
made (so that the same upstream state is never requested twice, also after a restart), the plans not submitted yet,
the partitions deferred while their own run waits or runs, the candidates a budgeted call left for the next one, the
taints it planned after late failed verdicts, the cursor and clock it resolved through, and the partitions whose
late data waits for their late-data policy (*stale*). The resolver is handed a ledger and keeps no tables of its own,
so its module reads as scheduling rules.

Both live in one SQLite file (the store's), in WAL mode: ``warehouse why`` and ``warehouse status`` read the stale
partitions while the engine writes. Every write of a resolver call happens in one transaction (:meth:`Ledger.batch`).
Losing the file loses decisions, not data: the store is rebuilt from the log, and a new ledger starts where the store
is (the partitions ready before it are a backfill's), as a new engine does.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from resources.settings import current
from warehouse_assets.catalog.lineage_events import LineageEvents, lineage_events
from warehouse_assets.center.ledger_cache import GENERATION_SCHEMA, KeptRecords, LedgerCache, Record, records_of

_SCHEMA = """
CREATE TABLE IF NOT EXISTS center_requests (table_fqn, partition, upstream, requested_at,
    PRIMARY KEY (table_fqn, partition, upstream)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS center_deferred (table_fqn, partition, PRIMARY KEY (table_fqn, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS center_cursor (id INTEGER PRIMARY KEY CHECK (id = 0), storage_id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS center_clock (id INTEGER PRIMARY KEY CHECK (id = 0), at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS center_pending (request_id TEXT PRIMARY KEY, planned_at REAL NOT NULL, plan TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS center_backlog (table_fqn, partition, by_clock INTEGER NOT NULL, trigger TEXT NOT NULL,
    PRIMARY KEY (table_fqn, partition));
CREATE TABLE IF NOT EXISTS center_taints (table_fqn, partition, storage_id INTEGER NOT NULL, taint TEXT NOT NULL,
    marked TEXT NOT NULL, PRIMARY KEY (table_fqn, partition, storage_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS center_stale (table_fqn, partition, since REAL NOT NULL, due REAL, changes INTEGER NOT NULL,
    upstream TEXT NOT NULL, policy TEXT NOT NULL, note TEXT NOT NULL, PRIMARY KEY (table_fqn, partition)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS center_stale_due ON center_stale (due);
CREATE TABLE IF NOT EXISTS center_rebuilds (table_fqn, partition, origin REAL NOT NULL, changes INTEGER NOT NULL,
    planned_at REAL NOT NULL, PRIMARY KEY (table_fqn, partition)) WITHOUT ROWID;
"""

Candidate = tuple[str, str]  # (table fqn, partition)


@dataclass(frozen=True)
class Stale:
    """A built partition behind its inputs: late data arrived after its build and its rebuild waits for the policy
    (``due``, epoch seconds), or will not come automatically (``due`` None: the policy says never, or the partition is
    beyond the policy's lookback; ``note`` says which)."""

    table: str
    partition: str
    since: float  # when the first late change it has not absorbed was seen (or, through a rebuilt upstream, made)
    due: float | None
    changes: int  # late changes seen since: what its rebuild absorbs
    upstream: str  # the upstream state last seen (the request key): a new one is one more late change
    policy: str  # the policy in words
    note: str  # "" or why no rebuild is due

    def describe(self, timezone: tzinfo) -> str:
        """``stale: late data since 2026-03-06 14:05+08:00 (3 changes), rebuild due 2026-03-06 15:05+08:00 (policy every
        1 h, lookback 3 d)``."""

        def local(at: float) -> str:  # its offset named: the UI shows instants in UTC
            return datetime.fromtimestamp(at, timezone).isoformat(sep=" ", timespec="minutes")

        changes = f"{self.changes} late change{'s' if self.changes != 1 else ''}"
        when = f"rebuild due {local(self.due)}" if self.due is not None else self.note or "no rebuild due"
        if self.due is not None and self.note:
            when += f"; {self.note}"
        return f"stale: late data since {local(self.since)} ({changes}), {when} (policy {self.policy})"


@dataclass(frozen=True)
class Rebuild:
    """A rebuild the center requested: the late change it absorbs first appeared at ``origin``, so a downstream
    partition late because of it is as late as that change, not as its rebuild."""

    origin: float
    changes: int
    planned_at: float  # when the rebuild was requested: the policy's interval counts from it


class Ledger:
    """The resolver's decisions, in the SQLite file at ``path`` (the state store's)."""

    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = path
        self.events: LineageEvents | None = None  # partitions becoming stale, told to the catalog once committed
        self._told: list[Stale] = []
        # the stale and rebuild records read or written, while the file's generation says they are its own
        self._stale_kept: KeptRecords[Stale] = KeptRecords()
        self._rebuilds_kept: KeptRecords[Rebuild] = KeptRecords()
        # of each partition, a request key known to be recorded (the latest asked about or made): a partition
        # looked at again with nothing new upstream asks about that key
        self._requests_kept: KeptRecords[str] = KeptRecords()
        self._kept: LedgerCache | None = None  # a reader's file may have no generation: it keeps nothing
        if readonly:
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
            return
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # as the store's connection to the same file: a commit is not synced to disk until the next checkpoint, so
        # only a power loss, never a crash of the process, can take back the latest calls (the file stays a
        # consistent prefix of both writers' commits); a sync per call was most of a call's time on a real disk
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._db.executescript(GENERATION_SCHEMA)
        self._kept = LedgerCache(self._db, [self._stale_kept, self._rebuilds_kept, self._requests_kept])
        self.events = lineage_events(current())

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction for every write of a resolver call: all of them or none."""
        self._db.execute("BEGIN IMMEDIATE")
        kept = self._kept
        try:
            if kept is not None:
                kept.begin()
            yield
            generation = kept.committing() if kept is not None else None
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if kept is not None:
                kept.undone()
            self._told.clear()
            raise
        if kept is not None and generation is not None:
            kept.committed(generation)
        self._tell()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """A resolver call's reads: the records kept are checked against the file once, as they begin (each read
        would check otherwise, which cost as much as the reads it saved)."""
        if self._kept is None or self._kept.in_reading:
            yield
            return
        self._kept.check()
        self._kept.in_reading = True
        try:
            yield
        finally:
            self._kept.in_reading = False

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write of kept records inside a transaction of the ledger's: the caller's batch, or one of its own."""
        if self._kept is None or self._kept.in_own_transaction:
            yield
            return
        if self._db.in_transaction:  # someone else's on this connection: whether it commits is not known here
            try:
                yield
            finally:
                self._kept.drop()
            return
        with self.batch():
            yield

    def _tell(self) -> None:
        """The stale partitions this transaction recorded, to the catalog (after the commit: never what it undid)."""
        if self.events is None or self._db.in_transaction:
            return
        told, self._told = self._told, []
        for s in told:
            detail = {"due": s.due, "changes": s.changes, "policy": s.policy, "note": s.note}
            self.events.state_changed(s.table, s.partition, "stale", detail)

    # --- cursor and clock ------------------------------------------------------------------------------------------

    def start_at(self, storage_id: int) -> None:
        """A new ledger starts at the store's cursor: what was ready before it is a backfill's."""
        self._db.execute("INSERT OR IGNORE INTO center_cursor VALUES (0, ?)", (storage_id,))

    @property
    def resolved_through(self) -> int:
        return int(self._db.execute("SELECT storage_id FROM center_cursor").fetchone()[0])

    def set_resolved_through(self, storage_id: int) -> None:
        self._db.execute("UPDATE center_cursor SET storage_id = ?", (storage_id,))

    def clock(self) -> float | None:
        """The time of the last resolver call (epoch seconds); None before the first."""
        row = self._db.execute("SELECT at FROM center_clock").fetchone()
        return None if row is None else float(row[0])

    def advance_clock(self, at: float) -> None:
        self._db.execute(
            "INSERT INTO center_clock VALUES (0, ?) ON CONFLICT (id) DO UPDATE SET at = max(at, excluded.at)", (at,)
        )

    # --- requests and deferrals ------------------------------------------------------------------------------------

    def requested(self, fqn: str, partition: str, upstream: str) -> bool:
        if self._kept is not None:
            self._kept.current()
            if self._requests_kept.of(fqn).get(partition) == upstream:
                return True
        query = "SELECT 1 FROM center_requests WHERE table_fqn = ? AND partition = ? AND upstream = ?"
        found = self._db.execute(query, (fqn, partition, upstream)).fetchone() is not None
        if found and self._kept is not None:
            self._kept.keep(self._requests_kept, fqn, {partition: upstream})
        return found

    def last_request(self, fqn: str, partition: str) -> str | None:
        """The upstream key of the partition's latest request (what its latest build was requested on)."""
        query = (
            "SELECT upstream FROM center_requests WHERE table_fqn = ? AND partition = ? "
            "ORDER BY requested_at DESC LIMIT 1"
        )
        row = self._db.execute(query, (fqn, partition)).fetchone()
        return None if row is None else str(row[0])

    def record_requests(self, requests: Iterable[tuple[str, str, str]], at: float) -> None:
        requests = list(requests)
        with self._writing():
            self._db.executemany(
                "INSERT OR IGNORE INTO center_requests VALUES (?, ?, ?, ?)", [(*r, at) for r in requests]
            )
            for fqn, partition, upstream in requests:
                self._requests_kept.put(fqn, partition, upstream)

    def forget_requests_before(self, at: float) -> None:
        with self._writing():
            self._db.execute("DELETE FROM center_requests WHERE requested_at < ?", (at,))
            self._db.execute("DELETE FROM center_rebuilds WHERE planned_at < ?", (at,))
            self._requests_kept.clear()  # which keys went is the file's to say
            for rows in self._rebuilds_kept.by_table.values():
                for partition, rebuild in rows.items():
                    if rebuild is not None and rebuild.planned_at < at:
                        rows[partition] = None

    def request_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM center_requests").fetchone()[0])

    def deferred(self, fqn: str, partition: str) -> bool:
        query = "SELECT 1 FROM center_deferred WHERE table_fqn = ? AND partition = ?"
        return self._db.execute(query, (fqn, partition)).fetchone() is not None

    def set_deferred(self, settled: Sequence[Candidate], deferred: Sequence[Candidate]) -> None:
        self._db.executemany("DELETE FROM center_deferred WHERE table_fqn = ? AND partition = ?", settled)
        self._db.executemany("INSERT OR IGNORE INTO center_deferred VALUES (?, ?)", deferred)

    # --- plans not submitted yet -----------------------------------------------------------------------------------

    def pending(self) -> list[tuple[str, str]]:
        """(request id, plan as JSON), oldest first."""
        rows = self._db.execute("SELECT request_id, plan FROM center_pending ORDER BY planned_at, rowid")
        return [(str(r), str(p)) for r, p in rows]

    def add_pending(self, request_id: str, plan: str, at: float) -> bool:
        """Record a plan to submit unless it is pending already."""
        known = self._db.execute("SELECT 1 FROM center_pending WHERE request_id = ?", (request_id,))
        if known.fetchone() is not None:
            return False
        self._db.execute("INSERT INTO center_pending VALUES (?, ?, ?)", (request_id, at, plan))
        return True

    def add_pendings(self, plans: Iterable[tuple[str, str]], at: float) -> None:
        self._db.executemany("INSERT INTO center_pending VALUES (?, ?, ?)", [(r, at, p) for r, p in plans])

    def submitted(self, request_id: str) -> None:
        self._db.execute("DELETE FROM center_pending WHERE request_id = ?", (request_id,))

    # --- taints planned after late failed verdicts -----------------------------------------------------------------

    def holds(self) -> list[tuple[str, str, int, str, str]]:
        """(table, partition, storage id, taint JSON, marked JSON) of each planned taint."""
        rows = self._db.execute("SELECT table_fqn, partition, storage_id, taint, marked FROM center_taints")
        return [tuple(r) for r in rows.fetchall()]  # type: ignore[misc]

    def set_holds(self, added: Iterable[tuple[str, str, int, str, str]], stale: Iterable[tuple[str, str, int]]) -> None:
        self._db.executemany("INSERT OR IGNORE INTO center_taints VALUES (?, ?, ?, ?, ?)", list(added))
        self._db.executemany(
            "DELETE FROM center_taints WHERE table_fqn = ? AND partition = ? AND storage_id = ?", list(stale)
        )

    # --- late data waiting for its policy --------------------------------------------------------------------------

    def stale(self, fqn: str, partitions: Sequence[str]) -> dict[str, Stale]:
        """The stale records of those of ``partitions`` that have one."""
        return self._read_through(self._stale_kept, fqn, partitions, self._read_stale)

    def _read_stale(self, fqn: str, partitions: Sequence[str]) -> dict[str, Stale]:
        found: dict[str, Stale] = {}
        for chunk in _chunks(partitions, 500):
            marks = ", ".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT * FROM center_stale WHERE table_fqn = ? AND partition IN ({marks})", (fqn, *chunk)
            )
            found.update({row[1]: Stale(*row) for row in rows})
        return found

    def due(self, at: float) -> list[Candidate]:
        """The stale partitions whose rebuild is due at ``at``: the policy's time came."""
        rows = self._db.execute("SELECT table_fqn, partition FROM center_stale WHERE due <= ? ORDER BY due", (at,))
        return [(str(t), str(p)) for t, p in rows]

    def all_stale(self) -> list[Stale]:
        return [Stale(*row) for row in self._db.execute("SELECT * FROM center_stale ORDER BY since")]

    def mark_stale(self, entries: Iterable[Stale]) -> None:
        entries = list(entries)
        with self._writing():
            self._db.executemany(
                "INSERT OR REPLACE INTO center_stale VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(s.table, s.partition, s.since, s.due, s.changes, s.upstream, s.policy, s.note) for s in entries],
            )
            for s in entries:
                self._stale_kept.put(s.table, s.partition, s)
        if self.events is not None:
            self._told.extend(entries)
            self._tell()  # outside a batch: now; inside: when it commits

    def park_stale(self, candidates: Iterable[Candidate], at: float) -> None:
        """The stale partitions among ``candidates`` whose rebuild was due at ``at`` and was not requested (an input
        is not ready): no longer looked at by the clock, their next change decides."""
        candidates = list(candidates)
        with self._writing():
            self._db.executemany(
                "UPDATE center_stale SET due = NULL, note = 'waiting for its inputs' "
                "WHERE table_fqn = ? AND partition = ? AND due <= ?",
                [(fqn, partition, at) for fqn, partition in candidates],
            )
            for fqn, partition in candidates:
                self._stale_kept.forget(fqn, partition)

    def clear_stale(self, candidates: Iterable[Candidate]) -> None:
        candidates = list(candidates)
        with self._writing():
            self._db.executemany("DELETE FROM center_stale WHERE table_fqn = ? AND partition = ?", candidates)
            for fqn, partition in candidates:
                self._stale_kept.put(fqn, partition, None)

    def rebuilds(self, fqn: str, partitions: Sequence[str]) -> dict[str, Rebuild]:
        """The rebuilds requested of these partitions, by partition (the latest of each)."""
        return self._read_through(self._rebuilds_kept, fqn, partitions, self._read_rebuilds)

    def _read_through(
        self,
        kept: KeptRecords[Record],
        fqn: str,
        partitions: Sequence[str],
        read: Callable[[str, Sequence[str]], dict[str, Record]],
    ) -> dict[str, Record]:
        """The records of those of ``partitions`` that have one: from ``kept`` where it holds them for the file's
        generation, the rest read from the file by ``read`` and kept (a partition without a record too)."""
        if self._kept is None:
            return read(fqn, partitions)
        self._kept.current()
        held = kept.of(fqn)
        unread = [p for p in dict.fromkeys(partitions) if p not in held]
        if unread:
            found = read(fqn, unread)
            self._kept.keep(kept, fqn, {p: found.get(p) for p in unread})
        return records_of(kept, fqn, partitions)

    def _read_rebuilds(self, fqn: str, partitions: Sequence[str]) -> dict[str, Rebuild]:
        found: dict[str, Rebuild] = {}
        for chunk in _chunks(partitions, 500):
            marks = ", ".join("?" * len(chunk))
            rows = self._db.execute(
                "SELECT partition, origin, changes, planned_at FROM center_rebuilds"
                f" WHERE table_fqn = ? AND partition IN ({marks})",
                (fqn, *chunk),
            )
            found.update({p: Rebuild(origin, changes, at) for p, origin, changes, at in rows})
        return found

    def record_rebuilds(self, rebuilds: Iterable[tuple[str, str, Rebuild]]) -> None:
        rebuilds = list(rebuilds)
        with self._writing():
            self._db.executemany(
                "INSERT OR REPLACE INTO center_rebuilds VALUES (?, ?, ?, ?, ?)",
                [(fqn, partition, r.origin, r.changes, r.planned_at) for fqn, partition, r in rebuilds],
            )
            for fqn, partition, rebuild in rebuilds:
                self._rebuilds_kept.put(fqn, partition, rebuild)

    # --- the backlog ----------------------------------------------------------------------------------------------

    def backlog(self, encode: Callable[[Any], Any], decode: Callable[[Any], Any]) -> Backlog:
        """The persisted backlog, its triggers turned to JSON-able data by ``encode`` and back by ``decode``."""
        return Backlog(self._db, encode, decode)


class Backlog:
    """The candidates a budgeted call left for the next: new changes' before the clock's, each kind first come first
    out, and their mirror in ``center_backlog`` (written by :meth:`persist` inside the caller's transaction)."""

    def __init__(self, db: sqlite3.Connection, encode: Callable[[Any], Any], decode: Callable[[Any], Any]):
        self._db, self._encode = db, encode
        self._events: OrderedDict[Candidate, Any] = OrderedDict()
        self._clock: OrderedDict[Candidate, Any] = OrderedDict()
        rows = db.execute("SELECT table_fqn, partition, by_clock, trigger FROM center_backlog ORDER BY rowid")
        for fqn, partition, by_clock, trigger in rows:
            (self._clock if by_clock else self._events)[(fqn, partition)] = decode(json.loads(trigger))
        self._persisted = {*self._events, *self._clock}
        self._added: list[tuple[Candidate, Any, bool]] = []

    def __len__(self) -> int:
        return len(self._events) + len(self._clock)

    def add(self, candidate: Candidate, trigger: Any, *, by_clock: bool) -> None:
        """Queue ``candidate`` unless it is queued already (then its first trigger stands)."""
        if candidate not in self._events and candidate not in self._clock:
            (self._clock if by_clock else self._events)[candidate] = trigger
            self._added.append((candidate, trigger, by_clock))

    def pop(self) -> tuple[Candidate, Any]:
        return (self._events or self._clock).popitem(last=False)

    def persist(self, evaluated: Sequence[Candidate]) -> None:
        """Delete the evaluated candidates from ``center_backlog``, insert the ones added and still queued."""
        done = [c for c in evaluated if c in self._persisted]
        self._db.executemany("DELETE FROM center_backlog WHERE table_fqn = ? AND partition = ?", done)
        self._persisted.difference_update(done)
        queued = [(c, t, k) for c, t, k in self._added if c in self._events or c in self._clock]
        self._db.executemany(
            "INSERT INTO center_backlog VALUES (?, ?, ?, ?)",
            [(fqn, partition, int(by_clock), json.dumps(self._encode(t))) for (fqn, partition), t, by_clock in queued],
        )
        self._persisted.update(c for c, _, _ in queued)
        self._added = []


def open_readonly(path: Path) -> Ledger | None:
    """The ledger at ``path`` for a reader (``why``, ``status``), or None when no engine has written one."""
    if not path.exists():
        return None
    try:
        ledger = Ledger(path, readonly=True)
        ledger._db.execute("SELECT 1 FROM center_stale LIMIT 1")
    except sqlite3.Error:
        return None
    return ledger


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
