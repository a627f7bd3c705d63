"""The engine: the dependency center's long-lived process, beside Dagster's webserver and daemon.

Every ``poll`` seconds it brings the partition state store up to the event log (one indexed read by storage id),
resolves what changed (:class:`warehouse_assets.center.resolver.Resolver`) and submits the runs that became possible
through Dagster's GraphQL API, the webserver's public interface: ``launchRun`` on the implicit asset job with the
table's asset and Dagster's partition (or partition range) tags. The runs are queued by the instance's run coordinator
and appear in the UI like any other: "Launched by" the ``dependency_center`` sensor (its ``dagster/sensor_name``
tag; the sensor's ticks show the engine's heartbeat, :mod:`warehouse_assets.center.heartbeat`), with a queue priority
by layer, their request and the change that triggered them in words.

Why a process of its own and not a Dagster sensor: an automation sensor evaluated on the code server is refused
above 500 assets and checks, a sensor's tick waits for the daemon's loop (at least 5 s), and a sensor cannot keep a
state store and a reverse index in memory between ticks. The engine needs neither the code location nor Spark: the
catalog and the event log are enough, and Dagster builds each run from the code location when it is submitted.

Exactly once: the resolver records each plan as *pending* in the transaction that records its request. The engine
submits the pending plans and forgets each once its run exists. After a crash, a pending plan whose run exists
(found by its ``warehouse/request`` tag) was submitted; the others are submitted now. A submission that fails
(the webserver restarting) stays pending and is retried, with one log line per outage rather than one per try.

A submission whose answer was lost (the webserver killed in the middle of it) may still have created its run: before
submitting such a plan again, the engine looks for a run with its request tag and takes it as the plan's, so a
request never gets two runs. A run the dying webserver created but never queued would wait for Dagster's run
monitoring to fail it and retry it (minutes, and a second run besides the engine's): the engine cancels it, tagged
``warehouse/orphaned``, and submits the plan again.

A run canceled because its worker was stopped (Ctrl-C or SIGTERM of the stack: the warm run launcher tags it
``warehouse/stopped_by``) was not done: the same sweep, whose first pass is the engine's first round, submits it again
(its partitions no later run took over), so the next start builds what the stopped one was building. A run a user
terminated is left alone.

A run that failed is Dagster's to retry (``run_retries`` in the instance). But when launching the retry fails (the
code server restarting at that moment), Dagster gives the run up for good (``dagster/will_retry=false``) and nothing
would build its partitions until new upstream data came. Every :data:`LOST_RETRY_SWEEP_S` the engine looks for such
runs of its own and submits them again, once: a run that failed on its data, or used up its retries, is left alone.
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import os
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from dagster import AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus, PartitionKeyRange, RunsFilter

from resources.settings import current
from warehouse_assets.catalog import Catalog, CatalogError, Table, load_catalog, partitions_def_of
from warehouse_assets.center import heartbeat
from warehouse_assets.center.heartbeat import SENSOR_NAME, Heartbeat
from warehouse_assets.center.plans import LOST_RETRY, PRIORITY_TAG, REQUEST_TAG, STOPPED, RunPlan, Trigger, run_priority
from warehouse_assets.center.reconcile import Reconciler
from warehouse_assets.center.resolver import Resolver
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.instance.lanes import LANE_TAG, REBUILD_LANE
from warehouse_assets.instance.pools import Pool, requirement_tags
from warehouse_assets.instance.warm_launcher import STOPPED_TAG
from warehouse_assets.materialize.gate import RETRY_ON_STEP_FAILURE_TAG
from warehouse_assets.materialize.validity import VALID

log = logging.getLogger("warehouse.engine")

ASSET_JOB = "__ASSET_JOB"  # Dagster's implicit job of every asset: what the UI's "Materialize" launches
REPOSITORY = "__repository__"  # the repository of a code location defined by a Definitions object
SENSOR_TAG = "dagster/sensor_name"  # what the Runs page's "Launched by" shows, linked to the sensor of that name
SUBMITTED_TAG = "warehouse/submitted_at"  # epoch seconds at which the engine submitted the run
SUBMITTERS = 4  # runs submitted at once: each call waits for the webserver to build the run from the code location
LOST_RETRY_SWEEP_S = 30.0  # how often the engine looks for failed runs whose retry Dagster could not launch
LOST_RETRY_PREFIX = "retry-"  # the request id of a run submitted again: retry-<failed run id>
STOPPED_PREFIX = "again-"  # the request id of a run submitted again after a stop canceled it: again-<run id>
# A run still NOT_STARTED this long after its creation was created by a webserver that died before queueing it (it
# queues a run in the same request, within milliseconds); longer than a submission's HTTP timeout, so that a slow
# webserver still answering is never taken for a dead one
ORPHAN_AFTER_S = 90.0
ORPHAN_TAG = "warehouse/orphaned"  # on such a run, canceled by the engine: the run submitted in its place took over
# Dagster's run tags (dagster._core.storage.tags): the retry decision on a failed run, and a retry's place in its group
WILL_RETRY_TAG = "dagster/will_retry"
AUTO_RETRY_RUN_ID_TAG = "dagster/auto_retry_run_id"
RETRY_NUMBER_TAG = "dagster/retry_number"


class RunSubmitter(Protocol):
    """Creates a Dagster run for a plan; returns its run id, raises when the run could not be created."""

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str: ...

    def submit_job(self, plan: RunPlan) -> str:
        """A plan of a job of the code location (``plan.job``, ``plan.run_config``): the taint job."""
        ...


class SubmitError(RuntimeError):
    """The webserver refused a launch, or answered something else than a run."""


_LAUNCH = """
mutation LaunchRun($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on Error { message }
  }
}
"""


_RELOAD = """
mutation Reload($location: String!) {
  reloadRepositoryLocation(repositoryLocationName: $location) {
    __typename
    ... on PythonError { message }
    ... on Error { message }
  }
}
"""

# what the webserver answers while the code server it started is gone; it does not start it again by itself
CODE_UNREACHABLE = "Could not reach user code server"
RELOAD_EVERY_S = 30.0  # a reload restarts the code server, which takes seconds: not every round
CATALOG_CHECK_S = 5.0  # how often the engine looks whether a table declaration was added, removed or changed


class GraphQLSubmitter:
    """Submits through the webserver's GraphQL API (``launchRun``), as the UI's Materialize button does.

    A run builds the asset and the checks ``checks`` names for it (the table's own, blocking or not): a check
    evaluated elsewhere (freshness, judged by its sensor at the deadline) is left out, where the UI's button would
    add an op that yields nothing and says so in every run's log. An asset ``checks`` does not name gets all of
    its checks. Safe to call from several threads: each call is one HTTP request of its own."""

    def __init__(
        self,
        url: str,
        location: str,
        checks: Mapping[AssetKey, Sequence[str]] | None = None,
        compute: Mapping[AssetKey, Mapping[str, str]] | None = None,
    ):
        """``compute``: the compute pool labels a run of an asset requires (its table's ``compute:``)."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if not parts.hostname:
            raise ValueError(f"{url!r}: expected the webserver's URL, e.g. http://127.0.0.1:3000")
        self.url, self.location = url, location
        self.endpoint = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/graphql"
        self.checks = dict(checks or {})
        self.compute = {key: requirement_tags(labels) for key, labels in (compute or {}).items()}
        self._reload_lock = threading.Lock()
        self._reloaded_at: float | None = None  # time.monotonic() of the last reload asked for

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str:
        selector: dict[str, object] = {"jobName": ASSET_JOB, "assetSelection": [{"path": list(asset_key.path)}]}
        if asset_key in self.checks:
            selector["assetCheckSelection"] = [
                {"assetKey": {"path": list(asset_key.path)}, "name": name} for name in self.checks[asset_key]
            ]
        return self._launch(plan, selector, {}, self.compute.get(asset_key, {}))

    def submit_job(self, plan: RunPlan) -> str:
        return self._launch(plan, {"jobName": plan.job}, json.loads(plan.run_config))

    def _launch(
        self,
        plan: RunPlan,
        selector: dict[str, object],
        run_config: dict[str, object],
        extra: Mapping[str, str] | None = None,
    ) -> str:
        # when the engine asked: the run's creation time minus this is the webserver's share of a handoff
        tags = {**plan.tags, **(extra or {}), SENSOR_TAG: SENSOR_NAME, SUBMITTED_TAG: f"{time.time():.3f}"}
        params = {
            "selector": {"repositoryLocationName": self.location, "repositoryName": REPOSITORY, **selector},
            "runConfigData": run_config,
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
        answer = self._post(_LAUNCH, {"executionParams": params})
        result = (answer.get("data") or {}).get("launchRun") or {}
        if result.get("__typename") == "LaunchRunSuccess":
            return str(result["run"]["runId"])
        why = result.get("message") or "; ".join(e["message"] for e in result.get("errors", [])) or answer.get("errors")
        if CODE_UNREACHABLE in str(why):
            self._reload()
        raise SubmitError(f"{result.get('__typename', 'no answer')}: {why}")

    def _post(self, query: str, variables: dict[str, object]) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(self.endpoint, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    def _reload(self, why: str = "the webserver could not reach the code location", force: bool = False) -> None:
        """Ask the webserver to reload the code location (the UI's Reload), which starts its code server again:
        without it, the engine's submissions fail until someone clicks Reload. At most once per RELOAD_EVERY_S,
        unless ``force`` (the catalog changed: the new tables' assets exist only after it)."""
        with self._reload_lock:
            now = time.monotonic()
            if not force and self._reloaded_at is not None and now - self._reloaded_at < RELOAD_EVERY_S:
                return
            self._reloaded_at = now
        answer = self._post(_RELOAD, {"location": self.location})
        result = (answer.get("data") or {}).get("reloadRepositoryLocation") or {}
        log.warning(
            "%s %s: asked it to reload (%s%s)",
            why,
            self.location,
            result.get("__typename", "no answer"),
            f": {result['message']}" if result.get("message") else "",
        )

    def catalog_changed(self, catalog: Catalog) -> None:
        """The catalog changed: its tables' own checks, and the code location reloaded so that their assets exist."""
        self.checks = dict(own_checks(catalog))
        self._reload("the catalog changed: the code location", force=True)


def own_checks(catalog: Catalog) -> dict[AssetKey, list[str]]:
    """Each derived table's checks a run of it evaluates: those declared beside the table and its ``valid`` check,
    which its asset carries too (an asset with checks cannot be built without all of them)."""
    return {AssetKey(t.key): [*(c.name for c in t.checks), VALID] for t in catalog.derived()}


def own_compute(catalog: Catalog, pools: Sequence[Pool] = ()) -> dict[AssetKey, dict[str, str]]:
    """The compute pool labels each table's runs require (its ``compute:``); with ``pools`` configured, ValueError
    naming the table when no pool has them (its runs could never start)."""
    found = {AssetKey(t.key): dict(t.compute) for t in catalog if t.compute}
    for table in catalog:
        if pools and table.compute and not any(pool.serves(dict(table.compute)) for pool in pools):
            wanted = ", ".join(f"{k}={v}" for k, v in table.compute)
            raise ValueError(
                f"{table.fqn} ({table.path}) requires compute {wanted}, which no pool of WAREHOUSE_SPARK_POOLS has "
                f"(pools: {', '.join(f'{p.name} {p.labels or {}}' for p in pools)})"
            )
    return found


class Watcher(Protocol):
    """Looks at a source of upstream events outside Dagster's event log (an external producer's deliveries) and
    reports what arrived into the instance, once per engine round before the round reads the log."""

    def poll(self) -> int: ...

    def close(self) -> None: ...


class Engine:
    """The state store, the reverse index and the resolver over ``instance``, and the loop that submits plans."""

    def __init__(
        self,
        instance: DagsterInstance,
        resolver: Resolver,
        submitter: RunSubmitter,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        watchers: Sequence[Watcher] = (),
        catalog_root: Path | None = None,
        reconciler: Reconciler | None = None,
    ):
        """``catalog_root``: the folder of the table declarations to watch (by default the catalog's own);
        ``reconciler``: compares the lake with the store on its cadence (none: never)."""
        self.instance, self.resolver, self.submitter, self.clock = instance, resolver, submitter, clock
        self.reconciler = reconciler
        self._reconciling = threading.Thread()  # the sweep in progress, if any (a thread never started: none)
        self.catalog, self.store = resolver.catalog, resolver.store
        self.watchers = list(watchers)
        started = time.perf_counter()
        self.resolver.prepare(clock())
        # the catalog, the index and the store's caches live as long as the engine: out of the collector's full passes,
        # which otherwise walk their millions of objects (about a second at 80,000 tables) in the middle of a round
        gc.freeze()
        self.load_seconds = time.perf_counter() - started
        self._failing: str | None = None  # the error of the current outage, logged once
        self._round_error = ""  # why the last round failed, while rounds fail
        self._pool = ThreadPoolExecutor(SUBMITTERS, thread_name_prefix="submit")
        self._started = time.time()
        self._submitted = 0
        self._latest: deque[str] = deque(maxlen=heartbeat.SHOWN)  # newest first
        self._beat_at = 0.0
        self.sweep_every = LOST_RETRY_SWEEP_S
        self._swept_at: float | None = None  # time.monotonic() of the last look for lost retries
        self.orphan_after = ORPHAN_AFTER_S
        self._unanswered: set[str] = set()  # requests whose submission failed: its run may exist all the same
        # the declarations the catalog was loaded from: a table added or changed there is built without a restart
        self.catalog_root = catalog_root if catalog_root is not None else _catalog_root(self.catalog)
        self._catalog_seen = _fingerprint(self.catalog_root)
        self._catalog_checked_at = time.monotonic()
        self._catalog_error = ""

    def close(self) -> None:
        for watcher in self.watchers:
            watcher.close()
        self.finish_sweep(timeout=30)
        self._pool.shutdown(wait=True)
        if self._beat_at:  # it beat while it ran: its last beat says it stopped
            self.beat(stopped=True)
        self.resolver.close()
        self.store.close()

    def beat(self, stopped: bool = False) -> None:
        """Write the heartbeat the ``dependency_center`` sensor and ``warehouse status`` read."""
        self._beat_at = time.time()
        heartbeat.beat(
            self.instance,
            Heartbeat(
                at=self._beat_at,
                started_at=self._started,
                cursor=self.store.cursor,
                backlog=self.resolver.backlog,
                pending=len(self.resolver.pending()),
                submitted=self._submitted,
                latest=list(self._latest),
                failing=self._round_error or self._failing or "",
                stopped=stopped,
            ),
        )

    def recover(self) -> int:
        """Settle the plans a previous engine recorded but may not have submitted: the ones whose run exists are done.
        Returns how many are left to submit."""
        left = 0
        for plan in self.resolver.pending():
            if self._run_of(plan.request_id):
                self.resolver.submitted(plan.request_id)
            else:
                self._unanswered.add(plan.request_id)  # a run still to be queued by a webserver gone meanwhile
                left += 1
        return left

    def _run_of(self, request_id: str) -> str | None:
        """The id of the run that exists for ``request_id``, if any; a run a dying webserver created and never queued
        (NOT_STARTED for longer than ``orphan_after``) is canceled and not counted. ``""``: a run too recent to tell
        (created, maybe about to be queued): neither the plan's nor to be replaced yet."""
        records = self.instance.get_run_records(RunsFilter(tags={REQUEST_TAG: request_id}))
        young = False
        for record in records:
            run = record.dagster_run
            if run.tags.get(ORPHAN_TAG):
                continue
            if run.status != DagsterRunStatus.NOT_STARTED:
                return run.run_id
            if time.time() - record.create_timestamp.timestamp() < self.orphan_after:
                young = True
                continue
            self.instance.add_run_tags(run.run_id, {ORPHAN_TAG: "true"})
            self.instance.report_run_canceled(
                run,
                message="created by a submission whose webserver died before queueing it: the dependency center "
                "submits its request again",
            )
            log.warning("run %s was created but never queued (its webserver died): submitting it again", run.run_id)
        return "" if young else None

    def tick(self, budget: float | None = None) -> list[tuple[RunPlan, str]]:
        """One round: report what the watchers see, resolve the events since the last round (for at most ``budget``
        seconds: a burst is resolved over several rounds, new events first), submit every pending plan; the runs
        submitted."""
        for watcher in self.watchers:
            watcher.poll()
        if time.monotonic() - self._catalog_checked_at >= CATALOG_CHECK_S:
            self._catalog_checked_at = time.monotonic()
            self.follow_catalog()
        if self._swept_at is None or time.monotonic() - self._swept_at >= self.sweep_every:
            self.plan_lost_retries()
            self._swept_at = time.monotonic()
        if self.reconciler is not None and self.reconciler.due() and not self._reconciling.is_alive():
            # beside the rounds, never in them: a sweep opens every table's Delta log, which takes seconds at scale
            self._reconciling = threading.Thread(
                target=self.reconcile, args=(self.catalog,), name="reconcile", daemon=True
            )
            self._reconciling.start()
        self.resolver.step(self.clock(), budget)
        return self.submit_pending()

    def finish_sweep(self, timeout: float | None = None) -> None:
        """Wait for the lake sweep in progress, if any, to end."""
        if self._reconciling.is_alive():
            self._reconciling.join(timeout=timeout)

    def reconcile(self, catalog: Catalog) -> None:
        """One sweep of the reconciler, on a store connection of its own (SQLite's are not shared across threads);
        its marks reach the engine's store as events of the log, in a later round."""
        if self.reconciler is None:
            return
        store = PartitionStateStore(self.instance, self.store.path)
        try:
            self.reconciler.sweep(catalog, store)
        except Exception as exc:  # the lake unreachable for a moment: the next sweep looks again
            log.warning("could not compare the lake with the partition states: %s", exc)
        finally:
            store.close()

    def follow_catalog(self) -> list[str]:
        """Load the catalog again when a declaration under ``catalog_root`` was added, removed or changed, and make the
        partitions of the new and changed tables candidates (within the lookback), as the clock does for windows that
        end; returns those tables. A catalog that does not load keeps the previous one, its error logged once."""
        seen = _fingerprint(self.catalog_root)
        if seen == self._catalog_seen or self.catalog_root is None:
            return []
        try:
            catalog = load_catalog(self.catalog_root)
        except (CatalogError, ValueError) as exc:
            if str(exc) != self._catalog_error:
                log.error("the catalog changed but does not load; the engine keeps the previous one: %s", exc)
                self._catalog_error = str(exc)
            return []
        self._catalog_seen, self._catalog_error = seen, ""
        old = self.catalog
        changed = sorted(fqn for fqn, table in catalog.tables.items() if old.tables.get(fqn) != table)
        now = self.clock()
        resolver = Resolver(
            catalog,
            ReverseIndex.build(catalog, current_time=now),
            self.store,
            self.resolver.max_partitions_per_run,
            self.resolver.lookback,
            ledger=self.resolver.ledger,
        )
        resolver.prepare(now)
        self.resolver, self.catalog = resolver, catalog
        on_catalog_change = getattr(self.submitter, "catalog_changed", None)
        if on_catalog_change is not None:
            try:
                on_catalog_change(catalog)
            except Exception as exc:  # the webserver down: the submissions retry, and ask for a reload themselves
                log.warning("could not ask the webserver to reload the code location: %s", exc)
        candidates = resolver.consider_tables(changed, now)
        log.info(
            "the catalog changed: %d table(s) added or changed (%s), %d partition(s) to look at",
            len(changed),
            ", ".join(changed[:5]) + (" …" if len(changed) > 5 else ""),
            candidates,
        )
        return changed

    def plan_lost_retries(self) -> list[RunPlan]:
        """Plan again each run of the engine's, within the lookback, that failed without failing on its data and that
        Dagster gave up retrying before its retries were used up, and each one a stop of the stack canceled; only
        their partitions no later run targeted."""
        now = self.clock()
        found: list[tuple[DagsterRun, bool]] = []
        if self.instance.run_retries_enabled:
            failed = RunsFilter(
                statuses=[DagsterRunStatus.FAILURE],
                tags={WILL_RETRY_TAG: "false"},
                created_after=now - self.resolver.lookback,
            )
            found += [(r.dagster_run, False) for r in self.instance.get_run_records(failed)]
        canceled = RunsFilter(
            statuses=[DagsterRunStatus.CANCELED],
            tags={STOPPED_TAG: ["SIGINT", "SIGTERM"]},
            created_after=now - self.resolver.lookback,
        )
        found += [(r.dagster_run, True) for r in self.instance.get_run_records(canceled)]
        plans: list[RunPlan] = []
        for run, stopped in found:
            plan = self._lost_retry(run, stopped)
            if plan is None or self.instance.get_run_records(RunsFilter(tags={REQUEST_TAG: plan.request_id}), limit=1):
                continue
            if self.resolver.add_pending(plan, now):
                why = "was canceled by a stop" if stopped else "failed and Dagster could not launch its retry"
                log.warning("run %s %s: submitting it again", plan.trigger.run_id, why)
                plans.append(plan)
        return plans

    def _lost_retry(self, run: DagsterRun, stopped: bool = False) -> RunPlan | None:
        tags = run.tags
        request = tags.get(REQUEST_TAG)
        if not request or (not stopped and request.startswith(LOST_RETRY_PREFIX)) or tags.get(AUTO_RETRY_RUN_ID_TAG):
            return None  # not the engine's, submitted again already, or retried by Dagster
        if not stopped and tags.get(RETRY_ON_STEP_FAILURE_TAG) == "false":
            return None  # it failed on its data: the engine requests it again when its inputs change
        if not stopped and int(tags.get(RETRY_NUMBER_TAG, "0")) >= self.instance.run_retries_max_retries:
            return None  # its retries are used up
        assets = list(run.asset_selection or ())
        table = self.catalog.tables.get(".".join(assets[0].path)) if len(assets) == 1 else None
        if table is None:
            return None  # a job's run (the taint job), not a table's
        keys = _partitions_of(table, tags)
        states = self.store.states(AssetKey(table.key), keys)
        partitions = [key for key in keys if states[key].latest_run in (None, run.run_id)]
        if not partitions:
            return None  # a later run took them over
        trigger = Trigger(table.fqn, partitions[0], None, run.run_id, frozenset({STOPPED if stopped else LOST_RETRY}))
        priority = int(tags.get(PRIORITY_TAG, run_priority(table.fqn, None, None)))
        return RunPlan(
            table.fqn,
            tuple(partitions),
            trigger,
            (STOPPED_PREFIX if stopped else LOST_RETRY_PREFIX) + run.run_id,
            priority=priority,
            rebuild=tags.get(LANE_TAG) == REBUILD_LANE,  # in the lane it was in
        )

    def submit_pending(self) -> list[tuple[RunPlan, str]]:
        plans = sorted(self.resolver.pending(), key=lambda plan: -plan.queue_priority)  # stable: oldest first
        if not plans:
            return []
        # A run the coordinator launches at once holds its slot until it ends, so the plans go in the order Dagster's
        # queue would launch them: one priority after the other (in parallel within one). Submitted all at once, a
        # day's first daily runs could take the slots before the day's last hour, whose run then waits for them.
        results: list[str | None] = []
        for _, group in itertools.groupby(plans, key=lambda plan: plan.queue_priority):
            results += self._pool.map(self._submit, list(group))
        done = [(plan, run_id) for plan, run_id in zip(plans, results, strict=True) if run_id is not None]
        for plan, run_id in done:
            self.resolver.submitted(plan.request_id)
            log.info("%s %s → run %s (%s)", plan.table, _span(plan.partitions), run_id, plan.trigger.describe())
            self._submitted += 1
            at = time.strftime("%H:%M:%S")
            self._latest.appendleft(f"{plan.table} {_span(plan.partitions)} → {run_id[:8]} at {at}")
        if len(done) == len(plans) and self._failing is not None:
            log.info("submitting runs again after: %s", self._failing)
            self._failing = None
        return done

    def _submit(self, plan: RunPlan) -> str | None:
        try:
            if plan.request_id in self._unanswered:  # the last try may have created the run before its answer was lost
                existing = self._run_of(plan.request_id)
                if existing is not None:
                    if existing:
                        self._unanswered.discard(plan.request_id)
                    return existing or None
            if plan.job:
                run_id = self.submitter.submit_job(plan)
            else:
                run_id = self.submitter.submit(plan, AssetKey(self.catalog[plan.table].key))
            self._unanswered.discard(plan.request_id)
            return run_id
        except Exception as exc:  # the webserver down or restarting: the plan stays pending, retried next round
            self._unanswered.add(plan.request_id)
            cause = exc.__cause__ or exc  # an HTTP client may wrap the transport's error in a generic one
            error = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
            if self._failing is None:
                log.warning("cannot submit runs (%s): the plans stay pending and are retried every round", error)
                self._failing = error
            return None

    def run(self, stop: threading.Event, poll: float) -> None:
        """Tick every ``poll`` seconds until ``stop`` is set; an error in a round is logged and the next one retries.

        A round resolves for at most ``poll`` seconds; while a burst (a day's end) leaves candidates in the resolver's
        backlog, the next round starts at once, so the events of the meantime wait one round, not the whole burst."""
        left = self.recover()
        log.info(
            "engine ready in %.1f s: %d tables, store at storage id %d, %d pending plan(s) to submit",
            self.load_seconds,
            len(list(self.catalog)),
            self.store.cursor,
            left,
        )
        while not stop.is_set():
            started = time.monotonic()
            busy = False
            try:
                self.tick(budget=poll)
                busy = self.resolver.backlog > 0
                self._round_error = ""
            except Exception as exc:  # a locked database, a storage hiccup: nothing recorded, the next round redoes it
                log.exception("engine round failed; retrying")
                first = str(exc).splitlines()[0] if str(exc) else ""
                self._round_error = f"round failed: {type(exc).__name__}: {first}"
            if time.time() - self._beat_at >= heartbeat.BEAT_SECONDS:
                try:
                    self.beat()
                except Exception:  # the instance's storage busy: the next round beats again
                    log.warning("could not write the engine's heartbeat; retrying next round", exc_info=True)
            stop.wait(0.0 if busy else max(0.0, poll - (time.monotonic() - started)))


def assemble_engine(
    instance: DagsterInstance,
    catalog: Catalog,
    submitter: RunSubmitter,
    max_partitions_per_run: Callable[[Table], int | None],
    clock: Callable[[], datetime] | None = None,
    watchers: Sequence[Watcher] = (),
    reconciler: Reconciler | None = None,
) -> Engine:
    """The engine over ``instance``'s state store, the catalog's reverse index and a resolver over both; its time is
    ``clock``'s, by default the settings' (real time, or the simulated sources' when they run faster than it)."""
    started = time.perf_counter()
    if clock is None:
        clock = current().center_clock.now
    store = PartitionStateStore(instance)
    resolver = Resolver(catalog, ReverseIndex.build(catalog, current_time=clock()), store, max_partitions_per_run)
    engine = Engine(instance, resolver, submitter, clock, watchers, reconciler=reconciler)
    engine.load_seconds = time.perf_counter() - started  # the store and the index included
    return engine


def _catalog_root(catalog: Catalog) -> Path | None:
    """The folder a catalog was loaded from (``tables/<layer>/<file>``), None for an empty one."""
    first = next(iter(catalog), None)
    return None if first is None else Path(first.path).parents[1]


def _fingerprint(root: Path | None) -> tuple[tuple[str, int, int], ...]:
    """Each declaration file's name, size and modification time: a change of any is a change of the catalog."""
    if root is None or not root.is_dir():
        return ()
    found = []
    for layer in sorted(os.scandir(root), key=lambda e: e.name):
        if not layer.is_dir():
            continue
        for entry in os.scandir(layer.path):
            if entry.name.endswith((".sql", ".yaml")):
                info = entry.stat()
                found.append((f"{layer.name}/{entry.name}", info.st_size, info.st_mtime_ns))
    return tuple(sorted(found))


def _partitions_of(table: Table, tags: Mapping[str, str]) -> list[str]:
    """The partitions a run's tags name: one, or a range of the table's partitions."""
    if "dagster/partition" in tags:
        return [tags["dagster/partition"]]
    first, last = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    if first is None or last is None:
        return []
    if first == last:  # one partition (a region's day is always a run of its own)
        return [first]
    # a backfill's range of a table with regions: Dagster's dates × regions between its ends
    return list(partitions_def_of(table).get_partition_keys_in_range(PartitionKeyRange(first, last)))


def _span(keys: tuple[str, ...]) -> str:
    return keys[0] if len(keys) == 1 else f"{keys[0]}…{keys[-1]} ({len(keys)})"
