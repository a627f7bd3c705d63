"""Key locality: which tables late data may rebuild by key, proven from their SQL, and why the others are rebuilt whole.

The example warehouse's tables decided by hand from their SQL, then one small query per rule, each next to the query
that breaks it; ``incremental: false``; ``warehouse lineage TABLE`` and ``--keys``. No Spark: the catalog and sqlglot
only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.small_catalog import assert_refused, sql_catalog
from warehouse_assets.catalog import Catalog, Dependency, DerivedTable, load_catalog
from warehouse_assets.catalog.key_locality import KeyLocality, key_locality
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.cli import main


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def verdicts(catalog: Catalog) -> dict[str, KeyLocality]:
    lineage = WarehouseLineage(catalog)
    return {table.fqn: key_locality(table, lineage.input_columns(table)) for table in catalog.derived()}


# --- the example warehouse, by hand ---------------------------------------------------------------------------

KEY_LOCAL = {
    # cleaned facts: one output row per source row, keyed by its id; the filters read the row's own columns
    "dwd.order_detail": ("order_id", {"ods.order": ("id",)}),
    # per-key groups of facts: the group key straight from the facts' column; count(DISTINCT) within the group
    "dws.order_hourly": ("course_id", {"ods.order": ("course_id",)}),
    "dws.course_attendance_weekly": ("course_id", {"dwd.attendance_detail": ("course_id",)}),
    "dws.user_learning_daily": ("user_id", {"dwd.attendance_detail": ("user_id",)}),
    "dws.user_order_daily": ("user_id", {"dwd.order_detail": ("user_id",)}),
    # grouped by user over a UNION ALL of two fact tables: each branch carries the key
    "dws.user_active_daily": ("user_id", {"dwd.attendance_detail": ("user_id",), "dwd.order_detail": ("user_id",)}),
    # a row-local select of a one-row-per-day table, keyed by its ds: provable, if of little use (one key a partition)
    "ads.revenue_flash": ("ds", {"dws.revenue_usd_daily": ("ds",)}),
}

WHOLE = {
    # a dimension joined on its own key: a late lesson change reaches every attendance of that lesson
    "dwd.attendance_detail": "joins dwd.lesson_snapshot on lesson_id, not on the key attendance_id",
    # snapshots and cumulative tables build each partition on the one before
    "dwd.course_daily": "reads a T-1 of itself (each partition is built on the one before)",
    "dwd.lesson_snapshot": "reads a T-1 of itself (each partition is built on the one before)",
    "dwd.user_snapshot": "reads a T-1 of itself (each partition is built on the one before)",
    "dws.user_learning_cumulative": "reads a T-1 of itself (each partition is built on the one before)",
    "ads.gmv_week_to_date": "reads a T-1 of itself (each partition is built on the one before)",
    # the day's exchange rate, cross-joined: a late rate changes every row
    "dws.order_usd_daily": "joins r (reading ext.fx_rate) on no column, not on the key status",
    "ads.gmv_usd_daily": "joins r (reading ext.fx_rate) on no column, not on the key ds",
    "ads.gmv_vs_month": "joins m (reading ads.monthly_report) on no column, not on the key ds",
    # one row of the whole partition: the key is the partition's own
    "dws.revenue_usd_daily": "sum(paid_amount) aggregates the whole partition, across keys (no GROUP BY)",
    "ads.daily_gmv": "sum(paid_amount) aggregates the whole partition, across keys (no GROUP BY)",
    "ads.gmv_hourly": "sum(paid_amount) aggregates the whole partition, across keys (no GROUP BY)",
    "ads.attendance_rate_daily": "sum(sessions) aggregates the whole partition, across keys (no GROUP BY)",
    "ads.dau_by_region": "count(DISTINCT user_id) aggregates the whole partition, across keys (no GROUP BY)",
    "ads.dau_global": "sum(dau) aggregates the whole partition, across keys (no GROUP BY)",
    "ads.retention_d1": "count(*) aggregates the whole partition, across keys (no GROUP BY)",
    "ads.retention_d7": "count(*) aggregates the whole partition, across keys (no GROUP BY)",
    "ads.active_users": (
        "count(DISTINCT CASE WHEN dt = '${ds}' THEN user_id END) aggregates the whole partition, across keys "
        "(no GROUP BY)"
    ),
    "ads.marketing_roi": "the key ds is the constant '${ds}': one key for the whole partition",
    "ads.monthly_report": "the key month is the constant substring('${ds}', 1, 7): one key for the whole partition",
    # the tier is looked up in the static city table: computed, and joined on the city, not the tier
    "ads.new_users_by_tier": "the key tier is computed (coalesce(tier, 'unlisted')), not carried from an input column",
    # only the newest snapshot day of the window, over every lesson
    "ads.lesson_catalog": "the subquery (SELECT max(dt) FROM dwd.lesson_snapshot) reads across keys",
}


def test_every_derived_table_of_the_example_has_a_verdict_decided_by_hand(verdicts: dict[str, KeyLocality]) -> None:
    assert set(verdicts) == set(KEY_LOCAL) | set(WHOLE)


@pytest.mark.parametrize("fqn", sorted(KEY_LOCAL))
def test_the_example_tables_proven_key_local(verdicts: dict[str, KeyLocality], fqn: str) -> None:
    key, carried = KEY_LOCAL[fqn]
    verdict = verdicts[fqn]
    assert verdict.key_local, verdict.reason
    assert verdict.key == (key,) and verdict.carried_from == carried


@pytest.mark.parametrize("fqn", sorted(WHOLE))
def test_the_example_tables_rebuilt_whole_and_why(verdicts: dict[str, KeyLocality], fqn: str) -> None:
    verdict = verdicts[fqn]
    assert not verdict.key_local and not verdict.carried_from
    assert verdict.reason == WHOLE[fqn]


def test_the_verdict_in_words(verdicts: dict[str, KeyLocality]) -> None:
    assert verdicts["dws.user_active_daily"].describe() == (
        "key-scoped rebuilds: by user_id (from dwd.attendance_detail.user_id, dwd.order_detail.user_id)"
    )
    assert verdicts["ads.daily_gmv"].describe() == f"whole-partition rebuilds: {WHOLE['ads.daily_gmv']}"


# --- one rule at a time, on small queries ----------------------------------------------------------------------

INPUTS = {
    "dwd.orders": ("order_id", "user_id", "course_id", "amount", "status", "dt"),
    "dwd.users": ("user_id", "referrer_id", "city", "dt"),
    "dwd.courses": ("course_id", "title", "dt"),
}


def verdict_of(sql: str, key: str, **fields: object) -> KeyLocality:
    """The verdict for ``dws.t`` keyed by ``key`` (comma-separated), reading the tables of :data:`INPUTS`."""
    fields.setdefault("deps", tuple(Dependency(t) for t in INPUTS))
    table = DerivedTable(
        layer="dws",
        name="t",
        period="daily",
        path=Path("dws/t.sql"),
        sql=sql,
        primary_key=tuple(key.split(", ")) if key else (),
        **fields,  # type: ignore[arg-type]
    )
    return key_locality(table, {**INPUTS, "dws.t": ("user_id", "orders")})


def whole(sql: str, key: str, **fields: object) -> str:
    verdict = verdict_of(sql, key, **fields)
    assert not verdict.key_local
    return verdict.reason


def test_a_row_local_select_keyed_by_a_carried_column() -> None:
    found = verdict_of("SELECT order_id AS id, amount FROM dwd.orders WHERE amount >= 0 AND status <> 'void'", "id")
    assert found.key_local and found.carried_from == {"dwd.orders": ("order_id",)}
    assert whole("SELECT order_id + 1 AS id, amount FROM dwd.orders", "id") == (
        "the key id is computed (order_id + 1), not carried from an input column"
    )
    assert whole("SELECT 1 AS id, amount FROM dwd.orders", "id") == (
        "the key id is the constant 1: one key for the whole partition"
    )


def test_a_group_by_the_key_carried_from_an_input_column() -> None:
    sql = "SELECT user_id, sum(amount) AS paid, count(DISTINCT course_id) AS courses FROM dwd.orders GROUP BY {}"
    found = verdict_of(sql.format("user_id"), "user_id")
    assert found.key_local and found.carried_from == {"dwd.orders": ("user_id",)}
    assert verdict_of(sql.format("1"), "user_id").key_local  # GROUP BY 1 is the column
    assert whole(sql.format("user_id, status"), "user_id") == (
        "groups by user_id, status, not by the key user_id carried from an input column"
    )
    assert whole(sql.format("ROLLUP (user_id)"), "user_id") == (  # its subtotals span keys
        "groups by ROLLUP (user_id), not by the key user_id carried from an input column"
    )


def test_a_multi_column_key_is_carried_column_by_column() -> None:
    found = verdict_of(
        "SELECT user_id, course_id, count(*) AS orders FROM dwd.orders GROUP BY user_id, course_id",
        "user_id, course_id",
    )
    assert found.carried_from == {"dwd.orders": ("user_id", "course_id")}
    assert found.describe() == (
        "key-scoped rebuilds: by (user_id, course_id) (from dwd.orders.user_id, dwd.orders.course_id)"
    )


def test_a_join_on_the_key_carries_it_into_each_side() -> None:
    on = verdict_of(
        "SELECT o.user_id, count(*) AS orders, max(u.city) AS city FROM dwd.orders o "
        "JOIN dwd.users u ON o.user_id = u.user_id AND u.city <> '' GROUP BY o.user_id",
        "user_id",
    )
    assert on.key_local and on.carried_from == {"dwd.orders": ("user_id",), "dwd.users": ("user_id",)}
    # USING qualifies to coalesce(o.user_id, u.user_id): one key, from either side
    using = verdict_of("SELECT user_id, u.city FROM dwd.orders o JOIN dwd.users u USING (user_id)", "user_id")
    assert using.carried_from == on.carried_from
    full = verdict_of(
        "SELECT coalesce(o.user_id, u.user_id) AS user_id, u.city FROM dwd.orders o "
        "FULL OUTER JOIN dwd.users u ON o.user_id = u.user_id",
        "user_id",
    )
    assert full.carried_from == on.carried_from


def test_a_key_from_the_optional_side_of_an_outer_join_is_not_carried() -> None:
    # orders without a user get a null key whatever their user_id: a user's late arrival changes those rows
    assert (
        whole("SELECT u.user_id, o.amount FROM dwd.orders o LEFT JOIN dwd.users u ON o.user_id = u.user_id", "user_id")
        == "the key user_id comes from u, the optional side of an outer join"
    )
    # a coalesce of two sides carries one key only when they are joined on it
    assert whole(
        "SELECT coalesce(o.user_id, u.user_id) AS user_id FROM dwd.orders o "
        "FULL OUTER JOIN dwd.users u ON o.course_id = u.user_id",
        "user_id",
    ) == ("the key user_id is coalesce(user_id, user_id), of columns not joined as equal")


def test_a_join_on_another_key_is_not_key_local() -> None:
    assert (
        whole(
            "SELECT o.user_id, sum(o.amount) AS paid, max(c.title) AS title FROM dwd.orders o "
            "JOIN dwd.courses c ON o.course_id = c.course_id GROUP BY o.user_id",
            "user_id",
        )
        == "joins dwd.courses on course_id, not on the key user_id"
    )
    assert (
        whole("SELECT o.order_id, c.title FROM dwd.orders o CROSS JOIN dwd.courses c", "order_id")
        == "joins dwd.courses on no column, not on the key order_id"
    )
    # the same table read by two keys: one filter on it cannot serve both
    assert (
        whole(
            "SELECT u.user_id, count(r.user_id) AS referred FROM dwd.users u "
            "JOIN dwd.users r ON u.user_id = r.referrer_id GROUP BY u.user_id",
            "user_id",
        )
        == "reads dwd.users twice, the key carried by user_id and by referrer_id"
    )


WINDOWED = (
    "SELECT user_id, course_id FROM (SELECT user_id, course_id, "
    "row_number() OVER (PARTITION BY {} ORDER BY amount DESC) AS nth FROM dwd.orders) AS ranked WHERE nth = 1"
)


def test_a_window_partitioned_by_the_key_stays_within_it() -> None:
    found = verdict_of(WINDOWED.format("user_id"), "user_id")
    assert found.key_local and found.carried_from == {"dwd.orders": ("user_id",)}


def test_a_window_not_partitioned_by_the_key_spans_keys() -> None:
    assert whole(WINDOWED.format("course_id"), "user_id") == (
        "window function row_number() OVER (PARTITION BY course_id ORDER BY amount DESC) spans keys"
    )
    assert whole("SELECT order_id, sum(amount) OVER () AS total FROM dwd.orders", "order_id") == (
        "window function sum(amount) OVER () spans keys"
    )


def test_an_aggregate_without_group_by_spans_the_partition() -> None:
    assert whole("SELECT '${ds}' AS ds, count(DISTINCT user_id) AS buyers FROM dwd.orders", "ds") == (
        "count(DISTINCT user_id) aggregates the whole partition, across keys (no GROUP BY)"
    )
    # also inside a CTE joined on the key: the total is every key's
    assert (
        whole(
            "WITH total AS (SELECT max(user_id) AS user_id, sum(amount) AS amount FROM dwd.orders) "
            "SELECT o.user_id, t.amount FROM dwd.orders o JOIN total t ON o.user_id = t.user_id",
            "user_id",
        )
        == "max(user_id) aggregates the whole partition, across keys (no GROUP BY)"
    )


def test_a_subquery_reads_across_keys() -> None:
    assert whole(
        "SELECT order_id, amount / (SELECT sum(amount) FROM dwd.orders) AS share FROM dwd.orders", "order_id"
    ) == ("the subquery (SELECT sum(amount) FROM dwd.orders) reads across keys")
    assert whole(
        "SELECT order_id FROM dwd.orders WHERE user_id IN (SELECT user_id FROM dwd.users WHERE city = 'x')", "order_id"
    ).startswith("the subquery (SELECT user_id FROM dwd.users")
    assert whole("SELECT order_id FROM dwd.orders ORDER BY amount DESC LIMIT 10", "order_id") == (
        "LIMIT keeps rows across keys"
    )
    assert whole("SELECT order_id FROM dwd.orders UNION ALL SELECT order_id FROM dwd.orders LIMIT 10", "order_id") == (
        "LIMIT keeps rows across keys"
    )


def test_sampled_literal_or_generated_rows_carry_no_key() -> None:
    assert whole("SELECT order_id, amount FROM dwd.orders TABLESAMPLE (10 PERCENT)", "order_id") == (
        "dwd.orders TABLESAMPLE (10 PERCENT) samples or pivots rows across keys"
    )
    assert whole("SELECT o.order_id, v.x FROM dwd.orders o CROSS JOIN (VALUES (1), (2)) AS v(x)", "order_id") == (
        "reads VALUES (1), (2) AS v(x): literal rows or a table function carry no key"
    )
    assert whole("SELECT o.order_id, e FROM dwd.orders o LATERAL VIEW explode(array(1, 2)) t AS e", "order_id") == (
        "reads LATERAL VIEW explode(array(1, 2)) t AS e: literal rows or a table function carry no key"
    )


def test_a_union_is_key_local_when_every_branch_carries_the_key() -> None:
    found = verdict_of(
        "SELECT user_id, city FROM dwd.users UNION ALL SELECT user_id, status AS city FROM dwd.orders", "user_id"
    )
    assert found.carried_from == {"dwd.orders": ("user_id",), "dwd.users": ("user_id",)}
    assert (
        whole("SELECT user_id, city FROM dwd.users UNION ALL SELECT 0 AS user_id, title FROM dwd.courses", "user_id")
        == "the key user_id is the constant 0: one key for the whole partition"
    )


def test_a_table_reading_itself_is_rebuilt_whole() -> None:
    sql = "SELECT user_id, orders FROM dws.t"
    own = {"columns": {"user_id": "bigint", "orders": "bigint"}}
    assert whole(sql, "user_id", deps=(Dependency("dws.t", -1, -1),), **own) == (
        "reads a T-1 of itself (each partition is built on the one before)"
    )
    assert whole(sql, "user_id", deps=(Dependency("dws.t", -7, -1),), **own) == (
        "reads a window [-7, -1] of itself (each partition is built on the one before)"
    )


def test_a_table_without_primary_key_or_with_sql_that_cannot_be_followed() -> None:
    assert whole("SELECT user_id FROM dwd.orders", "") == "declares no primary_key: no key to rebuild by"
    assert whole("SELECT user_id FROM", "user_id").startswith("the SQL could not be followed: ")
    assert whole("SELECT user_id FROM dwd.orders", "order_id") == "the key order_id is not a column the query selects"
    assert whole("SELECT user_id FROM dwd.users UNION ALL SELECT user_id FROM dwd.orders", "city") == (
        "the key city is not a column the query selects"
    )
    assert whole("SELECT mystery AS id FROM dwd.orders", "id") == (
        "the key id reads mystery, not a column of any table it reads"
    )
    assert whole("SELECT n.id FROM dwd.nope AS n", "id") == "reads dwd.nope AS n, not a table of the catalog"


def test_incremental_false_opts_out(tmp_path: Path) -> None:
    body = "SELECT id, count(*) AS n FROM ods.src GROUP BY id"
    catalog = sql_catalog(
        tmp_path,
        {
            "dwd/on.sql": ("period: daily\nprimary_key: [id]\n", body),
            "dwd/off.sql": ("period: daily\nprimary_key: [id]\nincremental: false\n", body),
        },
    )
    lineage = WarehouseLineage(catalog)
    on, off = (catalog[name] for name in ("dwd.on", "dwd.off"))
    assert isinstance(on, DerivedTable) and isinstance(off, DerivedTable)
    assert on.incremental and not off.incremental
    assert key_locality(on, lineage.input_columns(on)).key_local
    verdict = key_locality(off, lineage.input_columns(off))
    assert verdict.reason == "declared incremental: false"


@pytest.mark.parametrize("value", ["'false'", "0", "maybe", ""])
def test_incremental_must_say_true_or_false(tmp_path: Path, value: str) -> None:
    header = f"/* ---\ntable: dwd.t\nperiod: daily\nincremental: {value}\n--- */\nSELECT id FROM ods.src\n"
    assert_refused(tmp_path, {"dwd/t.sql": header}, "incremental must be true or false")


def test_a_static_table_declares_no_incremental(tmp_path: Path) -> None:
    header = "/* ---\ntable: dwd.t\nkind: static\ncolumns: {a: int}\nincremental: true\n--- */\nSELECT 1 AS a\n"
    assert_refused(tmp_path, {"dwd/t.sql": header}, "incremental is for partitioned tables")


# --- the command -----------------------------------------------------------------------------------------------


def test_the_lineage_command_prints_a_tables_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lineage", "dws.user_order_daily"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "dws.user_order_daily",
        "  reads dwd.order_detail",
        "  key-scoped rebuilds: by user_id (from dwd.order_detail.user_id)",
    ]
    assert main(["lineage", "ads.lesson_catalog"]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .startswith(f"  whole-partition rebuilds: {WHOLE['ads.lesson_catalog']}; not additive: reads the subquery")
    )
    assert main(["lineage", "ads.daily_gmv"]) == 0  # a total: maintained from its input's changed rows
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  additive: sum/count maintained from the changed rows of dws.user_order_daily"
    )
    assert main(["lineage", "ods.order"]) == 0
    assert capsys.readouterr().out.splitlines() == ["ods.order", "  reads no table: late data does not rebuild it"]
    assert main(["lineage", "ads.daily_gnv"]) == 2
    assert "did you mean ads.daily_gmv" in capsys.readouterr().err
    assert main(["lineage", "ads.daily_gmv", "--down"]) == 2
    assert "--down follows a column" in capsys.readouterr().err


def test_the_lineage_command_lists_every_tables_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lineage", "--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines[:-1]}
    assert list(listed)[0].startswith("dwd.") and list(listed)[-1].startswith("ads.")  # layer by layer
    assert {fqn for fqn, verdict in listed.items() if verdict.startswith("key-scoped rebuilds: by ")} == set(KEY_LOCAL)
    assert listed["dwd.attendance_detail"] == (
        f"whole-partition rebuilds: {WHOLE['dwd.attendance_detail']}; not additive: id AS attendance_id reads id "
        "outside an aggregate (no GROUP BY: one row per partition)"
    )
    additive = {fqn for fqn, verdict in listed.items() if verdict.startswith("additive: ")}
    assert additive == {
        "ads.attendance_rate_daily",
        "ads.daily_gmv",
        "ads.dau_global",
        "ads.gmv_hourly",
        "ads.retention_d1",  # a LEFT JOIN of the day's activity to a cohort, counted
        "ads.retention_d7",
        "ads.dau_by_region",  # count(DISTINCT user_id): its (value, multiplicity) pairs kept
        "ads.active_users",  # DAU, WAU, MAU: three distinct counts over the 30 days
    }
    assert lines[-1] == (
        f"{len(KEY_LOCAL)} of {len(listed)} tables key-scoped, {len(additive)} additive, "
        f"{len(WHOLE) - len(additive)} whole-partition"
    )
    assert main(["lineage"]) == 2
    assert main(["lineage", "--keys", "ads.daily_gmv"]) == 2
    assert "or list every table: --keys" in capsys.readouterr().err
