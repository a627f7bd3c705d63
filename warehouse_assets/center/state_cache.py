"""The partition state store's rows kept in memory between reads, coherent with every writer of its file.

The resolver reads the states of each candidate's upstream windows on every call; at 10,000 tables those reads were
a fifth of its time, and almost none of the rows had changed since the previous call. The store keeps the rows it
read or wrote, valid for one *generation* of its file: a counter in the file that triggers bump on every insert,
update or delete of a partition row, whoever writes it (the engine's update, a ``warehouse`` command or a second
engine in another process, a reconciler's connection, raw SQL). Every read compares the file's generation with the
one its rows were kept at (one row read by its key): a change since by anyone else drops them all. The store's own
commits move the generation too; they put their rows into the kept ones and take the generation they committed
(dropping the others if another writer's commit came before theirs), so the engine's own updates cost no reload.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from typing import Generic, Protocol, TypeVar


class Keyed(Protocol):
    """A row of the store as kept: the store's partition state (the cache needs only where it belongs)."""

    @property
    def asset_key(self) -> str: ...

    @property
    def partition(self) -> str: ...


State = TypeVar("State", bound=Keyed)

GENERATION_SCHEMA = """
CREATE TABLE IF NOT EXISTS generation (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS partitions_inserted AFTER INSERT ON partitions BEGIN UPDATE generation SET n = n + 1; END;
CREATE TRIGGER IF NOT EXISTS partitions_updated AFTER UPDATE ON partitions BEGIN UPDATE generation SET n = n + 1; END;
CREATE TRIGGER IF NOT EXISTS partitions_deleted AFTER DELETE ON partitions BEGIN UPDATE generation SET n = n + 1; END;
"""

# rows kept at most (a few hundred bytes each): past it they are all dropped and read again as needed
ROWS_KEPT = 1_000_000


class RowCache(Generic[State]):
    """Partition states by asset key and partition, as the store's file held them at :attr:`generation`."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db
        if db.execute("SELECT 1 FROM generation").fetchone() is None:
            db.execute("INSERT OR IGNORE INTO generation VALUES (0, 0)")  # once per file: a reader writes nothing
        self._rows: dict[str, dict[str, State]] = {}
        self._size = 0
        self.generation: int | None = None  # of the rows kept; None: nothing kept

    def file_generation(self) -> int:
        return int(self._db.execute("SELECT n FROM generation WHERE id = 0").fetchone()[0])

    def rows_of(self, asset_key: str) -> dict[str, State]:
        """The rows of ``asset_key`` kept, once every kept row is dropped if anyone changed the file since."""
        generation = self.file_generation()
        if generation != self.generation:
            self.drop()
            self.generation = generation
        rows = self._rows.get(asset_key)
        if rows is None:
            rows = self._rows[asset_key] = {}
        return rows

    def keep(self, asset_key: str, read: Mapping[str, State]) -> None:
        """Rows just read, not kept before (the generation :meth:`rows_of` checked)."""
        if self._size + len(read) > ROWS_KEPT:
            self._clear()
        self._rows.setdefault(asset_key, {}).update(read)
        self._size += len(read)

    def written(self, before: int, after: int, states: Iterable[State]) -> None:
        """The store's own commit of ``states``, the file's generation read inside its transaction before and after
        its writes: they are the file's rows at ``after``; the others kept, unless another writer changed the file
        since they were kept."""
        if before != self.generation:
            self._clear()
        for state in states:
            rows = self._rows.setdefault(state.asset_key, {})
            self._size += state.partition not in rows
            rows[state.partition] = state
        self.generation = after
        if self._size > ROWS_KEPT:
            self._clear()

    def drop(self) -> None:
        """Forget every row, and the generation they were kept at."""
        self._clear()
        self.generation = None

    def _clear(self) -> None:
        self._rows.clear()
        self._size = 0
