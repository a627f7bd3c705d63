"""The predictor's queue follows the coordinator's lanes, and a running partition is never predicted to finish in the
past: pinned times and run times, every figure computed by hand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from warehouse_assets.explain.eta import (
    NOT_BUILT,
    QUEUED,
    RUNNING,
    RUNS,
    History,
    Node,
    Predictor,
    Queue,
    QueuedRun,
    RunTime,
    Seen,
    TagLimit,
    predict,
    tag_limits,
)
from warehouse_assets.instance.lanes import BACKGROUND_TAG, FIRST_BUILD_LANE, REBUILD_LANE, lane_tags

NOW = 1_772_420_400.0


class Graph:
    def __init__(self, edges: Mapping[Node, Sequence[Node]]):
        self.edges = edges

    def upstream(self, node: Node) -> Sequence[Node]:
        return self.edges.get(node, ())

    def is_source(self, table: str) -> bool:
        return False

    def window_end(self, node: Node) -> float:
        return NOW - 3600


class States:
    def __init__(self, seen: Mapping[Node, Seen]):
        self.known = seen

    def seen(self, table: str, keys: Sequence[str]) -> dict[str, Seen]:
        return {k: self.known.get((table, k), NOT_BUILT) for k in keys}


def history(**seconds: float) -> History:
    return History(runs={table.replace("_", "."): [RunTime(s)] * 3 for table, s in seconds.items()})


# dagster_home/dagster.yaml's limits: three slots, one run per background lane, two background runs together
LIMITS = tag_limits(
    [
        {"key": "warehouse/lane", "value": "ingest", "limit": 1},
        {"key": "warehouse/lane", "value": "rebuild", "limit": 1},
        {"key": "warehouse/lane", "value": "maintenance", "limit": 1},
        {"key": "warehouse/background", "limit": 2},
    ]
)


def test_the_instances_tag_limits_are_read_as_the_coordinator_counts_them() -> None:
    assert (
        TagLimit("warehouse/lane", "ingest", 1),
        TagLimit("warehouse/lane", "rebuild", 1),
        TagLimit("warehouse/lane", "maintenance", 1),
        TagLimit(BACKGROUND_TAG, None, 2),
    ) == LIMITS
    assert tag_limits([{"key": "team", "value": {"applyLimitPerUniqueValue": True}, "limit": 2}]) == (
        TagLimit("team", None, 2, per_value=True),
    )


def test_a_queued_rebuild_behind_a_busy_rebuild_lane_starts_when_that_lane_frees_not_when_a_slot_does() -> None:
    times = history(dwd_a=600, dws_b=100, dwd_c=300, ads_d=50)
    queue = Queue(
        [
            QueuedRun("dwd.a", ("p0",), started_at=NOW - 100, tags=lane_tags(REBUILD_LANE)),  # the lane busy to +500
            QueuedRun("dws.b", ("p",), started_at=NOW, tags=lane_tags(FIRST_BUILD_LANE)),  # ends +100
            QueuedRun("dwd.c", ("p",), tags=lane_tags(REBUILD_LANE)),  # queued: a slot is free now, its lane is not
            QueuedRun("ads.d", ("p",), tags=lane_tags(FIRST_BUILD_LANE)),  # behind it, not held back by its lane
        ],
        slots=3,
        limits=LIMITS,
    )
    states = States({("dwd.c", "p"): Seen(queued=True), ("ads.d", "p"): Seen(queued=True)})
    rebuild = predict(Graph({}), states, times, NOW, "dwd.c", "p", queue)
    assert (rebuild.path[-1].kind, rebuild.path[-1].start, rebuild.finish) == (QUEUED, NOW + 500, NOW + 800)
    first = predict(Graph({}), states, times, NOW, "ads.d", "p", queue)
    assert (first.path[-1].start, first.finish) == (NOW, NOW + 50)

    # the same queue without lanes: the rebuild would take the free slot at once
    plain = Queue(queue.runs, slots=3)
    assert predict(Graph({}), states, times, NOW, "dwd.c", "p", plain).finish == NOW + 300


def test_the_background_limit_holds_a_third_background_run_and_a_first_build_still_finds_its_slot() -> None:
    times = history(ods_o=200, dwd_a=400, dwd_z=100, dws_w=30)
    queue = Queue(
        [
            QueuedRun("ods.o", ("h",), started_at=NOW, tags=lane_tags("ingest")),  # ends +200
            QueuedRun("dwd.a", ("p",), started_at=NOW, tags=lane_tags(REBUILD_LANE)),  # ends +400
            QueuedRun("dwd.z", ("p",), tags=lane_tags("maintenance")),  # its own lane free, two background busy
        ],
        slots=3,
        limits=LIMITS,
    )
    graph = Graph({("dws.w", "p"): [("dwd.a", "p0")]})
    states = States({("dwd.z", "p"): Seen(queued=True), ("dwd.a", "p0"): Seen(ready_at=NOW - 10)})
    assert predict(graph, states, times, NOW, "dwd.z", "p", queue).path[-1].start == NOW + 200
    # a first build submitted now is no background run: the third slot is its own at once
    first = predict(graph, states, times, NOW, "dws.w", "p", queue)
    assert (first.path[-1].kind, first.path[-1].start, first.finish) == (RUNS, NOW, NOW + 30)


def test_a_running_partition_finishes_at_the_earliest_now_and_so_does_what_waits_for_it() -> None:
    # started 1000 s ago, its table takes 300 s: overdue, it ends no earlier than now, and its reader runs after now
    graph = Graph({("ads.c", "p"): [("dwd.b", "p")]})
    states = States({("dwd.b", "p"): Seen(started_at=NOW - 1000)})
    predictor = Predictor(graph, states, history(dwd_b=300, ads_c=60), NOW)
    running = predictor.predict("dwd.b", "p")
    assert (running.path[-1].kind, running.finish) == (RUNNING, NOW)
    reader = predictor.predict("ads.c", "p")
    assert (reader.path[-1].start, reader.finish) == (NOW, NOW + 60)
