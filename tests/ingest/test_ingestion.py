"""ODS ingestion on hand-written Canal segments: positions, gaps, restart safety, CDC semantics, quarantine."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.support import oracle
from tests.support.lake import row_dicts
from warehouse_assets.catalog import CHANGED_AT, SNAPSHOT, OdsTable, Table, load_catalog
from warehouse_assets.ingest.merge import (
    QUARANTINE_KEY,
    BatchReport,
    ReconciliationError,
    TableReport,
    committed_positions,
    ingest_batch,
    ingest_table,
    ingested_counts,
    pending_segments,
)
from warehouse_assets.ingest.preparation import Engine

TZ = ZoneInfo("Asia/Shanghai")
BASE = datetime(2026, 3, 2, 10, 0, tzinfo=TZ)
DB = "edu_trade"
MYSQL_TYPES = {
    "id": "bigint(20)",
    "user_id": "bigint(20)",
    "course_id": "bigint(20)",
    "amount": "decimal(10,2)",
    "status": "varchar(16)",
    "pay_time": "datetime",
    "create_time": "datetime",
    "update_time": "datetime",
}
SQL_TYPES = {"bigint(20)": -5, "decimal(10,2)": 3, "varchar(16)": 12, "datetime": 93}


def _es(minute: float) -> int:
    """Binlog time (epoch ms) ``minute`` minutes after 2026-03-02 10:00 local."""
    return int((BASE + timedelta(minutes=minute)).timestamp() * 1000)


def _local(minute: float) -> str:
    return (BASE + timedelta(minutes=minute)).strftime("%Y-%m-%d %H:%M:%S")


def order(key: int, status: str = "created", amount: str = "10.00", **override: str | None) -> dict[str, str | None]:
    """A full row image of an order created at 10:01 local (so it lands in partition 2026-03-02 / 10)."""
    row: dict[str, str | None] = {
        "id": str(key),
        "user_id": "7",
        "course_id": "3",
        "amount": amount,
        "status": status,
        "pay_time": None,
        "create_time": _local(1),
        "update_time": _local(1),
    }
    row.update(override)
    return row


def message(
    msg_id: int,
    kind: str,
    rows: Sequence[dict[str, str | None]],
    minute: float,
    table: str = "order_00",
    old: Sequence[dict[str, str | None]] | None = None,
    **extra: Any,
) -> str:
    """One Canal flat message as Canal writes it to Kafka (compact JSON, values as strings).

    ``old`` (UPDATE only): per row, the previous values of the changed columns; default a status change."""
    obj: dict[str, Any] = {
        "data": list(rows),
        "database": DB,
        "es": _es(minute),
        "id": msg_id,
        "isDdl": False,
        "mysqlType": MYSQL_TYPES,
        "old": (list(old) if old is not None else [{"status": "created"} for _ in rows]) if kind == "UPDATE" else None,
        "pkNames": ["id"],
        "sql": "",
        "sqlType": {k: SQL_TYPES[v] for k, v in MYSQL_TYPES.items()},
        "table": table,
        "ts": _es(minute) + 250,
        "type": kind,
    }
    obj.update(extra)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Ods:
    spark: SparkSession
    store: DeltaStore
    landing: Landing
    table: Table

    def write(self, shard: str, seq: int, lines: Sequence[str | bytes], *, final_newline: bool = True) -> Path:
        """Segment ``seq`` of ``edu_trade.<shard>``: the 5-minute window starting at 10:00 + 5 * (seq - 1)."""
        start = BASE + timedelta(minutes=5 * (seq - 1))
        path = self.landing.root / "binlog" / DB / shard / f"{seq:06d}-{start:%Y%m%dT%H%M}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines)
        path.write_bytes(data + (b"\n" if lines and final_newline else b""))
        return path

    def ingest(self) -> TableReport:
        return ingest_table(self.spark, self.store, self.landing, self.table)

    def positions(self, *shards: str) -> dict[str, int]:
        return committed_positions(self.store, self.table, [f"{DB}.{s}" for s in shards])

    def version(self) -> int:
        return int(DeltaTable(self.store.table_uri(self.table.key)).version())

    def all_rows(self) -> list[dict[str, Any]]:
        """Every row, tombstones included: a DELETE is kept as a row flagged ``_deleted`` that readers skip."""
        return row_dicts(self.store.table_uri(self.table.key))

    def rows(self) -> list[dict[str, Any]]:
        """Live rows."""
        return [r for r in self.all_rows() if not r["_deleted"]]

    def by_id(self) -> dict[int, dict[str, Any]]:
        """Live rows by key, after asserting that no key is live twice anywhere in the table."""
        rows = self.rows()
        oracle.assert_each_key_live_once(rows, self.table.primary_key, self.table.partition_by)
        return {r["id"]: r for r in rows}

    def places(self, key: int) -> list[tuple[str, str, bool]]:
        """(dt, hh, tombstone) of every row of ``key``, live or not, in partition order."""
        return sorted((r["dt"], r["hh"], r["_deleted"]) for r in self.all_rows() if r["id"] == key)

    def quarantine(self) -> list[dict[str, Any]]:
        if not self.store.exists(QUARANTINE_KEY):
            return []
        return row_dicts(self.store.table_uri(QUARANTINE_KEY))


@pytest.fixture
def ods(spark: SparkSession, created_order_lake: Path, tmp_path: Path) -> Ods:
    """A copy of the module's created ``ods.order`` (the Delta log's paths are relative) and an empty landing area."""
    shutil.copytree(created_order_lake, tmp_path / "lake")
    return Ods(spark, DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing"), load_catalog()["ods.order"])


@pytest.fixture
def fresh_ods(spark: SparkSession, tmp_path: Path) -> Ods:
    """An empty lake: the first batch creates the table."""
    return Ods(spark, DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing"), load_catalog()["ods.order"])


def _balanced(batch: BatchReport) -> None:
    accounted = (
        batch.rows_applied + batch.rows_quarantined + batch.rows_duplicate + batch.rows_superseded + batch.ddl_lines
    )
    assert batch.rows_in == accounted, batch


# --- positions ------------------------------------------------------------------------------------------------


def test_positions_are_the_last_segment_per_stream_and_a_rerun_applies_nothing(ods: Ods) -> None:
    ods.write("order_00", 1, [message(1, "INSERT", [order(1)], 1)])
    ods.write("order_00", 2, [])  # an idle window still advances the stream
    ods.write("order_00", 3, [message(2, "INSERT", [order(2)], 11)])
    ods.write("order_01", 1, [message(1, "INSERT", [order(11)], 2, table="order_01")])
    ods.write("order_01", 2, [])

    first = ods.ingest()
    assert len(first.batches) == 1 and first.batches[0].segments == 5
    assert ods.positions("order_00", "order_01") == {f"{DB}.order_00": 3, f"{DB}.order_01": 2}
    assert sorted(ods.by_id()) == [1, 2, 11]
    version = ods.version()

    again = ods.ingest()
    assert again.batches == []
    assert ods.version() == version

    ods.write("order_00", 4, [message(3, "INSERT", [order(3)], 16)])
    third = ods.ingest()
    assert len(third.batches) == 1
    assert third.batches[0].segments == 1 and third.batches[0].positions == {f"{DB}.order_00": 4}
    assert third.batches[0].rows_in == third.batches[0].rows_applied == 1
    assert ods.positions("order_00", "order_01") == {f"{DB}.order_00": 4, f"{DB}.order_01": 2}
    assert sorted(ods.by_id()) == [1, 2, 3, 11]
    assert ods.version() == version + 1


def test_a_gap_in_sequence_numbers_stops_the_stream_until_the_segment_arrives(ods: Ods) -> None:
    ods.write("order_00", 1, [message(1, "INSERT", [order(1)], 1)])
    ods.write("order_00", 2, [message(2, "INSERT", [order(2)], 6)])
    ods.write("order_00", 4, [message(4, "INSERT", [order(4)], 16)])

    ods.ingest()
    assert ods.positions("order_00") == {f"{DB}.order_00": 2}
    assert sorted(ods.by_id()) == [1, 2]

    ods.write("order_00", 3, [message(3, "INSERT", [order(3)], 11)])
    report = ods.ingest()
    assert [b.segments for b in report.batches] == [2]
    assert ods.positions("order_00") == {f"{DB}.order_00": 4}
    assert sorted(ods.by_id()) == [1, 2, 3, 4]


# --- restart safety -----------------------------------------------------------------------------------------


def test_a_crash_before_the_merge_commit_keeps_the_position_and_the_rerun_applies_once(
    ods: Ods, monkeypatch: pytest.MonkeyPatch
) -> None:
    ods.write("order_00", 1, [message(1, "INSERT", [order(1, amount="10.00"), order(2, amount="20.00")], 1)])
    ods.ingest()
    version = ods.version()

    ods.write(
        "order_00",
        2,
        [
            message(2, "UPDATE", [order(1, "paid", amount="10.00", pay_time=_local(6), update_time=_local(6))], 6),
            message(3, "INSERT", [order(3, amount="30.00")], 7),
            "{broken",
        ],
    )

    def crash(self: DeltaStore, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("killed between prepare and commit")

    monkeypatch.setattr(DeltaStore, "merge", crash)
    with pytest.raises(RuntimeError, match="killed"):
        ods.ingest()
    monkeypatch.undo()

    assert ods.positions("order_00") == {f"{DB}.order_00": 1}
    assert ods.version() == version
    assert {k: r["status"] for k, r in ods.by_id().items()} == {1: "created", 2: "created"}

    report = ods.ingest()
    assert len(report.batches) == 1 and report.batches[0].rows_applied == 2
    assert ods.positions("order_00") == {f"{DB}.order_00": 2}
    rows = ods.by_id()  # asserts one row per key
    assert {k: (r["status"], r["amount"]) for k, r in rows.items()} == {
        1: ("paid", Decimal("10.00")),
        2: ("created", Decimal("20.00")),
        3: ("created", Decimal("30.00")),
    }
    # the quarantine was written before the crash; the re-run does not write it again
    assert [(q["segment"], q["line"]) for q in ods.quarantine()] == [("000002-20260302T1005.jsonl", 3)]
    assert ods.ingest().batches == []


def test_a_longer_rerun_after_a_crash_applies_and_counts_each_change_once(
    ods: Ods, monkeypatch: pytest.MonkeyPatch
) -> None:
    insert_1 = message(1, "INSERT", [order(1)], 1)
    ods.write("order_00", 1, [insert_1, message(2, "INSERT", [order(2)], 2)])
    ods.ingest()
    # the crashed batch records its changes and counts before its merge
    ods.write("order_00", 2, [message(3, "INSERT", [order(3)], 6), message(4, "UPDATE", [order(1, "paid")], 7)])

    def crash(self: DeltaStore, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("killed between prepare and commit")

    monkeypatch.setattr(DeltaStore, "merge", crash)
    with pytest.raises(RuntimeError, match="killed"):
        ods.ingest()
    monkeypatch.undo()

    # the re-run also takes a segment that arrived since, with message 1 (committed before) delivered again
    ods.write("order_00", 3, [message(5, "INSERT", [order(4)], 11), insert_1])
    [batch] = ods.ingest().batches
    counted, _ = ingested_counts(ods.store, ods.table)
    assert counted.rows == {f"{DB}.order_00": {"2026-03-02T10": 5}}  # 2 + 3 distinct changes, each once
    assert counted.seq == {f"{DB}.order_00": 3}
    _balanced(batch)
    assert (batch.rows_in, batch.rows_applied, batch.rows_duplicate) == (4, 3, 1)
    assert {k: r["status"] for k, r in ods.by_id().items()} == {1: "paid", 2: "created", 3: "created", 4: "created"}


def test_a_killed_runs_merge_that_commits_during_its_retry_leaves_nothing_of_the_retry_unapplied(
    ods: Ods, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed while Spark (the Connect server) runs its merge: the merge goes on without it and can commit
    while the retry, started meanwhile, prepares a longer batch from the same committed position. The retry's
    merge must still apply its own batch: nothing it recorded may be left unapplied."""
    ods.write("order_00", 1, [message(1, "INSERT", [order(1)], 1), message(2, "INSERT", [order(2)], 2)])
    ods.ingest()
    ods.write("order_00", 2, [message(3, "UPDATE", [order(1, "paid")], 6)])

    real_merge = DeltaStore.merge
    orphaned: list[Any] = []

    def killed(self: DeltaStore, *args: Any, **kwargs: Any) -> Any:
        orphaned.append(lambda: real_merge(self, *args, **kwargs))  # still running where the worker sent it
        raise RuntimeError("worker killed while Spark runs its merge")

    monkeypatch.setattr(DeltaStore, "merge", killed)
    with pytest.raises(RuntimeError, match="worker killed"):
        ods.ingest()

    def retry(self: DeltaStore, *args: Any, **kwargs: Any) -> Any:
        orphaned.pop()()  # the killed run's merge commits first
        return real_merge(self, *args, **kwargs)

    monkeypatch.setattr(DeltaStore, "merge", retry)
    # the retry also takes a segment that arrived after the kill
    ods.write("order_00", 3, [message(4, "UPDATE", [order(2, "paid")], 11), message(5, "INSERT", [order(3)], 12)])
    [batch] = ods.ingest().batches
    monkeypatch.undo()

    assert not orphaned
    _balanced(batch)
    assert ods.positions("order_00") == {f"{DB}.order_00": 3}
    assert {k: r["status"] for k, r in ods.by_id().items()} == {1: "paid", 2: "paid", 3: "created"}
    counted, _ = ingested_counts(ods.store, ods.table)
    assert counted.rows == {f"{DB}.order_00": {"2026-03-02T10": 5}}
    assert ods.ingest().batches == []


