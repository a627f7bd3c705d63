"""The ledger's late-data records and request keys kept between reads: never a stale answer after anyone else's write
to the ledger's file (a second engine's ledger, a bare SQL writer, another process), nor after its own transaction
was undone; and no record read again after the ledger's own writes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from warehouse_assets.center.ledger import Ledger, Rebuild, Stale

DAY = "2026-03-01"


def stale(partition: str = DAY, due: float | None = 100.0) -> Stale:
    return Stale("dws.a", partition, 10.0, due, 1, "[]", "every 15m", "")


def ledger_reads(ledger: Ledger) -> list[str]:
    """The statements reading stale, rebuild or request records that the ledger's connection runs from now on."""
    reads: list[str] = []
    tables = ("FROM center_stale", "FROM center_rebuilds", "FROM center_requests")
    ledger._db.set_trace_callback(
        lambda sql: reads.append(sql) if sql.startswith("SELECT") and any(t in sql for t in tables) else None
    )
    return reads


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "center.db"


def test_a_record_another_ledger_wrote_is_read_again_not_served_from_memory(path: Path) -> None:
    """The engine's ledger read the partition as not stale and its rebuild as never requested; a second ledger on the
    file (a restarted or second engine) records both: only the file's generation tells the first its answers aged."""
    engine, other = Ledger(path), Ledger(path)
    assert engine.stale("dws.a", [DAY]) == {}
    assert engine.rebuilds("dws.a", [DAY]) == {}
    with other.batch():
        other.mark_stale([stale()])
        other.record_rebuilds([("dws.a", DAY, Rebuild(5.0, 2, 50.0))])
    assert engine.stale("dws.a", [DAY]) == {DAY: stale()}
    assert engine.rebuilds("dws.a", [DAY]) == {DAY: Rebuild(5.0, 2, 50.0)}
    other.clear_stale([("dws.a", DAY)])  # outside a batch: its own transaction
    assert engine.stale("dws.a", [DAY]) == {}
    engine.close()
    other.close()


def test_a_record_changed_by_another_process_is_read_again(path: Path) -> None:
    ledger = Ledger(path)
    with ledger.batch():
        ledger.mark_stale([stale()])
        ledger.record_requests([("dws.a", DAY, "key 1")], 50.0)
    assert ledger.stale("dws.a", [DAY, "2026-03-02"])[DAY].due == 100.0
    assert ledger.requested("dws.a", DAY, "key 1")
    writer = (
        "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
        "db.execute(\"UPDATE center_stale SET due = 7 WHERE partition = '2026-03-01'\"); "
        "db.execute(\"INSERT INTO center_stale VALUES ('dws.a', '2026-03-02', 1, 2, 1, '[]', 'every 15m', '')\"); "
        'db.execute("DELETE FROM center_requests"); '
        "db.commit()"
    )
    subprocess.run([sys.executable, "-c", writer, str(path)], check=True)
    found = ledger.stale("dws.a", [DAY, "2026-03-02"])
    assert found[DAY].due == 7
    assert found["2026-03-02"].due == 2  # a partition read before as not stale
    assert not ledger.requested("dws.a", DAY, "key 1")
    ledger.close()


def test_a_record_deleted_on_the_same_connection_outside_the_ledger_is_read_again(path: Path) -> None:
    ledger = Ledger(path)
    ledger.mark_stale([stale()])
    assert ledger.stale("dws.a", [DAY])
    ledger._db.execute("DELETE FROM center_stale")  # what a hand repair or an older version would do
    assert ledger.stale("dws.a", [DAY]) == {}
    ledger.close()


def test_the_records_of_an_undone_transaction_are_not_kept(path: Path) -> None:
    ledger = Ledger(path)
    assert ledger.stale("dws.a", [DAY]) == {}
    with pytest.raises(RuntimeError), ledger.batch():
        ledger.mark_stale([stale()])
        ledger.record_rebuilds([("dws.a", DAY, Rebuild(5.0, 2, 50.0))])
        ledger.record_requests([("dws.a", DAY, "key 1")], 50.0)
        raise RuntimeError("the call failed")
    assert ledger.stale("dws.a", [DAY]) == {}
    assert ledger.rebuilds("dws.a", [DAY]) == {}
    assert not ledger.requested("dws.a", DAY, "key 1")
    ledger.close()


