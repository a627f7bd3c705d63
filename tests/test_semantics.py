"""Exact partition semantics of every dependency pattern, on a small synthetic catalog.

For a chosen partition of each pattern: the exact upstream partition keys, through the compiler's
``upstream_partitions`` and through Dagster's asset graph (the mapping on the edge). Then: a partition
whose mapped upstream partitions do not all exist — before the upstream's start, in the future, or simply
not materialized — is never started by the dependency center's engine (its resolver stepped at pinned times,
``tests.support.center_harness``), and fails naming the partitions when launched by hand; the first partition of a
self-dependent table needs no T-1, a later one never runs without it (the engine builds a chain in one run, T-1
first, as a backfill does).

The default warehouse start (2026-01-01) is the partitions' start here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    Definitions,
    TableColumnDep,
    TimeWindowPartitionsDefinition,
    instance_for_test,
    materialize,
)
from dagster._core.utils import make_new_run_id
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.settings import Settings, using
from tests.support.center_harness import CenterTicker
from tests.support.lineage_receiver import lineage_receiver
from warehouse_assets.catalog import BY_PERIOD, START, Catalog, load_catalog, upstream_partitions
from warehouse_assets.catalog.lineage import ColumnRef, WarehouseLineage
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.validity import Taint, taint_evaluation

TZ = ZoneInfo("Asia/Shanghai")

TABLES = {
    "ods/src.yaml": """table: ods.src
