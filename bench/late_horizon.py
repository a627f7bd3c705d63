"""Benchmark: what late data really costs over a whole lookback horizon, per late-data policy.

The handoff bench (``bench/handoff_latency.py``) runs the real stack for half an hour: too short for any daily
partition's late-data rebuild to come due, so its build counts say nothing of late data's cost. This bench drives the
product's own dependency center (the partition state store, the reverse index, the resolver with its gate and
late-data rules, ``warehouse_assets/center/``) on a simulated clock over six days, long enough for every change to the
first two days to arrive and be absorbed, at 1,000 and 10,000 tables (the synthetic catalogs of
``bench/automation_scale.py``), once per late-data policy (each derived table declares it), and counts what is built.

**The clock.** Ticks of 5 minutes (the simulated sources' micro-batch). At each tick: the root (ODS) hours that
ended 5 minutes before are reported, as the readiness sensor reports a complete hour; every root hour that received
late changes during the tick is reported again (one report per hour per tick, as the sensor reports an hour's
unreported changes); the resolver is called with the store's changes (``Resolver.on_changes``, as the engine's round
calls it, with or without changes, so that a rebuild whose policy time came is found); every run it plans completes
at once (its partitions reported built) and the loop goes on until nothing more is planned. A run takes no simulated
time: the late lag is the policy's, not Spark's.

**The late-change stream** (modelled on the simulated sources, where an order is paid, refunded or re-dated for up to
48 hours after it was created): each root hour receives a Poisson number of late changes (mean ``--late-per-hour``,
12), each touching one key (5 % of them move a key, touching two), arriving after the hour ended by a lag drawn
from: 60 % exponential with a mean of 30 minutes, 30 % uniform over 2-24 hours, 10 % uniform over 24-48 hours.
A **replay burst** on the fourth day at 12:00: the first root's 24 hours of the second day are delivered again, each
with 2 % of its rows changed (a re-delivery with corrections), all in one tick. Only the corrected rows count as
changed keys: the re-sent unchanged ones are copies of changes already taken in, which the ingestion drops by their
content before its merge (``ingest/preparation.py``: not written, not counted, the hour not reported again for them;
``tests/ingest/test_completeness.py``), so a replay without corrections costs nothing downstream.

**The work model.** A partition's rows are its table's rate times the hours in its window: a root 1,000,000 rows an
hour, a derived table half the mean rate of what it reads (at least 1,000), a static table 1,000 rows. A build reads
every partition its dependencies map it to (the reverse index's ``upstream_of``), whole: the rows it reads are their
sum, for a first build and any whole rebuild. A late-data rebuild of a table the product proves key-local
(``catalog/key_locality.py``; 30 % of the generated tables are made totals over the whole partition, which are not)
reads one row per changed key and input partition, as ``materialize/key_scope.py`` does, unless so many keys changed
that the product rebuilds it whole (the same thresholds). Half the totals are sums and counts; a sixth a distinct
count and an extreme (``count(DISTINCT t0.user_id)``, ``min(t0.user_id)``); a third a median
(``percentile_approx``), which no proof covers and only a whole rebuild recomputes. A sum, a distinct count or an
extreme over its inputs is additive (``catalog/additive.py``: one table, or tables joined on their key; the generated
sums add a joined table's column, ``sum(t0.user_id + coalesce(t1.user_id, 0))``, so that a join is not free), unless
it reads a static table (no change feed). Its late-data rebuild reads, as ``materialize/additive.py`` does by the
delta rule, per changed input partition its change feed (a pre- and a post-image per changed row) and, for every
other input partition of that term, the rows matching the changed keys (one per changed key and partition, capped at
its rows, as the key-scoped model counts), plus its stored partial states (one row), unless more rows changed than
it takes. A distinct count's or an extreme's rebuild reads besides one stored (group, value) pair per changed row
image (two per changed key: its old and its new value) and, when the changed rows held the group's extreme, the
group's every pair to find the next one: each changed row held it with probability 1 / the group's rows, and the
group (the whole partition, no GROUP BY) is counted as many pairs as rows (every value distinct: the most it can
be), so the expected re-read is min(changed keys, input rows) rows. The keys a build changes are what its readers
then see changed: a root hour's late changes (one key each, two for a moved key; 2 % of the hour's rows in the
replay), at most a partition's rows, and every row for a first build. ``late_work_ratio`` is the rows read by every
build after a partition's first over the rows read by the first builds; ``late_work_ratio_whole`` the same if every
rebuild were whole (the product before key-scoped rebuilds, or every table declaring ``incremental: false``).

**What it prints**, per size and policy: builds per closed daily and hourly partition (P50, P99, max: the partitions
of the first two days, each watched for at least four days after it closed), the amplification (builds over first
builds), the late lag (a sampled late change's arrival until each ADS partition built before it arrived, and built
from its hour, is built again with it: P50, P90; the pairs never absorbed counted apart), the late work ratio, and
the stale partitions left with a due time at the end. ``none`` is the same horizon without late changes: the builds
the rules make by design (states, any windows), against which the others compare. After the horizon the sources stop
and the clock runs on (at most three days) until no rebuild is due. Checked: no partition whose window ended within
the horizon is left unbuilt (``missed=0``), and every sampled change reaches every ADS partition it must
(``unabsorbed=0``), or stopped at a partition on its way reported stale and left to a repair by its policy (that ADS
partition or one before it; ``left_to_repair``: a rebuild due past the table's lookback). ``LATE_HORIZON_TRACE=N``
logs the N closed daily partitions built whole most, each build's time and trigger, and their inputs' builds.
``late_lag_hour_p90_s`` is the lag of the ADS tables whose policies promise an hour: every table on the way follows,
for the rebuild it gets (by key, or whole), a rule of at most an hour.

No Spark. Progress on stderr; the last line of stdout is ``RESULT`` with the figures of the default policy
(``every 15m/after 48h``, the product's) at the largest size, and the machine's ``calib_ms``.

    .venv/bin/python bench/late_horizon.py            # 1,000 and 10,000 tables, five policies
    .venv/bin/python bench/late_horizon.py --quick    # 100 tables, two policies, 4 days: a minute
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

BENCH = Path(__file__).resolve().parent
for path in (BENCH, BENCH.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import automation_scale as scale  # noqa: E402  (the synthetic catalogs and the store's history)
from calibration import calib_ms  # noqa: E402

from warehouse_assets.catalog.additive import MAX_CHANGED_ROWS  # noqa: E402
from warehouse_assets.catalog.key_locality import MAX_KEYS, MAX_SHARE, SMALL_PARTITION  # noqa: E402

TICK = timedelta(minutes=5)
DAYS = 6  # simulated days: the first two are measured, each followed by at least four
QUICK_DAYS = 4  # --quick: the measured days followed by two (past the default policy's 48 h and the replay's day)
MEASURED_DAYS = 2
ROOT_ROWS_PER_HOUR = 1_000_000
MIN_RATE = 1_000
STATIC_ROWS = 1_000
MOVED_SHARE = 0.05  # of late changes: a key moved (an order re-assigned, re-dated), touching its old and new key
REPLAY_DAY, REPLAY_AT, REPLAY_OF_DAY, REPLAY_CHANGED = 3, 12, 1, 0.02
LAG_SAMPLES = 200  # late changes followed to the ADS partitions they reach
DRAIN = timedelta(days=3)  # after the horizon, how long the clock may run on for the rebuilds still due
# of the derived tables: a total over the whole partition (no GROUP BY), which no key-scoped rebuild can touch
AGGREGATE_SHARE = 0.3
# of those totals: sums and counts (additive: maintained from their input's changed rows); then distinct counts and
# extremes (maintained from their (group, value) pairs); the rest a median, which only a whole rebuild recomputes
ADDITIVE_SHARE = 0.5
DISTINCT_SHARE = 1 / 6
AGGREGATE_MARK = "/* total */"
DEFAULT_POLICY = "every 15m/after 48h"  # the product's default (catalog/policies.py), as every table declares it
# the curve the default was chosen from: the former default (an hour for every rebuild) and its neighbours
POLICIES = ("none", "every 60m", "every 30m/after 48h", DEFAULT_POLICY, "every 15m/daily 06:00")
QUICK_POLICIES = ("none", DEFAULT_POLICY)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def late_lag_minutes(rng: random.Random) -> float:
    """A late change's delay after its hour ended, in minutes: most in the first hour, a tail to 48 hours."""
    draw = rng.random()
    if draw < 0.6:
        return min(rng.expovariate(1 / 30), 120.0)
    if draw < 0.9:
        return rng.uniform(120, 24 * 60)
    return rng.uniform(24 * 60, 48 * 60)


