"""Storage and status kept in step: the partitions whose data is gone from the lake, found, marked and rebuilt.

The state store says which partitions are materialized; the lake may disagree. A ``VACUUM`` with too short a
retention, a manual delete of a partition's files or a ``RESTORE`` of an older version leaves partitions that Dagster
still shows materialized, and that the dependency center would build on. :func:`reconcile` compares, per table, the
Delta log's live files (delta-rs's add actions, one read of the log and one listing of the table's folder: no data
read, no JVM) with the store's materialized partitions:

* a partition materialized in the store whose files the table's current version does not list (deleted, restored
  away), or lists but storage no longer holds (vacuumed, deleted by hand), is **gone**: it is marked missing by an
  observation of its asset in Dagster's event log (metadata ``lake: missing``, what was found, and the
  materialization whose data is gone). The store reads the mark as any event, so a rebuild of the store from the log
  keeps it; a partition marked missing counts as not materialized: the gate holds back what reads it, ``warehouse
  why`` names it, and the engine builds it again (its own candidate, as if new); a new materialization clears it;
* a partition whose files are all there, but whose latest materialization's write a ``RESTORE`` has rolled back (the
  table's current version holds it as a version older than the one that build recorded: read from the commits' log
  entries after it, each once per reader, and the engine keeps one), holds data older than the instance says: it is
  marked missing the same way, and built again;
* a partition whose latest materialization recorded no rows has no files to lose: it is not gone;
* a partition holding data in the lake that the instance never materialized is **reported**, never marked nor
  guessed (who wrote it, and whether it is right, is not the warehouse's to decide; nothing proves it orphaned, so
  the report never advises deleting it). Only what is finished is judged: an ODS table's hours hold rows before they
  are reported complete (the merge writes as the binlog arrives, the hour being ingested too), a partition whose
  window has not ended is not one Dagster lists yet (the week so far), and a partition with a run queued or in
  flight is being written: none of them is reported.

The report is one line per table that is out of step, never one per partition. The engine runs it on a cadence
(:class:`Reconciler`, ``WAREHOUSE_RECONCILE_SECONDS``); ``warehouse reconcile [TABLE]`` runs it on demand.
"""

from __future__ import annotations

import getpass
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dagster import AssetKey, AssetObservation, AssetRecordsFilter, DagsterInstance

from resources.delta_read import DeltaReader
from warehouse_assets.catalog import (
    BY_PERIOD,
    WHOLE,
    Catalog,
    Table,
    partition_key_from_values,
    partition_values_of,
    spelled_partition_key,
)
from warehouse_assets.center.state_store import PartitionState, PartitionStateStore, StateView
from warehouse_assets.materialize.gate import names
from warehouse_assets.materialize.validity import GONE, LAKE

log = logging.getLogger("warehouse.engine")

SHOWN = 6  # partitions named per table and finding; the rest counted
DAY_S = 86400


@dataclass
class TableReconciliation:
    """One table's partitions out of step with the lake."""

    table: str
    gone: dict[str, str] = field(default_factory=dict)  # partition → what was found, marked missing now
    unknown: list[str] = field(default_factory=list)  # data in the lake, never materialized in the instance

    @property
    def in_step(self) -> bool:
        return not (self.gone or self.unknown)

    def line(self) -> str:
        parts = []
        if self.gone:
            first = next(iter(self.gone.values()))
            parts.append(
                f"{len(self.gone)} partition(s) gone from the lake, marked missing and to be built again: "
                f"{names(list(self.gone), SHOWN)} ({first})"
            )
        if self.unknown:
            parts.append(
                f"{len(self.unknown)} partition(s) hold data in the lake that the instance never materialized: "
                f"{names(self.unknown, SHOWN)} (reported, not marked: materialize them if they are the warehouse's, "
                "or find out who wrote them)"
            )
        return f"{self.table}: " + "; ".join(parts)


@dataclass
class Reconciliation:
    tables: list[TableReconciliation]
    checked: int  # tables compared with the lake

    @property
    def gone(self) -> int:
        return sum(len(t.gone) for t in self.tables)

    def lines(self) -> list[str]:
        out = [t.line() for t in self.tables if not t.in_step]
        out.append(
            f"{self.checked} table(s) compared with the lake: "
            + (f"{len(out)} out of step, {self.gone} partition(s) marked missing" if out else "all in step")
        )
        return out


