"""The ledger's late-data records and request keys kept in memory between reads, coherent with every writer of its
file.

The late-data rule asks, on every resolver call, whether each upstream partition of a late candidate is stale and
whether it was rebuilt for late data, and the resolver whether each partition it looks at was requested on its
current upstream state: at 1,000 tables those point reads were a fifth of the resolver's time, and almost every
answer was the one of the previous call (no record; the same key). The ledger keeps the records it read (an absent
one as None) or wrote, valid for one *generation* of its file: a counter in the file that triggers bump on every
insert, update or delete of a stale, rebuild or request record, whoever writes it (the engine's ledger, a second
engine, raw SQL). A read compares the file's generation with the one its records were kept at (a resolver
call's reads once, as the call begins: they are the call's view of the ledger, as the resolver's snapshot reads each
row once): a change since by anyone else drops them all. The ledger's own writes put their records
into the kept ones at once; its transaction starts by the same comparison (the write lock then keeps everyone else
out until it ends) and ends by taking the generation it committed, or by dropping everything when it is undone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

GENERATION_SCHEMA = """
CREATE TABLE IF NOT EXISTS center_generation (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
INSERT OR IGNORE INTO center_generation VALUES (0, 0);
""" + "".join(
    f"CREATE TRIGGER IF NOT EXISTS {table}_{event.lower()}d AFTER {event} ON {table} "
    "BEGIN UPDATE center_generation SET n = n + 1; END;\n"
    for table in ("center_stale", "center_rebuilds", "center_requests")
    for event in ("INSERT", "UPDATE", "DELETE")
)

# records kept at most (a few hundred bytes each): past it they are all dropped and read again as needed
RECORDS_KEPT = 1_000_000

Record = TypeVar("Record")


class KeptRecords(Generic[Record]):
    """One kind of record, by table and partition; None: the ledger has none for the partition."""

    def __init__(self) -> None:
        self.by_table: dict[str, dict[str, Record | None]] = {}
        self.size = 0

    def of(self, fqn: str) -> dict[str, Record | None]:
        rows = self.by_table.get(fqn)
        if rows is None:
            rows = self.by_table[fqn] = {}
        return rows

    def put(self, fqn: str, partition: str, record: Record | None) -> None:
        rows = self.of(fqn)
        self.size += partition not in rows
        rows[partition] = record

    def forget(self, fqn: str, partition: str) -> None:
        """Not known any more: read again when asked (a conditional write's outcome is the file's to say)."""
        rows = self.by_table.get(fqn)
        if rows is not None and rows.pop(partition, 0) != 0:
            self.size -= 1

    def clear(self) -> None:
        self.by_table.clear()
        self.size = 0


class LedgerCache:
    """The generation the ``kinds`` of records kept are the file's at (plus the ledger's own writes of the
    transaction under way)."""

    def __init__(self, db: sqlite3.Connection, kinds: Sequence[KeptRecords[Any]]):
        self._db, self._kinds = db, kinds
        self.generation: int | None = None  # of the records kept; None: nothing kept
        self.in_own_transaction = False
        self.in_reading = False  # a resolver call's reads: the generation was checked as it started

    def file_generation(self) -> int:
        return int(self._db.execute("SELECT n FROM center_generation WHERE id = 0").fetchone()[0])

    def current(self) -> None:
        """Drop every record kept if anyone changed the file since (inside the ledger's own transaction nobody else
        can, and its writes are kept as they are made; within a resolver call's reads it was checked as they began)."""
        if self.in_own_transaction or self.in_reading:
            return
        self.check()

    def check(self) -> None:
        generation = self.file_generation()
        if generation != self.generation:
            self.drop()
            self.generation = generation

    def keep(self, kept: KeptRecords[Record], fqn: str, read: Mapping[str, Record | None]) -> None:
        """Records just read (absent ones as None), at the generation :meth:`current` checked."""
        if sum(k.size for k in self._kinds) + len(read) > RECORDS_KEPT:
            for kind in self._kinds:  # none kept is true at any generation
                kind.clear()
        rows = kept.of(fqn)
        kept.size += sum(1 for p in read if p not in rows)
        rows.update(read)

    def begin(self) -> None:
        """The ledger's transaction started (holding the write lock)."""
        self.check()
        self.in_own_transaction = True

    def committing(self) -> int:
        """The file's generation once the transaction commits, read inside it."""
        return self.file_generation()

    def committed(self, generation: int) -> None:
        self.in_own_transaction = False
        self.generation = generation

    def undone(self) -> None:
        """The transaction rolled back: its writes kept are not the file's."""
        self.in_own_transaction = False
        self.drop()

    def drop(self) -> None:
        """Forget every record, and the generation they were kept at."""
        for kind in self._kinds:
            kind.clear()
        self.generation = None


def records_of(kept: KeptRecords[Record], fqn: str, partitions: Iterable[str]) -> dict[str, Record]:
    """The partitions' kept records that exist."""
    rows = kept.of(fqn)
    return {p: record for p in partitions if (record := rows.get(p)) is not None}
