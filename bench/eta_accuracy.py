"""Benchmark: how good the predicted finish is, how early the SLA warning comes, and what one prediction costs.

**Accuracy.** The example warehouse's catalog is replayed over simulated days (``--warmup`` days that only fill the
history, then ``--days`` that are measured), by a discrete-event simulation of what the product does:

* every ODS hour is reported about 5 min after its end (normal noise, σ 1 min); ``ext.fx_rate`` about 1 h after its
  day, ``ext.marketing_spend`` about 6 h after (σ 15 min);
* a derived partition is queued 2 s after its last upstream partition is ready (and not before its window has
  ended), the queue starts runs first in, first out on ``--slots`` slots (the example instance's
  ``max_concurrent_runs``), and a run takes its table's own time times log-normal noise (σ ``--noise``);
* a late source: on the second measured day the partner's ``marketing_spend`` arrives at 09:20 the next morning, on
  the fourth the 23:00 hour of ``ods.order`` at 08:55 (``ads.daily_gmv`` and ``ads.marketing_roi`` are due at 09:00).

For every ADS partition of the measured days the prediction (:mod:`warehouse_assets.explain.eta`, on the simulated
state, history and queue at that moment: nothing of the future) is made at fixed times before its actual finish
(6 h, 3 h, 1 h, 30 min and 10 min): ``eta_err_p50_s``/``eta_err_p90_s`` are percentiles of |predicted − actual|.
Every partition with an SLA is also predicted every 5 min from its window's end until its deadline (or until it is
built); the first prediction past the deadline is the warning. ``misses``: partitions built after their deadline;
``warned``: misses warned before the deadline; ``warned_lead_p50_s``: how long before the deadline (median);
``false_warnings``: warned partitions that were on time.

**Self-consistency only.** The simulation is built on the predictor's own model: the same graph, a first-in,
first-out queue with the slot count the predictor is given, run times drawn around the medians it learns; no lanes,
priorities, ranged runs, retries, rebuilds or slowdown under load. Its figures are an upper bound of what the predictor
could do, not its accuracy; ``bench/eta_real.py`` scores the predictions the running stack recorded against its real
runs.

**Cost.** ``predict_p99_ms``: one prediction (a fresh predictor: nothing remembered from the previous one) of a
daily ADS partition at 20:00 of its day in a 10,000-table catalog of ``bench/automation_scale.py``'s generator
(every partition ended more than an hour before is built, the day's chain is not), P99 over ``--predictions``.

No Spark, no Dagster instance. The last line of stdout is the ``RESULT`` line, with the machine's ``calib_ms``
(``bench/calibration.py``). The figures are the machine's only on a quiet machine.

    .venv/bin/python bench/eta_accuracy.py            # the accuracy replay and the 10,000-table cost
    .venv/bin/python bench/eta_accuracy.py --quick    # fewer days, 1,000 tables: seconds
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
import tempfile
import time
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from automation_scale import generate_catalog

from bench.calibration import calib_ms
from warehouse_assets.catalog import WHOLE, Catalog, business_zone, load_catalog
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.explain.eta import NOT_BUILT, History, Node, Predictor, Queue, QueuedRun, RunTime, Seen
from warehouse_assets.explain.eta_instance import CatalogGraph
from warehouse_assets.materialize.freshness import deadline as sla_deadline
from warehouse_assets.materialize.gate import table_partitions_in_range

FIRST_DAY = date(2026, 3, 1)  # the first simulated day (history before it is built long ago)
HANDOFF_S = 2.0  # the dependency center's submission after the last upstream is ready
BEFORE = (6 * 3600, 3 * 3600, 3600, 1800, 600)  # predictions at these seconds before the actual finish
SCAN_S = 300  # an SLA partition is predicted this often until its deadline
# per layer, a table's run time is drawn once between these bounds (seconds)
RUN_S = {"dwd": (240, 600), "dws": (120, 360), "ads": (60, 240)}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


@dataclass
class Outcome:
    """What happened to one partition in the simulation."""

    ready: float  # built or arrived at
    queued: float | None = None
    start: float | None = None


class Simulation:
    """Simulated days of the catalog: when each source partition arrived, when each derived partition was queued,
    started and ended."""

    def __init__(
        self,
        catalog: Catalog,
        graph: CatalogGraph,
        start: datetime,
        end: datetime,
        late: Mapping[Node, float],
        args: argparse.Namespace,
    ):
        self.catalog, self.graph, self.slots, self.late = catalog, graph, args.slots, late
        self.start, self.end = start.timestamp(), end.timestamp()
        rng = random.Random(args.seed)
        self.base = {t.fqn: rng.uniform(*RUN_S.get(t.layer, (60, 240))) for t in catalog if not t.is_source}
        nodes = self._nodes()
        self.outcome: dict[Node, Outcome] = {}
        self.seq: dict[Node, int] = {}
        downstream: dict[Node, list[Node]] = defaultdict(list)
        waiting: dict[Node, int] = {}
        events: list[tuple[float, int, str, Node]] = []
        n = 0
        # in a fixed order: the draws below come one per node from one seeded stream, and a set's order changes
        # with each process's string hashing, which made two runs of one --seed differ
        for node in sorted(nodes):
            table = catalog[node[0]]
            if table.is_source:
                events.append((self._arrival(rng, node), n, "ready", node))
            else:
                ups = [u for u in graph.upstream(node) if u in nodes]
                for u in ups:
                    downstream[u].append(node)
                waiting[node] = len(ups)
                if not ups:  # everything it reads was built before the simulation: it runs once its window ends
                    events.append((graph.window_end(node) + HANDOFF_S, n, "queue", node))
            n += 1
        heapq.heapify(events)
        queue: list[tuple[float, int, Node]] = []
        busy = 0
        while events:
            at, _, kind, node = heapq.heappop(events)
            if kind == "queue":
                self.outcome[node] = Outcome(ready=math.inf, queued=at)
                self.seq[node] = n
                heapq.heappush(queue, (at, n, node))
                n += 1
            else:
                if kind == "ended":
                    busy -= 1
                    self.outcome[node].ready = at
                else:
                    self.outcome[node] = Outcome(ready=at)
                for down in downstream[node]:
                    waiting[down] -= 1
                    if waiting[down] == 0:
                        when = max(at, graph.window_end(down)) + HANDOFF_S
                        heapq.heappush(events, (when, n, "queue", down))
                        n += 1
            while queue and busy < self.slots:
                _, _, run = heapq.heappop(queue)
                busy += 1
                self.outcome[run].start = at
                took = self.base[run[0]] * math.exp(rng.gauss(0, args.noise))
                heapq.heappush(events, (at + took, n, "ended", run))
                n += 1
        self._index_history()

    def _nodes(self) -> set[Node]:
        first = datetime.fromtimestamp(self.start, business_zone())
        last = datetime.fromtimestamp(self.end, business_zone())
        # the product's own enumeration of a table's partitions, whole windows only: its period's keys, or for a table
        # with regions each region's day (``2026-03-05|utc``). A static table has no window: it is built long before
        # the simulation (SimStates says so), so it is no node of it.
        return {
            (table.fqn, key)
            for table in self.catalog
            if not table.is_static
            for key in table_partitions_in_range(table, first, last)
        }

    def _arrival(self, rng: random.Random, node: Node) -> float:
        end = self.graph.window_end(node)
        late = self.late.get(node)
        if late is not None:
            return late
        if node[0] == "ext.marketing_spend":
            return end + rng.gauss(6 * 3600, 900)
        if node[0] == "ext.fx_rate":
            return end + rng.gauss(3600, 600)
        return end + max(60.0, rng.gauss(300, 60))

    def _index_history(self) -> None:
        """Per table its runs by end time, per source its arrivals by time: what the instance would hold."""
        self.runs: dict[str, list[tuple[float, float]]] = defaultdict(list)  # table → (ended, seconds)
        self.arrivals: dict[str, list[tuple[float, float]]] = defaultdict(list)  # table → (arrived, delay)
        for (table, key), o in self.outcome.items():
            if o.start is not None:
                self.runs[table].append((o.ready, o.ready - o.start))
            elif self.catalog[table].is_source:
                self.arrivals[table].append((o.ready, o.ready - self.graph.window_end((table, key))))
        for series in (*self.runs.values(), *self.arrivals.values()):
            series.sort()

    # --- the view of the warehouse at a moment, as the predictor gets it from the instance ------------------------

    def history(self, now: float) -> History:
        def recent(series: list[tuple[float, float]]) -> list[float]:  # newest first, those known at ``now``
            return [v for _, v in reversed(series[: bisect_right(series, (now, math.inf))][-20:])]

        runs = {t: [RunTime(s) for s in recent(v)] for t, v in self.runs.items()}
        return History(runs=runs, arrivals={t: recent(v) for t, v in self.arrivals.items()})

    def queue(self, now: float) -> Queue:
        running, queued = [], []
        for node, o in self.outcome.items():
            if o.start is not None and o.start <= now < o.ready:
                running.append(QueuedRun(node[0], (node[1],), o.start))
            elif o.queued is not None and o.queued <= now and (o.start is None or now < o.start):
                queued.append((o.queued, self.seq[node], QueuedRun(node[0], (node[1],))))
        return Queue([*running, *(r for _, _, r in sorted(queued))], self.slots)

    def states(self, now: float) -> SimStates:
        return SimStates(self, now)

    def predictor(self, now: float) -> Predictor:
        return Predictor(self.graph, self.states(now), self.history(now), now, self.queue(now))


class SimStates:
    def __init__(self, sim: Simulation, now: float):
        self.sim, self.now = sim, now

    def seen(self, table: str, keys: Sequence[str]) -> dict[str, Seen]:
        out: dict[str, Seen] = {}
        for key in keys:
            o = self.sim.outcome.get((table, key))
            if o is None:  # before the simulation (or a static table): built long ago
                out[key] = Seen(ready_at=self.sim.start - 86400)
            elif o.ready <= self.now:
                out[key] = Seen(ready_at=o.ready)
            elif o.start is not None and o.start <= self.now:
                out[key] = Seen(started_at=o.start)
            elif o.queued is not None and o.queued <= self.now:
                out[key] = Seen(queued=True)
            else:
                out[key] = NOT_BUILT
        return out


def accuracy(args: argparse.Namespace) -> dict[str, float]:
    catalog = load_catalog()
    zone = business_zone()
    start = datetime.combine(FIRST_DAY, datetime.min.time(), zone)
    measured = [FIRST_DAY + timedelta(days=args.warmup + i) for i in range(args.days)]
    end = datetime.combine(measured[-1] + timedelta(days=2), datetime.min.time(), zone)  # the last day's morning too
    index = ReverseIndex.build(catalog, current_time=end)
    graph = CatalogGraph(catalog, index, end)
    late: dict[Node, float] = {}
    if len(measured) > 1:
        day = measured[1]
        late[("ext.marketing_spend", day.isoformat())] = _at(day + timedelta(days=1), 9, 20, zone)
    if len(measured) > 3:
        day = measured[3]
        late[("ods.order", f"{day.isoformat()}-23:00")] = _at(day + timedelta(days=1), 8, 55, zone)
    log(f"simulating {FIRST_DAY} … {end.date()} ({args.warmup} days of history, {args.days} measured)")
    sim = Simulation(catalog, graph, start, end, late, args)
    days = {d.isoformat() for d in measured}

    def measured_partition(node: Node) -> bool:
        return node[1][:10] in days and node[1] != WHOLE

    errors: list[float] = []
    ads = sorted(n for n in sim.outcome if catalog[n[0]].layer == "ads" and measured_partition(n))
    for table, key in ads:
        actual = sim.outcome[(table, key)].ready
        for before in BEFORE:
            at = actual - before
            predicted = sim.predictor(at).predict(table, key).finish
            errors.append(abs(predicted - actual))
    log(f"{len(errors)} predictions of {len(ads)} ADS partitions")

    misses = warned = false = 0
    leads: list[float] = []
    for node in sorted(sim.outcome):
        table = catalog[node[0]]
        if table.sla is None or not measured_partition(node) or table.is_source:
            continue
        due = sla_deadline(table, node[1]).timestamp()
        actual = sim.outcome[node].ready
        missed = actual > due
        misses += missed
        at = graph.window_end(node)
        warned_at = None
        while at < min(due, actual):
            if sim.predictor(at).predict(*node).finish > due:
                warned_at = at
                break
            at += SCAN_S
        if warned_at is not None and missed:
            warned += 1
            leads.append(due - warned_at)
        elif warned_at is not None:
            false += 1
        state = "MISSED" if missed else "on time"
        when = f", warned {(due - warned_at) / 60:.0f} min before" if warned_at is not None else ""
        log(f"  {node[0]} {node[1]}: ready {datetime.fromtimestamp(actual, zone):%m-%d %H:%M} ({state}{when})")
    return {
        "eta_err_p50_s": round(percentile(errors, 50)),
        "eta_err_p90_s": round(percentile(errors, 90)),
        "misses": misses,
        "warned": warned,
        "warned_lead_p50_s": round(statistics.median(leads)) if leads else float("nan"),
        "false_warnings": false,
    }


def _at(day: date, hour: int, minute: int, zone: ZoneInfo) -> float:
    return datetime.combine(day, datetime.min.time(), zone).replace(hour=hour, minute=minute).timestamp()


class HistoryUpTo:
    """The 10,000-table warehouse at 20:00 of a day: every partition ended an hour before is built."""

    def __init__(self, graph: CatalogGraph, now: float):
        self.graph, self.now = graph, now

    def seen(self, table: str, keys: Sequence[str]) -> Mapping[str, Seen]:
        out: dict[str, Seen] = {}
        for key in keys:
            end = self.graph.window_end((table, key))
            out[key] = Seen(ready_at=end + 600) if end + 3600 <= self.now else NOT_BUILT
        return out


def cost(args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory(prefix="eta-bench-") as tmp:
        root = Path(tmp)
        log(f"generating {args.tables:,} tables")
        generate_catalog(root, args.tables, args.seed)
        catalog = load_catalog(root)
        zone = business_zone()
        now = datetime(2026, 3, 10, 20, 0, tzinfo=zone)
        index = ReverseIndex.build(catalog, current_time=now)
        history = History(
            runs={t.fqn: [RunTime(120.0)] * 5 for t in catalog},
            arrivals={t.fqn: [300.0] * 5 for t in catalog if t.is_source},
        )
        targets = [t.fqn for t in catalog if t.layer == "ads" and t.period == "daily"]
        rng = random.Random(args.seed)
        picked = rng.sample(targets, min(args.predictions, len(targets)))
        # one warm-up: the calendars of the index are enumerated once per process
        CatalogGraph(catalog, index, now).upstream((picked[0], "2026-03-10"))
        times, steps = [], []
        for fqn in picked:
            started = time.perf_counter()
            graph = CatalogGraph(catalog, index, now)
            prediction = Predictor(graph, HistoryUpTo(graph, now.timestamp()), history, now.timestamp()).predict(
                fqn, "2026-03-10"
            )
            times.append((time.perf_counter() - started) * 1000)
            steps.append(len(prediction.path))
        log(
            f"{len(times)} predictions at {args.tables:,} tables: P50 {percentile(times, 50):.1f} ms, "
            f"P99 {percentile(times, 99):.1f} ms, critical paths of {min(steps)}-{max(steps)} partitions"
        )
        return percentile(times, 99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=7, help="simulated days before the measured ones (history)")
    parser.add_argument("--days", type=int, default=5, help="measured days")
    parser.add_argument("--slots", type=int, default=3, help="runs at once (max_concurrent_runs)")
    parser.add_argument("--noise", type=float, default=0.25, help="σ of a run time's log-normal noise")
    parser.add_argument("--tables", type=int, default=10_000, help="tables of the cost's catalog")
    parser.add_argument("--predictions", type=int, default=200, help="predictions timed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 days of history, 4 measured, 1,000 tables")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.days, args.tables, args.predictions = 3, 4, 1000, 50
    calib = calib_ms()
    figures = accuracy(args)
    figures["predict_p99_ms"] = round(cost(args), 1)
    figures["calib_ms"] = calib
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
