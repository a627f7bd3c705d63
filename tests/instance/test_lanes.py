"""Run lanes (warehouse_assets/instance/lanes.py): every run the product launches says which share of the run slots it
may take, and both instances' settings keep a slot for first builds and users' runs whatever the other lanes do."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from dagster import DagsterRun
from dagster._utils.tags import TagConcurrencyLimitsCounter

from warehouse_assets.instance.lanes import (
    BACKGROUND_LANES,
    BACKGROUND_TAG,
    FIRST_BUILD_LANE,
    LANE_TAG,
    USER_LANE,
    lane_tags,
)

ROOT = Path(__file__).resolve().parents[2]
INSTANCES = [ROOT / "dagster_home" / "dagster.yaml", ROOT / "dagster_home" / "postgres" / "dagster.yaml"]


def run(n: int, tags: dict[str, str]) -> DagsterRun:
    return DagsterRun(job_name="j", run_id=f"r{n:04d}", tags=tags)


def fill(limits: list[dict[str, object]], slots: int, order: tuple[str, ...]) -> list[DagsterRun]:
    """What the queue launches from an endless supply of background runs offered lane by lane in ``order``."""
    active: list[DagsterRun] = []
    for lane in itertools.islice(itertools.cycle(order), 30):
        candidate = run(len(active), lane_tags(lane))
        if len(active) < slots and not TagConcurrencyLimitsCounter(limits, active).is_blocked(candidate):
            active.append(candidate)
    return active


def test_a_background_lane_carries_the_shared_tag_and_the_others_do_not() -> None:
    assert lane_tags("rebuild") == {LANE_TAG: "rebuild", BACKGROUND_TAG: "rebuild"}
    assert lane_tags(FIRST_BUILD_LANE) == {LANE_TAG: FIRST_BUILD_LANE}
    assert lane_tags(USER_LANE) == {LANE_TAG: USER_LANE}
    with pytest.raises(ValueError, match="unknown run lane 'fast'"):
        lane_tags("fast")


@pytest.mark.parametrize("path", INSTANCES, ids=["embedded", "postgres"])
def test_every_background_lane_full_leaves_a_slot_to_first_builds_and_users(path: Path) -> None:
    config = yaml.safe_load(path.read_text())["run_coordinator"]["config"]
    slots, limits = config["max_concurrent_runs"], config["tag_concurrency_limits"]
    for order in itertools.permutations(BACKGROUND_LANES):
        active = fill(limits, slots, order)
        assert {r.tags[LANE_TAG] for r in active} <= set(BACKGROUND_LANES)
        assert len(active) < slots, f"{[r.tags[LANE_TAG] for r in active]} fill all {slots} slots"
        for lane in (FIRST_BUILD_LANE, USER_LANE):
            assert not TagConcurrencyLimitsCounter(limits, active).is_blocked(run(99, lane_tags(lane)))
        assert not TagConcurrencyLimitsCounter(limits, active).is_blocked(run(99, {}))  # the UI's Materialize
    # and each background lane still runs at all: one at a time
    for lane in BACKGROUND_LANES:
        assert len(fill(limits, slots, (lane,))) == 1


def test_every_job_of_the_code_location_puts_its_runs_in_a_lane() -> None:
    """The jobs' own tags are their runs' tags (a sensor's, a schedule's, the Launchpad's, execute_in_process's); the
    asset job's runs get theirs from who launches them (the engine's plans, the static sensor) or are a user's."""
    from warehouse_assets.definitions import defs

    expected = {
        "ods_ingest": "ingest",
        "ods_quality_checks": "ingest",
        "zorder_partitions": "maintenance",
        "lake_maintenance": "maintenance",
        "taint_repair": "user",
        "why_waiting": "user",
    }
    repository = defs.get_repository_def()
    lanes = {
        job.name: job.run_tags.get(LANE_TAG)
        for job in repository.get_all_jobs()
        if not job.name.startswith("__ASSET_JOB")
    }
    assert lanes == expected
    for name, lane in expected.items():
        assert dict(repository.get_job(name).run_tags).items() >= lane_tags(lane).items()
