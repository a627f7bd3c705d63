"""The stack benches' ``Supervisor`` (bench/soak.py) stops its processes side by side, not one after the other."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.soak import Supervisor

WIND_DOWN_S = 1.5

# a stack process that takes WIND_DOWN_S to exit once asked (SIGTERM, or SIGINT as the daemon is asked)
SLOW_TO_STOP = f"""
import signal, sys, time
from pathlib import Path
def leave(*_):
    time.sleep({WIND_DOWN_S})
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
signal.signal(signal.SIGINT, leave)
Path(sys.argv[1]).touch()
while True:
    time.sleep(0.1)
"""


def test_the_processes_wind_down_at_the_same_time(tmp_path: Path) -> None:
    supervisor = Supervisor({}, tmp_path, port=0, spark_port=0)
    names = ("engine", "daemon", "webserver", "spark_connect")
    supervisor.commands = {name: [sys.executable, "-c", SLOW_TO_STOP, str(tmp_path / name)] for name in names}
    for name in names:
        supervisor.start(name)
    deadline = time.monotonic() + 120
    while not all((tmp_path / name).exists() for name in names):  # each has its handlers in place
        assert time.monotonic() < deadline, "the processes did not start"
        time.sleep(0.1)
    started = time.monotonic()
    supervisor.stop()
    took = time.monotonic() - started
    assert all(proc.poll() == 0 for proc in supervisor.procs.values())  # each left by its own handler, not killed
    assert took < 2.5 * WIND_DOWN_S, f"the four stopped one after the other: {took:.1f} s"
