"""Benchmark: the dependency center at 1,000, 10,000 and 80,000 tables.

The product resolves partitions with the dependency center, not with Dagster's automation sensor: the partition state
store reads Dagster's event log by storage-id cursor (``warehouse_assets/center/state_store.py``) and the resolver
finds, through the reverse index, the downstream partitions each change can unblock and asks the gate about them
(``warehouse_assets/center/resolver.py``). This bench measures that path on synthetic catalogs, each N in a fresh
process so that its peak memory is its own:

* **load**: ``load_catalog`` of the N declaration files, then the code location's own assembly,
  ``warehouse_assets.definitions.build_definitions(catalog)``, resolved into a repository (what a code server
  does), with Python's full garbage collections held back as the code location's module holds them. The
  resolver-only rows (``--resolver-sizes``: a large firm's 80,000 tables) load the catalog only;
* **history**: the store's rows of every partition whose window ended in the ``--history-days`` before the
  simulated day (what the store holds after reading that history from the log), written straight into its SQLite
  table, with storage ids in time and dependency order. The day's windows reach 30 days back, a month on its days
  and the month before 62;
* **day**: one day of completions in a closed loop. The root (ODS) hours of the day are reported one after the
  other, each at its window's end + 5 min (the resolver's ``now``). Every round reads the new changes (the store's
  ``update``), hands them to ``Resolver.on_changes`` one completion at a time (the **per-event** time), then
  completes every partition of the runs it requested, until nothing more is requested. The day is the last of one
  year of partitions (``WAREHOUSE_START`` = 2025-01-01 + 364 days: a day in the past, see ``BENCH_START``), so its end
  completes the day's and the month's partitions.
  *Dagster rows*: a completion is a runless ``AssetMaterialization`` in a real ``DagsterInstance`` (consolidated
  SQLite event log, on disk) and the store reads it from the log; writing the events is the producers' cost
  (Dagster's), timed apart as ``write s`` and not counted in the day. *Resolver-only rows*: a completion's row is
  written straight into the store (no event log), and that write counts in the day;
* **log build**: a second store ``rebuild()`` from the whole event log of the day (events read per second);
* **taint closure**: for a 10-day taint of each ODS root (240 hours ending the day before the simulated day), the
  exact closure of every partition built from it (``ReverseIndex.closure``), and for the root with the largest
  closure the whole plan of ``warehouse taint`` (``plan_taint``: the closure, each partition's state from the store
  with its history, the runs counted);
* **peak memory**: the RSS high-water mark of the N's process (``ru_maxrss`` from ``os.wait4``), so it includes
  Python, Dagster and, in the Dagster rows, the definitions.

The day's partitions are checked: every partition the resolver requested is built once, and the partitions whose
window ended within the day but that were never requested are counted (``missed``): the resolver reacts to changes
only, so a partition whose upstream was complete before its own window ended (a T-1 read) waits for something else.

Synthetic catalogs: a handful of hourly ODS roots (5 + N // 1000); derived tables hourly / daily / weekly /
monthly (12 / 60 / 15 / 13 %; the resolver-only rows 4.5 / 67.5 / 15 / 13 %, so that a day has about 150,000
completions, as at a large firm), each reading 1-3 earlier tables (mean 1.5) with the usual offsets: set 0, set -1,
set -7, range 0-23 hours under a day, range 0-6 days under a week, a month on its days (default), sliding windows
range [-6, 0] and [-29, 0], hourly range [-23, 0]; about 3 % of daily tables are self-dependent (T-1). Generation
is deterministic (``--seed``); ``bench/reverse_index.py`` uses the same generator. The gate's richer rules are drawn
on top, from a random stream of their own (the same tables and edges with ``--no-rules``): 5 % of the daily set-0
daily dependencies wait until 09:00 (``mode: deadline``), 10 % of daily sliding windows take any of their days
(``mode: any``) and 5 % read only the latest usable day (``latest: true``), 3 % of the daily tables with a daily set-0
dependency are estimated on its previous day and completed on its own (``states``: such a partition may be built
twice in the day, once per state), half of the self-dependent daily tables are cumulative within the week, and 5 %
of the derived tables read a static table whole (one per 2,000 tables, ``kind: static``, built before the day).

No Spark is started. Progress goes to stderr, the table to stdout, and the last line of stdout is one ``RESULT``
line of ``key=value`` figures, the first four of the 10,000-table row (or the largest Dagster row), and the machine's
``calib_ms`` (``bench/calibration.py``, measured by the parent before the first N). The bench exits 1 when an N's
process failed.

    .venv/bin/python bench/automation_scale.py            # N = 1,000 and 10,000; the resolver alone at 80,000
    .venv/bin/python bench/automation_scale.py --quick    # N = 100 and the resolver alone at 300: seconds
"""

from __future__ import annotations

import argparse
import gc
import graphlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from datetime import time as clock
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calibration import calib_ms
from resources.settings import Settings
from warehouse_assets.catalog import START, periods
from warehouse_assets.materialize.compiler import max_partitions_per_run

ENGINE_ROUND_S = Settings.model_fields["engine_poll_seconds"].default  # the engine's budget for a resolver step