# --- CDC semantics ------------------------------------------------------------------------------------------


def test_the_latest_change_per_key_wins_within_and_across_batches(ods: Ods) -> None:
    ods.write(
        "order_00",
        1,
        [
            message(1, "INSERT", [order(1), order(2)], 1),  # one statement, two rows
            message(2, "UPDATE", [order(1, "paid", pay_time=_local(2), update_time=_local(2))], 2),
        ],
    )
    first = ods.ingest().batches[0]
    assert (first.rows_in, first.rows_applied, first.rows_superseded) == (3, 2, 1)
    assert {k: r["status"] for k, r in ods.by_id().items()} == {1: "paid", 2: "created"}

    update_2 = message(4, "UPDATE", [order(2, "paid", update_time=_local(7))], 7)
    ods.write(
        "order_00",
        2,
        [
            message(3, "UPDATE", [order(1, "refunded", update_time=_local(6))], 6),
            update_2,
            message(5, "DELETE", [order(2, "paid", update_time=_local(7))], 8),  # update then delete: absent
            message(6, "INSERT", [order(5)], 8),  # insert, update, delete of a new key in one batch: absent
            message(7, "UPDATE", [order(5, "paid", update_time=_local(9))], 9),
            message(8, "DELETE", [order(5, "paid", update_time=_local(9))], 9.5),
            update_2,  # Canal re-sent message 4: a duplicate
            message(9, "DELETE", [order(99)], 9.8),  # a key never seen: nothing to delete, no failure
        ],
    )
    second = ods.ingest().batches[0]
    _balanced(second)
    assert second.rows_in == 8
    assert second.rows_duplicate == 1
    assert second.rows_superseded == 3  # update of 2, insert and update of 5
    assert second.rows_applied == 4  # 1 refunded, delete 2, delete 5, delete 99
    assert {k: r["status"] for k, r in ods.by_id().items()} == {1: "refunded"}

    # an older change of key 1 (binlog time 10:04 < 10:06) arriving in a later batch changes nothing
    # (key 6 makes the batch change something: see the no-op batch test below)
    ods.write(
        "order_00",
        3,
        [
            message(10, "UPDATE", [order(1, "cancelled", update_time=_local(4))], 4),
            message(11, "INSERT", [order(6)], 12),
        ],
    )
    third = ods.ingest().batches[0]
    assert (third.rows_in, third.rows_applied) == (2, 2)
    rows = ods.by_id()
    assert {k: r["status"] for k, r in rows.items()} == {1: "refunded", 6: "created"}
    assert rows[1]["_es"] == _es(6)
    assert (rows[1]["dt"], rows[1]["hh"]) == ("2026-03-02", "10")
    assert ods.positions("order_00") == {f"{DB}.order_00": 3}


