"""A real OpenLineage HTTP receiver for tests: ``http.server`` in a thread, keeping every event POSTed to it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.url = ""

    def runs(self, job: str, kind: str | None = None) -> list[dict[str, Any]]:
        """The run events of ``job`` (of type ``kind``), in the order received."""
        return [
            e
            for e in self.events
            if e.get("job", {}).get("name") == job and (kind is None or e.get("eventType") == kind)
        ]

    def states(self, table: str) -> list[tuple[str, str]]:
        """(partition, state) of each partition-state event of ``table``, in order."""
        facets = [e["dataset"]["facets"]["partitionState"] for e in self.events if "dataset" in e]
        return [(f["partition"], f["state"]) for f in facets if f["table"] == table]


@contextmanager
def lineage_receiver() -> Iterator[Receiver]:
    """A receiver on a free loopback port, stopped on exit."""
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.paths.append(self.path)
            received.events.append(json.loads(body))
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    received.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
