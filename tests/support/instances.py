"""Dagster test instances for long histories: one event log, its SQLite files in memory-backed storage.

A test instance stores thousands of events (every ODS hour reported, every check verdict). Two costs it does not need
are avoidable: ``instance_for_test``'s default event log creates a SQLite database per run besides an index database
(``one_event_log``: one database for every run, the same reads), and SQLite syncs its write-ahead log to disk at every
commit, several per stored event (``memory_backed_dir``: the instance's files on a memory-backed file system, where a
sync costs nothing). The instance stays a real one, on disk as far as Dagster and the ``warehouse`` commands that open
it by ``DAGSTER_HOME`` can tell; the lake and the landing area stay in pytest's temporary directories.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from dagster._core.storage.event_log import ConsolidatedSqliteEventLogStorage
from sqlalchemy import Engine, create_engine

# a RAM-backed file system (tmpfs) on Linux; elsewhere the instance lives in the usual temporary directory
MEMORY_BACKED = Path("/dev/shm")


@contextmanager
def memory_backed_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory on the memory-backed file system when the machine has one (else the default temporary
    directory), removed with everything in it on exit."""
    base = str(MEMORY_BACKED) if MEMORY_BACKED.is_dir() and os.access(MEMORY_BACKED, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix=prefix, dir=base) as name:
        yield Path(name)


def one_event_log(home: Path) -> dict[str, Any]:
    """``instance_for_test`` overrides: one SQLite event log under ``home`` for every run, not a database per run
    and an index database (about 1 s to create each run's on a loaded 2-core machine)."""
    storage = {"module": "dagster._core.storage.event_log", "class": "ConsolidatedSqliteEventLogStorage"}
    return {"event_log_storage": {**storage, "config": {"base_dir": str(home / "events")}}}


class PooledSqliteEventLog(ConsolidatedSqliteEventLogStorage):
    """Dagster's one-database SQLite event log, its connections kept in a pool: the stock one creates an engine and
    opens the file for every read and write, which makes storing an event about twice as slow as Dagster's in-memory
    storage (5 times slower than this, measured with 600 materializations). Connections may be used by the thread of
    a backfill's runs as well as the test's (SQLite's write-ahead log, as before, keeps the readers off the writer)."""

    @cached_property
    def _engine(self) -> Engine:
        return create_engine(self._conn_string, connect_args={"timeout": 30, "check_same_thread": False})

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        with self._engine.connect() as connection, connection.begin():
            yield connection

    def has_table(self, table_name: str) -> bool:
        """Whether the database has the table, asked once per table: the stock storage asks with a new engine on
        every check verdict it stores (an ingestion judging a month of hours stores thousands), and the schema
        does not lose a table while the instance is open."""
        if table_name not in self._tables_present:
            with self._engine.connect() as connection:
                if self._engine.dialect.has_table(connection, table_name):
                    self._tables_present.add(table_name)
        return table_name in self._tables_present

    @cached_property
    def _tables_present(self) -> set[str]:
        return set()

    def dispose(self) -> None:
        super().dispose()
        self._engine.dispose()


def pooled_event_log(home: Path) -> dict[str, Any]:
    """``instance_for_test`` overrides: :func:`one_event_log` with its connections pooled
    (:class:`PooledSqliteEventLog`), for the instances that store a month of hour reports."""
    return {
        "event_log_storage": {
            "module": __name__,
            "class": "PooledSqliteEventLog",
            "config": {"base_dir": str(home / "events")},
        }
    }
