"""Compute pools' rule (warehouse_assets/instance/pools.py) on plain values: which pool a run goes to, when it waits
and what it says; the declarations that feed it (the pools' JSON, a table's ``compute:``). No Spark, no Dagster
instance: tests/instance/test_compute_pools.py runs the same rule on real Spark Connect servers."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from resources.settings import Settings
from resources.spark import POOL_TAG as RESOURCE_POOL_TAG
from resources.spark import POOL_URL_TAG as RESOURCE_POOL_URL_TAG
from tests.support.small_catalog import assert_refused, sql_catalog
from warehouse_assets.center.engine import own_compute
from warehouse_assets.instance.pools import (
    POOL_TAG,
    POOL_URL_TAG,
    RETRY_SECONDS,
    PoolRegistry,
    endpoint,
    parse_pools,
    parse_requirement,
    place,
    queue_limits,
    requirement_tags,
    without_token,
)

POOLS = parse_pools(
    '{"a": {"url": "sc://host-a:15002", "capacity": 1, "labels": {"region": "eu"}},'
    ' "b": {"url": "sc://host-b:15002", "capacity": 2, "labels": {"region": "eu", "size": "large"}},'
    ' "c": {"url": "spark://host-c:7077", "capacity": 1, "labels": {"region": "us"}}}'
)
EU = {"region": "eu"}


def answering(*down: str):
    asked: list[str] = []

    def probe(url: str) -> bool:
        asked.append(url)
        return not any(name in url for name in down)

    probe.asked = asked  # type: ignore[attr-defined]
    return probe


def test_a_run_goes_to_the_eligible_pool_with_the_most_free_capacity(tmp_path: Path) -> None:
    registry = PoolRegistry(tmp_path)
    assert place(POOLS, {}, EU, registry, time.time(), answering()).pool.name == "b"  # type: ignore[union-attr]
    # one run on b: a and b have one free slot each, the first declared wins
    assert place(POOLS, {"b": 1}, EU, registry, time.time(), answering()).pool.name == "a"  # type: ignore[union-attr]
    assert place(POOLS, {"a": 1, "b": 1}, EU, registry, time.time(), answering()).pool.name == "b"  # type: ignore[union-attr]
    # the labels: a large machine is b alone, the us region c alone, whatever the load elsewhere
    large = {"region": "eu", "size": "large"}
    assert place(POOLS, {"b": 1}, large, registry, time.time(), answering()).pool.name == "b"  # type: ignore[union-attr]
    assert place(POOLS, {}, {"region": "us"}, registry, time.time(), answering()).pool.name == "c"  # type: ignore[union-attr]


def test_when_every_eligible_pool_is_full_the_run_waits_and_says_which(tmp_path: Path) -> None:
    placement = place(POOLS, {"a": 1, "b": 2, "c": 0}, EU, PoolRegistry(tmp_path), time.time(), answering())
    assert placement.pool is None
    assert placement.message == "waiting for compute: pool a full (1/1), pool b full (2/2)"  # c lacks region=eu


def test_a_pool_that_does_not_answer_is_skipped_marked_offline_and_probed_again_later(tmp_path: Path) -> None:
    registry, now = PoolRegistry(tmp_path), time.time()
    probe = answering("host-b")
    assert place(POOLS, {}, EU, registry, now, probe).pool.name == "a"  # type: ignore[union-attr]
    assert probe.asked == ["sc://host-b:15002", "sc://host-a:15002"]  # type: ignore[attr-defined]
    assert registry.offline()["b"]["since"] == now
    # a full, b offline: the run waits, saying since when b is away (local time, as the operator reads it)
    waiting = place(POOLS, {"a": 1}, EU, registry, now + 1, probe)
    since = time.strftime("%H:%M", time.localtime(now))
    assert waiting.pool is None
    assert waiting.message == f"waiting for compute: pool a full (1/1), pool b offline since {since}"
    assert len(probe.asked) == 2  # type: ignore[attr-defined]  # b was not probed again yet
    # after RETRY_SECONDS it is probed again; answering now, it takes runs and is no longer offline
    back = place(POOLS, {"a": 1}, EU, registry, now + RETRY_SECONDS, answering())
    assert back.pool.name == "b"  # type: ignore[union-attr]
    assert registry.offline() == {}
    # still down at the retry: offline since the first time it was found so
    probe = answering("host-b")
    place(POOLS, {"a": 1}, EU, registry, now + 20, probe)
    place(POOLS, {"a": 1}, EU, registry, now + 40, probe)
    assert registry.offline()["b"] == {"since": now + 20, "probed": now + 40}


def test_a_requirement_no_pool_meets_is_an_error_naming_the_pools(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no compute pool has the labels region=ap .*a: \{'region': 'eu'\}"):
        place(POOLS, {}, {"region": "ap"}, PoolRegistry(tmp_path), time.time(), answering())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "expected a JSON object of pools"),
        ("{nope", "WAREHOUSE_SPARK_POOLS: not JSON"),
        ('{"a": {"url": "sc://host"}}', "pool 'a': url: .*sc://host:port"),
        ('{"a": {"url": "sc://h:1", "capacity": 0}}', "pool 'a': capacity: .*greater than or equal to 1"),
        ('{"a": {"url": "sc://h:1", "size": "large"}}', "pool 'a': size: Extra inputs"),
        ('{"a": "sc://h:1"}', "pool 'a' must be an object"),
    ],
)
def test_bad_pool_declarations_fail_naming_the_variable_and_the_pool(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_pools(text)


def test_nothing_configured_is_no_pools_and_addresses_are_read_from_each_kind_of_url() -> None:
    assert parse_pools("") == ()
    assert endpoint("sc://localhost:15003/;token=x") == ("localhost", 15003)
    assert endpoint("spark://m1:7077,m2:7077") == ("m1", 7077)
    assert endpoint("local[2]") is None and endpoint("yarn") is None
    assert parse_requirement("size=large, region=eu") == {"size": "large", "region": "eu"}
    assert requirement_tags({"size": "large", "region": "eu"}) == {"warehouse/compute": "region=eu,size=large"}
    with pytest.raises(ValueError, match="label=value"):
        parse_requirement("region")
    # the lake seam spells the tags its Spark resource reads itself: they must stay the same
    assert (RESOURCE_POOL_TAG, RESOURCE_POOL_URL_TAG) == (POOL_TAG, POOL_URL_TAG)
    # what the tags and the status show of a URL: never its token
    assert without_token("sc://h:15002/;token=s3cret") == "sc://h:15002"
    assert without_token("sc://h:15002/;use_ssl=true;token=s3cret") == "sc://h:15002/;use_ssl=true"
    assert without_token("spark://m:7077") == "spark://m:7077"


def test_a_run_reads_its_pools_url_token_included_from_the_settings() -> None:
    declared = '{"a": {"url": "sc://h:15002/;token=s3cret", "capacity": 2}}'
    assert Settings.from_env({"WAREHOUSE_SPARK_POOLS": declared}).spark_pool_urls == {"a": "sc://h:15002/;token=s3cret"}
    assert Settings.from_env({}).spark_pool_urls == {}
    with pytest.raises(ValueError, match="WAREHOUSE_SPARK_POOLS: expected a JSON object of pools"):
        Settings.from_env({"WAREHOUSE_SPARK_POOLS": '{"a": "sc://h:1"}'})


def test_a_tables_compute_labels_are_declared_in_its_header_and_checked_against_the_pools(tmp_path: Path) -> None:
    catalog = sql_catalog(
        tmp_path,
        {
            "dwd/big.sql": ("period: hourly\ncompute: {size: large, region: eu}\n", "SELECT id FROM ods.src"),
            "dwd/any.sql": ("period: hourly\n", "SELECT id FROM ods.src"),
        },
    )
    assert catalog["dwd.big"].compute == (("region", "eu"), ("size", "large"))
    assert [(key.to_user_string(), labels) for key, labels in own_compute(catalog, POOLS).items()] == [
        ("dwd/big", {"region": "eu", "size": "large"})
    ]
    us_only = parse_pools('{"c": {"url": "sc://h:1", "labels": {"region": "us"}}}')
    with pytest.raises(ValueError, match=r"dwd.big .*big.sql\) requires compute region=eu, size=large, which no pool"):
        own_compute(catalog, us_only)
    assert own_compute(catalog)  # no pools configured: the one endpoint, nothing to check against
    # the asset carries them as tags: a run launched from the UI requires them too (the launcher reads them)
    from dagster import AssetKey

    from warehouse_assets.materialize.compiler import build_asset

    tags = build_asset(catalog, catalog["dwd.big"]).tags_by_key[AssetKey(["dwd", "big"])]
    assert {k: v for k, v in tags.items() if k.startswith("warehouse/")} == {
        "warehouse/compute.region": "eu",
        "warehouse/compute.size": "large",
    }


@pytest.mark.parametrize(
    ("compute", "message"),
    [
        ("large", "compute must map compute pool labels to values"),
        ("{region: eu west}", "compute: region: eu west: labels and values are letters, digits"),
    ],
)
def test_a_compute_that_is_no_mapping_of_tag_words_is_refused_naming_the_file(
    tmp_path: Path, compute: str, message: str
) -> None:
    header = f"table: dwd.big\nperiod: hourly\ncompute: {compute}\n"
    assert_refused(tmp_path, {"dwd/big.sql": f"/* ---\n{header}--- */\nSELECT id FROM ods.src\n"}, message)


def test_why_and_status_say_what_the_pools_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A queued run on an instance whose pools are full or offline: ``warehouse why`` names them, ``warehouse status``
    lists each pool's load (no Spark: the runs are records, the offline pool the placement file's)."""
    from dagster import DagsterInstance, DagsterRun, DagsterRunStatus
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    from warehouse_assets.cli.main import status_command
    from warehouse_assets.explain.upstream import describe_run

    monkeypatch.setenv(
        "WAREHOUSE_SPARK_POOLS",
        '{"a": {"url": "sc://host-a:15002", "capacity": 1}, "b": {"url": "sc://host-b:15002", "capacity": 2}}',
    )
    (tmp_path / "dagster.yaml").write_text("telemetry: {enabled: false}\n")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        instance.add_run(
            DagsterRun(job_name="j", run_id="r1", status=DagsterRunStatus.STARTED, tags={"warehouse/pool": "a"})
        )
        location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="m"), location_name="here")
        origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), "j")
        waiting = instance.add_run(
            DagsterRun(job_name="j", run_id="r2", status=DagsterRunStatus.QUEUED, remote_job_origin=origin)
        )
        record = instance.get_run_record_by_id(waiting.run_id)
        assert record is not None
        now = datetime.now(UTC)
        # b has room: the run waits for a slot of the queue, not for compute
        assert "waiting for compute" not in describe_run(instance, record, now)
        registry = PoolRegistry(instance.root_directory)
        registry.mark_offline("b", datetime(2026, 11, 29, 14, 5).timestamp())
        registry.mark_offline("b", time.time())  # probed again just now, still down: offline since 14:05
        assert describe_run(instance, record, now).endswith(
            "; waiting for compute: pool a full (1/1), pool b offline since 14:05"
        )
        status_command(SimpleNamespace(runs=5), instance)
        # the queue's limits: a run slot for each free pool slot (b offline: none), one per label set a pool has
        for run_id, labels in (("r3", "size=large"), ("r4", "size=huge")):
            tags = {"warehouse/compute": labels}
            instance.add_run(DagsterRun(job_name="j", run_id=run_id, status=DagsterRunStatus.SUCCESS, tags=tags))
        sized = parse_pools(
            '{"a": {"url": "sc://host-a:15002", "capacity": 2, "labels": {"size": "large"}},'
            ' "b": {"url": "sc://host-b:15002", "capacity": 2}}'
        )
        large = {"key": "warehouse/compute", "value": "size=large", "limit": 1}
        assert queue_limits(instance, sized, 10) == (2, [large])
        assert queue_limits(instance, sized, 1)[0] == 1  # the configured limit stays when it is lower
    printed = capsys.readouterr().out
    assert printed.endswith(
        "compute pools:\n  pool a: 1/1 runs sc://host-a:15002\n  pool b: 0/2 runs, offline since 14:05 sc://host-b:15002\n"
    )
