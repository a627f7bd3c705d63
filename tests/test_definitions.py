"""The code location loads, validates, and has the shape the design promises."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DefaultSensorStatus,
    MultiPartitionsDefinition,
    TimeWindowPartitionMapping,
    TimeWindowPartitionsDefinition,
)

from resources import resources_from_env
from resources.settings import Settings
from tests.support.small_catalog import ODS, assert_refused, write
from warehouse_assets.catalog import load_catalog, upstream_partitions
from warehouse_assets.definitions import (
    FULL_COLLECTIONS_HELD_BACK,
    build_definitions,
    catalog,
    defs,
    full_collections_held_back,
)

ROOT = Path(__file__).resolve().parents[1]


def test_dagster_definitions_validate(tmp_path: Path) -> None:
    env = dict(os.environ, DAGSTER_HOME=str(tmp_path), DAGSTER_TELEMETRY_ENABLED="false")
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "All code locations passed validation" in result.stdout + result.stderr


def test_every_layer_is_present_with_one_timezone() -> None:
    graph = defs.resolve_asset_graph()
    keys = graph.get_all_asset_keys()
    layers = {key.path[0] for key in keys}
    assert layers == {"ext", "ods", "dwd", "dws", "ads"}
    for key in keys:
        node = graph.get(key)
        assert node.group_name == key.path[0]
        if key == AssetKey(["dwd", "city_tier"]):  # static: one unpartitioned reference table
            assert node.partitions_def is None
            continue
        if key == AssetKey(["ads", "dau_by_region"]):  # regional days: the business dates × the regions
            assert isinstance(node.partitions_def, MultiPartitionsDefinition)
            dates = node.partitions_def.get_partitions_def_for_dimension("date")
            regions = node.partitions_def.get_partitions_def_for_dimension("region")
            assert isinstance(dates, TimeWindowPartitionsDefinition) and dates.timezone == "Asia/Shanghai"
            assert regions.get_partition_keys() == ["shanghai", "karachi", "utc", "los_angeles"]
            continue
        assert isinstance(node.partitions_def, TimeWindowPartitionsDefinition)
        assert node.partitions_def.timezone == "Asia/Shanghai"
    assert len([k for k in keys if k.path[0] == "ods"]) == 5


def test_daily_dwd_depends_on_the_24_hours_of_its_day() -> None:
    graph = defs.resolve_asset_graph()
    mapping = graph.get_partition_mapping(AssetKey(["dwd", "order_detail"]), AssetKey(["ods", "order"]))
    dwd = graph.get(AssetKey(["dwd", "order_detail"])).partitions_def
    ods = graph.get(AssetKey(["ods", "order"])).partitions_def
    assert dwd is not None and ods is not None
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(
        dwd.empty_subset().with_partition_keys(["2026-03-05"]), dwd, ods
    )
    keys = sorted(result.partitions_subset.get_partition_keys())
    assert keys == [f"2026-03-05-{h:02d}:00" for h in range(24)]


def test_a_table_whose_first_partitions_never_build_says_so_in_its_description() -> None:
    """The lineage view shows such a table's early partitions missing for good: its page says why, and from when."""
    specs = {spec.key: spec for spec in defs.resolve_all_asset_specs()}
    active = specs[AssetKey(["ads", "active_users"])]
    assert active.description is not None
    assert active.description.endswith(
        "\n\n**Built from 2026-01-30 on** (once that day ends, 2026-01-31 00:00): its window needs "
        "dws.user_active_daily back to 2025-12-03, before the warehouse start 2026-01-01, so its partitions before "
        "2026-01-30 can never be built and stay missing."
    )
    assert active.metadata["first_buildable_partition"] == "2026-01-30"
    # a week is a partition once all of its days can exist: the first Monday after the start
    weekly = specs[AssetKey(["dws", "course_attendance_weekly"])].description
    assert weekly is not None and "**First partition 2026-01-05**" in weekly
    # a table built from the start on adds nothing
    assert "**" not in (specs[AssetKey(["ads", "daily_gmv"])].description or "")
    assert specs[AssetKey(["ads", "daily_gmv"])].metadata["first_buildable_partition"] == "2026-01-01"


PRODUCTION_SENSORS = {
    "dependency_center",
    "ods_landing",
    "ods_readiness",
    "ods_quality_checks",
    "zorder_complete_partitions",
    "ext_marketing_spend",
    "ext_fx_rate",
    "freshness_slas",
    "sla_forecast",
    "static_tables",
}


def test_sensors_run_by_default() -> None:
    sensors = {s.name: s for s in defs.sensors or []}
    assert set(sensors) == PRODUCTION_SENSORS  # the simulated sources' clock is not part of the product
    for sensor in sensors.values():
        assert sensor.default_status == DefaultSensorStatus.RUNNING