def test_a_batch_whose_changes_are_all_no_ops_still_advances_the_position(ods: Ods) -> None:
    ods.write("order_00", 1, [message(1, "INSERT", [order(1, "paid", update_time=_local(6))], 6)])
    ods.ingest()
    ods.write(
        "order_00",
        2,
        [
            message(2, "UPDATE", [order(1, "cancelled", update_time=_local(4))], 4),  # older than the stored row
            message(3, "DELETE", [order(99)], 7),  # a key the table never held
        ],
    )
    # one batch by hand, so a regression cannot hang the suite
    segments = pending_segments(ods.store, ods.landing, ods.table)
    batch = ingest_batch(ods.spark, ods.store, ods.table, segments)
    assert batch.rows_applied == 2
    assert {k: r["status"] for k, r in ods.by_id().items()} == {1: "paid"}
    assert ods.positions("order_00") == {f"{DB}.order_00": 2}
    assert pending_segments(ods.store, ods.landing, ods.table) == []


def test_a_change_older_than_a_delete_does_not_resurrect_the_row(ods: Ods) -> None:
    insert_1 = message(1, "INSERT", [order(1)], 1)
    ods.write("order_00", 1, [insert_1])
    ods.ingest()
    ods.write("order_00", 2, [message(2, "DELETE", [order(1)], 6)])
    ods.ingest()
    assert ods.by_id() == {}
    ods.write("order_00", 3, [insert_1, message(3, "INSERT", [order(3)], 12)])  # message 1 delivered again
    ods.ingest()
    assert sorted(ods.by_id()) == [3]


