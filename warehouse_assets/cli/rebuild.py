"""``warehouse rebuild --stale``: every stale partition's rebuild now, as the engine submits runs (a month-end close,
after an outage). What is rebuilt and in which order: :mod:`warehouse_assets.center.catch_up`."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo

HELP = (
    "bring every stale partition's rebuild due now (late data waiting for its policy, a `never` policy, beyond the "
    "lookback): one run per table and span in the rebuild lane, upstream tables first; the rebuild lane runs one at a "
    "time, so each downstream rebuild reads its rebuilt inputs and nothing is left stale"
)


def add_rebuild_parser(sub: Any) -> None:
    rebuild = sub.add_parser("rebuild", help=HELP, description=HELP)
    rebuild.add_argument(
        "--stale", action="store_true", required=True, help="the partitions the dependency center reports stale"
    )
    rebuild.add_argument("--table", nargs="+", default=[], metavar="LAYER.TABLE", help="only these tables")
    rebuild.add_argument("--dry-run", action="store_true", help="list them and the runs, launch nothing")
    rebuild.add_argument("--url", default=None, help="the Dagster webserver (default: WAREHOUSE_WEBSERVER_URL)")
    home = "the Dagster instance's directory (default: $DAGSTER_HOME, else ./dagster_home)"
    rebuild.add_argument("--dagster-home", default=None, help=home)


def rebuild_stale_command(args: argparse.Namespace, instance: Any, catalog: Any = None, submitter: Any = None) -> int:
    """List the stale partitions; without ``--dry-run`` launch their rebuilds through ``submitter`` (default: the
    webserver's GraphQL API, as the engine does). ``catalog`` defaults to the warehouse's."""
    from dagster import AssetKey

    from resources.settings import current
    from warehouse_assets.catalog import BY_PERIOD, load_catalog
    from warehouse_assets.center.catch_up import defer_to_runs, plan_catch_up
    from warehouse_assets.center.engine import GraphQLSubmitter, own_checks, own_compute
    from warehouse_assets.center.ledger import open_readonly
    from warehouse_assets.center.reverse_index import ReverseIndex
    from warehouse_assets.center.state_store import PartitionStateStore, default_path
    from warehouse_assets.instance.pools import pools_from_env
    from warehouse_assets.materialize.compiler import max_partitions_per_run

    catalog = catalog or load_catalog()
    try:
        wanted = {catalog.lookup(name).fqn for name in args.table}
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ledger = open_readonly(default_path(instance))
    if ledger is None:
        print(
            f"error: no ledger at {default_path(instance)}: the dependency center has not run on this instance",
            file=sys.stderr,
        )
        return 2
    try:
        stale = [s for s in ledger.all_stale() if not wanted or s.table in wanted]
    finally:
        ledger.close()
    if not stale:
        print("nothing stale" + (f" in {', '.join(sorted(wanted))}" if wanted else ""))
        return 0
    zone = ZoneInfo(BY_PERIOD["daily"].timezone)
    for entry in sorted(stale, key=lambda s: (s.table, s.partition)):
        print(f"{entry.table} {entry.partition}: {entry.describe(zone)}")
    index = ReverseIndex.build(catalog)
    store = PartitionStateStore(instance)
    view = store.view()

    def downstream(roots: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """The built partitions read from ``roots``: stale the moment those are rebuilt."""
        found = index.closure(roots)
        return {fqn: sorted(view_built(fqn, ks)) for fqn, ks in found.items() if fqn in catalog.tables}

    def view_built(fqn: str, keys: Sequence[str]) -> set[str]:
        return {k for k, s in view.states(AssetKey(catalog[fqn].key), keys).items() if s.materialized}

    try:
        request = f"catch-up-{uuid.uuid4().hex[:8]}"
        catch_up = plan_catch_up(catalog, stale, max_partitions_per_run, request=request, downstream=downstream)
    finally:
        store.close()
    for entry in catch_up.waiting:
        print(f"  left to the engine: {entry.table} {entry.partition} waits for its inputs, rebuilt once they are")
    spans = [
        f"{p.table} {p.partitions[0]}" + (f" … {p.partitions[-1]}" if len(p.partitions) > 1 else "")
        for p in catch_up.plans
    ]
    if args.dry_run:
        print(
            f"{len(stale)} stale partition(s) and {catch_up.followers} built from them; {len(catch_up.plans)} "
            "rebuild run(s), upstream first:"
        )
        print("\n".join(f"  {s}" for s in spans))
        print("nothing launched: without --dry-run they are launched in the rebuild lane")
        return 0
    if submitter is None:
        settings = current()
        submitter = GraphQLSubmitter(
            args.url or settings.webserver_url,
            settings.code_location,
            own_checks(catalog),
            own_compute(catalog, pools_from_env()),
        )
    # looked at again by the resolver when each run ends: stale no longer once built on its current inputs
    defer_to_runs(default_path(instance), catch_up.plans)
    launched = 0
    for plan, span in zip(catch_up.plans, spans, strict=True):
        try:
            run_id = submitter.submit(plan, AssetKey(catalog[plan.table].key))
        except Exception as exc:  # the webserver down: say which were launched, the rest stay stale
            print(f"error: {span}: could not launch its run ({type(exc).__name__}: {exc})", file=sys.stderr)
            print(f"launched {launched} of {len(catch_up.plans)} run(s); run it again once the webserver answers")
            return 1
        launched += 1
        print(f"  {span} → run {run_id}")
        time.sleep(0.05)  # the queue's order among equal priorities is the order of creation
    print(
        f"launched {launched} rebuild run(s) for {len(stale) - len(catch_up.waiting)} stale partition(s) and "
        f"{catch_up.followers} built from them, upstream first in the rebuild lane (one at a time); `warehouse "
        "status` shows them"
    )
    return 0


def _span(partitions: tuple[str, ...]) -> str:
    return partitions[0] if len(partitions) == 1 else f"{partitions[0]} … {partitions[-1]} ({len(partitions)})"