def test_the_simulated_source_runs_only_in_dev_mode() -> None:
    dev = Settings.from_env({"WAREHOUSE_SIMULATE_LIVE": "1"})  # what `warehouse dev` sets
    sensors = {s.name: s for s in build_definitions(catalog, dev).sensors or []}
    assert set(sensors) == PRODUCTION_SENSORS | {"simulated_source"}
    assert sensors["simulated_source"].default_status == DefaultSensorStatus.RUNNING


def test_a_run_prints_its_info_lines_not_every_event(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a run prints in `make dev`'s terminal, on the dev instance: its own lines (the why_waiting job's answer
    here), not a DEBUG line per event (a step start, a check verdict), which all stay in the run's log in the UI."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # the file locates its storage by it
    env = {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"), "WAREHOUSE_LANDING_ROOT": str(tmp_path)}
    config = {"ops": {"explain_partition": {"config": {"table": "ads.daily_gmv", "partition": "2026-01-02"}}}}
    with DagsterInstance.from_config(str(home)) as instance:
        result = defs.resolve_job_def("why_waiting").execute_in_process(
            run_config=config, instance=instance, resources=resources_from_env(env)
        )
        assert result.success
        stored = {e.dagster_event.event_type_value for e in instance.all_logs(result.run_id) if e.dagster_event}
    assert {"STEP_START", "STEP_SUCCESS", "PIPELINE_SUCCESS"} <= stored
    printed = capfd.readouterr()
    lines = (printed.out + printed.err).splitlines()
    assert any(" - INFO - why_waiting - " in line and "verdict: waiting for" in line for line in lines), lines
    assert not [line for line in lines if " - DEBUG - " in line]


def test_runs_execute_their_steps_in_process_unless_told_otherwise() -> None:
    # the engine's runs go through the implicit asset job: one process and one Spark session per run
    assert defs.resolve_implicit_global_asset_job_def().executor_def.name == "in_process"
    # choosing another executor, and the error for an unknown one: tests/resources/test_settings.py


def test_no_asset_or_check_carries_a_dagster_automation_condition() -> None:
    """The engine starts derived partitions (warehouse_assets/center/engine.py): a condition on any asset or check would
    make Dagster add its default automation sensor, which evaluates the whole graph every tick and is refused
    above 500 assets and checks."""
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.automation_condition is None, key
        assert node.is_executable == (key.path[0] not in ("ods", "ext")), key  # ODS hours and deliveries are reported
    for check_key in graph.asset_check_keys:
        assert graph.get(check_key).automation_condition is None, check_key


def _sql(name: str, body: str, header: str = "") -> str:
    return f"/* ---\ntable: dwd.{name}\nperiod: daily\n{header}--- */\n{body}\n"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"dwd/a.sql": _sql("a", "SELECT id FROM ods.nowhere")}, "reads ods.nowhere, which is not in the catalog"),
        (
            {"dwd/a.sql": _sql("a", "SELECT id FROM ods.src", "depends_on:\n  dwd.b: {set: [-1]}\n")},
            "declares a dependency on dwd.b that its SQL never reads",
        ),
        (
            {"dwd/a.sql": _sql("a", "SELECT id FROM dwd.b"), "dwd/b.sql": _sql("b", "SELECT id FROM dwd.a")},
            "dependency cycle",
        ),
        ({"dwd/a.sql": "/* ---\ntable: dwd.a\nperiod: yearly\n--- */\nSELECT 1"}, "period must be one of"),
        ({"dwd/a.sql": _sql("x", "SELECT 1")}, "must live in tables/dwd/x.sql"),
        ({"dwd/a.sql": _sql("a", "SELECT FROM WHERE")}, "does not parse"),
        (
            {
                "dwd/a.sql": _sql(
                    "a", "SELECT id FROM dwd.a UNION ALL SELECT id FROM ods.src", "columns: {id: bigint}\n"
                )
            },
            r"dwd.a reads itself: a self-dependency needs a negative offset",
        ),
        (
            {
                "dwd/a.sql": _sql(
                    "a",
                    "SELECT id FROM dwd.a UNION ALL SELECT id FROM ods.src",
                    "columns: {id: bigint}\ndepends_on:\n  dwd.a: {range: [-1, 0]}\n",
                )
            },
            "a self-dependency needs a negative offset",
        ),
        (
            {
                "dwd/a.sql": _sql(
                    "a", "SELECT id FROM dwd.a UNION ALL SELECT id FROM ods.src", "depends_on:\n  dwd.a: {set: [-1]}\n"
                )
            },
            r"dwd.a depends on itself: declare its output columns",
        ),
        (
            {
                "dwd/a.sql": _sql("a", "SELECT id FROM ods.src"),
                "ads/m.sql": "/* ---\ntable: ads.m\nperiod: monthly\ndepends_on:\n  dwd.a: {range: [0, 30]}\n--- */\n"
                "SELECT count(*) AS n FROM dwd.a\n",
            },
            "offsets across periods must cover the whole monthly period of dwd.a",
        ),
        (
            {
                "dwd/a.sql": _sql("a", "SELECT id FROM ods.src"),
                "dwd/b.sql": _sql("b", "SELECT id FROM dwd.a", "depends_on:\n  dwd.a: {set: [-7, -1]}\n"),
            },
            r"dependency dwd.a: set \[-7, -1\] has holes \(missing \[-6, -5, -4, -3, -2\]\)",
        ),
    ],
)
def test_catalog_errors_name_the_table_and_file(tmp_path: Path, files: dict[str, str], message: str) -> None:
    assert_refused(tmp_path, files, message)


