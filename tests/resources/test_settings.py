"""One settings object: every ``WAREHOUSE_*`` variable read once and validated; the business timezone everywhere.

The partitions follow ``WAREHOUSE_TIMEZONE``: in a zone with daylight saving time (America/Los_Angeles) the
day of the spring change has 23 hours and the autumn day 25, and a daily partition maps to exactly those hours
through the product's own mapping.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from dagster import AssetKey, MultiPartitionsDefinition
from pydantic import SecretStr

from resources import resources_from_env
from resources.settings import Settings, current, using
from warehouse_assets.catalog import (
    BY_PERIOD,
    load_catalog,
    mapped_upstream,
    partition_mapping,
    periods,
    upstream_partitions,
)
from warehouse_assets.definitions import build_definitions, run_executor
from warehouse_assets.materialize.freshness import deadline

CATALOG = load_catalog()
LOS_ANGELES = Settings.from_env({"WAREHOUSE_TIMEZONE": "America/Los_Angeles"})
LATER = datetime(2027, 1, 1, tzinfo=UTC)  # every hour of 2026 exists by then


def hours_of(day: str, settings: Settings) -> list[str]:
    """The hourly partitions whose window lies in the local day ``day``."""
    p = periods(settings)
    return p.hourly.get_partition_keys_in_time_window(p.daily.time_window_for_partition_key(day))


# --- defaults and validation ------------------------------------------------------------------------------


def test_an_empty_environment_gives_the_embedded_defaults() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.timezone == "Asia/Shanghai" and settings.start == date(2026, 1, 1)
    assert (settings.lake_root, settings.landing_root, settings.external_dir) == (
        "data/lake",
        "data/landing",
        "data/landing/external",
    )
    assert (settings.spark_mode, settings.run_executor, settings.simulate_live) == ("local", "in_process", False)
    assert (settings.engine_poll_seconds, settings.ods_checks_interval, settings.ods_sensor_interval) == (0.1, 10, 15)
    assert (settings.webserver_url, settings.code_location) == ("http://127.0.0.1:3000", "warehouse")
    assert (settings.external_sensor_interval, settings.freshness_sensor_interval) == (10, 60)
    assert (settings.freshness_horizon_hours, settings.time_travel_hours) == (48.0, 168)
    assert Settings.from_env({"WAREHOUSE_TIMEZONE": ""}).timezone == "Asia/Shanghai"  # empty is unset


def test_every_variable_is_read() -> None:
    env = {
        "WAREHOUSE_TIMEZONE": "Europe/Berlin",
        "WAREHOUSE_START": "2026-03-04",
        "WAREHOUSE_LAKE_ROOT": "s3://lake",
        "WAREHOUSE_LANDING_ROOT": "/landing",
        "WAREHOUSE_EXTERNAL_ROOT": "/partners",
        "WAREHOUSE_CATALOG_DIR": "/catalog",
        "WAREHOUSE_LOG_DIR": "/logs",
        "WAREHOUSE_SPARK_MODE": "connect",
        "WAREHOUSE_SPARK_MASTER": "spark://m:7077",
        "WAREHOUSE_SPARK_CONNECT_URL": "sc://spark:15002",
        "WAREHOUSE_SPARK_DRIVER_MEMORY": "2g",
        "WAREHOUSE_SPARK_CONF": "spark.a=1, spark.b=x=y",
        "WAREHOUSE_SPARK_POOLS": '{"a": {"url": "sc://a:15002"}}',
        "WAREHOUSE_SITES": '{"dc2": "s3://lake2"}',
        "WAREHOUSE_SPARK_LOG_LEVEL": "info",
        "WAREHOUSE_SPARK_SERVER_NICE": "5",
        "WAREHOUSE_TIME_TRAVEL_HOURS": "24",
        "WAREHOUSE_SIMULATE_LIVE": "1",
        "WAREHOUSE_RUN_EXECUTOR": "multiprocess",
        "WAREHOUSE_ENGINE_POLL_SECONDS": "0.5",
        "WAREHOUSE_CLOCK": "2026-03-06T00:15:00+08:00@1796000000*240",
        "WAREHOUSE_RECONCILE_SECONDS": "60",
        "WAREHOUSE_WEBSERVER_URL": "http://dagster:3000",
        "WAREHOUSE_CODE_LOCATION": "lake",
        "WAREHOUSE_ODS_SENSOR_INTERVAL": "2",
        "WAREHOUSE_ODS_CHECKS_INTERVAL": "11",
        "WAREHOUSE_EXTERNAL_SENSOR_INTERVAL": "12",
        "WAREHOUSE_FRESHNESS_SENSOR_INTERVAL": "90",
        "WAREHOUSE_FRESHNESS_HORIZON_HOURS": "0.5",
        "WAREHOUSE_CAPTURE_SOURCE": "mysql://cdc@db:3306",
        "WAREHOUSE_CAPTURE_PASSWORD": "pw",
        "WAREHOUSE_LINEAGE_AT_LOAD": "0",
        "WAREHOUSE_LINEAGE_CACHE_DIR": "/cache",
        "WAREHOUSE_OPENLINEAGE_URL": "http://marquez:5000",
        "WAREHOUSE_OPENLINEAGE_NAMESPACE": "lakehouse",
    }
    settings = Settings.from_env(env)
    assert settings.model_dump() == {
        "timezone": "Europe/Berlin",
        "start": date(2026, 3, 4),
        "lake_root": "s3://lake",
        "landing_root": "/landing",
        "external_root": "/partners",
        "catalog_dir": "/catalog",
        "log_dir": "/logs",
        "spark_mode": "connect",
        "spark_master": "spark://m:7077",
        "spark_connect_url": "sc://spark:15002",
        "spark_driver_memory": "2g",
        "spark_conf": {"spark.a": "1", "spark.b": "x=y"},
        "spark_pools": '{"a": {"url": "sc://a:15002"}}',
        "sites": '{"dc2": "s3://lake2"}',
        "spark_log_level": "INFO",
        "spark_server_nice": 5,
        "time_travel_hours": 24,
        "simulate_live": True,
        "run_executor": "multiprocess",
        "engine_poll_seconds": 0.5,
        "clock": "2026-03-06T00:15:00+08:00@1796000000*240",
        "reconcile_seconds": 60.0,
        "webserver_url": "http://dagster:3000",
        "code_location": "lake",
        "ods_sensor_interval": 2,
        "ods_checks_interval": 11,
        "external_sensor_interval": 12,
        "freshness_sensor_interval": 90,
        "freshness_horizon_hours": 0.5,
        "capture_source": "mysql://cdc@db:3306",
        "capture_password": SecretStr("pw"),
        "lineage_at_load": False,
        "lineage_cache_dir": "/cache",
        "openlineage_url": "http://marquez:5000",
        "openlineage_namespace": "lakehouse",
    }
    assert "pw" not in repr(settings)  # a secret never shows in a log line
    assert settings.external_dir == "/partners"
    resources = resources_from_env(settings)
    assert (resources["spark"].mode, resources["spark"].timezone, resources["spark"].conf["spark.a"]) == (
        "connect",
        "Europe/Berlin",
        "1",
    )
    assert (resources["lake"].root, resources["lake"].time_travel_hours) == ("s3://lake", 24)
    assert (resources["landing"].timezone, resources["landing"].simulate_live) == ("Europe/Berlin", True)
    assert resources["external"].root == "/partners"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("WAREHOUSE_TIMEZONE", "Mars/Olympus", "WAREHOUSE_TIMEZONE='Mars/Olympus': expected an IANA timezone name"),
        (
            "WAREHOUSE_START",
            "2026-3-4",
            "WAREHOUSE_START must be the first day of the warehouse's data as YYYY-MM-DD (e.g. 2026-01-01), "
            "got '2026-3-4'",
        ),
        ("WAREHOUSE_START", "2026-02-30", "WAREHOUSE_START must be the first day of the warehouse's data"),
        ("WAREHOUSE_ENGINE_POLL_SECONDS", "fast", "WAREHOUSE_ENGINE_POLL_SECONDS='fast': expected a positive number"),
        ("WAREHOUSE_ODS_CHECKS_INTERVAL", "0", "WAREHOUSE_ODS_CHECKS_INTERVAL='0': expected a positive whole number"),
        ("WAREHOUSE_FRESHNESS_HORIZON_HOURS", "two", "WAREHOUSE_FRESHNESS_HORIZON_HOURS='two': expected a number"),
        ("WAREHOUSE_SPARK_MODE", "yarn", "WAREHOUSE_SPARK_MODE='yarn': expected one of connect, local, master"),
        (
            "WAREHOUSE_RUN_EXECUTOR",
            "threads",
            "WAREHOUSE_RUN_EXECUTOR='threads': expected one of in_process, multiprocess",
        ),
        ("WAREHOUSE_SIMULATE_LIVE", "maybe", "WAREHOUSE_SIMULATE_LIVE='maybe': expected 1 or 0"),
        ("WAREHOUSE_SPARK_CONF", "spark.a=1,oops", "WAREHOUSE_SPARK_CONF='spark.a=1,oops': expected key=value pairs"),
        ("WAREHOUSE_SPARK_LOG_LEVEL", "loud", "WAREHOUSE_SPARK_LOG_LEVEL='loud': expected one of ERROR, WARN, INFO"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        Settings.from_env({variable: value})
    assert message in str(error.value)


def test_the_process_reads_its_settings_once() -> None:
    assert current() is current()
    with using(LOS_ANGELES):
        assert current() is LOS_ANGELES
    assert current() is not LOS_ANGELES


def test_runs_execute_in_process_unless_the_settings_say_otherwise() -> None:
    assert run_executor(Settings()).name == "in_process"
    assert run_executor(Settings.from_env({"WAREHOUSE_RUN_EXECUTOR": "multiprocess"})).name == "multiprocess"


# --- the business timezone: partitions in a zone with daylight saving time -----------------------------------


def test_partitions_follow_the_timezone_and_the_start() -> None:
    p = periods(Settings.from_env({"WAREHOUSE_TIMEZONE": "America/Los_Angeles", "WAREHOUSE_START": "2026-03-04"}))
    assert {d.timezone for d in p.by_period.values()} == {"America/Los_Angeles"}
    assert p.daily.get_first_partition_key() == "2026-03-04"
    assert p.weekly.get_first_partition_key() == "2026-03-09"
    assert p.monthly.get_first_partition_key() == "2026-04-01"
    assert periods(LOS_ANGELES) is periods(LOS_ANGELES)  # one object per configuration: mapped definitions match


def test_the_spring_day_has_23_hours_and_the_autumn_day_25() -> None:
    spring, autumn = hours_of("2026-03-08", LOS_ANGELES), hours_of("2026-11-01", LOS_ANGELES)
    assert len(spring) == 23 and "2026-03-08-02:00" not in spring  # 02:00 to 03:00 never happens
    assert len(autumn) == 25 and "2026-11-01-01:00-0800" in autumn  # 01:00 to 02:00 happens twice
    assert len(hours_of("2026-03-08", Settings())) == 24  # the default zone has no daylight saving time


@pytest.mark.parametrize(("day", "hours"), [("2026-03-08", 23), ("2026-11-01", 25), ("2026-03-09", 24)])
def test_a_daily_partition_maps_to_exactly_the_hours_of_its_local_day(day: str, hours: int) -> None:
    table = CATALOG["dwd.order_detail"]
    (dep,) = [d for d in table.deps if d.table == "ods.order"]  # range: [0, 23], the hours of the day
    p = periods(LOS_ANGELES)
    mapped = mapped_upstream(partition_mapping(table, dep, "hourly"), p.daily, p.hourly, [day], current_time=LATER)
    assert mapped.keys == hours_of(day, LOS_ANGELES) and len(mapped.keys) == hours
    assert mapped.nonexistent == []
    with using(LOS_ANGELES):  # the gate's view: the current process's periods
        upstream = upstream_partitions(CATALOG, table, dep, day, current_time=LATER)
    assert upstream.keys == mapped.keys and upstream.nonexistent == []


def test_definitions_built_for_another_zone_carry_it() -> None:
    la = build_definitions(CATALOG, LOS_ANGELES)
    graph = la.resolve_asset_graph()
    # every partitioned asset (a static table has no partitions)
    defs = [graph.get(key).partitions_def for key in graph.get_all_asset_keys()]
    # a table with regions: its dates are the business days (each region's own midnight is the catalog's)
    defs = [d.time_window_dimension.partitions_def if isinstance(d, MultiPartitionsDefinition) else d for d in defs]
    zones = {pdef.timezone for pdef in defs if pdef is not None}  # type: ignore[attr-defined]
    assert zones == {"America/Los_Angeles"}
    dwd, ods = AssetKey(["dwd", "order_detail"]), AssetKey(["ods", "order"])
    day_def, hour_def = graph.get(dwd).partitions_def, graph.get(ods).partitions_def
    assert day_def is not None and hour_def is not None
    result = graph.get_partition_mapping(dwd, ods).get_upstream_mapped_partitions_result_for_partitions(
        day_def.empty_subset().with_partition_keys(["2026-11-01"]), day_def, hour_def, current_time=LATER
    )
    assert sorted(result.partitions_subset.get_partition_keys()) == sorted(hours_of("2026-11-01", LOS_ANGELES))
    schedule = next(iter(la.schedules or []))
    assert schedule.execution_timezone == "America/Los_Angeles"  # lake maintenance at 04:30 local time
    # the process's own periods are untouched
    assert BY_PERIOD["daily"].timezone == current().timezone == "Asia/Shanghai"


def test_freshness_deadlines_are_local_times_of_the_zone() -> None:
    table = CATALOG["ads.daily_gmv"]  # sla: {deadline: "09:00"}
    with using(LOS_ANGELES):
        due = deadline(table, "2026-03-07")  # the next morning is the first one in daylight saving time
    assert due.isoformat() == "2026-03-08T09:00:00-07:00"


def test_every_interval_reaches_its_sensor() -> None:
    settings = Settings.from_env(
        {
            "WAREHOUSE_ODS_SENSOR_INTERVAL": "31",
            "WAREHOUSE_ODS_CHECKS_INTERVAL": "32",
            "WAREHOUSE_EXTERNAL_SENSOR_INTERVAL": "33",
            "WAREHOUSE_FRESHNESS_SENSOR_INTERVAL": "34",
        }
    )
    sensors = {s.name: s.minimum_interval_seconds for s in build_definitions(CATALOG, settings).sensors or []}
    assert "warehouse_automation" not in sensors  # the engine process starts downstream runs (warehouse engine)
    assert sensors["ods_landing"] == sensors["ods_readiness"] == 31
    assert sensors["ods_quality_checks"] == 32
    assert {v for k, v in sensors.items() if k.startswith("ext_")} == {33}
    assert sensors["freshness_slas"] == sensors["sla_forecast"] == 34
