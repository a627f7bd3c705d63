"""Automation conditions: a partition runs as soon as every mapped upstream partition is ready, never before.

Dagster's ``eager()`` only looks at the latest time window; the warehouse also needs the recent past to
catch up by itself (a source that comes back after an outage reports many hours at once). The condition:

* something changed: the partition is newly missing, or an upstream partition was updated — remembered
  ``since_last_handled`` so a partition whose upstream hours arrive one by one runs once the last arrives;
* ``~any_deps_missing()``: *every* mapped upstream partition exists (design §6.1: ``all_deps_match`` would
  accept some);
* nothing upstream or here is in progress, and the partition lies within ``LOOKBACK`` (older history is
  filled by backfills, design §6.4).
"""

from __future__ import annotations

from datetime import timedelta

from dagster import AutomationCondition

LOOKBACK = timedelta(days=35)


def ready_when_upstream_complete(lookback: timedelta = LOOKBACK) -> AutomationCondition:
    trigger = (AutomationCondition.newly_missing() | AutomationCondition.any_deps_updated()).since_last_handled()
    return (
        AutomationCondition.in_latest_time_window(lookback)
        & trigger.with_label("missing or upstream updated since last handled")
        & (~AutomationCondition.any_deps_missing()).with_label("every upstream partition exists")
        & ~AutomationCondition.any_deps_in_progress()
        & ~AutomationCondition.in_progress()
    ).with_label("all upstream partitions ready")
