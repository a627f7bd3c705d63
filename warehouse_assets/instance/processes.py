"""This machine's processes as Linux's /proc shows them: the one place that reads it.

The dev stack's stop and the warm run launcher look processes up by what Dagster does not hand them: the group a
process is in, its parent, its command line, a mark in its environment. Every reader tolerates a process ending
while it reads (its files vanish): a process gone is answered like one that never was.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessStat:
    """The fields of ``/proc/PID/stat`` the product reads."""

    state: str  # R running, S sleeping, ..., Z a zombie: ended, its parent not told yet
    parent: int
    group: int
    start: int  # clock ticks since boot: with the PID, it names one process for good (PIDs are reused)

    @property
    def running(self) -> bool:
        return self.state != "Z"


def all_pids() -> list[int]:
    """Every process of this machine."""
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def process_stat(pid: int) -> ProcessStat | None:
    """``pid``'s state, parent, process group and start, or None when there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    with contextlib.suppress(ValueError, IndexError):
        return ProcessStat(state=fields[0], parent=int(fields[1]), group=int(fields[2]), start=int(fields[19]))
    return None


def command_line(pid: int) -> list[bytes]:
    """``pid``'s arguments, the program first; [] when there is no such process (or it is a kernel thread)."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return []
    return argv[:-1] if argv and argv[-1] == b"" else argv


def environment_holds(pid: int, entry: str) -> bool:
    """Whether ``entry`` (``NAME=value``) is in ``pid``'s environment; False for a process gone or not ours."""
    try:
        return entry.encode() + b"\0" in (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