def test_a_declared_self_dependency_is_lineage_not_a_cycle(tmp_path: Path) -> None:
    write(tmp_path, "ods/src.yaml", ODS)
    write(
        tmp_path,
        "dwd/acc.sql",
        _sql(
            "acc",
            "SELECT id FROM dwd.acc UNION ALL SELECT id FROM ods.src",
            "columns: {id: bigint}\ndepends_on:\n  dwd.acc: {set: [-1]}\n  ods.src: {range: [0, 23]}\n",
        ),
    )
    write(
        tmp_path,
        "ads/month.sql",
        "/* ---\ntable: ads.month\nperiod: monthly\n--- */\nSELECT count(*) AS n FROM dwd.acc\n",
    )
    catalog = load_catalog(tmp_path)
    acc = catalog["dwd.acc"]
    assert [(d.table, d.start_offset, d.end_offset) for d in acc.deps] == [("dwd.acc", -1, -1), ("ods.src", 0, 23)]
    assert acc.columns == (("id", "bigint"),)
    assert [(d.table, d.start_offset) for d in catalog["ads.month"].deps] == [("dwd.acc", None)]


def test_a_set_without_holes_is_its_range(tmp_path: Path) -> None:
    """A weekly table on its 7 days written as Set 0..6 (a list of offsets) means the same as range [0, 6]."""
    write(tmp_path, "ods/src.yaml", ODS)
    write(tmp_path, "dwd/day.sql", _sql("day", "SELECT id FROM ods.src"))
    week = (
        "/* ---\ntable: dws.{name}\nperiod: weekly\ndepends_on:\n  dwd.day: {offsets}\n--- */\nSELECT id FROM dwd.day\n"
    )
    write(tmp_path, "dws/by_set.sql", week.format(name="by_set", offsets="{set: [0, 1, 2, 3, 4, 5, 6]}"))
    write(tmp_path, "dws/by_range.sql", week.format(name="by_range", offsets="{range: [0, 6]}"))
    write(tmp_path, "dwd/t1.sql", _sql("t1", "SELECT id FROM dwd.day", "depends_on:\n  dwd.day: {set: [-1]}\n"))
    catalog = load_catalog(tmp_path)
    by_set, by_range = catalog["dws.by_set"], catalog["dws.by_range"]
    assert [(d.start_offset, d.end_offset) for d in by_set.deps] == [(0, 6)]
    week_days = upstream_partitions(catalog, by_set, by_set.deps[0], "2026-03-02")
    assert week_days == upstream_partitions(catalog, by_range, by_range.deps[0], "2026-03-02")
    assert week_days.keys == [f"2026-03-{d:02d}" for d in range(2, 9)]
    assert [(d.start_offset, d.end_offset) for d in catalog["dwd.t1"].deps] == [(-1, -1)]


EXAMPLE_TABLES = {
    "ods": {"user", "course", "lesson", "order", "attendance"},
    "dwd": {
        "order_detail",
        "attendance_detail",
        "user_snapshot",
        "lesson_snapshot",
        "course_daily",  # a snapshot
        "city_tier",  # static: one unpartitioned reference table
    },
    "dws": {
        "user_order_daily",
        "user_learning_daily",
        "user_learning_cumulative",
        "course_attendance_weekly",
        "order_hourly",
        "user_active_daily",
        "order_usd_daily",  # uses the external fx_rate
        "revenue_usd_daily",  # estimated on the previous day's rate, completed on the day's
    },
    "ads": {
        "daily_gmv",
        "attendance_rate_daily",
        "retention_d1",
        "retention_d7",
        "active_users",
        "gmv_hourly",
        "monthly_report",
        "marketing_roi",  # needs the external marketing_spend
        "gmv_usd_daily",  # the external fx_rate until a deadline, then degraded
        "gmv_vs_month",  # a daily table on the latest monthly report
        "gmv_week_to_date",  # cumulative within the week
        "lesson_catalog",  # any one of the last three lesson snapshots
        "revenue_flash",  # takes the revenue estimated, and again completed
        "new_users_by_tier",  # reads the static city_tier whole, every day
        "dau_by_region",  # regional days: one partition per region's day, from its own midnight
        "dau_global",  # every region's day of the date: waits for the last region's
    },
    "ext": {"marketing_spend", "fx_rate"},
}