def poisson(rng: random.Random, mean: float) -> int:
    limit, k, p = math.exp(-mean), 0, 1.0
    while (p := p * rng.random()) > limit:
        k += 1
    return k


def policy_spec(policy: str) -> str:
    """``every 60m`` → ``{rebuild: every 60m}``; ``at_once/daily 06:00`` → key-local tables at once, whole rebuilds
    daily at 06:00."""
    rebuild, _, whole = policy.partition("/")
    return "{rebuild: " + rebuild + (f", whole: {whole}" if whole else "") + "}"


def declare(root: Path, policy: str, seed: int) -> None:
    """Give every derived table of the generated catalog the late-data policy (``none``: the default's, unused), and
    make a share of them (the same whatever the policy) totals over the whole partition: the generated tables all
    group by their key, which every real warehouse does not."""
    rng = random.Random(seed + 303)
    kinds = random.Random(seed + 404)  # its own draws: the same tables are totals as before sums were told apart
    for path in sorted(root.glob("*/*.sql")):
        text = path.read_text()
        if "kind: static" in text:
            continue
        if rng.random() < AGGREGATE_SHARE:
            kind = kinds.random()
            if kind < ADDITIVE_SHARE:  # a sum of a joined table's column too, where there is a join
                summed = "t0.user_id + coalesce(t1.user_id, 0)" if " AS t1 ON " in text else "t0.user_id"
                text = text.replace(
                    "SELECT t0.id, max(t0.user_id) AS user_id,",
                    f"SELECT {AGGREGATE_MARK} 0 AS id, sum({summed}) AS user_id,",
                    1,
                )
            elif kind < ADDITIVE_SHARE + DISTINCT_SHARE:
                text = text.replace(
                    "SELECT t0.id, max(t0.user_id) AS user_id,",
                    f"SELECT {AGGREGATE_MARK} count(DISTINCT t0.user_id) AS id, min(t0.user_id) AS user_id,",
                    1,
                )
            else:  # no proof covers a quantile: rebuilt whole
                text = text.replace("SELECT t0.id,", f"SELECT {AGGREGATE_MARK} percentile_approx(t0.id, 0.5) AS id,", 1)
            text = text.replace("\nGROUP BY t0.id\n", "\n", 1)
        if policy != "none":
            text = text.replace("owner: bench\n", f"owner: bench\nlate_data: {policy_spec(policy)}\n", 1)
        path.write_text(text)