def lake_tables(catalog: Catalog, only: Sequence[str] | None = None) -> list[Table]:
    """The tables whose data is in the lake (external producers keep their own; an ODS table's completeness windows
    hold none), or those of ``only``."""
    if not only:  # a table at another site is in that site's lake, not in this one
        return [t for t in catalog if not t.is_external and not t.is_windows and not t.site]
    tables = [catalog.lookup(name) for name in only]
    for table in tables:
        if table.is_external:
            raise ValueError(f"{table.fqn} is an external table: its data is its producer's, not in the lake")
        if table.is_windows:
            raise ValueError(f"{table.fqn} is an ODS table's completeness windows: no data of its own in the lake")
        if table.site:
            raise ValueError(f"{table.fqn} is at site {table.site}: its data is in that site's lake, not in this one")
    return tables


def reconcile(
    instance: DagsterInstance,
    catalog: Catalog,
    store: PartitionStateStore,
    reader: DeltaReader,
    tables: Sequence[Table],
    by: str = "",
) -> Reconciliation:
    """Compare each of ``tables`` with the lake; mark the partitions gone from it missing (one observation each, in
    the instance's event log); report the partitions the lake holds that the instance never materialized."""
    found: list[TableReconciliation] = []
    who = by or getpass.getuser()
    # the lake first: a partition materialized after its read is not taken for one whose files are gone
    lakes = [(table, time.time(), reader.partition_files(table.key)) for table in tables]
    if all(lake is None for _, _, lake in lakes) and any(store.partitions_of(AssetKey(t.key)) for t in tables):
        # a lake root that holds none of the tables is a wrong root far more often than a lost lake: marking every
        # partition missing would rebuild the warehouse
        raise ValueError(
            f"none of the {len(tables)} table(s) has a Delta table under {reader.root}, though the instance has "
            "partitions of them: is WAREHOUSE_LAKE_ROOT right? Nothing was marked"
        )
    for table, read_at, lake in lakes:
        view = store.view()
        marks, unknown = _compare(instance, table, store, view, lake, read_at, reader)
        for partition, (reason, storage_id) in marks.items():
            instance.report_runless_asset_event(
                AssetObservation(
                    AssetKey(table.key),
                    description=f"missing from the lake: {reason}",
                    partition=None if partition == WHOLE else partition,
                    metadata={LAKE: GONE, "reason": reason, "materialization": storage_id, "found_by": who},
                )
            )
        found.append(TableReconciliation(table.fqn, {k: reason for k, (reason, _) in marks.items()}, unknown))
    return Reconciliation(found, len(tables))


def _compare(
    instance: DagsterInstance,
    table: Table,
    store: PartitionStateStore,
    view: StateView,
    lake: dict[tuple[tuple[str, str], ...], tuple[int, int]] | None,
    read_at: float,
    reader: DeltaReader,
) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """The partitions gone from the lake or restored to older data (partition → what was found, and the storage id of
    the materialization whose data is gone), and those the lake holds that the instance never materialized."""
    by_key: dict[str, tuple[int, int]] = {}
    strays: list[str] = []  # partition values that name no partition of the table
    for values, counts in (lake or {}).items():
        key = WHOLE if table.is_static else partition_key_from_values(table, dict(values))
        if key is None:
            if not _unfinished(table, dict(values), read_at):
                strays.append("/".join(f"{c}={v}" for c, v in values))
        else:
            by_key[key] = counts
    asset = AssetKey(table.key)
    keys = sorted({*store.partitions_of(asset), *by_key})
    states = view.states(asset, keys)
    marks: dict[str, tuple[str, int]] = {}
    unknown: list[str] = []
    for key in keys:
        state = states[key]
        files, absent = by_key.get(key, (0, 0))
        if state.in_progress or state.queued:
            continue  # a run is writing it: what the lake holds now says nothing yet
        built = state.storage_id if state.materialized else None
        if built is not None and (state.timestamp or 0) < read_at and (files == 0 or absent > 0):
            if not _built_empty(instance, table, state):
                marks[key] = (_gone(table, key, files, absent, lake is not None), built)
        elif state.storage_id is None and files > absent and not table.is_ods:
            unknown.append(key)
    if lake is not None:
        marks.update(_restored(table, {k: s for k, s in states.items() if k not in marks}, reader, read_at))
    return marks, [*unknown, *strays]