PERIODS = ("hourly", "daily", "weekly", "monthly")
PERIOD_WEIGHTS = (0.12, 0.60, 0.15, 0.13)
RANK = {p: i for i, p in enumerate(PERIODS)}
DEP_COUNTS = ((1, 0.6), (2, 0.3), (3, 0.1))  # mean 1.5 upstream tables per derived table
SELF_DEP_SHARE = 0.03  # of daily derived tables
# the gate's richer rules, drawn from a random stream of their own so that the tables and edges are the same with and
# without them (--no-rules): a daily set-0 dependency with a 09:00 deadline, a sliding window with mode any, a daily
# table estimated on its upstream's previous day and completed on its own
DEADLINE_SHARE = 0.05  # of daily tables' daily set-0 dependencies
ANY_SHARE = 0.10  # of daily tables' sliding windows
STATES_SHARE = 0.03  # of daily tables with a daily set-0 dependency
LATEST_SHARE = 0.05  # of daily tables' sliding windows not drawn any: the latest usable day of the window
CUMULATIVE_SHARE = 0.5  # of self-dependent daily tables: cumulative within the week (afresh each Monday)
STATIC_EVERY = 2000  # one static reference table per this many tables (at least one)
STATIC_SHARE = 0.05  # of derived tables: read one static table whole (no offsets)
# (own period, upstream period) -> offsets in the catalog's vocabulary with their weights (None = default mapping)
OFFSETS: dict[tuple[str, str], list[tuple[dict[str, list[int]] | None, float]]] = {
    ("hourly", "hourly"): [(None, 0.6), ({"set": [0]}, 0.1), ({"set": [-1]}, 0.2), ({"range": [-23, 0]}, 0.1)],
    ("daily", "hourly"): [({"range": [0, 23]}, 0.6), (None, 0.4)],
    ("daily", "daily"): [
        ({"set": [0]}, 0.4),
        ({"set": [-1]}, 0.2),
        ({"set": [-7]}, 0.1),
        ({"range": [-6, 0]}, 0.15),
        ({"range": [-29, 0]}, 0.15),
    ],
    ("weekly", "hourly"): [(None, 1.0)],
    ("weekly", "daily"): [({"range": [0, 6]}, 0.7), (None, 0.3)],
    ("weekly", "weekly"): [({"set": [0]}, 0.6), ({"set": [-1]}, 0.4)],
    ("monthly", "hourly"): [(None, 1.0)],
    ("monthly", "daily"): [(None, 1.0)],  # a month on its days
    ("monthly", "monthly"): [({"set": [0]}, 0.6), ({"set": [-1]}, 0.4)],
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the synthetic catalog ---------------------------------------------------------------------------------


def _pick(rng: random.Random, options: list[tuple[Any, float]]) -> Any:
    return rng.choices([o for o, _ in options], weights=[w for _, w in options])[0]


def generate_catalog(
    root: Path,
    n: int,
    seed: int,
    period_weights: tuple[float, ...] = PERIOD_WEIGHTS,
    rules: bool = True,
    domains: bool = False,
) -> dict[str, Any]:
    """Write ``n`` table declarations under ``root/<layer>/``; return a summary of what was written. ``domains``: each
    table declares a ``domain`` (an ODS root's own, a derived table's first input's), as a large catalog groups its
    layers; the tables drawn are the same either way."""
    rng = random.Random(seed)
    weak_rng = random.Random(seed + 1)
    static_rng = random.Random(seed + 2)  # a stream of its own: the other rules are drawn as without static tables
    ruled: Counter[str] = Counter()
    n_roots = 5 + n // 1000
    tables: list[tuple[str, str]] = []  # (fqn, period) in creation order
    # per period, the earlier tables it may read, in creation order (kept as tables are added: linear in n)
    readable: dict[str, list[tuple[str, str]]] = {p: [] for p in PERIODS}

    def add(table: tuple[str, str]) -> None:
        tables.append(table)
        for period in PERIODS:
            if (period, table[1]) in OFFSETS:
                readable[period].append(table)

    for layer in ("ods", "dwd", "dws", "ads"):
        (root / layer).mkdir(parents=True, exist_ok=True)
    statics = [f"dwd.ref_{i:03d}" for i in range(max(1, n // STATIC_EVERY))]  # read only with the rules
    for fqn in statics:
        (root / "dwd" / f"{fqn.split('.')[1]}.sql").write_text(
            f"/* ---\ntable: {fqn}\nkind: static\ndescription: Synthetic reference table.\nowner: bench\n"
            "primary_key: [id]\ncolumns: {id: bigint, label: string}\n--- */\n"
            "SELECT id, label FROM VALUES (1L, 'a'), (2L, 'b') AS t(id, label)\n"
        )
    ruled["static"] = len(statics)
    domain_of: dict[str, str] = {}
    for i in range(n_roots):
        name = f"src_{i:03d}"
        domain_of[f"ods.{name}"] = f"d{i:02d}"
        (root / "ods" / f"{name}.yaml").write_text(
            f"table: ods.{name}\n"
            "period: hourly\n"
            + (f"domain: d{i:02d}\n" if domains else "")
            + f"description: Synthetic ODS root {i} (bench/automation_scale.py).\n"
            "owner: bench\n"
            f'source: {{database: bench_src, tables: "{name}_[0-9]{{2}}"}}\n'
            "primary_key: [id]\n"
            "partition_time: create_time\n"
            "columns:\n  id: bigint\n  user_id: bigint\n  v: double\n  create_time: timestamp\n"
            "  update_time: timestamp\n"
        )
        add((f"ods.{name}", "hourly"))
    edges = self_deps = 0
    by_kind: dict[str, int] = {}
    n_derived = n - n_roots
    for j in range(n_derived):
        period = rng.choices(PERIODS, weights=period_weights)[0]
        frac = j / max(1, n_derived)
        layer = "dwd" if frac < 0.3 else "dws" if frac < 0.7 else "ads"
        name = f"t_{j:05d}"
        fqn = f"{layer}.{name}"
        eligible = readable[period]
        k = min(len(eligible), _pick(rng, list(DEP_COUNTS)))
        ups = rng.sample(eligible, k)
        declared: dict[str, dict[str, list[int]]] = {}
        for up, up_period in ups:
            offsets = _pick(rng, OFFSETS[(period, up_period)])
            kind = f"{period}<-{up_period} " + (json.dumps(offsets).replace('"', "") if offsets else "default")
            by_kind[kind] = by_kind.get(kind, 0) + 1
            if offsets is not None:
                declared[up] = offsets
        reads = [up for up, _ in ups]
        if period == "daily" and rng.random() < SELF_DEP_SHARE:
            declared[fqn] = {"set": [-1]}
            reads.append(fqn)
            self_deps += 1
        edges += len(reads)
        states: list[str] = []
        if rules and period == "daily":
            states = _add_rules(weak_rng, declared, ups, ruled, may_have_states=fqn not in declared)
            if fqn in declared and weak_rng.random() < CUMULATIVE_SHARE:
                states += ["kind: cumulative", "resets: weekly"]
                ruled["cumulative"] += 1
        header = [
            f"table: {fqn}",
            f"period: {period}",
            f"description: Synthetic table {j} (bench/automation_scale.py).",
            "owner: bench",
            "primary_key: [id]",
        ]
        domain_of[fqn] = domain_of.get(reads[0], "")
        if domains and domain_of[fqn]:
            header.append(f"domain: {domain_of[fqn]}")
        if rng.random() < 0.1:
            header.append("zorder: [user_id]")
        if fqn in declared:  # a self-dependent table declares its output (its first T-1 is empty)
            header.append("columns: {id: bigint, user_id: bigint, n: bigint, ds: string}")
        if declared:
            header.append("depends_on:")
            header += [f"  {up}: {_flow(off)}" for up, off in declared.items()]
        header += states
        if rules and static_rng.random() < STATIC_SHARE:
            reads_static = static_rng.choice(statics)
            ruled["static_readers"] += 1
        else:
            reads_static = ""
        joins = "".join(f"\nLEFT JOIN {up} AS t{a} ON t0.id = t{a}.id" for a, up in enumerate(reads[1:], start=1))
        if reads_static:
            joins += f"\nLEFT JOIN {reads_static} AS r ON t0.id = r.id"
        sql = (
            "/* ---\n" + "\n".join(header) + "\n--- */\n"
            "SELECT t0.id, max(t0.user_id) AS user_id, count(*) AS n, '${ds}' AS ds\n"
            f"FROM {reads[0]} AS t0{joins}\nWHERE t0.id IS NOT NULL\nGROUP BY t0.id\n"
        )
        (root / layer / f"{name}.sql").write_text(sql)
        add((fqn, period))
    periods = {p: sum(1 for _, q in tables if q == p) for p in PERIODS}
    return {
        "roots": n_roots,
        "edges": edges,
        "self_deps": self_deps,
        **{f"rule_{k}": v for k, v in sorted(ruled.items())},
        "periods": periods,
        "kinds": by_kind,
    }


def _flow(offsets: dict[str, Any]) -> str:
    """A dependency's spec as a YAML flow mapping: ``{set: [0], mode: deadline, deadline: "09:00"}``."""
    items = [f"{key}: {json.dumps(value) if key == 'deadline' else value}" for key, value in offsets.items()]
    return "{" + ", ".join(items) + "}"


def _add_rules(
    rng: random.Random,
    declared: dict[str, Any],
    ups: list[tuple[str, str]],
    ruled: Counter[str],
    may_have_states: bool,
) -> list[str]:
    """Weak modes and states on a daily table's daily dependencies, in place; the header lines of its states (none
    for a self-dependent table)."""
    for up, up_period in ups:
        offsets = declared.get(up)
        if up_period != "daily" or offsets is None:
            continue
        if offsets == {"set": [0]}:
            draw = rng.random()
            if draw < STATES_SHARE and may_have_states:
                declared[up] = {"range": [-1, 0]}
                ruled["states"] += 1
                return [
                    "states:",
                    f"  estimated: {{{up}: {{set: [-1]}}}}",
                    f"  completed: {{{up}: {{set: [0]}}}}",
                ]
            if draw < STATES_SHARE + DEADLINE_SHARE:
                declared[up] = {**offsets, "mode": "deadline", "deadline": "09:00"}
                ruled["deadline"] += 1
        elif "range" in offsets and offsets["range"][0] < 0:
            draw = rng.random()
            if draw < ANY_SHARE:
                declared[up] = {**offsets, "mode": "any"}
                ruled["any"] += 1
            elif draw < ANY_SHARE + LATEST_SHARE:
                declared[up] = {**offsets, "latest": "true"}
                ruled["latest"] += 1
    return []


RESOLVER_PERIOD_WEIGHTS = (0.045, 0.675, 0.15, 0.13)  # about 150,000 completions a day at 80,000 tables
# The warehouse starts a year before the simulated day, in the past: Dagster leaves a partition key later than the
# wall clock out of a subset, so the gate's windows of a day in the future come out empty (and it lets them run).
BENCH_START = "2025-01-01"
SETTLE = timedelta(minutes=5)  # a root hour is reported this long after its window ends


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else 0.0


# --- one N, in a child process -----------------------------------------------------------------------------


class Feed(Protocol):
    """Where completions go and how the store learns of them."""

    store_s: float  # time spent by the store: reading the log (update) or writing its rows

    def complete(self, table: Any, partitions: tuple[str, ...], now: datetime) -> None: ...

    def changes(self) -> list[Any]: ...


class LogFeed:
    """Completions as runless materializations in the instance's event log; the store reads them by cursor.

    Each round's completions are written in one transaction as the event-log rows Dagster writes for a runless
    ``AssetMaterialization`` (``prepare_insert_event_batch``); Dagster's asset-key index and tags, which the store
    does not read, are left out: ``report_runless_asset_event`` took 25-70 ms an event on the loaded bench machine,
    hours for a day at 10,000 tables.
    """

    def __init__(self, instance: Any, store: Any):
        self.instance, self.store = instance, store
        self.store_s = self.write_s = 0.0
        self.events = 0
        self._pending: list[Any] = []

    def complete(self, table: Any, partitions: tuple[str, ...], now: datetime) -> None:
        from dagster import AssetKey, AssetMaterialization, DagsterEvent, DagsterEventType, EventLogEntry
        from dagster._core.events import StepMaterializationData
        from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID

        for partition in partitions:
            materialization = AssetMaterialization(AssetKey(table.key), partition=partition)
            event = DagsterEvent(
                event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
                job_name=RUNLESS_JOB_NAME,
                event_specific_data=StepMaterializationData(materialization),
            )
            self._pending.append(
                EventLogEntry(
                    user_message="",
                    level=logging.INFO,
                    job_name=RUNLESS_JOB_NAME,
                    run_id=RUNLESS_RUN_ID,
                    error_info=None,
                    timestamp=now.timestamp(),
                    step_key=None,
                    dagster_event=event,
                )
            )

    def changes(self) -> list[Any]:
        started = time.perf_counter()
        storage = self.instance.event_log_storage
        with storage.index_connection() as connection:  # one transaction
            for i in range(0, len(self._pending), 1000):  # SQLite's bound on a statement's parameters
                connection.execute(storage.prepare_insert_event_batch(self._pending[i : i + 1000]))
        self.events += len(self._pending)
        self._pending = []
        written = time.perf_counter()
        self.write_s += written - started
        found = self.store.update()
        self.store_s += time.perf_counter() - written
        return found


class DirectFeed:
    """Completions written straight into the store's rows, with the changes an update would report: the resolver
    alone, no event log."""

    def __init__(self, store: Any):
        self.store = store
        self.store_s = 0.0
        self.events = 0
        self._pending: list[Any] = []

    def complete(
        self,
        table: Any,
        partitions: tuple[str, ...],
        now: datetime,
        counts: dict[str, tuple[int | None, int | None]] | None = None,
    ) -> None:
        """``counts``: per partition, its rows and how many of them the build changed, as a materialization's
        metadata tells the store."""
        self.complete_many([(table, partitions, counts)], now)

    def complete_many(
        self,
        runs: list[tuple[Any, tuple[str, ...], dict[str, tuple[int | None, int | None]] | None]],
        now: datetime,
    ) -> None:
        """Several runs' completions (table, partitions, counts as in :meth:`complete`), in order, in one transaction:
        the same rows and storage ids as one call each, one commit."""
        from dagster import AssetKey

        from warehouse_assets.center.state_store import Change, PartitionState

        started = time.perf_counter()
        states = []
        for table, partitions, counts in runs:
            key = AssetKey(table.key).to_user_string()
            for partition in partitions:
                self.events += 1
                rows, changed = (counts or {}).get(partition, (None, None))
                states.append(
                    PartitionState(
                        key,
                        partition,
                        storage_id=self.events,
                        run_id="",
                        timestamp=now.timestamp(),
                        rows=rows,
                        changed=changed,
                    )
                )
        if not states:
            return
        self.store.put(states)  # as the engine's update writes the rows its events touched
        self._pending += [Change(s.asset_key, s.partition, frozenset({"materialized"}), s) for s in states]
        self.store_s += time.perf_counter() - started

    def changes(self) -> list[Any]:
        found, self._pending = self._pending, []
        return found


class Calendars:
    """Every partition of each period up to a horizon: keys and window end timestamps (the reverse index's)."""

    def __init__(self, horizon: float):
        from warehouse_assets.catalog import BY_PERIOD, MINUTE_PERIODS
        from warehouse_assets.center.reverse_index import Calendar

        self._of: dict[str, Any] = {}
        for period, pdef in BY_PERIOD.items():
            if period in MINUTE_PERIODS:  # the generated catalogs declare no mini-batch table
                continue
            calendar = self._of[period] = Calendar(pdef)
            calendar.cover(horizon)

    def ended(self, period: str, after: float, until: float) -> Iterator[tuple[str, float]]:
        """The partitions of ``period`` whose window ends in (``after``, ``until``], with their end."""
        calendar = self._of[period]
        for i in range(bisect_right(calendar.ends, after), bisect_right(calendar.ends, until)):
            yield calendar.keys[i], calendar.ends[i]


def seed_history(store: Any, catalog: Any, calendars: Calendars, day_start: float, days: int) -> int:
    """Write the store's rows of every partition whose window ended in the ``days`` before ``day_start``. Storage
    ids are negative (the day's events come after them), in order of window end, then of dependency (a partition
    materialized after its upstream), so that no upstream looks newer than its downstream (late data)."""
    from dagster import AssetKey

    from warehouse_assets.catalog import WHOLE
    from warehouse_assets.center.state_store import _COLUMNS, PartitionState, _to_row

    order = graphlib.TopologicalSorter({t.fqn: [d.table for d in t.deps if d.table != t.fqn] for t in catalog})
    rank = {fqn: i for i, fqn in enumerate(order.static_order())}
    n = len(rank)
    # the row of a runless report, as the store writes it (_to_row), built once: millions of rows
    template = _to_row(PartitionState("", "", storage_id=0, run_id="", timestamp=0.0))
    rest = template[5:]

    def rows() -> Iterator[tuple[object, ...]]:
        for table in catalog:
            key = AssetKey(table.key).to_user_string()
            if table.is_static:  # built by its sensor before the history's first day
                yield (key, WHOLE, -(days + 1) * 1440 * n - rank[table.fqn], "", day_start - days * 86400, *rest)
                continue
            for partition, end in calendars.ended(table.period, day_start - days * 86400, day_start):
                storage_id = (int(end - day_start) // 60 - 1) * n + rank[table.fqn]
                yield (key, partition, storage_id, "", end, *rest)

    counted = Counter[str]()

    def counting() -> Iterator[tuple[object, ...]]:
        for row in rows():
            counted["rows"] += 1
            yield row

    store._db.execute("BEGIN IMMEDIATE")
    store._db.executemany(f"INSERT INTO partitions ({_COLUMNS}) VALUES ({', '.join('?' * len(template))})", counting())
    store._db.execute("COMMIT")
    return counted["rows"]


def _rule_tables(catalog: Any) -> set[str]:
    """The tables the rules build more than once by design: those with states, an any or a latest window."""
    return {t.fqn for t in catalog.derived() if t.state_names or any(d.mode in ("any", "latest") for d in t.deps)}


def _rebuilt_by_rules(catalog: Any) -> set[str]:
    """The tables whose partitions the rules build more than once by design: those with states, an any or a latest
    window, and every table downstream of them."""
    found = _rule_tables(catalog)
    for table in graphlib.TopologicalSorter(
        {t.fqn: [d.table for d in t.deps if d.table != t.fqn] for t in catalog}
    ).static_order():
        if any(d.table in found for d in catalog[table].deps if d.table != table):
            found.add(table)
    return found


def simulate_day(
    catalog: Any, resolver: Any, feed: Feed, calendars: Calendars, day_start: float, budget: float | None
) -> dict[str, Any]:
    """The day's root hours reported in order; every requested run completed; until nothing more is requested.

    Each call resolves for at most ``budget`` seconds as the engine's rounds do (None: until done); while a burst
    leaves a backlog, the next call comes at once, with the changes of the runs completed meanwhile."""
    from warehouse_assets.materialize.gate import decide

    tz = ZoneInfo(periods().timezone)
    day_end = day_start + 86400
    roots = [t for t in catalog.ods()]
    per_event: list[float] = []
    built: Counter[tuple[str, str]] = Counter()
    order: dict[tuple[str, str], list[int]] = {}  # each partition's builds, by their place in the day's sequence
    runs = rounds = sliced = fed = 0
    burst = longest_burst = 0.0  # seconds of consecutive calls that left a backlog, and the call that emptied it
    # the engine steps every poll, with changes or without, so its clock stands at the day's start when the day
    # begins (a resolver's first step starts its clock: the windows that ended before it are a backfill's)
    resolver.on_changes([], datetime.fromtimestamp(day_start, tz))
    for hour, end in calendars.ended("hourly", day_start, day_end):
        now = datetime.fromtimestamp(end, tz) + SETTLE
        for root in roots:
            feed.complete(root, (hour,), now)
            built[(root.fqn, hour)] += 1
        # no wake-ups of the bench's own: a partition whose upstream was complete before its window ended is the
        # resolver's clock's (it looks at the windows that ended since its last call, on every call)
        while (changes := feed.changes()) or resolver.backlog:
            rounds += 1
            fed += len(changes)
            plans = []
            for change in changes or [None]:  # no change: a call for the backlog alone
                started = time.perf_counter()
                plans += resolver.on_changes([] if change is None else [change], now, budget)
                seconds = time.perf_counter() - started
                per_event.append(seconds)
                if resolver.backlog:
                    sliced += 1
                    burst += seconds
                else:
                    longest_burst, burst = max(longest_burst, burst + (seconds if burst else 0.0)), 0.0
            for plan in plans:
                runs += 1
                feed.complete(catalog[plan.table], plan.partitions, now)
                built.update((plan.table, p) for p in plan.partitions)
                for p in plan.partitions:
                    order.setdefault((plan.table, p), []).append(runs)
        log(f"    {hour}: {len(built)} partitions built, {runs} runs, {len(per_event)} events resolved")
    resolve_s = sum(per_event)
    expected = {
        (t.fqn, key) for t in catalog if not t.is_static for key, _ in calendars.ended(t.period, day_start, day_end)
    }
    missed = expected - set(built)
    # of the partitions never requested, those the gate lets run at the end of the day: their upstream was complete
    # before their own window ended, and no later change came (the others wait for one of them)
    missed_ready = [
        (f, p) for f, p in missed if decide(catalog, catalog[f], p, resolver.store, current_time=now).may_run
    ]
    rebuilding = _rebuilt_by_rules(catalog)
    ruled = _rule_tables(catalog)
    twice = [k for k, count in built.items() if count > 1 and k[0] not in rebuilding]

    def input_rebuilt_between(fqn: str, partition: str) -> bool:
        """Whether a partition this one reads was built again between its first and last builds: the rebuild
        is then the rule's (its input changed), not a second build of the same data."""
        first, last = order[(fqn, partition)][0], order[(fqn, partition)][-1]
        for dep in catalog[fqn].deps:
            keys = resolver.index.upstream_of(fqn, dep.table, partition, now) or []
            for key in keys:
                if any(first < n < last for n in order.get((dep.table, key), [])):
                    return True
        return False

    downstream_again = [k for k, count in built.items() if count > 1 and k[0] in rebuilding and k[0] not in ruled]
    # a partition downstream of a rule table built again although nothing it read was built in between
    unexplained = [k for k in downstream_again if not input_rebuilt_between(*k)]
    twice += unexplained
    per_event.sort()
    return {
        "events": len(per_event),
        "changes": fed,
        "runs": runs,
        "rounds": rounds,
        "built": len(built),
        # by design, a partition of a table with states is built once per state it reaches, and one reading an any
        # window again as the window fills; so is what is built from them once what they read was built again:
        # those are counted apart. Every other partition built more than once, downstream of a rule table or not
        "built_twice": len(twice),
        "rebuilt_by_rules": sum(1 for (f, _), count in built.items() if count > 1 and f in rebuilding),
        # of those, the partitions of tables downstream of a rule table (not ruled themselves), built again because
        # what they read was rebuilt after their build (those built again without that are in built_twice)
        "rebuilt_downstream_of_rules": len(downstream_again) - len(unexplained),
        "built_twice_partitions": sorted(twice)[:5],
        "rebuilt_downstream_partitions": sorted(
            k for k, count in built.items() if count > 1 and k[0] in rebuilding and k[0] not in ruled
        )[:5],
        "unexpected": len(set(built) - expected),
        "expected": len(expected),
        "missed": len(missed),
        "missed_ready": len(missed_ready),
        "missed_ready_tables": sorted({f for f, _ in missed_ready})[:5],
        "missed_ready_partitions": sorted(missed_ready)[:5],
        "resolve_s": round(resolve_s, 3),
        "store_s": round(feed.store_s, 3),
        "day_s": round(resolve_s + feed.store_s, 3),
        "write_s": round(getattr(feed, "write_s", 0.0), 3),
        "event_p50_ms": round(percentile(per_event, 0.50) * 1e3, 3),
        "event_p99_ms": round(percentile(per_event, 0.99) * 1e3, 3),
        "event_max_ms": round(per_event[-1] * 1e3 if per_event else 0.0, 3),
        "sliced_calls": sliced,
        "longest_burst_s": round(longest_burst, 3),
    }


def child_main(args: argparse.Namespace) -> None:
    n, resolver_only = args.child, args.resolver_only
    tz = ZoneInfo(periods().timezone)
    day = datetime.combine(date.fromisoformat(START) + timedelta(days=364), clock(), tz)
    day_start = day.timestamp()
    weights = RESOLVER_PERIOD_WEIGHTS if resolver_only else PERIOD_WEIGHTS
    with tempfile.TemporaryDirectory(prefix=f"automation_scale_{n}_") as tmp:
        root = Path(tmp) / "tables"
        log(f"N={n}: writing the synthetic catalog")
        summary = generate_catalog(root, n, args.seed, weights, rules=not args.no_rules)
        emit({"step": "generate", **{k: v for k, v in summary.items() if k != "kinds"}})

        # imported here so that their import is not part of the load figure
        from dagster import instance_for_test

        from warehouse_assets import definitions
        from warehouse_assets.catalog import load_catalog
        from warehouse_assets.center.resolver import Resolver
        from warehouse_assets.center.reverse_index import ReverseIndex
        from warehouse_assets.center.state_store import PartitionStateStore

        log(f"N={n}: loading")
        if resolver_only:  # the resolver alone: the catalog only
            started = time.perf_counter()
            catalog = load_catalog(root)
            catalog_s = time.perf_counter() - started
        else:  # the code location's load, as its module does it
            with definitions.full_collections_held_back():
                started = time.perf_counter()
                catalog = load_catalog(root)
                catalog_s = time.perf_counter() - started
                built = time.perf_counter()
                defs = definitions.build_definitions(catalog)
                resolved = time.perf_counter()
                assets = len(defs.get_repository_def().asset_graph.get_all_asset_keys())
            done = time.perf_counter()
        record: dict[str, Any] = {"step": "load", "tables": len(catalog.tables), "catalog_s": round(catalog_s, 3)}
        if not resolver_only:
            # where the load goes: the declarations, the Dagster definitions, their resolution into a repository
            record.update(
                load_s=round(done - started, 3),
                build_s=round(resolved - built, 3),
                repository_s=round(done - resolved, 3),
                assets=assets,
            )
            del defs
        emit(record)

        started = time.perf_counter()
        index = ReverseIndex.build(catalog, current_time=day + timedelta(days=2))
        emit({"step": "index", "index_s": round(time.perf_counter() - started, 3)})

        storage = {"module": "dagster._core.storage.event_log", "class": "ConsolidatedSqliteEventLogStorage"}
        (Path(tmp) / "home").mkdir()
        events_dir = str(Path(tmp) / "home" / "events")
        overrides = {"event_log_storage": {**storage, "config": {"base_dir": events_dir}}}
        with instance_for_test(temp_dir=str(Path(tmp) / "home"), overrides=overrides) as instance:
            store = PartitionStateStore(instance)
            calendars = Calendars(day_start + 2 * 86400)
            log(f"N={n}: writing {args.history_days} days of history into the store")
            started = time.perf_counter()
            rows = seed_history(store, catalog, calendars, day_start, args.history_days)
            emit({"step": "history", "rows": rows, "history_s": round(time.perf_counter() - started, 3)})

            emit({"step": "taint", **time_taint(catalog, index, store, day)})

            resolver = Resolver(catalog, index, store, max_partitions_per_run)
            started = time.perf_counter()
            resolver.prepare(day)  # as the engine does before its first round
            gc.freeze()  # as the engine does: what lives as long as it stays out of the collector's full passes
            emit({"step": "prepare", "prepare_s": round(time.perf_counter() - started, 3)})
            feed: Feed = DirectFeed(store) if resolver_only else LogFeed(instance, store)
            log(f"N={n}: simulating {day.date()}")
            emit({"step": "day", **simulate_day(catalog, resolver, feed, calendars, day_start, args.budget)})
            resolver.close()

            if not resolver_only:
                rebuilt = PartitionStateStore(instance, path=Path(tmp) / "rebuilt.db")
                started = time.perf_counter()
                rebuilt.rebuild()
                seconds = time.perf_counter() - started
                emit({"step": "log", "log_events": rebuilt.records_read, "log_s": round(seconds, 3)})
                rebuilt.close()
            store.close()


def time_taint(catalog: Any, index: Any, store: Any, day: datetime) -> dict[str, Any]:
    """The closure of a 10-day taint of each ODS root, and the whole plan for the largest."""
    from warehouse_assets.center.taint import new_taint, plan_taint

    hours = [(day - timedelta(hours=h)).strftime("%Y-%m-%d-%H:00") for h in range(240, 0, -1)]
    slowest = 0.0
    largest: tuple[int, int, str] = (0, 0, "")  # partitions, tables, root
    for table in catalog.ods():
        started = time.perf_counter()
        closure = index.closure({table.fqn: hours}, day)
        slowest = max(slowest, time.perf_counter() - started)
        largest = max(largest, (sum(len(keys) for keys in closure.values()), len(closure), table.fqn))
    size, tables, root = largest
    taint = new_taint(root, hours[0], hours[-1], "bench", "bench")
    started = time.perf_counter()
    plan = plan_taint(catalog, index, store, root, hours[0], hours[-1], taint, now=day)
    plan_s = time.perf_counter() - started
    return {
        "closure_s": round(slowest, 4),
        "closure_partitions": size,
        "closure_tables": tables,
        "closure_root": root,
        "plan_s": round(plan_s, 3),
        "plan_marked": plan.marked,
        "plan_runs": plan.runs,
    }


# --- the parent: one child per N, the table ----------------------------------------------------------------


def run_child(n: int, resolver_only: bool, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(n), "--seed", str(args.seed)] + (
        ["--no-rules"] if args.no_rules else []
    )
    cmd += ["--history-days", str(args.history_days)] + (["--resolver-only"] if resolver_only else [])
    cmd += ["--budget", "none" if args.budget is None else str(args.budget)]
    started = time.perf_counter()
    env = {**os.environ, "WAREHOUSE_START": BENCH_START}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert proc.stdout is not None
    row: dict[str, Any] = {"n": n, "resolver_only": resolver_only}
    try:
        for line in proc.stdout:
            row.update({k: v for k, v in json.loads(line).items() if k != "step"})
    except BaseException:  # the parent is interrupted: never leave the child behind
        proc.kill()
        raise
    _, status, usage = os.wait4(proc.pid, 0)
    row.update(exit=os.waitstatus_to_exitcode(status), peak_mb=round(usage.ru_maxrss / 1024, 1))
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def _f(row: dict[str, Any], key: str, fmt: str = "{:.2f}") -> str:
    return fmt.format(row[key]) if key in row else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="tables, with Dagster definitions and event log")
    parser.add_argument("--resolver-sizes", default="80000", help="tables, the resolver alone ('' for none)")
    parser.add_argument("--quick", action="store_true", help="N = 100 and the resolver alone at 300: a smoke test")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--no-rules",
        action="store_true",
        help="the same tables and edges without deadlines, any windows and states: the baseline of the rules' cost",
    )
    parser.add_argument("--history-days", type=int, default=62, help="days of partitions in the store before the day")
    parser.add_argument(
        "--budget",
        type=lambda v: None if v == "none" else float(v),
        default=ENGINE_ROUND_S,
        help="seconds a resolver call may take before it leaves the rest to the next call, as the engine's round "
        f"(WAREHOUSE_ENGINE_POLL_SECONDS, {ENGINE_ROUND_S}); 'none': every call resolves all it is given",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--resolver-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child_main(args)
        return
    if args.quick:
        args.sizes, args.resolver_sizes = "100", "300"
    calib = calib_ms()  # before the children: the machine as the first N finds it
    plan = [(int(s), False) for s in args.sizes.split(",") if s] + [
        (int(s), True) for s in args.resolver_sizes.split(",") if s
    ]
    rows = []
    for n, resolver_only in plan:
        log(f"N={n}{' (resolver alone)' if resolver_only else ''}: starting a fresh process")
        rows.append(run_child(n, resolver_only, args))
        log(f"N={n}: done in {rows[-1]['wall_s']} s: {rows[-1]}")

    header = (
        f"{'N':>6} {'edges':>6} {'load s':>7} {'index s':>7} {'history rows':>12} {'events':>7} {'runs':>6} "
        f"{'built/expected':>15} {'P50 ms':>7} {'P99 ms':>7} {'max ms':>7} {'day s':>7} {'store s':>7} "
        f"{'events/s':>8} {'write s':>7} {'log ev/s':>8} {'peak MB':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        built = f"{r['built']}/{r['expected']}" if "built" in r else "-"
        rate = f"{r['events'] / r['day_s']:.0f}" if r.get("day_s") else "-"
        log_rate = f"{r['log_events'] / r['log_s']:.0f}" if r.get("log_s") else "-"
        name = f"{r['n']}{'*' if r['resolver_only'] else ''}"
        print(
            f"{name:>6} {r.get('edges', '-'):>6} {_f(r, 'catalog_s' if r['resolver_only'] else 'load_s'):>7} "
            f"{_f(r, 'index_s'):>7} "
            f"{r.get('rows', '-'):>12} {r.get('events', '-'):>7} {r.get('runs', '-'):>6} {built:>15} "
            f"{_f(r, 'event_p50_ms'):>7} {_f(r, 'event_p99_ms'):>7} {_f(r, 'event_max_ms'):>7} "
            f"{_f(r, 'day_s', '{:.1f}'):>7} "
            f"{_f(r, 'store_s', '{:.1f}'):>7} {rate:>8} {_f(r, 'write_s', '{:.1f}'):>7} {log_rate:>8} "
            f"{r['peak_mb']:>8.0f}"
        )
    print(
        "* the resolver alone (no definitions, no event log; load s: load_catalog only). "
        "load s: load_catalog + build_definitions; "
        "P50/P99/max: one Resolver.on_changes call (one completion's changes, or the backlog alone), "
        f"budget {'none' if args.budget is None else f'{args.budget} s'}; day s: store + resolution (write s, "
        "Dagster writing the events, apart); peak MB: RSS high-water mark of the N's process"
    )
    for r in rows:
        if "prepare_s" in r:
            print(f"N={r['n']}{'*' if r['resolver_only'] else ''}: the clock's tables found in {r['prepare_s']:.2f} s")
        if r.get("sliced_calls"):
            print(
                f"N={r['n']}{'*' if r['resolver_only'] else ''}: {r['sliced_calls']} calls left a backlog; the "
                f"longest burst took {r['longest_burst_s']:.1f} s to resolve, in calls of at most "
                f"{r['event_max_ms'] / 1e3:.2f} s"
            )
    for r in rows:
        if "closure_s" in r:
            print(
                f"N={r['n']}{'*' if r['resolver_only'] else ''}: a 10-day taint of an ODS table: closure in "
                f"{r['closure_s'] * 1e3:.1f} ms at most ({r['closure_partitions']} partitions of {r['closure_tables']} "
                f"tables from {r['closure_root']}); its whole plan {r['plan_s']:.2f} s ({r['plan_marked']} to mark, "
                f"{r['plan_runs']} runs)"
            )
    for r in dagster_rows_of(rows):
        print(
            f"N={r['n']}: load {_f(r, 'load_s')} s = declarations {_f(r, 'catalog_s')} s + Dagster definitions "
            f"{_f(r, 'build_s')} s + repository {_f(r, 'repository_s')} s"
        )
    for r in rows:
        if r["exit"] != 0:
            print(f"N={r['n']}: the process exited with {r['exit']}")
        if r.get("missed") or r.get("built_twice") or r.get("unexpected"):
            print(
                f"N={r['n']}: {r.get('missed')} partitions of the day never requested ({r.get('missed_ready')} of "
                f"them ready at the end of the day, e.g. {', '.join(r.get('missed_ready_tables', []))}), "
                f"{r.get('built_twice')} built twice, {r.get('unexpected')} outside the day"
            )
    dagster_rows = dagster_rows_of(rows)
    main_row = next((r for r in dagster_rows if r["n"] == 10000), dagster_rows[-1] if dagster_rows else rows[-1])
    figures = {k: main_row.get(k, "na") for k in ("event_p99_ms", "day_s", "load_s", "peak_mb")}
    figures["n"] = main_row["n"]
    figures["budget_s"] = "none" if args.budget is None else args.budget
    figures["rules"] = "off" if args.no_rules else "on"
    for r in rows:
        prefix = f"{'resolver' if r['resolver_only'] else 'n'}{r['n']}_"
        for key in (
            "event_p50_ms",
            "event_p99_ms",
            "event_max_ms",
            "longest_burst_s",
            "day_s",
            "events",
            "runs",
            "built",
            "expected",
            "unexpected",
            "missed",
            "built_twice",
            "rebuilt_by_rules",
            "rebuilt_downstream_of_rules",
            "rule_deadline",
            "rule_any",
            "rule_states",
            "rule_latest",
            "rule_cumulative",
            "rule_static",
            "rule_static_readers",
            "load_s",
            "peak_mb",
            "closure_s",
            "closure_partitions",
            "plan_s",
        ):
            if key in r:
                figures[prefix + key] = r[key]
        figures[prefix + "exit"] = r["exit"]
    figures["calib_ms"] = calib
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()))
    if any(r["exit"] != 0 for r in rows):
        raise SystemExit(1)


def dagster_rows_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not r["resolver_only"]]


if __name__ == "__main__":
    main()