period: hourly
source: {database: db, tables: "src"}
primary_key: [id]
partition_time: t
columns: {id: bigint, t: timestamp, v: bigint}
""",
    "dwd/day.sql": "SELECT id, v FROM ods.src",  # a day on its 24 hours (the default roll-up)
    "dws/week.sql": "SELECT id, sum(v) AS v FROM dwd.day GROUP BY id",  # a week on its 7 days
    "dws/month.sql": "SELECT id, sum(v) AS v FROM dwd.day GROUP BY id",  # a month on its days
    "dws/hour.sql": "SELECT id, v FROM ods.src",  # hourly on hourly (Set 0)
    "dws/cum.sql": (  # self-dependency on T-1
        "SELECT id, sum(v) AS v FROM (SELECT id, v FROM dwd.day UNION ALL SELECT id, v FROM dws.cum) GROUP BY id"
    ),
    "ads/t1.sql": "SELECT id, v FROM dwd.day",
    "ads/t7.sql": "SELECT id, v FROM dwd.day",
    "ads/win30.sql": "SELECT id, sum(v) AS v FROM dwd.day GROUP BY id",
    "ads/next.sql": "SELECT id, v FROM dwd.day",  # T+1: needs a partition of the future near today
    "ads/ahead.sql": "SELECT id, sum(v) AS v FROM dwd.day GROUP BY id",  # a day on the 7 days from it
}
HEADERS = {
    "dwd/day.sql": "period: daily\n",
    "dws/week.sql": "period: weekly\ndepends_on:\n  dwd.day: {range: [0, 6]}\n",
    "dws/month.sql": "period: monthly\n",
    "dws/hour.sql": "period: hourly\ndepends_on:\n  ods.src: {set: [0]}\n",
    "dws/cum.sql": (
        "period: daily\ncolumns: {id: bigint, v: bigint}\ndepends_on:\n  dws.cum: {set: [-1]}\n  dwd.day: {set: [0]}\n"
    ),
    "ads/t1.sql": "period: daily\ndepends_on:\n  dwd.day: {set: [-1]}\n",
    "ads/t7.sql": "period: daily\ndepends_on:\n  dwd.day: {set: [-7]}\n",
    "ads/win30.sql": "period: daily\ndepends_on:\n  dwd.day: {range: [-29, 0]}\n",
    "ads/next.sql": "period: daily\ndepends_on:\n  dwd.day: {set: [1]}\n",
    "ads/ahead.sql": "period: daily\ndepends_on:\n  dwd.day: {range: [0, 6]}\n",
}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    root = tmp_path_factory.mktemp("catalog")
    for rel, body in TABLES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".sql"):
            layer, name = rel[:-4].split("/")
            body = f"/* ---\ntable: {layer}.{name}\n{HEADERS[rel]}--- */\n{body}\n"
        path.write_text(body)
    return load_catalog(root)


@pytest.fixture(scope="module")
def defs(catalog: Catalog, tmp_path_factory: pytest.TempPathFactory) -> Definitions:
    root = tmp_path_factory.mktemp("lake")
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(root / "lake"), "WAREHOUSE_LANDING_ROOT": str(root)})
    return Definitions(assets=build_assets(catalog), resources=resources)


def _days(first: str, last: str) -> list[str]:
    start, end = datetime.fromisoformat(first), datetime.fromisoformat(last)
    return [(start + timedelta(days=n)).strftime("%Y-%m-%d") for n in range((end - start).days + 1)]


def _hours(day: str) -> list[str]:
    return [f"{day}-{h:02d}:00" for h in range(24)]


# --- exact upstream partitions ------------------------------------------------------------------------------

EXACT = [
    # (table, partition, upstream, exact upstream keys)
    ("dws.week", "2026-03-02", "dwd.day", _days("2026-03-02", "2026-03-08")),  # ISO week: Monday .. Sunday
    ("dwd.day", "2026-03-05", "ods.src", _hours("2026-03-05")),
    ("ads.t1", "2026-03-05", "dwd.day", ["2026-03-04"]),
    ("ads.t7", "2026-03-05", "dwd.day", ["2026-02-26"]),
    ("ads.win30", "2026-03-05", "dwd.day", _days("2026-02-04", "2026-03-05")),
    ("ads.ahead", "2026-03-05", "dwd.day", _days("2026-03-05", "2026-03-11")),  # same period: not a roll-up
    ("dws.cum", "2026-03-05", "dws.cum", ["2026-03-04"]),
    ("dws.cum", "2026-03-05", "dwd.day", ["2026-03-05"]),
    ("dws.hour", "2026-03-05-13:00", "ods.src", ["2026-03-05-13:00"]),
    ("dws.month", "2026-02-01", "dwd.day", _days("2026-02-01", "2026-02-28")),
    ("dws.month", "2026-03-01", "dwd.day", _days("2026-03-01", "2026-03-31")),
]


@pytest.mark.parametrize(("table", "partition", "upstream", "expected"), EXACT)
def test_exact_upstream_partitions(
    catalog: Catalog, defs: Definitions, table: str, partition: str, upstream: str, expected: list[str]
) -> None:
    t = catalog[table]
    dep = next(d for d in t.deps if d.table == upstream)
    up = upstream_partitions(catalog, t, dep, partition)
    assert up.keys == expected and up.nonexistent == []
    # the same set through the mapping Dagster holds on the edge
    graph = defs.resolve_asset_graph()
    own, parent = AssetKey(t.key), AssetKey(catalog[upstream].key)
    own_def, up_def = graph.get(own).partitions_def, graph.get(parent).partitions_def
    assert isinstance(own_def, TimeWindowPartitionsDefinition) and isinstance(up_def, TimeWindowPartitionsDefinition)
    result = graph.get_partition_mapping(own, parent).get_upstream_mapped_partitions_result_for_partitions(
        own_def.empty_subset().with_partition_keys([partition]), own_def, up_def
    )
    assert sorted(result.partitions_subset.get_partition_keys()) == sorted(expected)


def test_a_day_is_its_24_local_hours_in_shanghai(catalog: Catalog) -> None:
    t = catalog["dwd.day"]
    up = upstream_partitions(catalog, t, t.deps[0], "2026-03-05")
    assert (up.keys[0], up.keys[-1], len(up.keys)) == ("2026-03-05-00:00", "2026-03-05-23:00", 24)
    hourly = BY_PERIOD["hourly"]
    first, last = hourly.time_window_for_partition_key(up.keys[0]), hourly.time_window_for_partition_key(up.keys[-1])
    assert first.start.astimezone(UTC) == datetime(2026, 3, 4, 16, tzinfo=UTC)  # 00:00 +08:00
    assert last.end.astimezone(UTC) == datetime(2026, 3, 5, 16, tzinfo=UTC)
    assert BY_PERIOD["daily"].time_window_for_partition_key("2026-03-05") == type(first)(first.start, last.end)


def test_first_partition_of_a_self_dependent_table_needs_no_t_minus_1(catalog: Catalog) -> None:
    t = catalog["dws.cum"]
    self_dep = next(d for d in t.deps if d.table == "dws.cum")
    assert BY_PERIOD["daily"].get_first_partition_key() == START == "2026-01-01"
    first = upstream_partitions(catalog, t, self_dep, START)
    assert (first.keys, first.nonexistent) == ([], [])  # nothing required: the chain starts here
    second = upstream_partitions(catalog, t, self_dep, "2026-01-02")
    assert (second.keys, second.nonexistent) == (["2026-01-01"], [])


@pytest.mark.parametrize(
    ("table", "partition", "keys", "nonexistent"),
    [
        ("ads.t7", "2026-01-03", [], ["2025-12-27"]),  # T-7 before the upstream's start
        ("ads.t1", "2026-01-01", [], ["2025-12-31"]),  # T-1 of another table is not a self-dependency
        ("ads.win30", "2026-01-10", _days("2026-01-01", "2026-01-10"), _days("2025-12-12", "2025-12-31")),
    ],
)
def test_upstream_partitions_before_the_start_are_named_not_dropped(
    catalog: Catalog, table: str, partition: str, keys: list[str], nonexistent: list[str]
) -> None:
    """Dagster's mapping clamps these windows (a 30-day window on day 10 maps to 10 days); ours does not."""
    t = catalog[table]
    up = upstream_partitions(catalog, t, t.deps[0], partition)
    assert (up.keys, up.nonexistent) == (keys, nonexistent)