class Horizon:
    """One size and policy: the center stepped tick by tick over the horizon, every build counted."""

    def __init__(
        self, catalog: Any, index: Any, store: Any, resolver: Any, feed: Any, day0: datetime, days: int = DAYS
    ) -> None:
        from warehouse_assets.catalog import partition_window

        self.catalog, self.index, self.store, self.resolver, self.feed = catalog, index, store, resolver, feed
        self.day0, self.days = day0, days
        self.window = partition_window
        self.builds: Counter[tuple[str, str]] = Counter()
        self.whole_builds: Counter[tuple[str, str]] = Counter()  # first builds and rebuilds of whole partitions
        self.first_rows = self.later_rows = self.later_rows_whole = 0.0
        # every build of a partition, in order, with the keys it changed: what a key-scoped rebuild reads
        self.sequence = 0
        self.history: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self.scoped: Counter[str] = Counter()
        self.work: Counter[str] = Counter()  # rows read after first builds, by why the rebuild read them
        self.key_local = self._key_local()
        self.valued: set[str] = set()  # of the additive ones, those keeping (group, value) pairs: set by _additive
        self.additive = self._additive()
        self.key_chain = self._key_chain()
        self.hour_promise = self._hour_promise()
        self.aggregates = {t.fqn for t in catalog.derived() if AGGREGATE_MARK in t.sql}
        self.rate = self._rates()
        self._rows: dict[tuple[str, str], float] = {}  # a partition's rows, by the model
        self._inputs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._whole: dict[tuple[str, str], float] = {}  # the rows a whole build of a partition reads
        # late-change samples: id → (root, hour, arrival); partition → the sampled changes it holds
        self.samples: dict[int, tuple[str, str, datetime]] = {}
        self.holds: dict[tuple[str, str], frozenset[int]] = {}
        self.absorbed: dict[tuple[int, str, str], datetime] = {}
        # each whole build of a partition: when, and why (LATE_HORIZON_TRACE=N logs the N most built closed days)
        self.whole_log: dict[tuple[str, str], list[str]] = {}
        self.trace = int(os.environ.get("LATE_HORIZON_TRACE", "0"))

    def _key_local(self) -> set[str]:
        """The tables the product proves key-local (a late-data rebuild of them is scoped to the changed keys)."""
        from warehouse_assets.catalog.key_locality import key_locality
        from warehouse_assets.catalog.lineage import WarehouseLineage

        lineage = WarehouseLineage(self.catalog)
        return {
            t.fqn
            for t in self.catalog.derived()
            if not t.is_static and key_locality(t, lineage.input_columns(t)).key_local
        }

    def _additive(self) -> set[str]:
        """The totals the product proves additive (a late-data rebuild of them reads the input's changed rows)."""
        from warehouse_assets.catalog.additive import WarehouseTypes

        types = WarehouseTypes(self.catalog)
        found = {t.fqn for t in self.catalog.derived() if not t.is_static and types.verdict(t).additive}
        self.valued = {fqn for fqn in found if types.verdict(self.catalog[fqn]).values}
        return found

    def _key_chain(self) -> set[str]:
        """The key-local tables whose every derived input is one too: late data reaches them without a whole
        rebuild on the way, so their policy's interval is the promise their lag is held to."""
        import graphlib

        chain: set[str] = set()
        order = graphlib.TopologicalSorter({t.fqn: [d.table for d in t.deps if d.table != t.fqn] for t in self.catalog})
        for fqn in order.static_order():
            table = self.catalog[fqn]
            if fqn in self.key_local and all(
                self.catalog[d.table].is_source or self.catalog[d.table].is_static or d.table in chain or d.table == fqn
                for d in table.deps
            ):
                chain.add(fqn)
        return chain

    def _hour_promise(self) -> set[str]:
        """The tables whose policies promise their late data within an hour: each table on the way follows the
        rule of the rebuild it gets (by key for a key-local table, else the ``whole`` rule), at once or at most
        every 60 minutes."""
        import graphlib

        from warehouse_assets.catalog.policies import AT_ONCE, EVERY

        def hourly(table: Any) -> bool:
            policy = table.late_data
            if policy.whole is not None and table.fqn not in self.key_local | self.additive:
                policy = policy.for_whole_rebuilds()
            return policy.rebuild == AT_ONCE or (policy.rebuild == EVERY and (policy.every_minutes or 0) <= 60)

        promise: set[str] = set()
        order = graphlib.TopologicalSorter({t.fqn: [d.table for d in t.deps if d.table != t.fqn] for t in self.catalog})
        for fqn in order.static_order():
            table = self.catalog[fqn]
            if table.is_source or table.is_static:
                continue
            inputs = [d.table for d in table.deps if d.table != fqn]
            ok = all(self.catalog[d].is_source or self.catalog[d].is_static or d in promise for d in inputs)
            if ok and hourly(table):
                promise.add(fqn)
        return promise

    def _rates(self) -> dict[str, float]:
        import graphlib

        rate: dict[str, float] = {}
        order = graphlib.TopologicalSorter({t.fqn: [d.table for d in t.deps if d.table != t.fqn] for t in self.catalog})
        for fqn in order.static_order():
            table = self.catalog[fqn]
            if table.is_static:
                rate[fqn] = 0.0
            elif table.is_source:
                rate[fqn] = ROOT_ROWS_PER_HOUR
            elif fqn in self.aggregates:
                rate[fqn] = 0.0  # one row a partition
            else:
                ups = [rate[d.table] for d in table.deps if d.table != fqn and not self.catalog[d.table].is_static]
                rate[fqn] = max(MIN_RATE, 0.5 * sum(ups) / len(ups)) if ups else MIN_RATE
        return rate

    def rows(self, fqn: str, key: str) -> float:
        found = self._rows.get((fqn, key))
        if found is None:
            table = self.catalog[fqn]
            if table.is_static:
                found = STATIC_ROWS
            elif fqn in self.aggregates:
                found = 1.0
            else:
                window = self.window(table, key)
                found = self.rate[fqn] * ((window.end - window.start).total_seconds() / 3600)
            self._rows[(fqn, key)] = found
        return found

    def inputs(self, fqn: str, key: str, now: datetime) -> list[tuple[str, str]]:
        """The partitions a build of ``key`` reads. Kept once every window is whole: a window that exists stays the
        same (the calendars are fixed), and a partition is built many times over the horizon."""
        from warehouse_assets.catalog import WHOLE

        known = self._inputs.get((fqn, key))
        if known is not None:
            return known
        found = []
        complete = True
        for dep in self.catalog[fqn].deps:
            if self.catalog[dep.table].is_static:
                found.append((dep.table, WHOLE))
                continue
            keys = self.index.upstream_of(fqn, dep.table, key, now)
            complete = complete and keys is not None
            found += [(dep.table, k) for k in keys or []]
        if complete:
            self._inputs[(fqn, key)] = found
        return found

    def report_root(
        self, fqn: str, hour: str, now: datetime, sampled: frozenset[int] = frozenset(), changed: int | None = None
    ) -> None:
        """A root hour reported, on time or again with ``changed`` late changes (as the readiness sensor reports
        them: the rows, and the changes new since the previous report)."""
        rows = int(self.rows(fqn, hour))
        self.feed.complete(self.catalog[fqn], (hour,), now, {hour: (rows, changed)})
        self.builds[(fqn, hour)] += 1
        if sampled:
            self.holds[(fqn, hour)] = self.holds.get((fqn, hour), frozenset()) | sampled

    def settle(self, now: datetime) -> int:
        """Resolve and complete until nothing more is planned; the runs completed."""
        runs = 0
        while True:
            changes = self.feed.changes()
            plans = self.resolver.on_changes(changes, now)
            if not plans and not changes and not self.resolver.backlog:
                return runs
            completed = []
            for plan in plans:
                runs += 1
                late = {partition for partition, _ in plan.late_changes}
                # each partition's rows and the keys its build changed, as the runner's metadata records them
                counts = {
                    key: self.built(plan.table, key, now, key in late, ",".join(sorted(plan.trigger.fields)))
                    for key in plan.partitions
                }
                completed.append((self.catalog[plan.table], plan.partitions, counts))
            self.feed.complete_many(completed, now)  # the round's runs in one commit, in the order they ended

    def built(self, fqn: str, key: str, now: datetime, late: bool = False, why: str = "") -> tuple[int, int]:
        """Count a build's work; its partition's rows and the keys it changed."""
        inputs = self.inputs(fqn, key, now)
        whole = self._whole.get((fqn, key))
        if whole is None:
            whole = sum(self.rows(*i) for i in inputs)
            if (fqn, key) in self._inputs:  # its inputs are known for good: so is what they hold
                self._whole[(fqn, key)] = whole
        first = (fqn, key) not in self.builds
        self.builds[(fqn, key)] += 1
        self.sequence += 1
        own = self.rows(fqn, key)
        # what the build's metadata says it changed: a key-scoped rebuild its keys; a whole write every row (the net
        # change, which its readers' key-scoped rebuilds then find in its change feed, is not known before)
        recorded = own
        if first:
            self.first_rows += whole
            changed = own
            self.whole_builds[(fqn, key)] += 1
            self.whole_log.setdefault((fqn, key), []).append(f"{now:%m-%d %H:%M}#{self.sequence} first ({why})")
        else:
            self.later_rows_whole += whole
            read, changed, by_key = self._rebuild_cost(fqn, key, inputs, whole, late)
            self.later_rows += read
            if by_key:  # whatever it read (all of a tiny input, maybe), it replaced the changed keys' rows only
                recorded = changed
                if self.trace:
                    entry = f"{now:%m-%d %H:%M}#{self.sequence} by key or additively ({why})"
                    self.whole_log.setdefault((fqn, key), []).append(entry)
            else:
                self.whole_builds[(fqn, key)] += 1
                self.whole_log.setdefault((fqn, key), []).append(
                    f"{now:%m-%d %H:%M}#{self.sequence} {'late' if late else 'not late'} ({why})"
                )
        self.history.setdefault((fqn, key), []).append((self.sequence, changed))
        held = frozenset().union(*(self.holds.get(i, frozenset()) for i in inputs))
        before = self.holds.get((fqn, key), frozenset())
        if held:
            self.holds[(fqn, key)] = held
        if fqn.startswith("ads.") and held - before:
            for sample in held - before:
                self.absorbed.setdefault((sample, fqn, key), now)
        return int(own), int(recorded)

    def _rebuild_cost(
        self, fqn: str, key: str, inputs: list[tuple[str, str]], whole: float, late: bool
    ) -> tuple[float, float, bool]:
        """The rows a rebuild reads, the keys it changes and whether it was by key, as the product decides
        (key_scope.KeyScoper): a late-data rebuild of a key-local table reads the changed keys' rows of its inputs (one
        row per key and input partition), unless so many keys changed that it rebuilds whole; any other rebuild reads
        every input row. What its readers then see changed is net (``DeltaStore.changed_values``): the keys that
        changed in its inputs, at most its rows; a rebuild for another reason than late data (a later state, a window
        filling) may change every row."""
        own = self.rows(fqn, key)
        last = self.history[(fqn, key)][-1][0]
        keys = 0
        for i in inputs:  # each history is in build order: only its tail is newer than the last build
            for seq, c in reversed(self.history.get(i, [])):
                if seq <= last:
                    break
                keys += c
        if late and fqn in self.additive:
            if keys > MAX_CHANGED_ROWS:
                self.scoped["too_many_rows"] += 1
                self.work["too_many_rows"] += whole
                return whole, own, False
            # the delta rule's terms and the stored partial states, one row per group; the changed groups' rows
            # replaced
            self.scoped["additive"] += 1
            read = self._maintained_read(inputs, last) + own
            self.work["additive"] += read
            if fqn in self.valued:  # the touched pairs, and the group's pairs when its extreme went
                pairs = 2 * keys + min(keys, whole)
                self.work["distinct"] += pairs
                read += pairs
            return read, min(keys, own), True
        if not late or fqn not in self.key_local:
            kind = "not_late" if not late else "total" if fqn in self.aggregates else "not_key_local"
            self.scoped[kind] += 1
            self.work[kind] += whole
            return whole, own if not late else min(keys, own), False
        if keys > MAX_KEYS or (own >= SMALL_PARTITION and keys > MAX_SHARE * own):
            self.scoped["too_many_keys"] += 1
            self.work["too_many_keys"] += whole
            return whole, min(keys, own), False
        self.scoped["by_key"] += 1
        read = sum(min(self.rows(*i), keys) for i in inputs)
        self.work["by_key"] += read
        return read, min(keys, own), True

    def _maintained_read(self, inputs: list[tuple[str, str]], last: int) -> float:
        """The rows a maintained total's terms read: per input partition changed since the build ``last``, its
        change feed (a pre- and a post-image per changed row) and, of every other input table's partitions, the rows
        matching its changed keys (one per key and partition, at most the partition's rows)."""
        read = 0.0
        for changed_input in inputs:
            keys = 0
            for seq, c in reversed(self.history.get(changed_input, [])):  # in build order: only the tail is newer
                if seq <= last:
                    break
                keys += c
            if keys:
                others = (i for i in inputs if i[0] != changed_input[0])
                read += 2 * keys + sum(min(self.rows(*i), keys) for i in others)
        return read

    def report_changes(self, fqn: str, hour: str, keys: int) -> None:
        """A root hour's late changes as its report's changed keys (the change feed of its merges)."""
        self.sequence += 1
        self.history.setdefault((fqn, hour), []).append((self.sequence, keys))