# --- partition-time moves ------------------------------------------------------------------------------------

DAY = "2026-03-02"


def move(msg_id: int, key: int, frm: float, to: float, minute: float) -> str:
    """An UPDATE setting ``create_time`` of ``key`` from 10:00 + ``frm`` to 10:00 + ``to`` minutes, with
    ``old`` as Canal writes it: the previous values of the changed columns."""
    row = order(key, create_time=_local(to), update_time=_local(minute))
    return message(msg_id, "UPDATE", [row], minute, old=[{"create_time": _local(frm), "update_time": _local(frm)}])


def test_an_update_moving_the_partition_time_leaves_the_key_live_in_its_new_partition_only(ods: Ods) -> None:
    insert = message(1, "INSERT", [order(1), order(2)], 1)
    ods.write("order_00", 1, [insert])
    ods.ingest()

    ods.write("order_00", 2, [move(2, 1, frm=1, to=65, minute=6)])  # hour 10 → hour 11, a batch later
    batch = ods.ingest().batches[0]
    _balanced(batch)
    assert (batch.rows_in, batch.rows_applied) == (1, 1)
    rows = ods.by_id()
    assert {k: (r["dt"], r["hh"]) for k, r in rows.items()} == {1: (DAY, "11"), 2: (DAY, "10")}
    assert ods.places(1) == [(DAY, "10", True), (DAY, "11", False)]
    assert batch.merge is not None
    merge = batch.merge.metadata()
    assert (merge["source_rows"], merge["rows_moved_out"], merge["partitions_touched"]) == (2, 1, 2)
    assert (merge["rows_inserted"], merge["rows_updated"], merge["files_scanned"]) == (1, 1, 1)

    ods.write("order_00", 3, [insert])  # the older INSERT delivered again: hour 10's tombstone holds it off
    ods.ingest()
    assert sorted(ods.by_id()) == [1, 2]
    assert ods.places(1) == [(DAY, "10", True), (DAY, "11", False)]

    ods.write("order_00", 4, [message(4, "DELETE", [order(1, create_time=_local(65), update_time=_local(6))], 20)])
    ods.ingest()
    assert sorted(ods.by_id()) == [2]
    assert ods.places(1) == [(DAY, "10", True), (DAY, "11", True)]


