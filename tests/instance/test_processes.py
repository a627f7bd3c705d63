"""The one reader of /proc: a process's stat fields, command line and environment, and a process gone meanwhile."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from warehouse_assets.instance.processes import all_pids, command_line, environment_holds, process_stat


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    # a program whose name holds a space and parentheses: the stat line's command field does, too
    program = tmp_path / "s (le) ep"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
    child = subprocess.Popen([str(program), "30"], env={**os.environ, "PROCESS_MARK": "test-7"}, start_new_session=True)
    # Popen returns as the exec begins: on a loaded machine the new image's arguments are not in /proc for a moment
    deadline = time.monotonic() + 10
    while not command_line(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    yield child
    child.kill()
    child.wait()


def test_a_process_reads_as_its_state_parent_group_start_command_and_environment(
    sleeper: subprocess.Popen[bytes],
) -> None:
    stat = process_stat(sleeper.pid)
    assert stat is not None and stat.running
    assert stat.parent == os.getpid()
    assert stat.group == sleeper.pid  # a session of its own: its own group
    again = process_stat(sleeper.pid)
    assert stat.start > 0 and again is not None and again.start == stat.start  # the same process, read again
    assert command_line(sleeper.pid)[1:] == [b"30"]
    assert command_line(sleeper.pid)[0].endswith(b"s (le) ep")
    assert environment_holds(sleeper.pid, "PROCESS_MARK=test-7")
    assert not environment_holds(sleeper.pid, "PROCESS_MARK=test-")  # a whole entry, not a prefix of one
    assert sleeper.pid in all_pids() and os.getpid() in all_pids()


def test_a_process_that_ended_reads_as_a_zombie_then_as_none(sleeper: subprocess.Popen[bytes]) -> None:
    sleeper.kill()
    deadline = time.monotonic() + 5
    while (stat := process_stat(sleeper.pid)) is not None and stat.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stat is not None and not stat.running  # ended, not reaped yet: a zombie until its parent waits
    sleeper.wait()
    assert process_stat(sleeper.pid) is None
    assert command_line(sleeper.pid) == []
    assert not environment_holds(sleeper.pid, "PROCESS_MARK=test-7")
