"""Column lineage at the code location's load, read from a cache instead of the SQL.

Reading every table's SQL with sqlglot at load would make the load grow with the SQL (at 10,000 tables, seconds).
Like SQLMesh's cache of optimised queries, each table's :class:`TableLineage` is kept under a key of what decides it:
the table, its SQL text, the columns of each table it reads (its inputs' schemas), the columns the build adds, and the
versions of sqlglot and of this module's format. A cold load computes each table once and writes the file; a warm load
reads it and parses no SQL. A changed SQL or an upstream column added changes the key of that table alone (and of the
tables whose inputs' columns it changes), so only those are computed again.

One JSON file per catalog folder, under ``$DAGSTER_HOME/column_lineage/`` (else beside the catalog), rewritten whole
with the entries of the last load (so it never grows with old SQL), through a temporary file and a rename: the code
server, the daemon and each run load the code location at once, and a reader sees either file, never half of one. A
cache that cannot be read or written is logged and the lineage computed: the load never fails for it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import sqlglot

from warehouse_assets.catalog.lineage import ColumnRef, TableLineage, WarehouseLineage
from warehouse_assets.catalog.model import Catalog

log = logging.getLogger(__name__)

FORMAT = 1  # raised when what is stored, or how lineage is computed from the SQL, changes
CACHE_FOLDER = "column_lineage"


def lineage_key(table: str, sql: str, inputs: Mapping[str, Sequence[str]], added: Sequence[str]) -> str:
    """What decides a table's lineage, hashed: its SQL, its inputs' columns, the columns its build adds."""
    what = [FORMAT, sqlglot.__version__, table, sql, sorted((t, list(c)) for t, c in inputs.items()), list(added)]
    return hashlib.sha256(orjson.dumps(what)).hexdigest()


def cache_path(catalog: Catalog, dagster_home: str | None) -> Path | None:
    """Where the catalog's lineage is kept: under ``dagster_home`` (one file per catalog folder), else beside the
    catalog's table folders; None for a catalog of no files (built in memory)."""
    files = [t.path for t in catalog if getattr(t, "path", None) is not None]
    if not files:
        return None
    root = files[0].resolve().parents[1]  # tables/<layer>/<file>
    if dagster_home:
        name = hashlib.sha256(str(root).encode()).hexdigest()[:16]
        return Path(dagster_home).expanduser() / CACHE_FOLDER / f"{name}.json"
    return root / f".{CACHE_FOLDER}.json"


@dataclass
class LineageCache:
    """The lineage of each table by :func:`lineage_key`, read from ``path`` when first asked; :meth:`save` writes what
    this load used. ``computed`` counts the tables whose lineage was not in the cache."""

    path: Path | None
    computed: int = 0
    read: int = 0
    _stored: dict[str, dict[str, object]] | None = None
    _used: dict[str, dict[str, object]] = field(default_factory=dict)

    def get(
        self, table: str, sql: str, inputs: Mapping[str, Sequence[str]], added: Sequence[str]
    ) -> TableLineage | None:
        key = lineage_key(table, sql, inputs, added)
        entry = self._entries().get(key)
        if entry is None:
            return None
        try:
            found = _decode(entry)
        except (KeyError, TypeError, ValueError) as exc:  # an entry of another shape: computed again
            log.warning("column lineage cache %s: entry unreadable (%s), computing it", self.path, exc)
            return None
        self._used[key] = entry
        self.read += 1
        return found

    def put(
        self, table: str, sql: str, inputs: Mapping[str, Sequence[str]], added: Sequence[str], lineage: TableLineage
    ) -> None:
        self._used[lineage_key(table, sql, inputs, added)] = _encode(lineage)
        self.computed += 1

    def save(self) -> None:
        """Write the entries of this load, if any was computed or any stored one went unused."""
        if self.path is None or (not self.computed and self._used.keys() == self._entries().keys()):
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.path.parent, prefix=self.path.name, delete=False) as out:
                out.write(orjson.dumps({"format": FORMAT, "tables": self._used}))
            os.chmod(out.name, 0o644)  # the temporary file's 0600 would keep the other processes' users out
            os.replace(out.name, self.path)
        except OSError as exc:
            log.warning("column lineage cache %s not written (%s): the next load computes it again", self.path, exc)

    def _entries(self) -> dict[str, dict[str, object]]:
        if self._stored is None:
            self._stored = {}
            if self.path is not None and self.path.exists():
                try:
                    stored = orjson.loads(self.path.read_bytes())
                    if stored.get("format") == FORMAT:
                        self._stored = stored["tables"]
                except (OSError, orjson.JSONDecodeError, AttributeError, KeyError) as exc:
                    log.warning("column lineage cache %s unreadable (%s): computing the lineage", self.path, exc)
        return self._stored


def lineage_at_load(catalog: Catalog, dagster_home: str | None) -> tuple[WarehouseLineage, LineageCache]:
    """Every table's lineage, from the cache where its key is there, computed (and stored) where not."""
    cache = LineageCache(cache_path(catalog, dagster_home))
    lineage = WarehouseLineage(catalog, cache=cache)
    lineage.all()
    cache.save()
    return lineage, cache


def _refs(refs: frozenset[ColumnRef]) -> list[list[str]]:
    return [[ref.table, ref.column] for ref in sorted(refs)]


def _encode(lineage: TableLineage) -> dict[str, object]:
    return {
        "table": lineage.table,
        "inputs": list(lineage.inputs),
        "columns": {name: _refs(refs) for name, refs in lineage.columns.items()},
        "rows": _refs(lineage.rows),
        "unresolved": dict(lineage.unresolved),
    }


def _decode(entry: Mapping[str, object]) -> TableLineage:
    def refs(found: object) -> frozenset[ColumnRef]:
        if not isinstance(found, list):
            raise TypeError("not a list of columns")
        return frozenset(ColumnRef(table, column) for table, column in found)

    columns = entry["columns"]
    unresolved = entry["unresolved"]
    inputs = entry["inputs"]
    if not isinstance(columns, dict) or not isinstance(unresolved, dict) or not isinstance(inputs, list):
        raise TypeError("not a table's lineage")
    return TableLineage(
        str(entry["table"]),
        tuple(inputs),
        {name: refs(found) for name, found in columns.items()},
        refs(entry["rows"]),
        unresolved,
    )
