"""The dev stack's log file: what ``warehouse dev`` and every process it starts print, copied into ``dev.log`` without
ANSI escape codes. The terminal keeps them (Dagster colours its run lines whatever its output is); a file read with
``less`` or ``grep`` would show them as ``[32m`` noise.

The copy sits at the file descriptors: stdout and stderr of this process become pipes, which every child inherits,
and a thread per pipe passes each chunk on to the original descriptor as is and each whole line, stripped, to the file.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from pathlib import Path
from typing import BinaryIO

# CSI sequences (colours, bold, cursor moves: ESC [ parameters letter) and OSC ones (a terminal's title or link)
ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def strip_ansi(line: bytes) -> bytes:
    return ANSI.sub(b"", line)


class DevLog:
    """Copies this process's stdout and stderr, and its future children's, into ``path`` without escape codes.
    :meth:`start` once, :meth:`stop` at the end (it restores the descriptors and writes what is still pending)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()
        self._saved: list[int] = []  # the original descriptors 1 and 2
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
            stream.flush()
            original = os.dup(fd)
            read, write = os.pipe()
            os.dup2(write, fd)
            os.close(write)
            self._saved.append(original)
            thread = threading.Thread(target=self._copy, args=(read, original), name=f"dev-log-{fd}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Give descriptors 1 and 2 back and wait (``timeout`` seconds at most) for the copies to reach the end of
        their pipes, which they do once no child holds them any more."""
        for fd, stream, original in zip((1, 2), (sys.stdout, sys.stderr), self._saved, strict=True):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
            os.dup2(original, fd)
        for thread in self._threads:
            thread.join(timeout)
        for original in self._saved:
            os.close(original)
        self._saved = []
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _copy(self, read: int, terminal: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read, 65536):
                with contextlib.suppress(OSError):  # a closed terminal must not stop the file's copy
                    _write_all(terminal, chunk)
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()  # a line's end may come with the next chunk, an escape code with it
                if lines:
                    self._write(b"".join(strip_ansi(line) + b"\n" for line in lines))
            if pending:
                self._write(strip_ansi(pending) + b"\n")
        finally:
            os.close(read)

    def _write(self, data: bytes) -> None:
        with self._lock:
            if self._file is not None:
                self._file.write(data)
                self._file.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