def run_policy(n: int, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    from dagster import instance_for_test

    from warehouse_assets.catalog import load_catalog, periods
    from warehouse_assets.center.resolver import Resolver
    from warehouse_assets.center.reverse_index import ReverseIndex
    from warehouse_assets.center.state_store import PartitionStateStore
    from warehouse_assets.materialize.compiler import max_partitions_per_run

    tz = ZoneInfo(periods().timezone)
    day0 = datetime.combine(date.fromisoformat(scale.BENCH_START) + timedelta(days=364), clock(), tz)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"late_horizon_{n}_") as tmp:
        root = Path(tmp) / "tables"
        scale.generate_catalog(root, n, args.seed)
        declare(root, policy, args.seed)
        catalog = load_catalog(root)
        end = day0 + timedelta(days=args.days)
        index = ReverseIndex.build(catalog, current_time=end + timedelta(days=1))
        (Path(tmp) / "home").mkdir()
        with instance_for_test(temp_dir=str(Path(tmp) / "home")) as instance:
            store = PartitionStateStore(instance)
            calendars = scale.Calendars(end.timestamp() + 2 * 86400)
            scale.seed_history(store, catalog, calendars, day0.timestamp(), args.history_days)
            resolver = Resolver(catalog, index, store, max_partitions_per_run)
            resolver.prepare(day0)
            resolver.on_changes([], day0)  # the engine's clock starts with the horizon
            horizon = Horizon(catalog, index, store, resolver, scale.DirectFeed(store), day0, args.days)
            figures = simulate(horizon, calendars, policy, args, tz)
            resolver.close()
            store.close()
    figures.update(n=n, policy=policy, wall_s=round(time.perf_counter() - start, 1))
    return figures