def test_upstream_partitions_in_the_future_are_named(catalog: Catalog) -> None:
    t = catalog["ads.next"]
    at = datetime(2026, 3, 5, 10, tzinfo=TZ)  # 2026-03-05 is not over yet
    assert upstream_partitions(catalog, t, t.deps[0], "2026-03-04", current_time=at).nonexistent == ["2026-03-05"]
    later = datetime(2026, 3, 6, 0, 0, tzinfo=TZ)
    up = upstream_partitions(catalog, t, t.deps[0], "2026-03-04", current_time=later)
    assert (up.keys, up.nonexistent) == (["2026-03-05"], [])
    week = catalog["dws.week"]  # a week on Friday: its weekend lies in the future
    up = upstream_partitions(catalog, week, week.deps[0], "2026-03-02", current_time=datetime(2026, 3, 7, tzinfo=TZ))
    assert (up.keys, up.nonexistent) == (_days("2026-03-02", "2026-03-06"), ["2026-03-07", "2026-03-08"])


# --- the engine ---------------------------------------------------------------------------------------------
#
# The engine reacts to each change of partition state. So each test starts it (a first tick), reports upstream
# materializations (``report_runless_asset_event``, as the readiness sensor does), and ticks again at a pinned time.


def _report(instance: DagsterInstance, catalog: Catalog, table: str, keys: Sequence[str]) -> None:
    for key in keys:
        instance.report_runless_asset_event(AssetMaterialization(AssetKey(catalog[table].key), partition=key))


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


@pytest.fixture
def ticker_of(instance: DagsterInstance, catalog: Catalog) -> Iterator[Callable[[Sequence[str]], CenterTicker]]:
    tickers: list[CenterTicker] = []

    def make(tables: Sequence[str]) -> CenterTicker:
        tickers.append(CenterTicker(instance, catalog, tables))
        return tickers[-1]

    yield make
    for ticker in tickers:
        ticker.close()