def test_a_batch_marks_the_rows_it_replaces_in_deletion_vectors_and_copies_none(fresh_ods: Ods) -> None:
    ods = fresh_ods
    ods.write("order_00", 1, [message(1, "INSERT", [order(1), order(2), order(3), order(4)], 1)])
    ods.ingest()
    assert ods.store.has_deletion_vectors(ods.table.key)  # the ingestion created the table with them

    update = message(2, "UPDATE", [order(1, "paid", update_time=_local(6))], 6)
    delete = message(3, "DELETE", [order(2, update_time=_local(7))], 7)
    ods.write("order_00", 2, [update, delete, move(4, 3, frm=1, to=65, minute=8)])
    batch = ods.ingest().batches[0]
    assert batch.merge is not None
    merge = batch.merge.metadata()
    # three of hour 10's four rows replaced (the delete is a tombstone): marked in a deletion vector, and the
    # unchanged row 4 is not rewritten
    assert merge["rows_copied"] == 0 and merge["deletion_vectors_added"] == 1
    assert {k: (r["status"], r["hh"]) for k, r in ods.by_id().items()} == {
        1: ("paid", "10"),
        3: ("created", "11"),
        4: ("created", "10"),
    }

    def seen(rows: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((r["id"], r["status"], r["dt"], r["hh"], r["_deleted"]) for r in rows)

    # the independent replay of the log (data files minus the rows their deletion vectors mark) agrees
    replayed = oracle.delta_live_rows(Path(ods.store.table_uri(ods.table.key)))
    assert seen(replayed) == seen(ods.all_rows()) and len(replayed) == 5  # 1, 2's tombstone, 3 and its tombstone, 4


def test_several_moves_of_a_key_in_one_batch_leave_it_live_in_the_newest_partition_only(ods: Ods) -> None:
    ods.write("order_00", 1, [message(1, "INSERT", [order(1), order(2)], 1)])
    ods.ingest()
    insert_3 = message(4, "INSERT", [order(3)], 7)
    ods.write(
        "order_00",
        2,
        [
            move(2, 1, frm=1, to=65, minute=5),  # key 1: hour 10 → 11
            move(3, 1, frm=65, to=125, minute=6),  # key 1: hour 11 → 12
            insert_3,  # key 3: created in hour 10 ...
            move(5, 3, frm=1, to=65, minute=8),  # ... and moved to hour 11 in the same batch
            move(6, 2, frm=1, to=65, minute=9),  # key 2: hour 10 → 11 ...
            message(7, "DELETE", [order(2, create_time=_local(65), update_time=_local(9))], 10),  # ... then deleted
        ],
    )
    batch = ods.ingest().batches[0]
    _balanced(batch)
    assert (batch.rows_in, batch.rows_applied, batch.rows_superseded) == (6, 3, 3)
    rows = ods.by_id()
    assert {k: (r["dt"], r["hh"]) for k, r in rows.items()} == {1: (DAY, "12"), 3: (DAY, "11")}
    assert ods.places(1) == [(DAY, "10", True), (DAY, "11", True), (DAY, "12", False)]
    assert ods.places(2) == [(DAY, "10", True), (DAY, "11", True)]
    assert ods.places(3) == [(DAY, "10", True), (DAY, "11", False)]
    assert batch.merge is not None
    merge = batch.merge.metadata()
    # moved out: key 1 of hours 10 and 11, key 2 and key 3 of hour 10; the merge reads hours 10, 11, 12 only
    assert (merge["rows_moved_out"], merge["source_rows"], merge["partitions_touched"]) == (4, 7, 3)

    ods.write("order_00", 3, [insert_3])  # key 3's superseded INSERT delivered again: not back in hour 10
    ods.ingest()
    assert sorted(ods.by_id()) == [1, 3]
    assert ods.places(3) == [(DAY, "10", True), (DAY, "11", False)]


def unplaced_move(msg_id: int, key: int, to: float, minute: float, old: list[dict[str, str | None]] | None) -> str:
    """An UPDATE setting ``create_time`` of ``key`` to 10:00 + ``to`` minutes whose ``old`` does not carry the
    previous ``create_time``: ``None`` (or no image for the row) as a producer without before images writes, or only
    other columns (Canal's: then the partition time did not change)."""
    line = json.loads(
        message(msg_id, "UPDATE", [order(key, create_time=_local(to), update_time=_local(minute))], minute)
    )
    line["old"] = old
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("old", [None, [None]], ids=["old-null", "row-old-null"])
def test_an_update_moving_the_partition_time_without_its_old_value_finds_the_key_where_it_was(
    ods: Ods, old: list[dict[str, str | None]] | None
) -> None:
    ods.write("order_00", 1, [message(1, "INSERT", [order(1), order(2)], 1)])
    ods.write("order_00", 2, [message(2, "INSERT", [order(3, create_time=_local(125))], 6)])  # hour 12
    ods.ingest()

    # key 1: hour 10 → hour 11, a batch later, and nothing in the batch says it was in hour 10
    ods.write("order_00", 3, [unplaced_move(3, 1, to=65, minute=11, old=old)])
    batch = ods.ingest().batches[0]
    _balanced(batch)
    assert (batch.rows_in, batch.rows_applied, batch.rows_quarantined) == (1, 1, 0)
    rows = ods.by_id()  # no key live twice anywhere
    assert {k: (r["dt"], r["hh"]) for k, r in rows.items()} == {1: (DAY, "11"), 2: (DAY, "10"), 3: (DAY, "12")}
    assert ods.places(1) == [(DAY, "10", True), (DAY, "11", False)]
    assert batch.merge is not None
    merge = batch.merge.metadata()
    assert (merge["source_rows"], merge["rows_moved_out"], merge["partitions_touched"]) == (2, 1, 2)

    # key 3: hour 12 → hour 10, where key 2 lives; and key 1 moves on to hour 12 within the same batch
    ods.write(
        "order_00",
        4,
        [unplaced_move(4, 3, to=2, minute=16, old=old), unplaced_move(5, 1, to=126, minute=17, old=old)],
    )
    ods.ingest()
    assert {k: (r["dt"], r["hh"]) for k, r in ods.by_id().items()} == {1: (DAY, "12"), 2: (DAY, "10"), 3: (DAY, "10")}
    assert ods.places(1) == [(DAY, "10", True), (DAY, "11", True), (DAY, "12", False)]
    assert ods.places(3) == [(DAY, "10", False), (DAY, "12", True)]


def test_an_update_without_its_old_partition_time_that_stays_put_retires_nothing(ods: Ods) -> None:
    ods.write("order_00", 1, [message(1, "INSERT", [order(1)], 1)])
    ods.ingest()
    ods.write("order_00", 2, [unplaced_move(2, 1, to=1, minute=6, old=[{"update_time": _local(1)}])])
    ods.write("order_00", 3, [unplaced_move(3, 2, to=65, minute=11, old=None)])  # a key never seen: nowhere yet
    batch = ods.ingest().batches[0]
    _balanced(batch)
    assert {k: (r["dt"], r["hh"]) for k, r in ods.by_id().items()} == {1: (DAY, "10"), 2: (DAY, "11")}
    assert ods.places(1) == [(DAY, "10", False)]
    assert batch.merge is not None
    assert batch.merge.metadata()["rows_moved_out"] == 0


def test_an_update_whose_old_partition_time_is_unreadable_is_quarantined(ods: Ods) -> None:
    bad = order(1, create_time=_local(65), update_time=_local(6))
    ods.write(
        "order_00",
        1,
        [
            message(1, "INSERT", [order(1)], 1),
            message(2, "UPDATE", [bad], 6, old=[{"create_time": "yesterday", "update_time": _local(1)}]),
        ],
    )
    batch = ods.ingest().batches[0]
    _balanced(batch)
    assert (batch.rows_applied, batch.rows_quarantined) == (1, 1)
    assert {k: (r["dt"], r["hh"]) for k, r in ods.by_id().items()} == {1: (DAY, "10")}
    assert [q["reason"] for q in ods.quarantine()] == ["bad old value for create_time: yesterday"]


# --- quarantine ---------------------------------------------------------------------------------------------


def test_bad_records_go_to_quarantine_with_their_position_and_the_batch_reconciles(ods: Ods) -> None:
    good = message(1, "INSERT", [order(1)], 1)
    truncated = message(9, "INSERT", [order(9)], 9)
    lines: list[str | bytes] = [
        good,  # 1
        '{"data":[{"id":"2"',  # 2 malformed JSON
        b'{"data":[{"id":"3","status":"\xff\xfe"}]}',  # 3 invalid UTF-8
        message(4, "INSERT", [order(4, id=None)], 4),  # 4 a row without its primary key
        message(5, "INSERT", [order(5)], 5, table="order_01"),  # 5 another shard's message in this stream
        message(6, "INSERT", [order(6, create_time="2026-02-30 25:61:00")], 6),  # 6 impossible datetime
        message(
            7, "ALTER", [], 7, isDdl=True, data=None, sql="ALTER TABLE order_00 ADD COLUMN coupon varchar(16)"
        ),  # 7 DDL
        message(8, "INSERT", [order(8), order(80, id=None)], 8),  # 8 second row of the statement is bad
        good,  # 9 re-sent message 1
        truncated[: len(truncated) // 2],  # 10 the writer died mid-line: no newline at the end
    ]
    segment = ods.write("order_00", 1, lines, final_newline=False)

    batch = ods.ingest().batches[0]
    _balanced(batch)
    assert batch.rows_in == 11
    assert (batch.rows_applied, batch.rows_quarantined, batch.rows_duplicate, batch.ddl_lines) == (2, 7, 1, 1)
    assert batch.rows_superseded == 0
    assert sorted(ods.by_id()) == [1, 8]
    assert ods.positions("order_00") == {f"{DB}.order_00": 1}

    found = {(q["line"], q["row_index"]): q for q in ods.quarantine()}
    assert sorted(found) == [(2, -1), (3, -1), (4, 0), (5, -1), (6, 0), (8, 1), (10, -1)]
    assert {q["segment"] for q in found.values()} == {segment.name}
    assert {q["stream"] for q in found.values()} == {f"{DB}.order_00"}
    assert {q["table"] for q in found.values()} == {"ods.order"}
    assert found[(2, -1)]["reason"] == "malformed JSON"
    assert found[(3, -1)]["reason"] == "invalid UTF-8"
    assert "missing primary key id" in found[(4, 0)]["reason"]
    assert "unexpected table edu_trade.order_01" in found[(5, -1)]["reason"]
    assert "bad value for create_time: 2026-02-30 25:61:00" in found[(6, 0)]["reason"]
    assert "missing primary key id" in found[(8, 1)]["reason"]
    assert found[(10, -1)]["reason"] == "malformed JSON"
    assert found[(2, -1)]["raw"] == '{"data":[{"id":"2"'
    assert found[(10, -1)]["raw"] == truncated[: len(truncated) // 2]
    assert found[(3, -1)]["raw"] and found[(3, -1)]["raw"].startswith('{"data"')


# --- reconciliation -----------------------------------------------------------------------------------------


def test_batch_report_check_raises_when_counts_do_not_add_up() -> None:
    balanced = BatchReport(
        "ods.order",
        segments=1,
        rows_in=10,
        rows_applied=4,
        rows_quarantined=2,
        rows_duplicate=1,
        rows_superseded=2,
        ddl_lines=1,
    )
    balanced.check()
    lost = BatchReport("ods.order", segments=1, rows_in=10, rows_applied=4, rows_quarantined=2, rows_superseded=2)
    with pytest.raises(ReconciliationError, match="10 records in but 8 accounted for"):
        lost.check()
    invented = BatchReport("ods.order", segments=1, rows_in=1, rows_applied=2)
    with pytest.raises(ReconciliationError):
        invented.check()


# --- snapshot tables: a change stream kept whole ------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["in-process", "spark"])
def test_a_snapshot_table_keeps_every_change_in_the_hour_of_its_binlog_time_each_once(
    fresh_ods: Ods, engine: Engine
) -> None:
    ods = fresh_ods  # the change stream's table, with its column of change times, created by its first batch
    mirror = ods.table
    assert isinstance(mirror, OdsTable)
    changes = replace(
        mirror, kind=SNAPSHOT, partition_time=CHANGED_AT, columns=(*mirror.columns, (CHANGED_AT, "timestamp"))
    )
    ods = replace(ods, table=changes)
    first = [
        message(1, "INSERT", [order(1), order(2)], 1),
        # no old image: in a mirror this costs a lookup by key; a change stream has nothing to look up
        unplaced_move(2, 1, to=1, minute=3, old=None).replace('"created"', '"paid"'),
    ]
    ods.write("order_00", 1, first)
    ods.write(
        "order_00", 2, [message(3, "UPDATE", [order(2, status="paid")], 65)]
    )  # created at 10:01, changed at 11:05
    ods.write("order_00", 3, [message(4, "DELETE", [order(1, status="paid")], 70)])
    ods.write("order_00", 4, first)  # the first segment delivered again
    report = ingest_table(ods.spark, ods.store, ods.landing, changes, engine=engine)
    for batch in report.batches:
        _balanced(batch)
        assert batch.merge is None or batch.merge.metadata()["rows_moved_out"] == 0
    assert sum(b.rows_applied for b in report.batches) == 5
    assert sum(b.rows_duplicate for b in report.batches) == 3
    rows = sorted(ods.all_rows(), key=lambda r: (r["_es"], r["id"]))
    assert [(r["id"], r["status"], r["dt"], r["hh"], r["_deleted"]) for r in rows] == [
        (1, "created", DAY, "10", False),
        (2, "created", DAY, "10", False),
        (1, "paid", DAY, "10", False),
        (2, "paid", DAY, "11", False),  # its create_time says 10:01: the change's own hour counts
        (1, "paid", DAY, "11", True),  # a DELETE is a change too, flagged
    ]
    assert [int(r[CHANGED_AT].timestamp() * 1000) for r in rows] == [_es(1), _es(1), _es(3), _es(65), _es(70)]
