"""The stamps of a maintained total's value states (:mod:`warehouse_assets.materialize.additive_values`): each value
table's partition carries a stamp row with the table's Delta version its pairs match, so that a crash between the
table's commit and a value table's leaves a stamp the next late rebuild finds older than the partition's last build
(and rebuilds it whole). No Spark: the value tables are written by delta-rs, and the stamps read as the runner reads
them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from resources.delta_lake import DeltaStore
from warehouse_assets.catalog import Dependency, DerivedTable
from warehouse_assets.catalog.additive import MULTIPLICITY, VALUE, additivity
from warehouse_assets.materialize.additive_values import VERSION, ValueStates

TYPES = {"user_id": "bigint", "amount": "decimal(12,2)", "city": "string", "dt": "string"}
SQL = "SELECT city, count(DISTINCT user_id) AS buyers, max(amount) AS top FROM dwd.orders GROUP BY city"
DAY = "2026-03-02"


def pairs(stamp: int, values: list[Any], dt: str = DAY) -> pa.Table:
    """A partition's pairs of one argument (group ``bj``), and its stamp row (group, value, multiplicity NULL)."""
    n = len(values)
    return pa.table(
        {
            "__g0": pa.array(["bj"] * n + [None], pa.string()),
            VALUE: pa.array([*values, None]),
            MULTIPLICITY: pa.array([1] * n + [None], pa.int64()),
            VERSION: pa.array([stamp] * (n + 1), pa.int64()),
            "dt": pa.array([dt] * (n + 1), pa.string()),
        }
    )


def test_value_states_match_the_last_build_only_when_every_arguments_stamp_is_its_version(tmp_path: Path) -> None:
    table = DerivedTable(
        layer="ads", name="t", period="daily", path=Path("ads/t.sql"), sql=SQL, deps=(Dependency("dwd.orders"),)
    )
    verdict = additivity(table, {"dwd.orders": TYPES})
    assert verdict.values == ("orders.user_id", "orders.amount")
    store = DeltaStore(str(tmp_path / "lake"))
    states = ValueStates(None, store, table)  # type: ignore[arg-type]  # the stamps are read without Spark
    assert states.stamped(verdict, DAY, 7) == "no value states of orders.user_id stored"

    write_deltalake(store.table_uri(states.key(0)), pairs(7, [10, 11]), partition_by=["dt"])
    write_deltalake(store.table_uri(states.key(1)), pairs(7, [1.5, 2.5]), partition_by=["dt"])
    assert states.key(1) == ["ads", "t__state_1"]
    assert states.stamped(verdict, DAY, 7) == ""

    # the table's commit (version 8) landed, and the pairs of user_id, but the process died before those of amount
    write_deltalake(store.table_uri(states.key(0)), pairs(8, [10]), partition_by=["dt"], mode="overwrite")
    assert states.stamped(verdict, DAY, 8) == (
        "the value states of orders.amount match version [7], not its last build's (8)"
    )
    # another partition's stamp says nothing of this one's
    write_deltalake(store.table_uri(states.key(1)), pairs(8, [3.5], "2026-03-03"), partition_by=["dt"], mode="append")
    assert (
        states.stamped(verdict, "2026-03-03", 8)
        == "the value states of orders.user_id match version none, not its last build's (8)"
    )