def test_the_engine_never_starts_a_window_reaching_before_the_start(
    catalog: Catalog, instance: DagsterInstance, ticker_of: Callable[[Sequence[str]], CenterTicker]
) -> None:
    ticker = ticker_of(["ads.t1", "ads.t7", "ads.win30"])
    assert ticker.tick(datetime(2026, 2, 2, 9, tzinfo=TZ)) == {"ads.t1": [], "ads.t7": [], "ads.win30": []}
    _report(instance, catalog, "dwd.day", _days("2026-01-01", "2026-02-01"))
    requested = ticker.tick(datetime(2026, 2, 2, 9, 1, tzinfo=TZ))
    assert requested["ads.t1"] == _days("2026-01-02", "2026-02-01")  # 2026-01-01 would need 2025-12-31
    assert requested["ads.t7"] == _days("2026-01-08", "2026-02-01")  # Dagster's mapping alone also runs 01-01..07
    assert requested["ads.win30"] == _days("2026-01-30", "2026-02-01")  # … and 29 windows of 1 to 29 days


def test_the_engine_never_starts_a_window_reaching_into_the_future(
    catalog: Catalog, instance: DagsterInstance, ticker_of: Callable[[Sequence[str]], CenterTicker]
) -> None:
    ticker = ticker_of(["ads.next"])
    ticker.tick(datetime(2026, 3, 5, 9, 59, tzinfo=TZ))
    _report(instance, catalog, "dwd.day", _days("2026-03-01", "2026-03-04"))
    # 2026-03-04 needs 2026-03-05, which is not a partition until the day is over
    assert ticker.tick(datetime(2026, 3, 5, 10, tzinfo=TZ)) == {"ads.next": _days("2026-02-28", "2026-03-03")}
    # once the day is over and reported, it runs
    _report(instance, catalog, "dwd.day", ["2026-03-05"])
    assert ticker.tick(datetime(2026, 3, 6, 1, tzinfo=TZ)) == {"ads.next": ["2026-03-04"]}


def test_the_engine_waits_for_every_hour_of_the_day_and_every_day_of_the_week(
    catalog: Catalog, instance: DagsterInstance, ticker_of: Callable[[Sequence[str]], CenterTicker]
) -> None:
    ticker = ticker_of(["dwd.day", "dws.week"])
    at = datetime(2026, 3, 9, 9, tzinfo=TZ)
    ticker.tick(at)
    _report(instance, catalog, "ods.src", [h for h in _hours("2026-03-05") if h != "2026-03-05-23:00"])
    _report(instance, catalog, "dwd.day", [d for d in _days("2026-03-02", "2026-03-08") if d != "2026-03-05"])
    assert ticker.tick(at + timedelta(minutes=1)) == {"dwd.day": [], "dws.week": []}
    _report(instance, catalog, "ods.src", ["2026-03-05-23:00"])
    # the day runs; the week waits until the day is materialized (a week and a day never share a run)
    assert ticker.tick(at + timedelta(minutes=2)) == {"dwd.day": ["2026-03-05"], "dws.week": []}
    _report(instance, catalog, "dwd.day", ["2026-03-05"])
    assert ticker.tick(at + timedelta(minutes=3)) == {"dwd.day": [], "dws.week": ["2026-03-02"]}


def test_the_engine_starts_the_first_self_dependent_partition_and_no_later_one_without_t_minus_1(
    catalog: Catalog, instance: DagsterInstance, ticker_of: Callable[[Sequence[str]], CenterTicker]
) -> None:
    ticker = ticker_of(["dws.cum"])
    ticker.tick(datetime(2026, 1, 3, 9, tzinfo=TZ))
    # day 2 of dwd.day is there, day 1 is not: the first partition lacks its day, the second its T-1
    _report(instance, catalog, "dwd.day", ["2026-01-02"])
    assert ticker.tick(datetime(2026, 1, 3, 9, 1, tzinfo=TZ)) == {"dws.cum": []}
    # day 1 arrives: the first partition runs although its T-1 can never exist, and the second after it in the
    # same run (its T-1 is written first there, as in a backfill); not as a run of its own
    _report(instance, catalog, "dwd.day", ["2026-01-01"])
    assert ticker.tick(datetime(2026, 1, 3, 9, 2, tzinfo=TZ)) == {"dws.cum": ["2026-01-01", "2026-01-02"]}
    assert ticker.runs("dws.cum") == [["2026-01-01", "2026-01-02"]]
    assert ticker.tick(datetime(2026, 1, 3, 9, 3, tzinfo=TZ)) == {"dws.cum": []}
    _report(instance, catalog, "dws.cum", ["2026-01-01", "2026-01-02"])  # the run writes them, in order
    assert ticker.tick(datetime(2026, 1, 3, 9, 4, tzinfo=TZ)) == {"dws.cum": []}  # nothing is requested twice


