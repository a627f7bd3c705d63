"""The dev stack's log file keeps what the terminal shows, its children's output included, without colour codes; the
terminal keeps them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from warehouse_assets.cli.dev_log import strip_ansi

GREEN, RESET = "\x1b[32m", "\x1b[0m"
# what `warehouse dev` does with it, in a process of its own: its descriptors 1 and 2 are the ones redirected
SCRIPT = textwrap.dedent(
    """
    import subprocess, sys
    from pathlib import Path
    from warehouse_assets.cli.dev_log import DevLog

    log = DevLog(Path(sys.argv[1]))
    log.start()
    print("\\x1b[32m[dev] the UI is up\\x1b[0m", flush=True)
    # a child writing to the inherited descriptors, an escape code split over two writes, stderr, no final newline
    child = (
        "import os, sys; os.write(1, b'run \\\\x1b[1;3'); os.write(1, b'4mSTEP_SUCCESS\\\\x1b[0m\\\\n'); "
        "sys.stderr.write('\\\\x1b]0;title\\\\x07warning: late\\\\n'); sys.stdout.write('no newline')"
    )
    subprocess.run([sys.executable, "-c", child], check=True)
    log.stop()
    print("after stop", flush=True)
    """
)


def test_the_log_file_has_no_escape_codes_and_the_terminal_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "dev.log"
    path.write_bytes(b"an earlier start\n")
    terminal = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path)], capture_output=True, check=True, cwd=Path(__file__).parents[2]
    )
    lines = path.read_text().splitlines()  # stdout and stderr are copied apart: their lines may interleave
    assert lines[:2] == ["an earlier start", "[dev] the UI is up"]
    assert sorted(lines[2:]) == ["no newline", "run STEP_SUCCESS", "warning: late"]
    assert f"{GREEN}[dev] the UI is up{RESET}".encode() in terminal.stdout
    assert b"run \x1b[1;34mSTEP_SUCCESS\x1b[0m\n" in terminal.stdout
    assert b"warning: late" in terminal.stderr and b"warning: late" not in terminal.stdout
    assert terminal.stdout.endswith(b"after stop\n") and b"after stop" not in path.read_bytes()


def test_strip_ansi_removes_colour_and_title_sequences_only() -> None:
    assert strip_ansi(b"\x1b[32m2026-11-29 13:21:09 +0800\x1b[0m - dagster - \x1b[1;31mERROR\x1b[0m") == (
        b"2026-11-29 13:21:09 +0800 - dagster - ERROR"
    )
    assert strip_ansi(b"\x1b]0;title\x07[x] [0m literal") == b"[x] [0m literal"


def test_the_engines_lines_name_the_zone_they_are_written_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack runs with TZ set to the business timezone; the engine's lines then read as Dagster's do, the offset
    named (before, a bare UTC time sat beside Dagster's +0800 lines)."""
    import io
    import logging
    import time

    from warehouse_assets.cli.services import engine_log_handler

    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    try:
        record = logging.LogRecord("warehouse.engine", logging.INFO, __file__, 1, "resolved", None, None)
        record.created = 1_764_400_000.0  # 2025-11-29 07:06:40 UTC
        line = engine_log_handler(io.StringIO()).format(record)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert line == "2025-11-29 15:06:40 +0800 [engine] resolved"
