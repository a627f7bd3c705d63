"""The checks of a key-scoped rebuild judged over the whole partition from the Delta log and DataFusion counts
(:mod:`warehouse_assets.materialize.log_checks`): a clean partition passes every check of ``dwd.order_detail`` and
``dws.user_order_daily`` without Spark; bad data is never passed there, it is left to the Spark evaluation, which
fails it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore, PartitionWritten, Predicate
from tests.support import datafusion_plans as plans
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.catalog.checks import Outcome
from warehouse_assets.materialize.gate import Verdict
from warehouse_assets.materialize.key_scope import KeyScope
from warehouse_assets.materialize.log_checks import JUDGED_BY, PartitionFacts, judge
from warehouse_assets.materialize.runner import _Planned, _RangedBuild

DAY = "2026-03-02"
HOURS = [f"{DAY}-{h:02d}:00" for h in (9, 10)]
ORDERS = pa.schema(
    [("order_id", pa.int64()), ("user_id", pa.int64()), ("course_id", pa.int64()), ("amount", pa.decimal128(10, 2)),
     ("status", pa.string()), ("pay_time", pa.timestamp("us", "UTC")), ("create_time", pa.timestamp("us", "UTC")),
     ("dt", pa.string())]
)  # fmt: skip
AT = datetime(2026, 3, 2, 2, 0)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def _orders(rows: list[tuple[Any, Any, str]]) -> pa.Table:
    """(order_id, user_id, amount) → dwd.order_detail rows of the day."""
    return pa.table(
        {
            "order_id": [r[0] for r in rows],
            "user_id": [r[1] for r in rows],
            "course_id": [1] * len(rows),
            "amount": [Decimal(r[2]) for r in rows],
            "status": ["paid"] * len(rows),
            "pay_time": [AT] * len(rows),
            "create_time": [AT] * len(rows),
            "dt": [DAY] * len(rows),
        },
        schema=ORDERS,
    )


def _lake(tmp_path: Path, orders: pa.Table, ods_live: int = 4, users: tuple[int, ...] = (1, 2)) -> DeltaStore:
    """ods.order with ``ods_live`` live rows and one tombstone over two hours, ``orders`` as dwd.order_detail's day,
    and dws.user_order_daily's day holding ``users``."""
    store = DeltaStore(str(tmp_path / "lake"))
    ods = pa.table(
        {
            "id": list(range(ods_live + 1)),
            "_deleted": [False] * ods_live + [True],
            "dt": [DAY] * (ods_live + 1),
            "hh": [("09", "10")[i % 2] for i in range(ods_live + 1)],
        }
    )
    write_deltalake(store.table_uri(["ods", "order"]), ods, partition_by=["dt", "hh"])
    write_deltalake(store.table_uri(["dwd", "order_detail"]), orders, partition_by=["dt"])
    n = len(users)
    daily = pa.table(
        {
            "user_id": pa.array(users, pa.int64()),
            "orders": [1] * n,
            "paid_orders": [1] * n,
            "paid_amount": [Decimal("1.00")] * n,
            "refunded_orders": [0] * n,
            "dt": [DAY] * n,
        }
    )
    write_deltalake(store.table_uri(["dws", "user_order_daily"]), daily, partition_by=["dt"])
    return store


GOOD = [(1, 1, "10.00"), (2, 1, "0.00"), (3, 2, "5.50"), (4, 2, "7.25")]


def _facts(catalog: Catalog, store: DeltaStore, table: str) -> PartitionFacts:
    read = {"dwd.order_detail": {"ods.order": HOURS}, "dws.user_order_daily": {"dwd.order_detail": [DAY]}}[table]
    versions = {name: 0 for name in read}
    return PartitionFacts(catalog, catalog[table], store, DAY, 0, read, versions)


def test_a_clean_partition_passes_every_check_without_spark(catalog: Catalog, tmp_path: Path) -> None:
    store = _lake(tmp_path, _orders(GOOD))
    for table in ("dwd.order_detail", "dws.user_order_daily"):
        facts = _facts(catalog, store, table)
        outcomes = {c.name: judge(c, facts) for c in catalog[table].checks}
        assert all(o is not None and o.passed and o.metadata[JUDGED_BY] for o in outcomes.values()), outcomes
    dwd = _facts(catalog, store, "dwd.order_detail")
    [row_count] = [judge(c, dwd) for c in catalog["dwd.order_detail"].checks if c.name == "row_count"]
    assert row_count is not None
    # the ODS rows are counted as the build read them: its tombstone is not one
    assert (row_count.metadata["rows"], row_count.metadata["upstream_rows"]) == (4, 4)