def test_the_engine_never_starts_a_later_self_dependent_partition_without_t_minus_1(
    catalog: Catalog, instance: DagsterInstance, ticker_of: Callable[[Sequence[str]], CenterTicker]
) -> None:
    ticker = ticker_of(["dws.cum"])
    ticker.tick(datetime(2026, 1, 7, 9, tzinfo=TZ))
    _report(instance, catalog, "dwd.day", [d for d in _days("2026-01-01", "2026-01-06") if d != "2026-01-04"])
    _report(instance, catalog, "dws.cum", _days("2026-01-01", "2026-01-03"))  # built on those days, after them
    # 01-04 lacks its day; 01-05 and 01-06 have theirs but not their T-1
    assert ticker.tick(datetime(2026, 1, 7, 9, 1, tzinfo=TZ)) == {"dws.cum": []}
    _report(instance, catalog, "dwd.day", ["2026-01-04"])
    # the chain from 01-04 in one run, in time order: each day after its T-1 (the run guard refuses any other order)
    assert ticker.tick(datetime(2026, 1, 7, 9, 2, tzinfo=TZ)) == {"dws.cum": _days("2026-01-04", "2026-01-06")}
    assert ticker.runs("dws.cum") == [_days("2026-01-04", "2026-01-06")]
    _report(instance, catalog, "dws.cum", _days("2026-01-04", "2026-01-06"))  # the run writes them, in order
    assert ticker.tick(datetime(2026, 1, 7, 9, 3, tzinfo=TZ)) == {"dws.cum": []}  # nothing is requested twice


# --- launched by hand ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lake(catalog: Catalog, tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> dict[str, Any]:
    """ods.src in Delta for the first three days (rows at midnight only: the other hours are empty), and
    the resources to read it."""
    root = tmp_path_factory.mktemp("hand")
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(root / "lake"), "WAREHOUSE_LANDING_ROOT": str(root)})
    days = _days("2026-01-01", "2026-01-03")
    rows = [(i, datetime.fromisoformat(d), 1, False, d, "00") for d in days for i in (1, 2)]
    df = spark.createDataFrame(rows, "id bigint, t timestamp, v bigint, _deleted boolean, dt string, hh string")
    resources["lake"].store().overwrite(["ods", "src"], df, ["dt", "hh"], [{"dt": d, "hh": "00"} for d in days])
    return {"resources": resources, "hours": [h for d in days for h in _hours(d)]}


def _run(
    catalog: Catalog, lake: dict[str, Any], instance: DagsterInstance, table: str, first: str, last: str | None = None
) -> str | None:
    """Materialize ``table`` for [first, last] in process, as the UI's "Materialize" does; the error or None."""
    result = materialize(
        build_assets(catalog),
        instance=instance,
        resources=lake["resources"],
        selection=[AssetKey(catalog[table].key)],
        tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last or first},
        raise_on_error=False,
    )
    if result.success:
        return None
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert failure.step_failure_data is not None and failure.step_failure_data.error is not None
    return failure.step_failure_data.error.message