def late_stream(catalog: Any, calendars: Any, day0: datetime, rng: random.Random, mean: float, days: int) -> list[Any]:
    """Every late change of the ``days``-day horizon: (arrival, root, hour, keys touched, replay?), in arrival order."""
    roots = sorted(t.fqn for t in catalog.ods())
    stream = []
    end = day0 + timedelta(days=days)
    for hour, hour_end in calendars.ended("hourly", day0.timestamp(), end.timestamp()):
        for fqn in roots:
            for _ in range(poisson(rng, mean)):
                arrival = datetime.fromtimestamp(hour_end, day0.tzinfo) + timedelta(minutes=late_lag_minutes(rng))
                if arrival < end:
                    stream.append((arrival, fqn, hour, 2 if rng.random() < MOVED_SHARE else 1, False))
    replay_at = day0 + timedelta(days=REPLAY_DAY, hours=REPLAY_AT)
    replayed = day0 + timedelta(days=REPLAY_OF_DAY)
    for h in range(24):
        hour = (replayed + timedelta(hours=h)).strftime("%Y-%m-%d-%H:00")
        stream.append((replay_at, roots[0], hour, int(ROOT_ROWS_PER_HOUR * REPLAY_CHANGED), True))
    stream.sort(key=lambda change: change[0])
    return stream