def test_records_read_or_written_by_the_ledger_itself_are_not_read_again(path: Path) -> None:
    """What makes the resolver's calls cheap: the late-data records it asks about each call, mostly absent, and the
    request key of a partition with nothing new upstream, come from memory while no one else writes the file."""
    ledger = Ledger(path)
    with ledger.batch():
        ledger.mark_stale([stale()])
        ledger.record_rebuilds([("dws.a", DAY, Rebuild(5.0, 2, 50.0))])
        ledger.record_requests([("dws.a", DAY, "key 1")], 50.0)
    reads = ledger_reads(ledger)
    assert ledger.stale("dws.a", [DAY]) == {DAY: stale()}  # written: kept
    assert ledger.rebuilds("dws.a", [DAY]) == {DAY: Rebuild(5.0, 2, 50.0)}
    assert ledger.requested("dws.a", DAY, "key 1")
    assert reads == []
    assert ledger.stale("dws.a", ["2026-03-02"]) == {}  # read once, as absent
    assert ledger.stale("dws.a", [DAY, "2026-03-02"]) == {DAY: stale()}
    assert len(reads) == 1
    ledger.close()


def test_a_parked_record_is_read_again_and_old_rebuilds_are_forgotten(path: Path) -> None:
    """The writes whose outcome depends on the row (a due time passed, a rebuild planned before a time) are the
    file's to say."""
    ledger = Ledger(path)
    with ledger.batch():
        ledger.mark_stale([stale(due=100.0), stale("2026-03-02", due=300.0)])
        ledger.record_rebuilds([("dws.a", DAY, Rebuild(5.0, 2, 50.0)), ("dws.a", "2026-03-02", Rebuild(5.0, 1, 90.0))])
        ledger.record_requests([("dws.a", DAY, "key 1")], 50.0)
    with ledger.batch():
        ledger.park_stale([("dws.a", DAY), ("dws.a", "2026-03-02")], 200.0)
        ledger.forget_requests_before(60.0)
    found = ledger.stale("dws.a", [DAY, "2026-03-02"])
    assert (found[DAY].due, found[DAY].note) == (None, "waiting for its inputs")
    assert found["2026-03-02"].due == 300.0
    assert ledger.rebuilds("dws.a", [DAY, "2026-03-02"]) == {"2026-03-02": Rebuild(5.0, 1, 90.0)}
    assert not ledger.requested("dws.a", DAY, "key 1")
    ledger.close()


def test_a_reader_keeps_nothing_and_sees_every_commit(path: Path) -> None:
    engine = Ledger(path)
    reader = Ledger(path, readonly=True)
    assert reader.stale("dws.a", [DAY]) == {}
    engine.mark_stale([stale()])
    assert reader.stale("dws.a", [DAY]) == {DAY: stale()}
    reader.close()
    engine.close()
    assert sqlite3.connect(path).execute("SELECT n FROM center_generation").fetchone()[0] > 0


def test_a_resolver_calls_reads_check_the_file_once_and_the_next_call_sees_another_writers_commit(path: Path) -> None:
    """A call's reads are its view of the ledger (as its snapshot reads each row once): the file's generation is
    read as they begin, not before each read, and a commit by anyone else before the next call is seen by it."""
    engine, other = Ledger(path), Ledger(path)
    checks: list[str] = []
    engine._db.set_trace_callback(lambda sql: checks.append(sql) if "center_generation" in sql else None)
    with engine.reading():
        assert engine.stale("dws.a", [DAY]) == {}
        assert engine.rebuilds("dws.a", [DAY]) == {}
        assert not engine.requested("dws.a", DAY, "key 1")
        assert engine.stale("dws.a", [DAY]) == {}
    assert len(checks) == 1
    other.mark_stale([stale()])
    with engine.reading():
        assert engine.stale("dws.a", [DAY]) == {DAY: stale()}
    engine.close()
    other.close()