def test_by_hand_a_window_before_the_start_fails_naming_the_partitions(
    catalog: Catalog, lake: dict[str, Any], instance: DagsterInstance
) -> None:
    _report(instance, catalog, "dwd.day", _days("2026-01-01", "2026-01-10"))
    error = _run(catalog, lake, instance, "ads.t7", "2026-01-03")  # no data read: refused before Spark
    assert error is not None and "ads.t7 2026-01-03 needs 1 partition(s) of dwd.day that do not exist" in error
    assert "2025-12-27" in error
    error = _run(catalog, lake, instance, "ads.win30", "2026-01-10")
    assert error is not None and "needs 20 partition(s) of dwd.day that do not exist" in error
    assert "2025-12-12" in error and "2025-12-31" in error
    assert instance.get_materialized_partitions(AssetKey(["ads", "win30"])) == set()


def test_by_hand_a_window_in_the_future_fails_naming_the_partitions(
    catalog: Catalog, lake: dict[str, Any], instance: DagsterInstance
) -> None:
    today = datetime.now(TZ)
    yesterday = (today - timedelta(days=1)).strftime("%Y-%m-%d")
    _report(instance, catalog, "dwd.day", [yesterday])
    error = _run(catalog, lake, instance, "ads.next", yesterday)
    assert error is not None and "needs 1 partition(s) of dwd.day that do not exist" in error
    assert today.strftime("%Y-%m-%d") in error


def test_by_hand_the_self_dependent_chain_starts_at_the_first_partition_and_needs_t_minus_1_after(
    catalog: Catalog, lake: dict[str, Any], instance: DagsterInstance
) -> None:
    _report(instance, catalog, "ods.src", lake["hours"])
    assert _run(catalog, lake, instance, "dwd.day", "2026-01-01", "2026-01-03") is None
    # a later partition without its T-1 fails naming it
    error = _run(catalog, lake, instance, "dws.cum", "2026-01-02")
    assert error is not None
    assert "dws.cum 2026-01-02 waits for 1 partition(s) of dws.cum that are not materialized: 2026-01-01" in error
    # the first partition needs no T-1; a range is built in time order in one run
    assert _run(catalog, lake, instance, "dws.cum", "2026-01-01", "2026-01-03") is None
    assert instance.get_materialized_partitions(AssetKey(["dws", "cum"])) == set(_days("2026-01-01", "2026-01-03"))
    rows = lake["resources"]["lake"].store().read_rows(["dws", "cum"])[0].to_pylist()
    totals = {(r["dt"], r["id"]): r["v"] for r in rows}
    assert totals == {(d, i): n for n, d in enumerate(_days("2026-01-01", "2026-01-03"), 1) for i in (1, 2)}
    # the build's materialization carries the column lineage the UI's lineage tab draws, from the SQL
    [record] = instance.fetch_materializations(AssetKey(["dws", "cum"]), limit=1).records
    metadata = record.asset_materialization.metadata  # type: ignore[union-attr]
    lineage = metadata["dagster/column_lineage"].value
    assert lineage.deps_by_column["v"] == [  # type: ignore[union-attr]
        TableColumnDep(asset_key=AssetKey(["dwd", "day"]), column_name="v"),
        TableColumnDep(asset_key=AssetKey(["dws", "cum"]), column_name="v"),
    ]
    assert lineage.deps_by_column["dt"] == []  # type: ignore[union-attr]
    assert metadata["rows_depend_on"].value == "dwd.day.id, dws.cum.id"  # GROUP BY id
    # and the same as the Markdown table the open-source UI shows on the asset's page
    markdown = metadata["column_lineage"].value
    assert "| `v` | dwd.day.v, dws.cum.v |" in markdown  # type: ignore[operator]
    assert "**rows decided by:** dwd.day.id, dws.cum.id" in markdown  # type: ignore[operator]


# --- the example warehouse ----------------------------------------------------------------------------------