def simulate(horizon: Horizon, calendars: Any, policy: str, args: argparse.Namespace, tz: ZoneInfo) -> dict[str, Any]:
    catalog, day0 = horizon.catalog, horizon.day0
    rng = random.Random(args.seed + 101)
    stream = [] if policy == "none" else late_stream(catalog, calendars, day0, rng, args.late_per_hour, horizon.days)
    # the samples followed to the ADS: changes to the measured days' hours, not the replay's
    measured_end = day0 + timedelta(days=MEASURED_DAYS)
    eligible = [i for i, c in enumerate(stream) if not c[4] and c[2] < measured_end.strftime("%Y-%m-%d")]
    sampled = set(random.Random(args.seed + 202).sample(eligible, min(LAG_SAMPLES, len(eligible))))
    roots = [t.fqn for t in catalog.ods()]
    # two hours past the horizon for the on-time reports: the horizon's last hour, and its last day, are built
    end = day0 + timedelta(days=horizon.days, hours=2)
    now, i, runs, ticks = day0, 0, 0, 0
    keys_changed = 0
    targets: dict[int, list[tuple[str, str]]] = {}
    resolve_s = 0.0
    while now < end:
        now += TICK
        ticks += 1
        for hour, _ in calendars.ended(
            "hourly", (now - TICK - scale.SETTLE).timestamp(), (now - scale.SETTLE).timestamp()
        ):
            for fqn in roots:
                horizon.report_root(fqn, hour, now)
        arrived: dict[tuple[str, str], set[int]] = {}
        keys_of: dict[tuple[str, str], int] = {}
        while i < len(stream) and stream[i][0] <= now:
            arrival, fqn, hour, keys, _ = stream[i]
            keys_changed += keys
            keys_of[(fqn, hour)] = keys_of.get((fqn, hour), 0) + keys
            arrived.setdefault((fqn, hour), set())
            if i in sampled:
                arrived[(fqn, hour)].add(i)
                horizon.samples[i] = (fqn, hour, arrival)
                # the ADS partitions built from the hour before the change arrived: each must absorb it
                closure = horizon.index.closure({fqn: [hour]}, now)
                targets[i] = [
                    (t, k)
                    for t, keys_ in closure.items()
                    if t.startswith("ads.")
                    for k in keys_
                    if (t, k) in horizon.builds
                ]
            i += 1
        for (fqn, hour), ids in arrived.items():
            if (fqn, hour) in horizon.builds:  # a change to an hour not reported yet is part of its first report
                horizon.report_root(fqn, hour, now, frozenset(ids), keys_of[(fqn, hour)])
                horizon.report_changes(fqn, hour, keys_of[(fqn, hour)])
            elif ids:
                horizon.holds[(fqn, hour)] = horizon.holds.get((fqn, hour), frozenset()) | ids
        started = time.perf_counter()
        runs += horizon.settle(now)
        resolve_s += time.perf_counter() - started
        if ticks % 72 == 0:
            log(f"  {policy}: {now:%Y-%m-%d %H:%M}, {sum(horizon.builds.values())} builds, {runs} runs")
    # the sources stop (no change, no new hour); the clock runs on hour by hour until no rebuild is due any more, at
    # most DRAIN: a change is then absorbed late, or never, and the check tells which
    drained = now
    while now < drained + DRAIN and any(s.due is not None for s in horizon.resolver.ledger.all_stale()):
        now += timedelta(hours=1)
        runs += horizon.settle(now)
    log(f"  {policy}: drained by {now:%Y-%m-%d %H:%M}")
    return figures(horizon, calendars, stream, sampled, targets, now, keys_changed, runs, resolve_s, policy)


