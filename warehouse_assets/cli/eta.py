"""``warehouse eta --accuracy [--since T]``: the predicted finishes the product recorded, scored against the finishes
in Dagster's event log (:mod:`warehouse_assets.explain.accuracy`). No Spark, no lake: the instance alone."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

DEFAULT_SINCE = timedelta(days=1)


def add_eta_parser(sub: Any) -> None:
    eta = sub.add_parser(
        "eta", help="how good the predicted finishes were: error by horizon, SLA misses warned, false warnings"
    )
    eta.add_argument(
        "--accuracy",
        action="store_true",
        help="score the recorded predictions (the sla_forecast sensor's and `warehouse why`'s) against the actual "
        "finishes in the event log",
    )
    eta.add_argument(
        "--since",
        metavar="TIME",
        help="the finishes and SLA deadlines from TIME on (ISO 8601, business time zone unless it names an offset; "
        "default: the last 24 hours)",
    )
    eta.add_argument("--dagster-home", default=None, help="the Dagster instance's directory (default: $DAGSTER_HOME)")


def eta_command(args: argparse.Namespace, instance: Any) -> int:
    from warehouse_assets.catalog import business_zone, load_catalog
    from warehouse_assets.explain.accuracy import instance_accuracy
    from warehouse_assets.explain.status import parse_moment

    if not args.accuracy:
        print(
            "error: warehouse eta needs --accuracy (a partition's own predicted finish: `warehouse why TABLE KEY`)",
            file=sys.stderr,
        )
        return 2
    zone = business_zone()
    now = datetime.now(UTC)
    try:
        since = parse_moment(args.since, zone, "--since") if args.since else now - DEFAULT_SINCE
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if since >= now:
        print(f"error: --since {args.since!r} is not in the past", file=sys.stderr)
        return 2
    accuracy = instance_accuracy(instance, load_catalog(), since, now)
    print(f"finishes and SLA deadlines from {since.astimezone(zone):%Y-%m-%d %H:%M} to {now.astimezone(zone):%H:%M}")
    print("\n".join(accuracy.lines(zone)))
    return 0
