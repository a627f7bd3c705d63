"""The soak's checkers (``bench/soak.py``) on a small lake written by hand: the lake the oracle expects counts nothing,
and a lost row, a duplicated row, a missing partition and a mismatched partition planted in it each make the count
that names it non-zero. A soak that reports ``lost=0 duplicated=0 missing=0 mismatched_partitions=0`` is worth only
what these checkers can see. No Spark: the tables are written with delta-rs, the instances are in memory."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance
from deltalake import write_deltalake

from bench import soak
from tests.support import oracle
from warehouse_assets.catalog import load_catalog

TZ = ZoneInfo("Asia/Shanghai")
DAYS = [date(2026, 1, 1), date(2026, 1, 2)]
KEYS = [f"{d:%Y-%m-%d}" for d in DAYS]
# the oracle's replay as the checkers read it: business-local strings; three orders over two days, two paid
ORDERS: dict[int, dict[str, Any]] = {
    1: {"id": 1, "user_id": 7, "status": "paid", "amount": "10.00", "create_time": "2026-01-01 09:15:00"},
    2: {"id": 2, "user_id": 8, "status": "created", "amount": "5.00", "create_time": "2026-01-01 20:40:00"},
    3: {"id": 3, "user_id": 7, "status": "paid", "amount": "2.50", "create_time": "2026-01-02 11:05:00"},
}
for _order in ORDERS.values():
    _order["update_time"] = _order["create_time"]  # no change after creation
TRUTH: oracle.Tables = {"order": ORDERS, "user": {}, "course": {}, "lesson": {}, "attendance": {}}


def _local(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=TZ)


def _ods_order(lake: Path, rows: list[dict[str, Any]]) -> None:
    """``ods.order`` as the merge writes it: partitioned by the local hour of ``create_time``, deletes kept."""
    schema = pa.schema(
        [("id", pa.int64()), ("update_time", pa.timestamp("us", tz="UTC")), ("_deleted", pa.bool_()),
         ("dt", pa.string()), ("hh", pa.string())]
    )  # fmt: skip
    table = pa.Table.from_pylist(
        [
            {
                "id": r["id"],
                "update_time": _local(r["update_time"]),
                "_deleted": False,
                "dt": r["create_time"][:10],
                "hh": r["create_time"][11:13],
            }
            for r in rows
        ],
        schema=schema,
    )
    write_deltalake(str(lake / "ods" / "order"), table, partition_by=["dt", "hh"], mode="overwrite")


def _order_detail(lake: Path, rows: list[tuple[int, str]]) -> None:
    table = pa.table({"order_id": [r[0] for r in rows], "dt": [r[1] for r in rows]})
    write_deltalake(str(lake / "dwd" / "order_detail"), table, partition_by=["dt"], mode="overwrite")


def _daily_gmv(lake: Path, gmv: dict[str, Decimal]) -> None:
    table = pa.table(
        {"dt": list(gmv), "gmv": pa.array(list(gmv.values()), pa.decimal128(18, 2))},
    )
    write_deltalake(str(lake / "ads" / "daily_gmv"), table, partition_by=["dt"], mode="overwrite")


def _expected_gmv() -> dict[str, Decimal]:
    by_day = oracle.daily_gmv(ORDERS, "Asia/Shanghai")
    return {key: by_day.get(day, Decimal("0.00")) for key, day in zip(KEYS, DAYS, strict=True)}


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as instance:
        yield instance


def _materialized(instance: DagsterInstance, fqn: str, keys: list[str]) -> None:
    for key in keys:
        instance.report_runless_asset_event(AssetMaterialization(AssetKey(fqn.split(".")), partition=key))


def _every_checked_partition(instance: DagsterInstance) -> None:
    """Every partition ``check_derived`` requires for the two days, materialized."""
    for fqn in ("dwd.order_detail", "ads.daily_gmv", "ads.attendance_rate_daily"):
        _materialized(instance, fqn, KEYS)
    _materialized(instance, "ads.gmv_hourly", [f"{k}-{h:02d}:00" for k in KEYS for h in range(24)])


def _ods_findings(lake: Path) -> soak.Findings:
    found = soak.Findings()
    only_order = SimpleNamespace(ods=lambda: [load_catalog()["ods.order"]])
    soak.check_ods(lake, TRUTH, only_order, found)
    return found


def test_an_ods_table_equal_to_the_replay_counts_nothing(tmp_path: Path) -> None:
    _ods_order(tmp_path, list(ORDERS.values()))
    found = _ods_findings(tmp_path)
    assert (found.lost, found.duplicated, found.mismatched) == (0, 0, []), found.notes


def test_a_lost_ods_row_is_counted_lost(tmp_path: Path) -> None:
    _ods_order(tmp_path, [ORDERS[1], ORDERS[3]])
    found = _ods_findings(tmp_path)
    assert found.lost == 1, found.notes
    assert found.mismatched == ["ods.order 2026-01-01-20"]  # the partition that lost it


def test_a_key_live_in_two_partitions_is_counted_duplicated(tmp_path: Path) -> None:
    moved = dict(ORDERS[2], create_time="2026-01-02 08:00:00")  # the same key again, live in another hour
    _ods_order(tmp_path, [*ORDERS.values(), moved])
    found = _ods_findings(tmp_path)
    assert found.duplicated == 1, found.notes
    assert found.lost == 0


def _derived_findings(lake: Path, instance: DagsterInstance) -> soak.Findings:
    found = soak.Findings()
    soak.check_derived(lake, TRUTH, DAYS, instance, found)
    return found


def _oracle_lake(lake: Path) -> None:
    _order_detail(lake, [(k, r["create_time"][:10]) for k, r in ORDERS.items()])
    _daily_gmv(lake, _expected_gmv())


def test_derived_tables_equal_to_the_oracle_count_nothing(tmp_path: Path, instance: DagsterInstance) -> None:
    _oracle_lake(tmp_path)
    _every_checked_partition(instance)
    found = _derived_findings(tmp_path, instance)
    assert (found.missing, found.mismatched) == (0, []), found.notes


def test_a_partition_never_materialized_is_counted_missing(tmp_path: Path, instance: DagsterInstance) -> None:
    _oracle_lake(tmp_path)
    for fqn in ("dwd.order_detail", "ads.attendance_rate_daily"):
        _materialized(instance, fqn, KEYS)
    _materialized(instance, "ads.daily_gmv", KEYS[:1])  # its second day never built
    _materialized(instance, "ads.gmv_hourly", [f"{k}-{h:02d}:00" for k in KEYS for h in range(24)])
    found = _derived_findings(tmp_path, instance)
    assert found.missing == 1, found.notes
    assert found.notes == ["ads.daily_gmv: 1 partitions never materialized, e.g. ['2026-01-02']"]


def test_a_derived_partition_unlike_the_oracle_is_counted_mismatched(tmp_path: Path, instance: DagsterInstance) -> None:
    _order_detail(tmp_path, [(1, "2026-01-01"), (2, "2026-01-01"), (3, "2026-01-02")])
    _daily_gmv(tmp_path, {**_expected_gmv(), "2026-01-02": Decimal("99.00")})
    _every_checked_partition(instance)
    found = _derived_findings(tmp_path, instance)
    assert found.mismatched == ["ads.daily_gmv 2026-01-02"], found.notes

    _order_detail(tmp_path, [(1, "2026-01-01"), (3, "2026-01-02")])  # order 2 lost from its day
    _daily_gmv(tmp_path, _expected_gmv())
    found = _derived_findings(tmp_path, instance)
    assert found.mismatched == ["dwd.order_detail 2026-01-01"], found.notes


def _reference_findings(lake: Path, have: list[str], ref_lake: Path, built: list[str]) -> tuple[soak.Findings, int]:
    """``check_against_reference`` on ``ads.daily_gmv``: the soak materialized ``have``, the rebuild ``built``."""
    only_gmv = SimpleNamespace(statics=lambda: [], derived=lambda: [load_catalog()["ads.daily_gmv"]])
    found = soak.Findings()
    with DagsterInstance.ephemeral() as ours, DagsterInstance.ephemeral() as theirs:
        _materialized(ours, "ads.daily_gmv", have)
        _materialized(theirs, "ads.daily_gmv", built)
        compared = soak.check_against_reference(lake, ours, ref_lake, theirs, only_gmv, DAYS[0], len(DAYS), found)
    return found, compared


def test_the_rebuild_from_scratch_counts_missing_and_mismatched_partitions(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "soak", tmp_path / "reference"
    _daily_gmv(theirs, _expected_gmv())
    _daily_gmv(ours, _expected_gmv())
    found, compared = _reference_findings(ours, KEYS, theirs, KEYS)
    assert (found.missing, found.mismatched, compared) == (0, [], 2), found.notes

    found, compared = _reference_findings(ours, KEYS[:1], theirs, KEYS)  # the soak never built the 2nd
    assert (found.missing, found.mismatched, compared) == (1, [], 1), found.notes

    _daily_gmv(ours, {**_expected_gmv(), "2026-01-01": Decimal("0.01")})
    found, compared = _reference_findings(ours, KEYS, theirs, KEYS)
    assert found.missing == 0
    assert found.mismatched == ["ads.daily_gmv 2026-01-01: 1 rows, 1 from scratch"], found.notes

    found, _ = _reference_findings(ours, KEYS, theirs, KEYS[:1])  # built by the soak only: not buildable
    assert found.mismatched[0] == "ads.daily_gmv 2026-01-02 (built by the soak, not buildable from scratch)"