BAD: dict[str, Callable[[Path], DeltaStore]] = {
    "not_null": lambda p: _lake(p, _orders([*GOOD[:3], (4, None, "7.25")])),
    "range": lambda p: _lake(p, _orders([*GOOD[:3], (4, 2, "-1.00")])),
    "unique": lambda p: _lake(p, _orders([*GOOD[:3], (3, 2, "7.25")])),
    "row_count": lambda p: _lake(p, _orders(GOOD), ods_live=5),  # 4 of 5 orders: a ratio of 0.8
}


@pytest.mark.parametrize("failing", sorted(BAD))
def test_bad_data_after_a_key_scoped_write_fails_its_check_on_spark(
    catalog: Catalog, spark: SparkSession, tmp_path: Path, failing: str
) -> None:
    """The runner's checks of a key-scoped write: what the log proves passed is not evaluated again, the check it
    cannot pass is evaluated on Spark, which fails it."""
    store = BAD[failing](tmp_path)
    table = catalog["dwd.order_detail"]
    facts = _facts(catalog, store, "dwd.order_detail")
    assert judge(next(c for c in table.checks if c.name == failing), facts) is None  # not judged from the log
    outcomes = {o.check.name: o for o in _checks_of_a_scoped_write(catalog, spark, store)}
    assert list(outcomes) == [c.name for c in table.checks]
    assert not outcomes[failing].passed and JUDGED_BY not in outcomes[failing].metadata
    assert all(o.passed and o.metadata[JUDGED_BY] for name, o in outcomes.items() if name != failing)


def _checks_of_a_scoped_write(catalog: Catalog, spark: SparkSession, store: DeltaStore) -> list[Outcome]:
    """The runner's checks of dwd.order_detail's day after a key-scoped write at version 0 (of one order)."""
    build = _RangedBuild.__new__(_RangedBuild)
    build.catalog, build.table, build.store, build.spark = catalog, catalog["dwd.order_detail"], store, spark
    scope = KeyScope(("order_id",), pa.table({"order_id": [4]}), {"ods.order": ("id",)})
    ods, _ = store.read(spark, ("ods", "order"), [{"dt": DAY, "hh": h} for h in ("09", "10")])
    inputs = {"ods.order": ods.where("NOT _deleted")}
    planned = _Planned(DAY, Verdict(build.table, DAY, []), ods, inputs, {"ods.order": HOURS}, {"ods.order": 0}, scope)
    build.pending = [planned]
    return build._check(0)


def test_a_reference_missing_from_the_input_is_left_to_spark(catalog: Catalog, tmp_path: Path) -> None:
    store = _lake(tmp_path, _orders(GOOD), users=(1, 2, 9))  # user 9 has no order
    facts = _facts(catalog, store, "dws.user_order_daily")
    [references] = [c for c in catalog["dws.user_order_daily"].checks if c.name == "references"]
    assert judge(references, facts) is None