def figures(
    horizon: Horizon,
    calendars: Any,
    stream: list[Any],
    sampled: set[int],
    targets: dict[int, list[tuple[str, str]]],
    now: datetime,
    keys_changed: int,
    runs: int,
    resolve_s: float,
    policy: str,
) -> dict[str, Any]:
    catalog, day0 = horizon.catalog, horizon.day0
    measured = (day0.timestamp(), (day0 + timedelta(days=MEASURED_DAYS)).timestamp())
    closed: dict[str, list[int]] = {"hourly": [], "daily": []}
    closed_whole: list[int] = []
    missed = 0
    for table in catalog.derived():
        if table.is_static:
            continue
        horizon_end = (day0 + timedelta(days=horizon.days)).timestamp()
        for key, _ in calendars.ended(table.period, day0.timestamp(), horizon_end):
            if (table.fqn, key) not in horizon.builds:
                missed += 1
                if missed <= 10:
                    log(f"  missed {table.fqn} {key} ({table.period}, deps {[d.table for d in table.deps]})")
        if table.period in closed:
            keys = [k for k, _ in calendars.ended(table.period, *measured)]
            closed[table.period] += [horizon.builds[(table.fqn, k)] for k in keys]
            if table.period == "daily":
                closed_whole += [horizon.whole_builds[(table.fqn, k)] for k in keys]
    trace_most_built(horizon, calendars, measured)
    derived_builds = {k: v for k, v in horizon.builds.items() if not catalog[k[0]].is_source}
    lags: dict[bool, list[float]] = {True: [], False: []}  # by whether the ADS table is key-local
    chain_lags: list[float] = []  # ADS tables reached through key-local tables only
    hour_lags: list[float] = []  # ADS tables whose policies promise an hour
    unabsorbed = left_to_repair = 0
    for sample in sampled:
        root, hour, arrival = horizon.samples[sample]
        for fqn, key in targets.get(sample, []):
            at = horizon.absorbed.get((sample, fqn, key))
            if at is not None:
                lags[fqn in horizon.key_local].append((at - arrival).total_seconds())
                if fqn in horizon.key_chain:
                    chain_lags.append((at - arrival).total_seconds())
                if fqn in horizon.hour_promise:
                    hour_lags.append((at - arrival).total_seconds())
                continue
            if left_to_a_repair(horizon, sample, (root, hour), (fqn, key), now):
                left_to_repair += 1
                continue
            unabsorbed += 1
            if unabsorbed <= 3:  # what a lost change looks like, for whoever reads the log
                log(f"  {policy}: {root} {hour}'s change at {arrival:%m-%d %H:%M} never reached {fqn} {key}")
                trace_lost(horizon, sample, (root, hour), (fqn, key), now)
    stale_left = sum(1 for s in horizon.resolver.ledger.all_stale() if s.due is not None)
    out: dict[str, Any] = {
        "late_changes": sum(1 for c in stream if not c[4]),
        "keys_changed": keys_changed,
        "runs": runs,
        "builds": sum(derived_builds.values()),
        "first_builds": len(derived_builds),
        "amplification": round(sum(derived_builds.values()) / max(1, len(derived_builds)), 3),
        "late_work_ratio": round(horizon.later_rows / max(1.0, horizon.first_rows), 4),
        "late_work_ratio_whole": round(horizon.later_rows_whole / max(1.0, horizon.first_rows), 3),
        "rebuilds_by_key": horizon.scoped["by_key"],
        "rebuilds_additive": horizon.scoped["additive"],
        "rebuilds_whole": sum(n for kind, n in horizon.scoped.items() if kind not in ("by_key", "additive")),
        **{f"whole_{kind}": n for kind, n in horizon.scoped.items() if kind not in ("by_key", "additive")},
        # the late work ratio's parts: which rebuilds read the rows
        **{f"work_{kind}": round(rows / max(1.0, horizon.first_rows), 4) for kind, rows in horizon.work.items()},
        "key_local_tables": len(horizon.key_local),
        "additive_tables": len(horizon.additive),
        "total_tables": len(horizon.aggregates),
        "missed": missed,
        "late_lag_pairs": len(lags[True]) + len(lags[False]),
        "unabsorbed": unabsorbed,
        "left_to_repair": left_to_repair,
        "late_lag_p50_s": round(percentile(lags[True] + lags[False], 0.5)),
        "late_lag_p90_s": round(percentile(lags[True] + lags[False], 0.9)),
        "late_lag_key_local_p90_s": round(percentile(lags[True], 0.9)),
        "late_lag_whole_p90_s": round(percentile(lags[False], 0.9)),
        "late_lag_key_chain_p90_s": round(percentile(chain_lags, 0.9)),
        "key_chain_ads_pairs": len(chain_lags),
        "late_lag_hour_p90_s": round(percentile(hour_lags, 0.9)),
        "hour_ads_pairs": len(hour_lags),
        "stale_left": stale_left,
        "resolve_s": round(resolve_s, 2),
    }
    for (fqn, key), n in horizon.whole_builds.most_common(3):  # where whole builds go, for whoever reads the log
        deps = ", ".join(f"{d.table} ({d.mode})" for d in catalog[fqn].deps)
        log(f"  {policy}: {fqn} {key} built whole {n} times; it reads {deps}")
    out["closed_daily_whole_builds_p50"] = percentile(closed_whole, 0.5)
    out["closed_daily_whole_builds_p99"] = percentile(closed_whole, 0.99)
    out["closed_daily_whole_builds_max"] = max(closed_whole, default=0)
    for period, counts in closed.items():
        name = f"closed_{period}_builds"
        out.update({f"{name}_p50": percentile(counts, 0.5), f"{name}_p99": percentile(counts, 0.99)})
        out[f"{name}_max"] = max(counts, default=0)
    return out


def on_paths(horizon: Horizon, root: tuple[str, str], target: tuple[str, str], now: datetime) -> set[tuple[str, str]]:
    """The partitions on the paths from a root hour down to ``target``, both included."""
    closure = horizon.index.closure({root[0]: [root[1]]}, now)
    downstream = {(t, k) for t, keys in closure.items() for k in keys} | {root}
    seen, frontier = {target}, [target]
    while frontier:  # upward from the target, within the root's closure
        fqn, key = frontier.pop()
        for up in horizon.inputs(fqn, key, now):
            if up in downstream and up not in seen:
                seen.add(up)
                frontier.append(up)
    return seen


def left_to_a_repair(
    horizon: Horizon, sample: int, root: tuple[str, str], target: tuple[str, str], now: datetime
) -> bool:
    """Whether a change that never reached ``target`` stopped at a partition reported stale and left to a repair
    (its rebuild past its lookback, or a never policy): the target itself, or one on the way that does not hold it."""
    for fqn, key in on_paths(horizon, root, target, now):
        if (fqn, key) != target and sample in horizon.holds.get((fqn, key), frozenset()):
            continue
        stale = horizon.resolver.ledger.stale(fqn, [key]).get(key)
        if stale is not None and stale.due is None and "waits for" not in stale.note:
            return True
    return False


def trace_lost(horizon: Horizon, sample: int, root: tuple[str, str], target: tuple[str, str], now: datetime) -> None:
    """Log the path from a late change's root hour to an ADS partition that never absorbed it: each partition on
    the way, whether it holds the change, its builds, and the ledger's stale entry: where the change stopped."""
    seen = on_paths(horizon, root, target, now)
    for fqn, key in sorted(seen, key=lambda p: (p[0].split(".")[0] != "ods", p)):
        holds = sample in horizon.holds.get((fqn, key), frozenset())
        stale = horizon.resolver.ledger.stale(fqn, [key]).get(key)
        entry = "-" if stale is None else f"due={stale.due} changes={stale.changes} {stale.policy} {stale.note!r}"
        kind = "key-local" if fqn in horizon.key_local else "whole"
        log(
            f"    {fqn} {key} ({kind}): holds={holds} builds={horizon.builds[(fqn, key)]} "
            f"whole={horizon.whole_builds[(fqn, key)]} stale: {entry}"
        )


