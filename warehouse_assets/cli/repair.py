"""``warehouse taint``, ``reingest``, ``release``, ``reconcile`` and ``status TABLE``: mark bad data and what was built
from it, repair it, accept it as it is, find what left the lake, look at it.

``taint`` without ``--apply`` reads the catalog and the dependency center's state store only; with ``--apply``, and
``reingest`` and ``release``, execute the ``taint_repair`` job in this process (the run, its plan as Markdown and the
repair backfill show in the UI as if launched from the Launchpad). Only re-ingesting needs Spark.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any


def taint_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.reverse_index import ReverseIndex
    from warehouse_assets.center.state_store import PartitionStateStore
    from warehouse_assets.center.taint import new_taint, plan_taint

    columns = _columns(args.columns)
    if not args.apply:
        catalog = load_catalog()
        store = PartitionStateStore(instance)
        try:
            taint = new_taint(args.table, args.start, args.end, args.reason, args.by, columns=columns)
            index = ReverseIndex.build(catalog)
            plan = plan_taint(catalog, index, store.view(), args.table, args.start, args.end, taint, columns=columns)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            store.close()
        print("\n".join(plan.lines()))
        print("nothing marked yet: --apply marks them tainted and launches the repair backfill")
        return 0

    config = {"table": args.table, "start": args.start, "end": args.end, "reason": args.reason, "apply": True}
    config |= {"by": args.by, "reingest": args.reingest, "columns": columns}
    return _run_taint_job(config, instance, resources, args.reingest)


def _columns(text: str) -> list[str]:
    """``--columns amount,status`` as a list (none: the whole table)."""
    return [name.strip() for name in text.split(",") if name.strip()] if text else []


def reingest_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    config = {"table": args.table, "start": args.start, "end": args.end or args.start, "action": "reingest"}
    return _run_taint_job(config, instance, resources, lake=True)


def release_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.state_store import PartitionStateStore
    from warehouse_assets.center.taint import releasable

    config = {"table": args.table, "start": args.start, "end": args.end or args.start, "reason": args.reason}
    # checked here first: a release of nothing would otherwise be a failed run in the UI and a Dagster traceback
    store = PartitionStateStore(instance)
    try:
        releasable(load_catalog(), store.view(), config["table"], config["start"], config["end"])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    return _run_taint_job({**config, "by": args.by, "action": "release"}, instance, resources, lake=False)


def _run_taint_job(config: dict[str, Any], instance: Any, resources: dict[str, Any], lake: bool) -> int:
    """The code location's ``taint_repair`` job, executed here: its run shows in the UI as the Launchpad's would."""
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.taint import build_taint_job
    from warehouse_assets.cli.common import in_process_run_tags, with_running_spark
    from warehouse_assets.instance.lanes import USER_LANE

    result = build_taint_job(load_catalog(), lake=lake).execute_in_process(
        run_config={
            "ops": {"taint_and_repair": {"config": config}},
            "loggers": {"console": {"config": {"log_level": "WARNING"}}},  # the plan is printed once, below
        },
        instance=instance,
        tags=in_process_run_tags(USER_LANE),  # run monitoring must find this process as the run's worker
        resources=with_running_spark({k: v for k, v in resources.items() if k in ("spark", "lake", "landing")})
        if lake
        else None,
        raise_on_error=False,
    )
    if not result.success:
        failure = next((e for e in result.all_events if e.is_step_failure), None)
        error = failure.step_failure_data.error if failure is not None and failure.step_failure_data else None
        message = error.message.strip() if error is not None else "see the run's log"
        text = message.splitlines()[-1] if message else message
        if error is not None and error.cls_name == "Failure":  # the job's own words: Dagster's class path adds none
            text = text.split(f"{error.cls_name}: ", 1)[-1]
        print(f"error: {text} (run {result.run_id})", file=sys.stderr)
        return 1
    out = result.output_for_node("taint_and_repair")
    print("\n".join(out["lines"]))
    if config.get("action", "taint") == "taint":
        backfill = f"repair backfill {out['backfill']}" if out["backfill"] else "nothing to rebuild: no backfill"
        print(f"marked {out['marked']} partition(s) tainted; {backfill} (run {result.run_id})")
    else:
        print(f"(run {result.run_id})")
    return 0


def table_status_command(
    args: argparse.Namespace, instance: Any, landing: Any = None, now: datetime | None = None
) -> int:
    """Each partition of ``args.table`` in ``args.range``: materialized, valid or tainted, its checks, and a partition
    not built its predicted finish (a source hour in ``landing``, the landing area, waits for the ingestion, as
    ``why`` and the forecast sensor predict it)."""
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.ledger import open_readonly
    from warehouse_assets.center.state_store import PartitionStateStore
    from warehouse_assets.explain.eta_instance import instance_predictor
    from warehouse_assets.explain.status import status_keys, status_lines

    catalog = load_catalog()
    start, end = args.range or (None, None)
    if getattr(args, "as_of", None):
        return _status_as_of(args, instance, catalog, start, end)
    store = PartitionStateStore(instance)
    ledger = open_readonly(store.path)
    try:
        keys = status_keys(catalog, args.table, start, end)
        view = store.view()
        predictor = instance_predictor(instance, catalog, view, now or datetime.now(UTC), landing=landing)
        print("\n".join(status_lines(catalog, view, args.table, keys, ledger, predictor.predict)))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
        if ledger is not None:
            ledger.close()
    return 0


def _status_as_of(args: argparse.Namespace, instance: Any, catalog: Any, start: str | None, end: str | None) -> int:
    """``status TABLE --as-of TIME``: the partitions as they were at TIME, from the event log replayed up to it."""
    from warehouse_assets.catalog import business_zone
    from warehouse_assets.center.state_store import state_as_of
    from warehouse_assets.explain.status import as_of_lines, parse_moment, status_keys

    try:
        moment = parse_moment(args.as_of, business_zone())
        keys = status_keys(catalog, args.table, start, end, now=moment)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        store = state_as_of(instance, moment)
    except ValueError as exc:
        print(f"error: --as-of {args.as_of!r}: {exc}", file=sys.stderr)
        return 2
    try:
        print("\n".join(as_of_lines(catalog, store, args.table, keys, moment)))
    finally:
        store.close()
    return 0


def reconcile_command(args: argparse.Namespace, instance: Any, resources: dict[str, Any]) -> int:
    """Compare the lake with the partitions' states: mark what is gone missing (the engine builds it again), report
    what the lake holds that the instance never materialized. Exit status 1 when a table is out of step."""
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.center.reconcile import lake_tables, reconcile
    from warehouse_assets.center.state_store import PartitionStateStore

    catalog = load_catalog()
    try:
        tables = lake_tables(catalog, args.tables)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = PartitionStateStore(instance)
    try:
        result = reconcile(instance, catalog, store, resources["lake"].store(), tables, by=args.by)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print("\n".join(result.lines()))
    return 0 if all(t.in_step for t in result.tables) else 1


def add_taint_parser(sub: Any) -> None:
    taint = sub.add_parser("taint", help="mark partitions and everything built from them tainted; --apply repairs")
    taint.add_argument("table", help="e.g. ods.order")
    taint.add_argument(
        "start",
        nargs="?",
        default="",
        help="first partition, e.g. 2026-03-02-08:00 (daily: 2026-03-02); none of a static table",
    )
    taint.add_argument("end", nargs="?", default="", help="last partition (inclusive)")
    taint.add_argument("--reason", required=True, help="why the data is bad: shown on every tainted partition")
    taint.add_argument("--apply", action="store_true", help="mark them and launch the repair backfill")
    taint.add_argument(
        "--reingest",
        action="store_true",
        help="with --apply, of an ODS table: re-ingest the hours from the landing area's retained segments at once "
        "(instead of waiting for the source to send them again)",
    )
    taint.add_argument(
        "--columns",
        default="",
        help="only these columns are bad (comma-separated, e.g. amount,status): only the tables that read them, "
        "through the columns they compute from them, are tainted (a filter, join or grouping on one taints all)",
    )
    taint.add_argument("--by", default="", help="who marks them (default: your user name)")
    home = "the Dagster instance's directory (default: $DAGSTER_HOME, else ./dagster_home)"
    taint.add_argument("--dagster-home", default=None, help=home)

    again = sub.add_parser(
        "reingest", help="re-ingest ODS hours from the landing area's retained segments and report them again"
    )
    again.add_argument("table", help="an ODS table, e.g. ods.order")
    again.add_argument("start", help="first hour, e.g. 2026-03-02-08:00")
    again.add_argument("end", nargs="?", default="", help="last hour (inclusive; default: START)")
    again.add_argument("--dagster-home", default=None, help=home)

    release = sub.add_parser(
        "release", help="accept tainted partitions as they are (their source will not send them again), with a reason"
    )
    release.add_argument("table", help="e.g. ods.order")
    release.add_argument("start", nargs="?", default="", help="first partition (none of a static table)")
    release.add_argument("end", nargs="?", default="", help="last partition (inclusive; default: START)")
    release.add_argument("--reason", required=True, help="why the data is accepted: shown on every released partition")
    release.add_argument("--by", default="", help="who releases them (default: your user name)")
    release.add_argument("--dagster-home", default=None, help=home)

    reconcile = sub.add_parser(
        "reconcile",
        help="compare the lake's files with the partitions' states: mark the partitions gone from the lake missing "
        "(the engine builds them again), report data the instance never materialized",
    )
    reconcile.add_argument("tables", nargs="*", help="e.g. dwd.order_detail (default: every table in the lake)")
    reconcile.add_argument("--by", default="", help="who asks (default: your user name)")
    reconcile.add_argument("--dagster-home", default=None, help=home)