REAL = [
    # (table, partition, upstream, exact upstream keys): one chosen partition of each pattern
    ("dws.course_attendance_weekly", "2026-03-02", "dwd.attendance_detail", _days("2026-03-02", "2026-03-08")),
    ("dwd.order_detail", "2026-03-05", "ods.order", _hours("2026-03-05")),
    ("ads.retention_d1", "2026-03-05", "dwd.user_snapshot", ["2026-03-04"]),
    ("ads.retention_d7", "2026-03-05", "dwd.user_snapshot", ["2026-02-26"]),
    ("ads.retention_d7", "2026-03-05", "dws.user_active_daily", ["2026-03-05"]),
    ("ads.active_users", "2026-03-05", "dws.user_active_daily", _days("2026-02-04", "2026-03-05")),
    ("dws.user_learning_cumulative", "2026-03-05", "dws.user_learning_cumulative", ["2026-03-04"]),
    ("dws.user_learning_cumulative", START, "dws.user_learning_cumulative", []),  # the first: no T-1
    ("dwd.user_snapshot", START, "dwd.user_snapshot", []),
    ("dws.order_hourly", "2026-03-05-13:00", "ods.order", ["2026-03-05-13:00"]),
    ("ads.gmv_hourly", "2026-03-05-00:00", "dws.order_hourly", ["2026-03-05-00:00"]),
    ("ads.monthly_report", "2026-02-01", "dws.user_order_daily", _days("2026-02-01", "2026-02-28")),
    ("ads.monthly_report", "2026-01-01", "dws.user_active_daily", _days("2026-01-01", "2026-01-31")),
]


@pytest.mark.parametrize(("table", "partition", "upstream", "expected"), REAL)
def test_exact_upstream_partitions_of_the_example_warehouse(
    table: str, partition: str, upstream: str, expected: list[str]
) -> None:
    from warehouse_assets.definitions import catalog as real
    from warehouse_assets.definitions import defs as real_defs

    t = real[table]
    dep = next(d for d in t.deps if d.table == upstream)
    up = upstream_partitions(real, t, dep, partition)
    assert (up.keys, up.nonexistent) == (expected, [])
    graph = real_defs.resolve_asset_graph()
    own, parent = AssetKey(t.key), AssetKey(real[upstream].key)
    own_def, up_def = graph.get(own).partitions_def, graph.get(parent).partitions_def
    assert isinstance(own_def, TimeWindowPartitionsDefinition) and isinstance(up_def, TimeWindowPartitionsDefinition)
    result = graph.get_partition_mapping(own, parent).get_upstream_mapped_partitions_result_for_partitions(
        own_def.empty_subset().with_partition_keys([partition]), own_def, up_def
    )
    assert sorted(result.partitions_subset.get_partition_keys()) == sorted(expected)


def test_the_example_warehouse_builds_each_table_from_its_first_complete_partition() -> None:
    from warehouse_assets.definitions import catalog as real
    from warehouse_assets.materialize.gate import backfill_partitions

    plan = backfill_partitions(real, datetime(2026, 1, 1, tzinfo=TZ), datetime(2026, 2, 1, tzinfo=TZ))
    firsts = {fqn: keys[0] for fqn, keys in plan.items()}
    assert firsts["dws.user_learning_cumulative"] == firsts["dwd.user_snapshot"] == "2026-01-01"  # self T-1
    assert firsts["ads.retention_d1"] == "2026-01-02"
    assert firsts["ads.retention_d7"] == "2026-01-08"
    assert firsts["ads.active_users"] == "2026-01-30"
    assert plan["dws.course_attendance_weekly"] == ["2026-01-05", "2026-01-12", "2026-01-19"]  # 01-26 ends in Feb
    assert plan["ads.monthly_report"] == ["2026-01-01"]
    assert (plan["ads.gmv_hourly"][0], plan["ads.gmv_hourly"][-1]) == ("2026-01-01-00:00", "2026-01-31-23:00")
    # a region's day is in the range when its own window is: of the 31st only Shanghai's ends by February 1st 00:00,
    # so the global 31st is left to a later range
    assert plan["ads.dau_by_region"][:2] == ["2026-01-01|shanghai", "2026-01-01|karachi"]
    assert plan["ads.dau_by_region"][-2:] == ["2026-01-30|los_angeles", "2026-01-31|shanghai"]
    assert (plan["ads.dau_global"][0], plan["ads.dau_global"][-1]) == ("2026-01-01", "2026-01-30")
    assert set(plan) == {t.fqn for t in real.derived()}


