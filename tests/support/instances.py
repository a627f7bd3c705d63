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
from pathlib import Path
from typing import Any

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
