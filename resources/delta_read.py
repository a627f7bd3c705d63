"""Reading the lake's Delta tables with delta-rs, without a JVM: what the Dagster process, its sensors and
``warehouse why`` need to know about a table without starting Spark.

:class:`DeltaReader` opens a table at ``<lake root>/<key parts>`` (a version of it, for time travel) and reads
from its log: versions, schema, history, application transaction versions, the live files of some partitions
and their counts, and the rows of the small tables the warehouse keeps about itself or a producer's table
(Arrow reads the files the log selects). Nothing here writes; :class:`resources.delta_lake.DeltaStore`
writes, and delegates its reads here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from resources.storage import DeltaLayerError, filesystem

PartitionSpec = Mapping[str, str]
"""One partition: partition column → value, e.g. ``{"dt": "2024-03-05", "hh": "13"}``."""


@dataclass
class ReadStats:
    files_in_table: int = 0
    files_after_partition_pruning: int = 0
    files_read: int = 0
    bytes_read: int = 0
    version: int | None = None


def _conjunction(specs: Sequence[PartitionSpec]) -> list[tuple[str, str, Any]] | None:
    """The partitions as one delta-rs filter (``=`` on the columns they share a value of, ``in`` on one that
    varies), or None when they do not fit one conjunction (the caller then filters rows itself)."""
    if not specs or any(set(s) != set(specs[0]) for s in specs):
        return None
    filters: list[tuple[str, str, Any]] = []
    for column in specs[0]:
        values = sorted({str(s[column]) for s in specs})
        filters.append((column, "=", values[0]) if len(values) == 1 else (column, "in", values))
    return filters if sum(op == "in" for _, op, _ in filters) <= 1 else None


@dataclass
class DeltaReader:
    """The lake's tables as delta-rs reads them. ``root`` is already normalized
    (:func:`resources.storage.normalize_root`); ``storage_options`` are delta-rs's."""

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)

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

    # rows: the small tables the warehouse keeps about itself, a producer's table --------------------------
    def read_rows(
        self,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        where: pc.Expression | None = None,
    ) -> tuple[pa.Table, ReadStats]:
        """The rows of ``partitions`` (all without), read by Arrow from the files the Delta log selects,
        that match ``where`` (Arrow skips the row groups whose statistics exclude it).

        The stats say how many files were read: partition pruning keeps a read of a few partitions the
        same size however many partitions the table has. An empty table (no rows) when it does not exist.
        """
        dt = self.table(key, version)
        if dt is None:
            return pa.table({}), ReadStats()
        # delta-rs selects the files by partition before Arrow sees them: a few partitions cost the same in a
        # table of any size. The Arrow filter then keeps exactly the wanted partitions.
        dataset = dt.to_pyarrow_dataset(file_pruning_predicate=_conjunction(partitions or []))
        selected = None
        for spec in partitions or []:
            term = None
            for column, value in spec.items():
                equal = pc.field(column) == str(value)
                term = equal if term is None else term & equal
            selected = term if selected is None else selected | term
        if partitions is not None and selected is None:  # no partition wanted: nothing to read
            selected = pc.scalar(False)
        if where is not None:
            selected = where if selected is None else selected & where
        fragments = list(dataset.get_fragments(filter=selected))
        rows = dataset.to_table(columns=list(columns) if columns else None, filter=selected)
        # files_in_table stays 0: counting them would cost what the pruning saves
        stats = ReadStats(0, len(fragments), len(fragments), version=int(dt.version()))
        return rows, stats

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
    ) -> tuple[list[dict[str, Any]], ReadStats]:
        """The table's live files in ``partitions`` (every live file without), from the Delta log."""
        dt = self.table(key, version)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        stats = ReadStats(files_in_table=len(actions), version=dt.version())
        if partitions is not None:
            wanted = {tuple(sorted((k, str(v)) for k, v in p.items())) for p in partitions}
            cols = sorted({k for p in partitions for k in p})
            actions = [a for a in actions if tuple(sorted((c, a.get(f"partition.{c}")) for c in cols)) in wanted]
        stats.files_after_partition_pruning = stats.files_read = len(actions)
        stats.bytes_read = sum(int(a["size_bytes"]) for a in actions)
        return actions, stats

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

    def log_entries(self, key: Sequence[str] | str) -> int:
        """How many commit entries (``_delta_log/*.json``) the table's log holds."""
        fs, base = filesystem(self.table_uri(key) + "/_delta_log")
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        return sum(1 for i in infos if i.path.endswith(".json"))