# --- OpenLineage events --------------------------------------------------------------------------------------


def _tables_of(fields: list[dict[str, Any]], root: str) -> frozenset[ColumnRef]:
    """OpenLineage input fields as ``layer.table.column``s: each dataset named by its path under the lake root."""
    return frozenset(ColumnRef(f["name"].removeprefix(root + "/").replace("/", "."), f["field"]) for f in fields)


def test_openlineage_events_of_builds_and_of_a_taint_and_its_repair(
    catalog: Catalog, lake: dict[str, Any], instance: DagsterInstance, tmp_path: Path
) -> None:
    root = lake["resources"]["lake"].root
    with lineage_receiver() as receiver, using(Settings(lake_root=root, openlineage_url=receiver.url)):
        store = PartitionStateStore(instance, tmp_path / "states.db")
        _report(instance, catalog, "ods.src", _hours("2026-01-01"))
        assert _run(catalog, lake, instance, "dwd.day", "2026-01-01") is None
        error = _run(catalog, lake, instance, "ads.t7", "2026-01-03")  # its T-7 is before the start
        assert error is not None
        store.update()
        assert ("2026-01-01", "ready") in receiver.states("dwd.day")

        [record] = instance.fetch_materializations(AssetKey(["dwd", "day"]), limit=1).records
        taint = Taint("amounts 100x", "ods.src 2026-01-01-00:00", "oncall", record.timestamp)
        target = (record.storage_id, record.run_id, record.timestamp)
        evaluation = taint_evaluation(catalog["dwd.day"], "2026-01-01", taint, target)
        event = DagsterEvent(
            DagsterEventType.ASSET_CHECK_EVALUATION.value, "taint_repair", event_specific_data=evaluation
        )
        instance.report_dagster_event(event, make_new_run_id())
        store.update()
        assert _run(catalog, lake, instance, "dwd.day", "2026-01-01") is None  # the repair
        store.update()
        store.close()

    assert set(receiver.paths) == {"/api/v1/lineage"}
    # each build: START then COMPLETE of the table's job, one run id; the failing one FAIL, saying why
    lineage = WarehouseLineage(catalog)
    runs = receiver.runs("dwd.day")
    assert [e["eventType"] for e in runs] == ["START", "COMPLETE", "START", "COMPLETE"]  # the build and the repair
    assert len({e["run"]["runId"] for e in runs[:2]}) == 1 and runs[0]["run"]["runId"] != runs[2]["run"]["runId"]
    complete = runs[1]
    assert complete["run"]["facets"]["partitions"]["keys"] == ["2026-01-01"]
    assert [(i["namespace"], i["name"]) for i in complete["inputs"]] == [("file", f"{root}/ods/src")]
    [output] = complete["outputs"]
    assert (output["namespace"], output["name"]) == ("file", f"{root}/dwd/day")
    assert [f["name"] for f in output["facets"]["schema"]["fields"]] == ["id", "v", "dt"]
    # the column lineage is `warehouse lineage`'s (the rows' columns too: tests/catalog/test_lineage_events.py)
    facet = output["facets"]["columnLineage"]
    found = {column: _tables_of(f["inputFields"], root) for column, f in facet["fields"].items()}
    assert (
        found
        == dict(lineage.of("dwd.day").columns)
        == {
            "id": {ColumnRef("ods.src", "id")},
            "v": {ColumnRef("ods.src", "v")},
            "dt": set(),
        }
    )
    [start, fail] = receiver.runs("ads.t7")
    assert (start["eventType"], fail["eventType"]) == ("START", "FAIL")
    assert "needs 1 partition(s) of dwd.day" in fail["run"]["facets"]["errorMessage"]["message"]
    # the partition's changes of state: built, tainted, rebuilt
    assert [s for p, s in receiver.states("dwd.day") if p == "2026-01-01"] == ["ready", "tainted", "repaired"]
