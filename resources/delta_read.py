"""Reading the lake's Delta tables with delta-rs, without a JVM: what the Dagster process, its sensors and
``warehouse why`` need to know about a table without starting Spark.

:class:`DeltaReader` opens a table at ``<lake root>/<key parts>`` (a version of it, for time travel) and reads
from its log: versions, schema, history, application transaction versions, the live files of some partitions
and their counts (rows marked deleted by deletion vectors subtracted); and rows, through delta-rs's DataFusion
reader, the one that applies deletion vectors (:meth:`DeltaReader.read_rows`). Nothing here writes;
:class:`resources.delta_lake.DeltaStore` writes, and delegates its reads here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError

from resources.storage import DeltaLayerError, filesystem

PartitionSpec = Mapping[str, str]
"""One partition: partition column → value, e.g. ``{"dt": "2024-03-05", "hh": "13"}``."""

# The key of a key-scoped write's user metadata naming, per column, the values its replaceWhere held it to: every row
# the commit removed or wrote holds one of them, so its readers learn what it changed from its log entry alone
REPLACED = "warehouse.replaced"


@dataclass
class ReadStats:
    files_in_table: int = 0
    files_after_partition_pruning: int = 0
    files_read: int = 0
    bytes_read: int = 0
    version: int | None = None


def arrow_table(data: Any) -> pa.Table:
    """A pyarrow table of what delta-rs returns (arro3 tables and readers), through the Arrow C stream interface:
    ``pa.table`` would first import pandas to ask whether it is a data frame, a quarter of a second of a cold
    ``warehouse sql``."""
    return pa.RecordBatchReader.from_stream(data).read_all()


class _Commit(NamedTuple):
    partitions: frozenset[tuple[tuple[str, str], ...]]  # those its data-changing actions name
    restored: int | None  # a RESTORE's: the version it restored the table to (-1 when its entry does not say)
    at: float | None = None  # when it was committed (epoch seconds, its commitInfo's timestamp), if its entry says
    # a key-scoped write's: column → the values every row it removed or wrote holds there (:data:`REPLACED`)
    replaced: Mapping[str, tuple[Any, ...]] | None = None


@functools.lru_cache(maxsize=65536)  # a commit's entry never changes: each is read once per process
def _commit(uri: str, version: int) -> _Commit:
    """What one commit changed, from its log entry; FileNotFoundError (never cached) without its entry."""
    fs, base = filesystem(uri + "/_delta_log")
    with fs.open_input_stream(f"{base}/{version:020d}.json") as entry:
        lines = entry.read().decode().splitlines()
    found = set()
    restored = None
    at = None
    replaced = None
    for line in lines:
        action = json.loads(line) if line.strip() else {}
        for kind in ("add", "remove"):
            file = action.get(kind)
            if file and file.get("dataChange", True) and file.get("partitionValues"):
                found.add(tuple(sorted((k, str(v)) for k, v in file["partitionValues"].items())))
        info = action.get("commitInfo")
        if isinstance(info, dict) and isinstance(info.get("timestamp"), int | float):
            at = info["timestamp"] / 1000
        if isinstance(info, dict) and str(info.get("operation", "")).upper() == "RESTORE":
            target = (info.get("operationParameters") or {}).get("version")
            restored = int(str(target)) if str(target).isdigit() else -1  # unsaid: as if restored to before any version
        if isinstance(info, dict):
            replaced = _replaced(info.get("userMetadata")) or replaced
    return _Commit(frozenset(found), restored, at, replaced)


def _replaced(user_metadata: object) -> dict[str, tuple[Any, ...]] | None:
    """What a key-scoped write recorded in its commit's user metadata under :data:`REPLACED`, if it did."""
    if not isinstance(user_metadata, str) or not user_metadata.startswith("{"):
        return None
    try:
        recorded = json.loads(user_metadata).get(REPLACED)
    except ValueError:
        return None
    if not isinstance(recorded, dict):
        return None
    return {str(c): tuple(v) for c, v in recorded.items() if isinstance(v, list)}


class Restore(NamedTuple):
    """A RESTORE commit that rolled a partition's write back."""

    version: int  # the RESTORE's commit
    restored: int  # the version it restored the table to (-1: its entry does not say)


