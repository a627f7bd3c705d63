"""``warehouse rebuild --stale``: every stale partition's rebuild brought due now (a month-end close, after an outage).

The ledger's stale partitions (:meth:`Ledger.all_stale`) wait for their late-data policy, or for nobody (``never``,
beyond the lookback). A catch-up turns them into the runs the engine would submit when their policy's time came: one
run per table and contiguous span (at most the table's ``max_partitions_per_run``), tagged as rebuilds in the rebuild
lane with the late changes each absorbs (so the runner rebuilds them by key where it can).

Upstream before downstream, in one pass, ending with nothing stale. A stale partition's rebuild makes every built
partition read from it behind its inputs in turn (a day's rebuild makes its week stale), and that one would wait for
its own policy: so the catch-up rebuilds the stale partitions *and* every built partition downstream of them (the
reverse index's closure, as a taint's repair follows it). All runs are submitted at once, upstream tables first: a
higher queue priority by dependency depth, then oldest first. The rebuild lane runs one run at a time, so a downstream
rebuild starts only after the upstream ones queued before it landed, and reads them. Meanwhile the engine builds
nothing on an input whose rebuild is queued or running, and launches no second run for a partition whose run is
queued. (Submitting only the top of each chain would leave the rest to their policies: what a catch-up must not wait
for.)

Each partition of the catch-up is recorded *deferred* in the ledger before its run is submitted, as the resolver
records a partition whose own run is queued (:func:`defer_to_runs`): when the run ends, the resolver looks at the
partition again by its own rule, and one built on its current inputs leaves the ledger's stale partitions then, not
at its policy's time; one whose run failed, or that got late data while it ran, stays stale with its due time. A
partition parked ``waiting for its inputs`` is not submitted: its run could not build; the engine rebuilds it once
they are ready.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from warehouse_assets.catalog import BY_PERIOD, Catalog, Table
from warehouse_assets.center.ledger import Ledger, Stale
from warehouse_assets.center.plans import RunPlan, Trigger

CATCH_UP = "warehouse rebuild --stale"  # the trigger's field: the runs' tag says who asked
WAITING_FOR_INPUTS = "waiting for its inputs"  # the ledger's note on a stale partition whose inputs are not ready
BASE_PRIORITY = -150  # after what a user launches (0), before the engine's own rebuilds (-200 and up to -107)


@dataclass(frozen=True)
class CatchUp:
    """The runs of a catch-up, upstream first; the stale partitions left to the engine (inputs not ready); how many
    built partitions downstream of the stale ones the runs rebuild too."""

    plans: tuple[RunPlan, ...]
    waiting: tuple[Stale, ...]
    followers: int = 0


def depths(catalog: Catalog) -> dict[str, int]:
    """Each table's depth in the dependency graph: 0 for a source, else one more than its deepest input."""

    @functools.cache
    def depth(fqn: str) -> int:
        deps = [d.table for d in catalog[fqn].deps if d.table != fqn and d.table in catalog.tables]
        return 1 + max(map(depth, deps)) if deps else 0

    return {fqn: depth(fqn) for fqn in catalog.tables}


def plan_catch_up(
    catalog: Catalog,
    stale: Iterable[Stale],
    max_partitions_per_run: Callable[[Table], int | None],
    request: str = "catch-up",
    downstream: Callable[[Mapping[str, Sequence[str]]], Mapping[str, Iterable[str]]] | None = None,
) -> CatchUp:
    """The rebuild runs of ``stale``'s partitions, in the order to submit them (upstream tables first); ``request``
    prefixes their request ids (``warehouse/request``). ``downstream(roots)``: the built partitions read, directly or
    not, from ``roots`` (table → partitions); they are rebuilt too, after their inputs (none: the stale ones only)."""
    by_table: dict[str, list[Stale]] = {}
    waiting: list[Stale] = []
    for entry in stale:
        if entry.table not in catalog.tables:
            continue  # a table removed from the catalog since: nothing to rebuild it with
        if entry.due is None and entry.note == WAITING_FOR_INPUTS:
            waiting.append(entry)
        else:
            by_table.setdefault(entry.table, []).append(entry)
    changes = {(fqn, s.partition): max(1, s.changes) for fqn, entries in by_table.items() for s in entries}
    keys: dict[str, set[str]] = {fqn: {s.partition for s in entries} for fqn, entries in by_table.items()}
    followers = 0
    if downstream is not None and keys:
        for fqn, found in downstream({fqn: sorted(k) for fqn, k in keys.items()}).items():
            if fqn in catalog.tables and not catalog[fqn].is_source:
                added = set(found) - keys.get(fqn, set())
                followers += len(added)
                keys.setdefault(fqn, set()).update(added)
    depth = depths(catalog)
    plans: list[RunPlan] = []
    for fqn in sorted((t for t in keys if keys[t]), key=lambda t: (depth[t], t)):
        table = catalog[fqn]
        for span in _spans(table, sorted(keys[fqn], key=lambda k: _start(table, k)), max_partitions_per_run(table)):
            trigger = Trigger(fqn, span[0], None, None, frozenset({CATCH_UP}))
            plans.append(
                RunPlan(
                    fqn,
                    tuple(span),
                    trigger,
                    request_id=f"{request}-{fqn}-{span[0]}",
                    priority=BASE_PRIORITY - depth[fqn],
                    rebuild=True,
                    # a partition rebuilt for its rebuilt inputs absorbs what they absorbed: one change, by key
                    late_changes=tuple((k, changes.get((fqn, k), 1)) for k in span),
                )
            )
    return CatchUp(tuple(plans), tuple(waiting), followers)


def defer_to_runs(ledger_path: Path, plans: Iterable[RunPlan]) -> None:
    """Record the plans' partitions deferred in the ledger at ``ledger_path``: the resolver looks at each again when the
    run ends (one transaction; the engine may be writing the same file, in WAL mode)."""
    ledger = Ledger(ledger_path)
    try:
        with ledger.batch():
            ledger.set_deferred([], [(plan.table, partition) for plan in plans for partition in plan.partitions])
    finally:
        ledger.close()


def _start(table: Table, key: str) -> tuple[float, str]:
    try:
        return BY_PERIOD[table.period].time_window_for_partition_key(key).start.timestamp(), key
    except Exception:  # a regional or static key: by its name
        return 0.0, key


def _spans(table: Table, keys: Sequence[str], limit: int | None) -> list[list[str]]:
    """``keys`` (in time order) cut into runs of contiguous partitions, each at most ``limit`` long: a ranged run
    builds every partition between its first and last."""
    spans: list[list[str]] = []
    for key in keys:
        last = spans[-1] if spans else None
        if last is not None and (limit is None or len(last) < limit) and _follows(table, last[-1], key):
            last.append(key)
        else:
            spans.append([key])
    return spans


def _follows(table: Table, before: str, key: str) -> bool:
    if table.is_regional or table.period not in BY_PERIOD:
        return False
    pdef = BY_PERIOD[table.period]
    try:
        return pdef.time_window_for_partition_key(before).end == pdef.time_window_for_partition_key(key).start
    except Exception:
        return False
