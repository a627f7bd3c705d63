"""Run lanes: the share of the instance's run slots each kind of run may take.

Every run the product launches carries ``warehouse/lane``: ``ingest`` (``ods_ingest``, ``ods_quality_checks``),
``rebuild`` (every partition of the run was built before: late data, a later state, a repair), ``maintenance``
(Z-order, ``lake_maintenance``), ``first_build`` (a partition's first build: the dependency center's runs, a static
table's) and ``user`` (what someone launches: the CLI's repair commands, ``why_waiting``; the UI's Materialize and
backfills carry no lane and count as a user's). The three background lanes carry ``warehouse/background`` too.

``dagster_home/dagster.yaml``'s run coordinator limits each background lane to one run and the sum of them, through
``warehouse/background``, to one run less than ``max_concurrent_runs``: Dagster's ``tag_concurrency_limits`` cannot
limit a set of values of one tag, but a limit on a tag's key alone counts every run that has it, whatever its value.
So an ingestion, a rebuild and a Z-order run together never fill every slot, and a first build or a user's run
always finds one (``tests/instance/test_lanes.py`` checks both instances' settings).

This module imports nothing: the product's launchers (the engine's plans, the sensors, the jobs, the CLI) and the
instance plugins read the same names from it.
"""

from __future__ import annotations

LANE_TAG = "warehouse/lane"
BACKGROUND_TAG = "warehouse/background"  # on every run of a background lane; its value is the lane

INGEST_LANE = "ingest"
REBUILD_LANE = "rebuild"
MAINTENANCE_LANE = "maintenance"
FIRST_BUILD_LANE = "first_build"
USER_LANE = "user"

BACKGROUND_LANES = (INGEST_LANE, REBUILD_LANE, MAINTENANCE_LANE)
LANES = (*BACKGROUND_LANES, FIRST_BUILD_LANE, USER_LANE)


def lane_tags(lane: str) -> dict[str, str]:
    """The tags that put a run in ``lane``: the lane, and the shared background tag for a background lane."""
    if lane not in LANES:
        raise ValueError(f"unknown run lane {lane!r}: expected one of {', '.join(LANES)}")
    return {LANE_TAG: lane, **({BACKGROUND_TAG: lane} if lane in BACKGROUND_LANES else {})}
