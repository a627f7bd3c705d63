"""One decision at a time across the instance's processes (the daemon, the webserver, the run workers): an exclusive
``flock`` on a file under the instance's directory, released when the block ends or the process dies."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold the lock named by ``path`` (created with its directory if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