def _checkpoint_version(uri: str) -> int:
    """The version of the table's latest checkpoint (``_delta_log/_last_checkpoint``), -1 without one."""
    fs, base = filesystem(uri + "/_delta_log")
    try:
        with fs.open_input_stream(f"{base}/_last_checkpoint") as pointer:
            return int(json.loads(pointer.read().decode())["version"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: Any) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _sql_partitions(specs: Sequence[PartitionSpec] | None) -> str | None:
    """The partitions as one SQL condition on their columns (None: every partition; FALSE: none)."""
    if specs is None:
        return None
    if not specs:
        return "FALSE"
    terms = [" AND ".join(f"{_identifier(c)} = {_literal(v)}" for c, v in spec.items()) or "TRUE" for spec in specs]
    return " OR ".join(f"({t})" for t in terms)


def uses_deletion_vectors(dt: DeltaTable) -> bool:
    return "deletionVectors" in (dt.protocol().reader_features or [])


def deleted_rows(dt: DeltaTable) -> dict[str, int]:
    """Rows marked deleted per data file (its path relative to the table, unquoted) by the table's deletion
    vectors; nothing is read from a table whose protocol has none."""
    if not uses_deletion_vectors(dt):
        return {}
    base = unquote(dt.table_uri.rstrip("/") + "/")
    out: dict[str, int] = {}
    for batch in dt.deletion_vectors():
        vectors = pa.record_batch(batch)
        for uri, keep in zip(vectors["filepath"].to_pylist(), vectors["selection_vector"].to_pylist(), strict=True):
            path = unquote(str(uri))
            out[path[len(base) :] if path.startswith(base) else path] = keep.count(False)
    return out


@dataclass
class DeltaReader:
    """The lake's tables as delta-rs reads them. ``root`` is already normalized
    (:func:`resources.storage.normalize_root`); ``storage_options`` are delta-rs's."""

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)
    # per table URI, what :meth:`rolled_back` read of its log: (first version, last version, its restores)
    _scanned: dict[str, tuple[int, int, dict[int, int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def table_uri(self, key: Sequence[str] | str) -> str:
        parts = [key] if isinstance(key, str) else list(key)
        for part in parts:
            if not part or "/" in part or part.startswith((".", "_")):
                raise DeltaLayerError(f"invalid table key part {part!r} in {parts}")
        return self.root + "/" + "/".join(parts)

    def table(self, key: Sequence[str] | str, version: int | None = None) -> DeltaTable | None:
        """The table (at ``version`` if given), None when it does not exist."""
        try:
            return DeltaTable(self.table_uri(key), version=version, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def exists(self, key: Sequence[str] | str) -> bool:
        return DeltaTable.is_deltatable(self.table_uri(key), storage_options=self.storage_options or None)

    def version(self, key: Sequence[str] | str, at: int | None = None) -> int | None:
        """The table's current version (or ``at`` if that version is still readable), None without a table."""
        dt = self.table(key, at)
        return None if dt is None else int(dt.version())

    def arrow_schema(self, key: Sequence[str] | str) -> pa.Schema | None:
        dt = self.table(key)
        return None if dt is None else pa.schema(dt.schema().to_arrow())  # type: ignore[call-overload]

    # rows: every read of a table's rows without a JVM -----------------------------------------------------
    def read_rows(
        self,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        where: str | None = None,
    ) -> tuple[pa.Table, ReadStats]:
        """The rows of ``partitions`` (all without) that match ``where`` (a SQL condition), read by delta-rs's
        DataFusion reader: the one way the product reads a table's rows without Spark, with the table's own
        column types. An empty table (no columns) when the table does not exist.

        DataFusion applies deletion vectors, which delta-rs's Arrow dataset path refuses: a table merged by
        Spark marks replaced and deleted rows in them instead of rewriting its files. The partitions prune
        files from the log first, so a read of a few partitions costs the same in a table of any size; the
        stats say how many files they selected.
        """
        dt = self.table(key, version)
        if dt is None:
            return pa.table({}), ReadStats()
        wanted = _sql_partitions(partitions)
        condition = " AND ".join(f"({c})" for c in (wanted, where) if c is not None)
        schema = pa.schema(dt.schema().to_arrow())  # type: ignore[call-overload]
        names = list(columns) if columns else schema.names
        missing = [c for c in names if c not in schema.names]
        if missing:
            raise DeltaLayerError(f"{self.table_uri(key)} has no column(s) {missing}")
        query = f"SELECT {', '.join(_identifier(c) for c in names)} FROM {_identifier('rows')}"
        if condition:
            query += f" WHERE {condition}"
        reader = QueryBuilder().register("rows", dt).execute(query)
        # DataFusion reads strings as views: the callers see the table's own types
        rows = arrow_table(reader).cast(pa.schema([schema.field(c) for c in names]))
        files = 0 if wanted == "FALSE" else len(dt.file_uris(file_pruning_predicate=wanted))
        # files_in_table stays 0: counting them would cost what the pruning saves
        return rows, ReadStats(0, files, files, version=int(dt.version()))

    def count_rows(
        self, key: Sequence[str] | str, partitions: Sequence[PartitionSpec], by: Sequence[str]
    ) -> dict[tuple[str, ...], int]:
        """Live rows per value of the partition columns ``by`` in ``partitions``, counted by DataFusion (deletion
        vectors applied): the files of those partitions are read, never the whole table's deletion vectors."""
        dt = self.table(key)
        if dt is None or not partitions:
            return {}
        columns = ", ".join(_identifier(c) for c in by)
        query = (
            f"SELECT {columns}, count(*) AS n FROM {_identifier('rows')} WHERE {_sql_partitions(partitions)} "
            f"GROUP BY {columns}"
        )
        counted = arrow_table(QueryBuilder().register("rows", dt).execute(query)).to_pylist()
        return {tuple(str(row[c]) for c in by): int(row["n"]) for row in counted}

    def live_aggregates(self, tables: Mapping[str, tuple[Sequence[str] | str, int]], query: str) -> dict[str, Any]:
        """The one row of ``query``, an aggregate over ``tables`` (the name it reads → a table and its version), run
        by delta-rs's DataFusion reader in this process: deletion vectors applied, only the columns the query names
        read, partitions pruned by its conditions. A check over a whole partition reads a column or two of it this
        way in a fraction of what a Spark job costs."""
        builder = QueryBuilder()
        for name, (key, version) in tables.items():
            dt = self.table(key, version)
            if dt is None:
                raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
            builder = builder.register(name, dt)
        rows = arrow_table(builder.execute(query)).to_pylist()
        if len(rows) != 1:
            raise DeltaLayerError(f"an aggregate query returned {len(rows)} rows: {query}")
        return rows[0]

    # application transactions: how far an exactly-once writer got ---------------------------------------
    def app_versions(self, key: Sequence[str] | str, app_ids: Iterable[str]) -> dict[str, int]:
        """The last version committed for each app id (0 for none, or when the table does not exist)."""
        dt = self.table(key)
        return {app_id: (dt.transaction_version(app_id) if dt is not None else None) or 0 for app_id in app_ids}

    def app_version(self, key: Sequence[str] | str, app_id: str) -> int | None:
        """The last version committed for ``app_id`` (e.g. an ingestion position), or None."""
        dt = self.table(key)
        return None if dt is None else dt.transaction_version(app_id)

    # the log: file selection (no data read), history ----------------------------------------------------
    def live_files(
        self,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        version: int | None = None,
        deletions: bool = True,
    ) -> tuple[list[dict[str, Any]], ReadStats]:
        """The table's live files in ``partitions`` (every live file without), from the Delta log: delta-rs's
        add actions plus ``deleted_records``, the rows its deletion vector marks deleted, and ``live_records``, the
        rows a reader sees (``num_records`` counts every row the file stores). Without ``deletions`` the deletion
        vectors are not read (delta-rs reads every one of the table's): those two keys are left out."""
        dt = self.table(key, version)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        actions = arrow_table(dt.get_add_actions(flatten=True)).to_pylist()
        stats = ReadStats(files_in_table=len(actions), version=dt.version())
        if partitions is not None:
            wanted = {tuple(sorted((k, str(v)) for k, v in p.items())) for p in partitions}
            cols = sorted({k for p in partitions for k in p})
            actions = [a for a in actions if tuple(sorted((c, a.get(f"partition.{c}")) for c in cols)) in wanted]
        deleted = deleted_rows(dt) if actions and deletions else {}
        for action in actions if deletions else []:
            action["deleted_records"] = deleted.get(unquote(str(action["path"])), 0)
            action["live_records"] = int(action.get("num_records") or 0) - action["deleted_records"]
        stats.files_after_partition_pruning = stats.files_read = len(actions)
        stats.bytes_read = sum(int(a["size_bytes"]) for a in actions)
        return actions, stats

    def partition_files(self, key: Sequence[str] | str) -> dict[tuple[tuple[str, str], ...], tuple[int, int]] | None:
        """Per partition (its sorted column values; ``()`` for an unpartitioned table), how many live files the
        table's current version lists and how many of those are absent from storage: one read of the log's add
        actions and one listing of the table's folder, no data read. None when the table does not exist."""
        dt = self.table(key)
        if dt is None:
            return None
        actions = arrow_table(dt.get_add_actions(flatten=True)).to_pylist()
        fs, base = filesystem(self.table_uri(key))
        listed = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        base = base.rstrip("/") + "/"
        present = {i.path[len(base) :] for i in listed if i.type == pafs.FileType.File and i.path.startswith(base)}
        found: dict[tuple[tuple[str, str], ...], tuple[int, int]] = {}
        for action in actions:
            values = tuple(
                sorted((k.removeprefix("partition."), str(v)) for k, v in action.items() if k.startswith("partition."))
            )
            files, absent = found.get(values, (0, 0))
            found[values] = (files + 1, absent + (unquote(str(action["path"])) not in present))
        return found

    def has_deletion_vectors(self, key: Sequence[str] | str) -> bool:
        """Whether the table's writers may mark rows deleted in deletion vectors (its protocol allows them)."""
        dt = self.table(key)
        return dt is not None and uses_deletion_vectors(dt)

    def history(self, key: Sequence[str] | str, limit: int | None = None) -> list[dict[str, Any]]:
        """The newest commits first; the ``warehouse.*`` keys of a Spark commit's user metadata at the top
        level, as delta-rs writes them."""
        dt = self.table(key)
        commits = []
        for commit in [] if dt is None else dt.history(limit):
            commit = dict(commit)
            extra = commit.get("userMetadata")
            if isinstance(extra, str) and extra.startswith("{"):
                commit.update({k: v for k, v in json.loads(extra).items() if k.startswith("warehouse.")})
            commits.append(commit)
        return commits

    def partitions_written(self, key: Sequence[str] | str, after: int) -> list[dict[str, str]]:
        """The partitions whose rows the commits after version ``after`` changed: those of their data-changing
        add and remove actions (a rewrite such as OPTIMIZE changes no row), read from the commits' log entries. A
        commit whose entry the log no longer keeps is passed over."""
        return [dict(p) for p in sorted(self._last_written(key, after))]

    def partitions_written_at(self, key: Sequence[str] | str, after: int) -> list[tuple[dict[str, str], float | None]]:
        """:meth:`partitions_written`, each with the time of the latest of those commits that changed it (epoch
        seconds, from its entry's commitInfo; None when an entry changing it does not say)."""
        return [(dict(p), at) for p, at in sorted(self._last_written(key, after).items())]

    def _last_written(self, key: Sequence[str] | str, after: int) -> dict[tuple[tuple[str, str], ...], float | None]:
        """Partition → the time of the latest commit after ``after`` that changed its rows.

        Called on every readiness tick for every ODS table, where usually nothing was committed since: the entries
        after ``after`` are read until one is missing (one probe when there is none), and the table is opened only
        when a checkpoint past ``after`` says that entries may have been cleaned up."""
        uri = self.table_uri(key)
        commits: list[_Commit] = []
        version = after + 1
        while True:
            try:
                commits.append(_commit(uri, version))
            except FileNotFoundError:
                break
            version += 1
        if version == after + 1 and _checkpoint_version(uri) > after:
            dt = self.table(key)
            for cleaned in range(after + 1, -1 if dt is None else dt.version() + 1):
                try:
                    commits.append(_commit(uri, cleaned))
                except FileNotFoundError:
                    continue
        found: dict[tuple[tuple[str, str], ...], float | None] = {}
        for commit in commits:  # in version order: the latest commit's time stays
            found.update(dict.fromkeys(commit.partitions, commit.at))
        return found

    def rolled_back(
        self, key: Sequence[str] | str, written: Mapping[str, tuple[int, PartitionSpec]]
    ) -> dict[str, Restore]:
        """Of the partitions ``written`` (name → the version that wrote it, and its partition values; ``{}`` for an
        unpartitioned table), those whose write a RESTORE has rolled back since: the table's current version holds
        them as an older version did, with every file present. Read from the log's entries after the oldest of those
        versions; each entry is read once per reader (a restore whose entry the log no longer keeps is not seen).

        The current version's content is followed back through the restores: the commits after the newest restore
        are its own, then those of the version that restore went back to, and so on. A write among the commits a
        restore skipped is rolled back when a skipped commit up to it changed its partition (a write that reports
        the table's version rather than its own commit, an ODS hour's, is not taken for rolled back when the skipped
        commits never touched its partition)."""
        if not written:
            return {}
        uri = self.table_uri(key)
        current, restores = self._restores(uri, min(v for v, _ in written.values()) + 1)
        found: dict[str, Restore] = {}
        for name, (wrote, spec) in written.items():
            by = _restored_away(wrote, current, restores)
            if by is None:
                continue
            values = tuple(sorted((k, str(v)) for k, v in spec.items()))
            if not values or any(_changed(uri, c, values) for c in range(max(by.restored, -1) + 1, wrote + 1)):
                found[name] = by
        return found

    def _restores(self, uri: str, start: int) -> tuple[int, dict[int, int]]:
        """The table's current version and its RESTORE commits from ``start`` on (version → the version restored),
        from its log entries: those read by an earlier call are not read again, only the commits since."""
        first, current, restores = self._scanned.get(uri, (start, start - 1, {}))
        if first > start:  # older versions asked for than were scanned: from the start again
            first, current, restores = start, start - 1, {}
        restores = dict(restores)

        def read_on(version: int) -> int:
            """The restores of the entries from ``version`` on; the version of the first missing (the next one)."""
            while True:
                try:
                    commit = _commit(uri, version)
                except FileNotFoundError:
                    return version
                if commit.restored is not None:
                    restores[version] = commit.restored
                version += 1

        after = read_on(current + 1)
        if after == current + 1 == start and _checkpoint_version(uri) >= start:
            # the entries up to a checkpoint may have been cleaned up: those kept are read, then the ones after it
            for version in range(start, _checkpoint_version(uri) + 1):
                try:
                    commit = _commit(uri, version)
                except FileNotFoundError:
                    continue
                if commit.restored is not None:
                    restores[version] = commit.restored
            after = read_on(_checkpoint_version(uri) + 1)
        self._scanned[uri] = (first, after - 1, restores)
        return after - 1, restores

    def log_entries(self, key: Sequence[str] | str) -> int:
        """How many commit entries (``_delta_log/*.json``) the table's log holds."""
        fs, base = filesystem(self.table_uri(key) + "/_delta_log")
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        return sum(1 for i in infos if i.path.endswith(".json"))


def _changed(uri: str, version: int, partition: tuple[tuple[str, str], ...]) -> bool:
    """Whether a commit changed the partition's rows; True when its entry is gone (it may have)."""
    try:
        return partition in _commit(uri, version).partitions
    except FileNotFoundError:
        return True


def _restored_away(wrote: int, current: int, restores: Mapping[int, int]) -> Restore | None:
    """The restore that left the commit ``wrote`` out of the table's current version, None if that version holds it:
    from the newest restore back, the commits after a restore are kept, those between the version it restored and
    itself are not, and the walk goes on from the version it restored."""
    newest = current
    for at in sorted(restores, reverse=True):
        if at > newest:
            continue  # skipped itself by a later restore
        if wrote > at:
            return None
        if wrote > restores[at]:
            return Restore(at, restores[at])
        newest = restores[at]
    return None