def test_the_example_warehouse_has_every_table_of_design_section_4() -> None:
    keys = defs.resolve_asset_graph().get_all_asset_keys()
    found: dict[str, set[str]] = {}
    for key in keys:
        found.setdefault(key.path[0], set()).add(key.path[1])
    assert found == EXAMPLE_TABLES


@pytest.mark.parametrize(
    ("child", "parent", "offsets"),
    [
        ("dwd.order_detail", "ods.order", (0, 0)),  # daily on 24 hours: the default roll-up
        ("dws.course_attendance_weekly", "dwd.attendance_detail", (0, 0)),  # weekly on its 7 days
        ("ads.monthly_report", "dws.user_order_daily", (0, 0)),  # monthly on its days
        ("ads.retention_d1", "dwd.user_snapshot", (-1, -1)),  # T-1
        ("ads.retention_d7", "dwd.user_snapshot", (-7, -7)),  # T-7
        ("ads.active_users", "dws.user_active_daily", (-29, 0)),  # a 30-day sliding window
        ("dws.user_learning_cumulative", "dws.user_learning_cumulative", (-1, -1)),  # self T-1
        ("dwd.user_snapshot", "dwd.user_snapshot", (-1, -1)),  # self T-1 (a dimension snapshot)
        ("ads.gmv_week_to_date", "ads.gmv_week_to_date", (-1, -1)),  # self T-1 within the week (Monday reads none)
        ("ads.gmv_hourly", "dws.order_hourly", (0, 0)),  # hourly on hourly
        # a day on the latest month: Dagster's superset of the exact months (two months of days back, to its own)
        ("ads.gmv_vs_month", "ads.monthly_report", (-62, 0)),
    ],
)
def test_loading_the_definitions_shows_every_pattern(child: str, parent: str, offsets: tuple[int, int]) -> None:
    graph = defs.resolve_asset_graph()
    mapping = graph.get_partition_mapping(AssetKey(child.split(".")), AssetKey(parent.split(".")))
    assert isinstance(mapping, TimeWindowPartitionMapping)
    assert (mapping.start_offset, mapping.end_offset) == offsets
    periods = {key: graph.get(AssetKey(key.split("."))).partitions_def for key in (child, parent)}
    assert all(p is not None and p.timezone == "Asia/Shanghai" for p in periods.values())


def test_loading_the_code_location_imports_no_pyspark() -> None:
    # in a fresh interpreter (the tests' own has PySpark loaded): the code server, the daemon and every sensor
    # tick import the code location, and none of them runs Spark
    script = (
        "import sys\n"
        "import warehouse_assets.definitions\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j') "
        "or m == 'warehouse_assets.materialize.runner'))\n"
    )
    env = {**os.environ, "DAGSTER_TELEMETRY_ENABLED": "false"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_imports_point_one_way() -> None:
    """The import contract of pyproject.toml (layers, simulators outside the product, one Delta seam) holds."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


def test_the_engines_check_selection_is_every_check_its_asset_builds_but_the_deadline_ones() -> None:
    """A derived table's asset cannot be built with a subset of its own checks: the engine's selection must name
    all of them; the freshness checks, judged by their sensor at the deadline, are separate definitions."""
    from warehouse_assets.center.engine import own_checks

    selection = own_checks(catalog)
    graph = defs.resolve_asset_graph()
    for table in catalog.derived():
        key = AssetKey(table.key)
        built_with_it = {spec.key.name for spec in graph.get(key).assets_def.check_specs if spec.asset_key == key}
        assert set(selection[key]) == built_with_it, key


def test_the_code_locations_load_holds_full_collections_back_and_freezes_only_what_a_load_that_succeeded_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Freezes are counted by call, not by gc.get_freeze_count(): a frozen object freed meanwhile lowers that count.
    thresholds, freezes = gc.get_threshold(), []
    real_freeze = gc.freeze

    def freeze() -> None:
        freezes.append(gc.get_threshold())
        real_freeze()

    monkeypatch.setattr(gc, "freeze", freeze)
    with pytest.raises(RuntimeError, match="bad declaration"), full_collections_held_back():
        assert gc.get_threshold() == (*thresholds[:2], FULL_COLLECTIONS_HELD_BACK)
        raise RuntimeError("bad declaration")
    assert gc.get_threshold() == thresholds
    assert freezes == []  # a failed load keeps nothing out of the collector

    with full_collections_held_back():
        assert gc.isenabled()  # the young collections still free what the load leaves behind
        assert freezes == []
    assert gc.get_threshold() == thresholds
    assert freezes == [thresholds]  # frozen once, after the thresholds were restored