def trace_most_built(horizon: Horizon, calendars: Any, measured: tuple[float, float]) -> None:
    """With ``LATE_HORIZON_TRACE=N``: the N closed daily partitions built whole most, each whole build's time and
    why (its run's trigger), and how the table reads its inputs: what to look at when the P99 is high."""
    count = int(os.environ.get("LATE_HORIZON_TRACE", "0"))
    if not count:
        return
    closed = {
        (t.fqn, k)
        for t in horizon.catalog.derived()
        if t.period == "daily" and not t.is_static
        for k, _ in calendars.ended("daily", *measured)
    }
    for fqn, key in sorted(closed, key=lambda p: -horizon.whole_builds[p])[:count]:
        table = horizon.catalog[fqn]
        deps = ", ".join(f"{d.table}:{d.mode}[{d.start_offset},{d.end_offset}]" for d in table.deps)
        kind = "key-local" if fqn in horizon.key_local else "whole"
        log(f"  {fqn} {key} ({kind}; {deps}): {horizon.whole_builds[(fqn, key)]} whole builds")
        for line in horizon.whole_log.get((fqn, key), []):
            log(f"      {line}")
        for up in sorted(set(horizon.inputs(fqn, key, datetime.fromtimestamp(measured[1], UTC))))[:6]:
            if not horizon.catalog[up[0]].is_source:
                ukind = "key-local" if up[0] in horizon.key_local else "whole"
                log(f"    input {up[0]} {up[1]} ({ukind}): " + "; ".join(horizon.whole_log.get(up, [])[-8:]))


def child_main(args: argparse.Namespace) -> None:
    for policy in args.policies.split(";"):
        log(f"N={args.child}: {policy}")
        print(json.dumps(run_policy(args.child, policy, args)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--policies", default=";".join(POLICIES), help="';'-separated: none, at_once, every 30m...")
    parser.add_argument("--late-per-hour", type=float, default=12.0, help="mean late changes per root hour")
    parser.add_argument("--history-days", type=int, default=62)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--days", type=int, default=DAYS, help=f"simulated days (default {DAYS}; --quick {QUICK_DAYS})")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"100 tables, two policies, 3 late changes an hour, 35 days of history, {QUICK_DAYS} days",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child_main(args)
        return
    if args.quick:
        args.sizes, args.history_days = "100", 35
        if args.policies == ";".join(POLICIES):  # unless others were asked for
            args.policies = ";".join(QUICK_POLICIES)
        args.late_per_hour = min(args.late_per_hour, 3.0)
        args.days = min(args.days, QUICK_DAYS)
    if args.days <= max(REPLAY_DAY, MEASURED_DAYS):
        parser.error(f"--days {args.days}: more than the replay's day ({REPLAY_DAY}) and the measured days")
    calibration = calib_ms()
    log(f"calib_ms={calibration:.0f}")
    rows: list[dict[str, Any]] = []
    for n in (int(s) for s in args.sizes.split(",")):
        cmd = [sys.executable, __file__, "--child", str(n), "--policies", args.policies, "--seed", str(args.seed)]
        cmd += ["--history-days", str(args.history_days), "--late-per-hour", str(args.late_per_hour)]
        cmd += ["--days", str(args.days)]
        env = {**os.environ, "WAREHOUSE_START": scale.BENCH_START}
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=False)
        if proc.returncode:
            sys.exit(f"N={n}: the child failed ({proc.returncode})")
        rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    columns = [
        "n",
        "policy",
        "builds",
        "first_builds",
        "amplification",
        "late_work_ratio",
        "late_work_ratio_whole",
        "rebuilds_by_key",
        "rebuilds_whole",
        "closed_daily_builds_p50",
        "closed_daily_builds_p99",
        "closed_daily_builds_max",
        "closed_daily_whole_builds_p99",
        "closed_daily_whole_builds_max",
        "closed_hourly_builds_p99",
        "closed_hourly_builds_max",
        "late_lag_p50_s",
        "late_lag_p90_s",
        "late_lag_key_local_p90_s",
        "late_lag_whole_p90_s",
        "late_lag_key_chain_p90_s",
        "late_lag_hour_p90_s",
        "hour_ads_pairs",
        "unabsorbed",
        "left_to_repair",
        "stale_left",
        "missed",
        "resolve_s",
        "wall_s",
    ]
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row.get(c, "-")) for c in columns))
    for row in rows:
        print(
            f"ROW n={row['n']} policy={row['policy'].replace(' ', '_')} "
            + " ".join(f"{k}={row[k]}" for k in columns[2:])
            + "".join(f" {k}={v}" for k, v in sorted(row.items()) if k.startswith(("work_", "whole_")))
        )
    failures = [r for r in rows if r["missed"] or (r["policy"] not in ("none", "never") and r["unabsorbed"])]
    largest = max(r["n"] for r in rows)
    default = next(
        r
        for r in rows
        if r["n"] == largest
        and r["policy"] == (DEFAULT_POLICY if DEFAULT_POLICY in args.policies.split(";") else r["policy"])
    )
    keys = (
        "closed_daily_builds_p99",
        "closed_daily_whole_builds_p99",
        "amplification",
        "late_lag_p90_s",
        "late_lag_key_local_p90_s",
        "late_lag_whole_p90_s",
        "late_lag_key_chain_p90_s",
        "late_lag_hour_p90_s",
        "late_work_ratio",
        "late_work_ratio_whole",
        "missed",
        "unabsorbed",
    )
    print(
        f"RESULT n={largest} policy={default['policy'].replace(' ', '_')} "
        + " ".join(f"{k}={default[k]}" for k in keys)
        + f" calib_ms={calibration:.0f}"
    )
    if failures:
        sys.exit(f"correctness: {[(r['n'], r['policy'], r['missed'], r['unabsorbed']) for r in failures]}")


if __name__ == "__main__":
    main()
