"""Additive totals: which tables late data may maintain from the changed rows of their inputs (sums and counts per
group, of one table or of an equi-join), proven from their SQL, and why the others are rebuilt whole; the partial
states a proof names, and the queries that compute them and the table's items from them. No Spark: the catalog and
sqlglot only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from warehouse_assets.catalog import Catalog, Dependency, DerivedTable, load_catalog
from warehouse_assets.catalog.additive import Additivity, Partial, WarehouseTypes, additivity


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def verdicts(catalog: Catalog) -> dict[str, Additivity]:
    types = WarehouseTypes(catalog)
    return {table.fqn: types.verdict(table) for table in catalog.derived()}


# --- the example warehouse, by hand ---------------------------------------------------------------------------

ADDITIVE = {
    # GMV, paying users, their share of ordering users (a ratio of two counts), orders: of the day's users
    "ads.daily_gmv": "dws.user_order_daily",
    "ads.gmv_hourly": "dws.order_hourly",
    # sessions and attended sessions summed, learners counted, and the rate of the two sums
    "ads.attendance_rate_daily": "dws.user_learning_daily",
    # the regions' DAU summed
    "ads.dau_global": "ads.dau_by_region",
    # a cohort's users counted, and those of them active on the day: a LEFT JOIN of the activity on user_id
    "ads.retention_d1": "dwd.user_snapshot",
    "ads.retention_d7": "dwd.user_snapshot",
    # distinct counts, kept as (value, multiplicity) pairs: the region's DAU; DAU, WAU and MAU over 30 days
    "ads.dau_by_region": "ods.attendance",
    "ads.active_users": "dws.user_active_daily",
}

NOT_ADDITIVE = {
    "ads.monthly_report": (
        "reads the subquery (SELECT CAST(coalesce(sum(paid_amount), 0) AS DECIMAL(18, 2)) AS gmv, "
        "CAST(coalesce(sum(...), which does not merge into one SELECT"
    ),
    "ads.gmv_usd_daily": "reads ext.fx_rate, whose changes no change data feed records",
    "ads.new_users_by_tier": "reads dwd.city_tier, whose changes no change data feed records",
    "ads.gmv_week_to_date": "reads itself (each partition is built on the one before)",
    "ads.lesson_catalog": "reads the subquery (SELECT max(dt) FROM dwd.lesson_snapshot), which does not merge into one "
    "SELECT",
    "dws.revenue_usd_daily": "passes through states",
    # grouped by their key: the key-scoped rebuild replaces the changed keys' rows already
    "dws.user_order_daily": "key-local: its key-scoped rebuild replaces the changed keys' rows",
    "dwd.order_detail": "key-local: its key-scoped rebuild replaces the changed keys' rows",
}


@pytest.mark.parametrize("fqn", sorted(ADDITIVE))
def test_the_example_totals_proven_additive(verdicts: dict[str, Additivity], fqn: str) -> None:
    assert verdicts[fqn].additive, verdicts[fqn].reason
    assert verdicts[fqn].input == ADDITIVE[fqn]


@pytest.mark.parametrize("fqn", sorted(NOT_ADDITIVE))
def test_the_example_tables_not_additive_and_why(verdicts: dict[str, Additivity], fqn: str) -> None:
    assert verdicts[fqn].reason == NOT_ADDITIVE[fqn]


def test_no_other_example_table_is_additive(verdicts: dict[str, Additivity]) -> None:
    assert {fqn for fqn, v in verdicts.items() if v.additive} == set(ADDITIVE)


def test_the_verdict_in_words(verdicts: dict[str, Additivity]) -> None:
    assert verdicts["ads.daily_gmv"].describe() == (
        "additive: sum/count maintained from the changed rows of dws.user_order_daily"
    )
    assert verdicts["ads.dau_by_region"].describe() == (
        "additive: sum/count, distinct counts and extremes maintained from the changed rows of ods.attendance"
    )
    assert verdicts["ads.dau_by_region"].values == ("attendance.user_id",)
    assert verdicts["ads.lesson_catalog"].describe() == f"not additive: {NOT_ADDITIVE['ads.lesson_catalog']}"


def test_column_types_come_from_declarations_and_through_each_tables_sql(catalog: Catalog) -> None:
    types = WarehouseTypes(catalog)
    assert types.columns("ods.order")["amount"] == "decimal(10,2)"
    derived = types.columns("dws.user_order_daily")  # declared nowhere: inferred through dwd.order_detail
    assert derived["orders"] == "bigint" and derived["paid_amount"].startswith("decimal")
    assert derived["dt"] == "string"


# --- one rule at a time, on small queries ----------------------------------------------------------------------

TYPES = {"amount": "decimal(12,2)", "qty": "bigint", "score": "double", "status": "string", "city": "string"}
TYPES |= {"user_id": "bigint", "paid": "boolean", "note": "", "dt": "string"}


def verdict_of(sql: str, inputs: dict[str, dict[str, str]] | None = None, **fields: object) -> Additivity:
    """The verdict for ``ads.t`` reading ``dwd.orders`` (of :data:`TYPES`) unless ``inputs`` says otherwise."""
    inputs = inputs or {"dwd.orders": TYPES}
    fields.setdefault("deps", tuple(Dependency(t) for t in inputs))
    table = DerivedTable(layer="ads", name="t", period="daily", path=Path("ads/t.sql"), sql=sql, **fields)  # type: ignore[arg-type]
    return additivity(table, inputs)


def reason(sql: str, **fields: object) -> str:
    found = verdict_of(sql, **fields)
    assert not found.additive
    return found.reason


def test_a_ratio_of_counts_and_sums_of_integers_and_decimals_are_additive() -> None:
    found = verdict_of(
        "SELECT '${ds}' AS ds, sum(amount) AS gmv, count(*) AS orders, count_if(paid) AS paid_orders, "
        "count_if(paid) / nullif(count(*), 0) AS paid_share, CAST(coalesce(sum(qty), 0) AS bigint) + 1 AS items "
        "FROM dwd.orders WHERE status <> 'void'"
    )
    assert found.additive and found.input == "dwd.orders" and found.group_by == ()
    assert found.where == "orders.status <> 'void'"
    # the distinct calls once each, as mergeable sums: count_if(paid) is kept once for both of its uses; a sum
    # keeps the count of its non-null values beside it; the hidden count of rows is count(*) itself
    assert found.partials == (
        Partial("__rows", "rows"),
        Partial("__a1", "sum", "orders.amount"),
        Partial("__a2", "nonnull", "orders.amount"),
        Partial("__a3", "count_if", "orders.paid"),
        Partial("__a4", "sum", "orders.qty"),
        Partial("__a5", "nonnull", "orders.qty"),
    )
    assert found.partials[3].sql() == "sum(CASE WHEN orders.paid THEN 1 ELSE 0 END)"
    assert found.partials[3].sql("__net") == "sum(CASE WHEN orders.paid THEN __net ELSE 0 END)"
    assert found.partials[1].sql("__net") == "sum((orders.amount) * __net)"
    assert found.select[1] == "CASE WHEN __a2 > 0 THEN __a1 END AS gmv"  # NULL again once every value is gone
    assert found.select[4] == "COALESCE(__a3, 0) / NULLIF(COALESCE(__rows, 0), 0) AS paid_share"


def test_a_group_by_input_columns_is_kept_per_group() -> None:
    found = verdict_of(
        "SELECT city AS where_from, status, count(*) AS n, sum(qty) AS q FROM dwd.orders GROUP BY city, status"
    )
    assert found.additive and found.group_by == ("city", "status")
    assert found.group_outputs == ("where_from", "status")  # the MERGE finds a group's row by them
    assert found.state_sql() == (
        "SELECT orders.city AS __g0, orders.status AS __g1, sum(1) AS __rows, sum(orders.qty) AS __a1, "
        "sum(CASE WHEN (orders.qty) IS NOT NULL THEN 1 ELSE 0 END) AS __a2 FROM dwd.orders AS orders "
        "GROUP BY orders.city, orders.status"
    )
    assert found.final_sql("s") == (
        "SELECT __g0 AS where_from, __g1 AS status, COALESCE(__rows, 0) AS n, CASE WHEN __a2 > 0 THEN __a1 END AS q "
        "FROM s"
    )
    assert reason("SELECT status, count(*) AS n FROM dwd.orders GROUP BY status, city") == (
        "groups by city, which it does not select: its rows cannot be found by group"
    )
    assert reason("SELECT upper(city) AS c, count(*) AS n FROM dwd.orders GROUP BY upper(city)") == (
        "groups by upper(city): only input columns are groups"
    )


def test_a_cte_that_merges_into_one_select_is_inlined() -> None:
    found = verdict_of("WITH paid AS (SELECT * FROM dwd.orders WHERE paid) SELECT sum(qty) AS q FROM paid")
    assert found.additive and found.where == "orders.paid"


def test_aggregates_changed_rows_cannot_maintain_are_refused() -> None:
    assert reason("SELECT count(DISTINCT user_id, city) AS users FROM dwd.orders") == (
        "count(DISTINCT user_id, city): only distinct values of one argument are kept"
    )
    assert reason("SELECT min(qty, user_id) AS m FROM dwd.orders") == (
        "least(qty, user_id) is not a sum, a count, a distinct count or an extreme"
    )
    assert reason("SELECT percentile_approx(qty, 0.5) AS m FROM dwd.orders") == (
        "percentile_approx(qty, 0.5) is not a sum, a count, a distinct count or an extreme"
    )
    assert reason("SELECT sum(score) AS s FROM dwd.orders") == (
        "sum(score) sums double values, whose maintained sum drifts from a recomputed one (only integral and "
        "decimal sums are kept)"
    )
    assert reason("SELECT sum(note) AS s FROM dwd.orders") == "sum(note): the type of note is not known"
    assert (
        reason("SELECT avg(qty) AS m FROM dwd.orders")
        == "avg(qty) is not a sum, a count, a distinct count or an extreme"
    )
    assert reason("SELECT count(*) FILTER (WHERE paid) AS m FROM dwd.orders") == (
        "count(*) FILTER(WHERE paid): FILTER is not maintained"
    )


def test_distinct_counts_and_extremes_keep_their_value_pairs_one_state_table_per_argument() -> None:
    found = verdict_of(
        "SELECT city, count(DISTINCT user_id) AS buyers, min(user_id) AS first_buyer, max(amount) AS top, "
        "min(DISTINCT user_id) AS same, sum(qty) AS q, count(DISTINCT CASE WHEN paid THEN user_id END) AS payers "
        "FROM dwd.orders WHERE status <> 'void' GROUP BY city"
    )
    assert found.additive
    # the arguments whose pairs are kept, once each: user_id's pairs serve its distinct count, its min, min(DISTINCT)
    assert found.values == ("orders.user_id", "orders.amount", "CASE WHEN orders.paid THEN orders.user_id END")
    assert [p for p in found.partials if not p.summed] == [
        Partial("__a1", "distinct", "orders.user_id"),
        Partial("__a2", "min", "orders.user_id"),
        Partial("__a3", "max", "orders.amount"),
        Partial("__a6", "distinct", "CASE WHEN orders.paid THEN orders.user_id END"),
    ]
    assert found.select[1:4] == ("COALESCE(__a1, 0) AS buyers", "__a2 AS first_buyer", "__a3 AS top")
    assert found.select[4] == "__a2 AS same"
    # a whole build computes them with the sums; a change moves the sums only, the pairs by their own query
    assert "count(DISTINCT orders.user_id) AS __a1, min(orders.user_id) AS __a2" in found.state_sql()
    assert "__a1" not in found.state_sql("__net", whole=False)
    assert found.values_sql(1, "o.__net") == (
        "SELECT orders.city AS __g0, orders.amount AS __v, sum(o.__net) AS __m FROM dwd.orders AS orders "
        "WHERE (orders.status <> 'void') AND (orders.amount) IS NOT NULL GROUP BY orders.city, orders.amount"
    )
    with pytest.raises(ValueError, match="not a sum of weighted rows"):
        found.partials[1].sql("__net")


def test_distinct_counts_over_a_join_and_without_groups_are_kept() -> None:
    joined = verdict_of(
        "SELECT count(DISTINCT u.city) AS cities, max(u.credit) AS most FROM dwd.orders o "
        "LEFT JOIN dwd.users u ON u.user_id = o.user_id",
        JOINED,
    )
    assert joined.additive and joined.values == ("u.city", "u.credit")
    assert joined.values_sql(0) == (
        "SELECT u.city AS __v, sum(1) AS __m FROM dwd.orders AS o LEFT JOIN dwd.users AS u ON u.user_id = o.user_id "
        "WHERE (u.city) IS NOT NULL GROUP BY u.city"
    )


def test_what_reads_across_rows_otherwise_is_refused() -> None:
    assert reason("SELECT qty, count(*) AS n FROM dwd.orders") == (
        "qty reads qty outside an aggregate (no GROUP BY: one row per partition)"
    )
    assert reason("SELECT status, sum(qty) AS q FROM dwd.orders GROUP BY status HAVING sum(qty) > 0") == (
        "HAVING is not maintained from changed rows"
    )
    assert reason("SELECT DISTINCT status FROM dwd.orders") == "DISTINCT is not maintained from changed rows"
    assert reason("SELECT sum(qty) AS q FROM dwd.orders LIMIT 1") == "LIMIT is not maintained from changed rows"
    assert reason("SELECT sum(qty) OVER (PARTITION BY status) AS q FROM dwd.orders").startswith("window function")
    assert reason("SELECT count(*) AS n FROM dwd.orders UNION ALL SELECT count(*) AS n FROM dwd.orders") == (
        "UNION of queries: a set operation is not maintained"
    )
    assert reason("SELECT count(*) AS n FROM dwd.orders WHERE qty > (SELECT avg(qty) FROM dwd.orders)").startswith(
        "reads the subquery"
    )


# --- totals over joins ---------------------------------------------------------------------------------------

USERS = {"user_id": "bigint", "city": "string", "tier": "int", "credit": "decimal(10,2)", "weight": "double"}
JOINED = {"dwd.orders": TYPES, "dwd.users": USERS}


def test_a_total_over_an_equi_join_is_kept_per_group_of_any_joined_tables_columns() -> None:
    found = verdict_of(
        "SELECT u.city, o.status, count(*) AS n, sum(o.qty * u.tier) AS weighted, count(u.user_id) AS known "
        "FROM dwd.orders o LEFT JOIN dwd.users AS u ON o.user_id = u.user_id AND u.city = o.city "
        "WHERE u.credit > 0 OR o.paid GROUP BY u.city, o.status",
        JOINED,
    )
    assert found.additive, found.reason
    assert found.inputs == ("dwd.orders", "dwd.users") and found.aliases == ("o", "u")
    [join] = found.joins
    assert join.left and join.keys == (("user_id", "o", "user_id"), ("city", "o", "city"))
    assert found.group_by == ("city", "status") and found.group_sources == ("u", "o")
    assert found.describe() == "additive: sum/count maintained from the changed rows of dwd.orders, dwd.users"
    assert found.state_sql("o.__net") == (
        "SELECT u.city AS __g0, o.status AS __g1, sum(o.__net) AS __rows, sum((o.qty * u.tier) * o.__net) AS __a1, "
        "sum(CASE WHEN (o.qty * u.tier) IS NOT NULL THEN o.__net ELSE 0 END) AS __a2, "
        "sum(CASE WHEN (u.user_id) IS NOT NULL THEN o.__net ELSE 0 END) AS __a3 "
        "FROM dwd.orders AS o LEFT JOIN dwd.users AS u ON o.user_id = u.user_id AND u.city = o.city "
        "WHERE u.credit > 0 OR o.paid GROUP BY u.city, o.status"
    )
    inner = verdict_of("SELECT count(*) AS n FROM dwd.orders o JOIN dwd.users u ON u.user_id = o.user_id", JOINED)
    assert inner.additive and not inner.joins[0].left and inner.joins[0].keys == (("user_id", "o", "user_id"),)
    using = verdict_of("SELECT count(*) AS n FROM dwd.orders o JOIN dwd.users u USING (user_id)", JOINED)
    assert using.joins[0].keys == inner.joins[0].keys  # USING is the equality of its columns
    # a column named alike in both tables is told apart by its table
    assert verdict_of(
        "SELECT o.user_id, count(*) AS n FROM dwd.orders o JOIN dwd.users u ON u.user_id = o.user_id "
        "GROUP BY u.user_id",
        JOINED,
    ).reason == ("user_id reads user_id outside an aggregate, not a group column")


def test_joins_the_delta_rule_cannot_maintain_are_refused_and_why() -> None:
    def refused(sql: str) -> str:
        found = verdict_of(sql, JOINED)
        assert not found.additive
        return found.reason

    base = "SELECT count(*) AS n FROM dwd.orders o "
    equalities = "only equalities of its columns with the columns of the tables joined before it are maintained"
    assert refused(base + "JOIN dwd.users u ON o.user_id < u.user_id") == (
        f"joins dwd.users AS u on user_id < user_id: {equalities}"
    )
    assert refused(base + "JOIN dwd.users u ON o.user_id = u.user_id + 1") == (
        f"joins dwd.users AS u on user_id = user_id + 1: {equalities}"
    )
    assert refused(base + "LEFT JOIN dwd.users u ON o.user_id = u.user_id OR o.city = u.city").startswith(
        "joins dwd.users AS u on user_id = user_id OR city = city: only equalities"
    )
    assert refused(base + "JOIN dwd.users u ON o.user_id = u.user_id AND u.tier = 1").startswith(
        "joins dwd.users AS u on user_id = user_id AND tier = 1: only equalities"
    )
    assert refused(base + "FULL JOIN dwd.users u ON o.user_id = u.user_id") == (
        "FULL JOIN dwd.users AS u: only inner joins and LEFT JOINs are maintained"
    )
    assert refused(base + "RIGHT JOIN dwd.users u ON o.user_id = u.user_id") == (
        "RIGHT JOIN dwd.users AS u: only inner joins and LEFT JOINs are maintained"
    )
    assert refused(base + "CROSS JOIN dwd.users u") == (
        "CROSS JOIN dwd.users AS u: only inner joins and LEFT JOINs are maintained"
    )
    assert refused(base + "JOIN dwd.orders p ON o.user_id = p.user_id") == (
        "reads dwd.orders twice: each input's change is one term of the join"
    )
    assert refused("SELECT sum(u.weight) AS w FROM dwd.orders o JOIN dwd.users u ON o.user_id = u.user_id") == (
        "sum(weight) sums double values, whose maintained sum drifts from a recomputed one (only integral and "
        "decimal sums are kept)"
    )
    table = DerivedTable(
        layer="ads",
        name="t",
        period="daily",
        path=Path("ads/t.sql"),
        sql=base + "JOIN dwd.users u ON o.user_id = u.user_id",
        deps=(Dependency("dwd.orders"), Dependency("dwd.users")),
    )
    assert additivity(table, JOINED, feeds=("dwd.orders",)).reason == (
        "reads dwd.users, whose changes no change data feed records"
    )


def test_an_opt_out_a_key_local_table_and_a_table_without_a_change_feed_are_rebuilt_whole() -> None:
    total = "SELECT sum(qty) AS q FROM dwd.orders"
    assert reason(total, incremental=False) == "declared incremental: false"
    assert reason("SELECT user_id, sum(qty) AS q FROM dwd.orders GROUP BY user_id", primary_key=("user_id",)) == (
        "key-local: its key-scoped rebuild replaces the changed keys' rows"
    )
    table = DerivedTable(
        layer="ads", name="t", period="daily", path=Path("ads/t.sql"), sql=total, deps=(Dependency("dwd.orders"),)
    )
    assert additivity(table, {"dwd.orders": TYPES}, feeds=()).reason == (
        "reads dwd.orders, whose changes no change data feed records"
    )
