"""Automation conditions: a partition runs as soon as every mapped upstream partition is ready, never before.

Dagster's ``eager()`` only looks at the latest time window; the warehouse also needs the recent past to
catch up by itself (a source that comes back after an outage reports many hours at once). The condition:

* something changed: the partition is newly missing, or an upstream partition was updated — remembered
  ``since_last_handled`` so a partition whose upstream hours arrive one by one runs once the last arrives;
* ``UpstreamPartitionsExist``: every partition the window needs is a partition at all. Dagster's mappings
  leave out upstream partitions before the upstream's start or in the future (design §6.2), so a 30-day
  window on the third day would otherwise run on three days. A self-dependency's T-1 before the table's
  first partition is not needed: the first partition of a self-dependent table starts the chain;
* ``~any_deps_missing()``: *every* mapped upstream partition is materialized (design §6.1: ``all_deps_match``
  would accept some) — for a self-dependency that is T-1, so a later partition never runs without it;
* nothing upstream or here is in progress, and the partition lies within ``LOOKBACK`` (older history is
  filled by backfills, design §6.4).

``UpstreamPartitionsExist`` asks the gate (:func:`warehouse_assets.gate.runnable_where_upstream_exists`) on the
asset graph's edges. It is Python evaluated by the automation sensor on the code server
(``use_user_code_server=True``, which Dagster limits to 500 assets per sensor).
"""

from datetime import timedelta

from dagster import AssetKey, AutomationCondition, AutomationContext, AutomationResult, TimeWindowPartitionsDefinition

from warehouse_assets.gate import Edge, runnable_where_upstream_exists

LOOKBACK = timedelta(days=35)


class UpstreamPartitionsExist(AutomationCondition):  # type: ignore[type-arg]
    """True for the candidate partitions all of whose mapped upstream partitions exist at evaluation time."""

    @property
    def name(self) -> str:
        return "upstream_partitions_exist"

    @property
    def description(self) -> str:
        return "every mapped upstream partition exists (none before its start or in the future)"

    def evaluate(self, context: AutomationContext) -> AutomationResult:  # type: ignore[type-arg]
        candidates = context.candidate_subset
        own_def = context.partitions_def
        if candidates.is_empty or not isinstance(own_def, TimeWindowPartitionsDefinition):
            return AutomationResult(context, true_subset=candidates)
        keys = sorted(candidates.expensively_compute_partition_keys())
        ok = runnable_where_upstream_exists(own_def, self._edges(context), keys, context.evaluation_time)
        if len(ok) == len(keys):
            return AutomationResult(context, true_subset=candidates)
        return AutomationResult(context, true_subset=candidates.compute_intersection_with_partition_keys(set(ok)))

    @staticmethod
    def _edges(context: AutomationContext) -> list[Edge]:  # type: ignore[type-arg]
        """The asset's time-window dependencies as the asset graph states them."""
        graph = context.asset_graph
        node = graph.get(context.key)
        edges = []
        for parent in sorted(k for k in node.parent_entity_keys if isinstance(k, AssetKey)):
            up_def = graph.get(parent).partitions_def
            if isinstance(up_def, TimeWindowPartitionsDefinition):
                edges.append(Edge(graph.get_partition_mapping(context.key, parent), up_def, parent == context.key))
        return edges


def ready_when_upstream_complete(lookback: timedelta = LOOKBACK) -> AutomationCondition:  # type: ignore[type-arg]
    trigger = (AutomationCondition.newly_missing() | AutomationCondition.any_deps_updated()).since_last_handled()
    return (
        AutomationCondition.in_latest_time_window(lookback)
        & trigger.with_label("missing or upstream updated since last handled")
        & UpstreamPartitionsExist()
        & (~AutomationCondition.any_deps_missing()).with_label("every upstream partition materialized")
        & ~AutomationCondition.any_deps_in_progress()
        & ~AutomationCondition.in_progress()
    ).with_label("all upstream partitions ready")
