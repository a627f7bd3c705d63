"""Benchmark: what placing a run on a compute pool costs (warehouse_assets/instance/pools.py), per run, in ms.

A Dagster instance on SQLite in a temporary folder and three pools (capacities 4, 8 and 4; the first has the label
``size=small``) whose endpoints are TCP listeners of this process, so each placement probes a real socket. Runs are
added one by one as the launcher sees them (STARTING); each is placed by ``place_run`` (the placement lock, the runs in
progress counted from the run storage, the offline file, one probe, the tags written), and the queue's limits the
run coordinator reads on every pass (``queue_limits``) are timed beside it. When every pool is full the oldest run
ends. Every placement is checked against the rule computed apart (the eligible pool with the most free capacity,
the first declared on a tie): ``wrong`` must be 0. A tenth of the runs require ``size=small``.

``place_p50_ms``/``place_p90_ms``: one placement; ``limits_p50_ms``: one computation of the queue's limits;
``history``: the finished runs in the storage when timing starts. The ``RESULT`` line carries ``calib_ms``
(``bench/calibration.py``).

    .venv/bin/python bench/placement.py            # 300 placements over 2,000 finished runs
    .venv/bin/python bench/placement.py --quick    # 30 placements over 50: seconds
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from bench.calibration import calib_ms
from warehouse_assets.instance.pools import (
    POOL_TAG,
    parse_pools,
    place_run,
    queue_limits,
    requirement_tags,
)

CAPACITIES = {"small": 4, "large": 8, "spare": 4}


def listener() -> tuple[socket.socket, int]:
    """A TCP endpoint that accepts and closes connections, as a Spark server's port answers a probe."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, int(server.getsockname()[1])


def expected(running: dict[str, int], small: bool) -> str | None:
    """The rule, computed apart: the eligible pool with the most free capacity, the first declared on a tie."""
    best, room = None, 0
    for name, capacity in CAPACITIES.items():
        if small and name != "small":
            continue
        free = capacity - running.get(name, 0)
        if free > room:
            best, room = name, free
    return best


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(placements: int, history: int) -> dict[str, str]:
    listeners = {name: listener() for name in CAPACITIES}
    spec = {
        name: {
            "url": f"sc://127.0.0.1:{port}",
            "capacity": CAPACITIES[name],
            "labels": {"size": "small"} if name == "small" else {},
        }
        for name, (_, port) in listeners.items()
    }
    pools = parse_pools(json.dumps(spec))
    with tempfile.TemporaryDirectory(prefix="placement_") as home:
        Path(home, "dagster.yaml").write_text("telemetry: {enabled: false}\n")
        with DagsterInstance.from_config(home) as instance:
            for _ in range(history):  # what a day of runs leaves in the storage
                instance.add_run(
                    DagsterRun(job_name="bench", run_id=str(uuid.uuid4()), status=DagsterRunStatus.SUCCESS)
                )
            place_ms, limit_ms, wrong = [], [], 0
            running: list[DagsterRun] = []
            for n in range(placements):
                small = n % 10 == 0
                run = instance.add_run(
                    DagsterRun(
                        job_name="bench",
                        run_id=str(uuid.uuid4()),
                        status=DagsterRunStatus.STARTING,
                        tags=requirement_tags({"size": "small"}) if small else {},
                    )
                )
                counts: dict[str, int] = {}
                for r in running:
                    counts[r.tags[POOL_TAG]] = counts.get(r.tags[POOL_TAG], 0) + 1
                while expected(counts, small) is None:  # full: the oldest run on a pool it could take ends
                    ended = next(r for r in running if not small or r.tags[POOL_TAG] == "small")
                    instance.report_run_canceled(ended)
                    running.remove(ended)
                    counts[ended.tags[POOL_TAG]] -= 1
                start = time.perf_counter()
                queue_limits(instance, pools, -1)
                limit_ms.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                placement = place_run(instance, run, pools)
                place_ms.append((time.perf_counter() - start) * 1000)
                chosen = placement.pool.name if placement.pool else None
                wrong += chosen != expected(counts, small)
                placed = instance.get_run_by_id(run.run_id)
                assert placed is not None
                running.append(placed)
    for server, _ in listeners.values():
        server.close()
    return {
        "place_p50_ms": f"{statistics.median(place_ms):.2f}",
        "place_p90_ms": f"{percentile(place_ms, 0.9):.2f}",
        "limits_p50_ms": f"{statistics.median(limit_ms):.2f}",
        "placements": str(placements),
        "history": str(history),
        "wrong": str(wrong),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 placements over 50 finished runs")
    parser.add_argument("--placements", type=int, default=300)
    parser.add_argument("--history", type=int, default=2000)
    args = parser.parse_args()
    placements, history = (30, 50) if args.quick else (args.placements, args.history)
    figures = run(placements, history)
    print("  ".join(f"{k}={v}" for k, v in figures.items()))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()) + f" calib_ms={calib_ms()}")
    return 1 if figures["wrong"] != "0" else 0


if __name__ == "__main__":
    sys.exit(main())