def test_the_key_counts_count_duplicated_and_null_keys_in_the_partition_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DataFusion counts the unique and references checks judge by, on a key of two columns: a duplicated key
    is one key of two rows, a key with a null part is no key and each of its rows a null row; the other partition's
    rows, the referenced table's rows left out by its predicate and its unread partition count for nothing. Each
    count reads the partition once (a partition holding null keys: its statistics answer no null count)."""
    store = DeltaStore(str(tmp_path / "lake"))
    x = [(1, 1), (1, 1), (1, 2), (2, None), (None, None), (None, None), (3, 3)]
    y = [(9, 9), (None, 9), (1, 1)]  # another partition: none of it counted
    keys = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("ok", pa.bool_()), ("dt", pa.string())])

    def rows(by_dt: dict[str, list[tuple[Any, Any]]], ok: list[bool] | None = None) -> pa.Table:
        flat = [(a, b, d) for d, pairs in by_dt.items() for a, b in pairs]
        flags = ok or [True] * len(flat)
        return pa.table({"a": [r[0] for r in flat], "b": [r[1] for r in flat], "ok": flags,
                         "dt": [r[2] for r in flat]}, schema=keys)  # fmt: skip

    write_deltalake(store.table_uri("t"), rows({"x": x, "y": y}), partition_by=["dt"])
    # referenced: 1 twice and a null in a partition read; 2 only on a row its predicate leaves out; 3 only unread
    ref = rows({"x": [(1, 0), (1, 0), (None, 0), (2, 0)], "y": [(3, 0)]}, ok=[True, True, True, False, True])
    write_deltalake(store.table_uri("r"), ref, partition_by=["dt"])
    read = ("r", 0, [{"dt": "x"}], [Predicate("ok", "=", True)])
    read_both = ("r", 0, [{"dt": "x"}, {"dt": "y"}], [Predicate("ok", "=", True)])
    queries = plans.recorded(store, monkeypatch)
    assert store.distinct_keys("t", 0, {"dt": "x"}, ["a", "b"]) == (7, 3, 3)
    assert store.distinct_keys("t", 0, {"dt": "x"}, ["a"]) == (7, 3, 2)
    assert store.key_references("t", 0, {"dt": "x"}, "a", read, "a") == (7, 3, 2, 2)
    assert store.key_references("t", 0, {"dt": "x"}, "a", read_both, "a") == (7, 3, 2, 1)
    assert [plans.scans(store, q) for q in queries] == [1, 1, 2, 2]
    assert store.distinct_keys("t", 0, {"dt": "z"}, ["a"]) == (0, 0, 0)  # an empty partition
    assert store.key_references("t", 0, {"dt": "z"}, "a", read_both, "a") == (0, 0, 0, 0)


def test_a_table_unique_by_the_key_it_references_by_is_counted_once_for_both(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dws.user_order_daily is unique by user_id and references dwd.order_detail by it: its two checks are judged
    from one DataFusion query (one read of its partition), each with its own verdict: a duplicated user fails the
    unique check alone, a user without orders the references check alone."""
    table = catalog["dws.user_order_daily"]
    [unique] = [c for c in table.checks if c.name == "unique"]
    [references] = [c for c in table.checks if c.name == "references"]
    for users, unique_passes, references_pass in [
        ((1, 2), True, True),
        ((1, 2, 2), False, True),
        ((1, 9), True, False),
    ]:
        store = _lake(tmp_path / "-".join(map(str, users)), _orders(GOOD), users=users)
        queries = plans.recorded(store, monkeypatch)
        facts = _facts(catalog, store, "dws.user_order_daily")
        verdicts = (judge(unique, facts), judge(references, facts))
        assert [v is not None for v in verdicts] == [unique_passes, references_pass], users
        assert len(queries) == 1, queries
    assert verdicts[0] is not None and verdicts[0].metadata["rows"] == 2


def test_the_checks_of_a_key_scoped_write_take_the_live_files_it_read(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key-scoped write counts its partitions' rows from their live files at its commit; its checks judge from
    those same files: the Delta log and the deletion vectors are not read a second time."""
    store = _lake(tmp_path, _orders(GOOD))
    table = catalog["dwd.order_detail"]
    files, _ = store.live_files(table.key, [{"dt": DAY}], 0)
    written = PartitionWritten(rows=4, files=len(files), bytes=0, live_files=tuple(files))
    build = _RangedBuild.__new__(_RangedBuild)
    build.catalog, build.table, build.store = catalog, table, store
    scope = KeyScope(("order_id",), pa.table({"order_id": [4]}), {"ods.order": ("id",)})
    verdict = Verdict(table, DAY, [])
    build.pending = [_Planned(DAY, verdict, None, {}, {"ods.order": HOURS}, {"ods.order": 0}, scope)]  # type: ignore[arg-type]

    def read_again(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the live files were read again")

    monkeypatch.setattr(store, "live_files", read_again)
    outcomes = build._check(0, [written])
    assert [o.check.name for o in outcomes] == [c.name for c in table.checks]
    assert all(o.passed and o.metadata[JUDGED_BY] for o in outcomes), outcomes