def _unfinished(table: Table, values: dict[str, str], read_at: float) -> bool:
    """Whether Delta partition values that name no partition Dagster lists spell one still in the making: any hour of
    an ODS table (merged before it is reported, the hour being ingested too), or a partition whose window had not
    ended when the lake was read (Dagster lists a time partition only once it has ended)."""
    period, own = table.period, values
    if table.is_regional:  # a region's day: its day, in the region's zone
        period, own = "daily", {k: v for k, v in values.items() if k != "region"}
    key = spelled_partition_key(period, own)
    if key is None:
        return False  # spells no partition at all: a stray, reported
    if table.is_ods:
        return True
    end = BY_PERIOD[period].time_window_for_partition_key(key).end.timestamp()
    # a region's day ends up to a day after the business zone's (its zone is behind): judged once both have ended
    return end + (DAY_S if table.is_regional else 0) > read_at


def _restored(
    table: Table, states: Mapping[str, PartitionState], reader: DeltaReader, read_at: float
) -> dict[str, tuple[str, int]]:
    """Of ``states``, the partitions whose latest materialization's write a Delta RESTORE has rolled back, their files
    all present: the table holds them as an older version did, older than what the instance recorded (partition →
    what was found, and the storage id of that materialization). Only a materialization that recorded its Delta
    version is judged."""
    written: dict[str, tuple[int, dict[str, str]]] = {}
    for key, state in states.items():
        if state.in_progress or state.queued or not state.materialized or (state.timestamp or 0) >= read_at:
            continue  # being written, not built, or built after the lake was read
        if state.delta_version is None or state.delta_version < 0:
            continue
        try:
            written[key] = (state.delta_version, {} if key == WHOLE else partition_values_of(table, key))
        except ValueError:  # a key of no partition of the table as declared now (its period or regions changed)
            continue
    found = {}
    for key, by in reader.rolled_back(table.key, written).items():
        to = f"version {by.restored}" if by.restored >= 0 else "an older version"
        reason = (
            f"the table was restored to {to} (RESTORE, Delta version {by.version}), before Delta version "
            f"{written[key][0]} that built it: its data is older than its latest materialization"
        )
        found[key] = (reason, states[key].storage_id or 0)
    return found


def _gone(table: Table, key: str, files: int, absent: int, exists: bool) -> str:
    """What was found of a partition whose data is gone, in words."""
    if not exists:
        return "the Delta table does not exist"
    if files == 0:
        values = {} if key == WHOLE else partition_values_of(table, key)
        where = f" for {'/'.join(f'{c}={v}' for c, v in values.items())}" if values else ""
        return f"the table's current Delta version lists no file{where} (deleted, or restored to an older version)"
    return f"{absent} of its {files} file(s) listed in the Delta log are gone from storage (vacuumed or deleted)"


def _built_empty(instance: DagsterInstance, table: Table, state: PartitionState) -> bool:
    """Whether the partition's latest materialization recorded that it wrote no rows (so it has no files to lose)."""
    partition = None if state.partition == WHOLE else state.partition
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(table.key), asset_partitions=[partition] if partition else None), limit=1
    ).records
    if not records or records[0].storage_id != state.storage_id or records[0].asset_materialization is None:
        return False
    metadata = records[0].asset_materialization.metadata
    listed = metadata.get("partitions")
    for entry in listed.value if listed is not None and isinstance(listed.value, list) else []:
        if isinstance(entry, dict) and entry.get("partition") == state.partition:
            return entry.get("rows") == 0
    rows = metadata.get("rows")
    written = metadata.get("partitions_written")
    single = written is None or written.value == 1  # a ranged run's rows are the sum over its partitions
    return rows is not None and rows.value == 0 and single


class Reconciler:
    """The engine's cadence: :func:`reconcile` of every lake table at most every ``every`` seconds, logging a table's
    line only when it differs from the previous sweep's (what is reported unknown stays so until someone acts)."""

    def __init__(self, instance: DagsterInstance, reader: DeltaReader, every: float):
        self.instance, self.reader, self.every = instance, reader, every
        self._at: float | None = None
        self._said: dict[str, str] = {}

    def due(self) -> bool:
        return self.every > 0 and (self._at is None or time.monotonic() - self._at >= self.every)

    def sweep(self, catalog: Catalog, store: PartitionStateStore) -> Reconciliation | None:
        """Reconcile every lake table of ``catalog`` against ``store`` if a sweep is due; None if not."""
        if not self.due():
            return None
        self._at = time.monotonic()
        result = reconcile(self.instance, catalog, store, self.reader, lake_tables(catalog), by="engine")
        said: dict[str, str] = {}
        for table in result.tables:
            if table.in_step:
                continue
            line = table.line()
            said[table.table] = line
            if table.gone or self._said.get(table.table) != line:
                log.warning("reconcile: %s", line)
        self._said = said
        return result
