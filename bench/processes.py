"""What the benches that start the stack share: a free port, and killing what a stack left behind."""

import os
import signal
import socket
from pathlib import Path

# How long a bench's stop waits after its SIGTERM to what the stack left behind (``stop_marked``) before SIGKILL. When
# eta_real's quick run ends the stack is still catching up, and a process of the warm launcher (``python -m
# warehouse_assets.instance.warm_launcher``) outlived its SIGTERM for the whole 10 s default in each run looked at.
# The bench's figures are taken by then: nothing it reports depends on how the leftovers end
LEFTOVER_GRACE_S = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_stragglers(marker: str) -> None:
    """Kill what the stack left behind (a code server may outlive dagster dev), found by its environment."""
    needle = marker.encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
