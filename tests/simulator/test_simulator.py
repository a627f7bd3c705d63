"""Tests of the simulated MySQL source (simulator/cdc.py), checked through the independent oracle."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from simulator.cdc import (
    LOGICAL_TABLES,
    SimulationConfig,
    SimulationSummary,
    append,
    main,
    read_simulation,
    simulate,
)
from tests.support.oracle import (
    daily_gmv,
    logical_name,
    parse_line,
    replay_detailed,
    replay_until,
    row_counts,
    segment_files,
    source_counts,
)

TZ = ZoneInfo("Asia/Shanghai")
DAY = datetime(2024, 3, 1)
BATCH_MINUTES = 15
CANAL_FIELDS = {
    "id",
    "database",
    "table",
    "pkNames",
    "isDdl",
    "type",
    "es",
    "ts",
    "sql",
    "mysqlType",
    "sqlType",
    "data",
    "old",
}
JDBC = {"bigint": -5, "varchar": 12, "decimal": 3, "datetime": 93, "tinyint": -6, "int": 4}


def ms(local: datetime | str) -> int:
    """Epoch ms of a business-local datetime (or 'YYYY-MM-DD HH:MM:SS' string)."""
    if isinstance(local, str):
        local = datetime.strptime(local, "%Y-%m-%d %H:%M:%S")
    return int(local.replace(tzinfo=TZ).timestamp()) * 1000


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


Located = tuple[str, str, Path, dict[str, Any]]


def messages(landing: Path, data_only: bool = True) -> list[Located]:
    """Every parseable line as (db, table, segment, message), in file order."""
    out = []
    for db, table, path in segment_files(landing):
        if data_only and table == "heartbeat":
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            message = parse_line(line)
            if message is not None:
                out.append((db, table, path, message))
    return out


@pytest.fixture(scope="module")
def day_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SimulationSummary]:
    """One business day at scale 0.05 with the default configuration but 15-minute batches (fewer files)."""
    landing = tmp_path_factory.mktemp("day") / "landing"
    config = SimulationConfig(scale=0.05, batch_minutes=BATCH_MINUTES)
    summary = simulate(landing, DAY, DAY + timedelta(days=1), config)
    return landing, summary


@pytest.fixture(scope="module")
def day_messages(day_run: tuple[Path, SimulationSummary]) -> list[Located]:
    """The parseable data messages of ``day_run`` (heartbeats left out)."""
    return messages(day_run[0])


def test_same_arguments_give_identical_bytes(tmp_path: Path) -> None:
    config = SimulationConfig(scale=0.02, batch_minutes=15)
    for name in ("a", "b"):
        simulate(tmp_path / name, DAY, DAY + timedelta(hours=6), config)
    first, second = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert first == second
    assert len(first) > 26 * 24


def test_append_equals_one_shot_generation(tmp_path: Path) -> None:
    config = SimulationConfig(scale=0.03, batch_minutes=30, dup_rate=0.02, lag={"order_03": timedelta(minutes=70)})
    end = DAY + timedelta(hours=30)
    simulate(tmp_path / "once", DAY, end, config)

    simulate(tmp_path / "parts", DAY, DAY + timedelta(hours=7), config)
    append(tmp_path / "parts", DAY + timedelta(hours=25, minutes=30))
    summary = append(tmp_path / "parts", end + timedelta(minutes=17))  # floored to the window
    assert summary.end == end.replace(tzinfo=TZ)
    assert append(tmp_path / "parts", end).messages == 0  # already there: no-op

    assert tree(tmp_path / "once") == tree(tmp_path / "parts")


def test_segments_are_ordered_and_contiguous(day_run: tuple[Path, SimulationSummary]) -> None:
    landing, _ = day_run
    by_stream: dict[str, list[Path]] = {}
    for db, table, path in segment_files(landing):
        by_stream.setdefault(f"{db}.{table}", []).append(path)
    assert len(by_stream) == 4 + 2 + 8 + 8 + 4
    for stream, paths in by_stream.items():
        assert len(paths) == 24 * 60 // BATCH_MINUTES, stream
        last_id, last_es = 0, 0
        for seq, path in enumerate(paths, start=1):
            window = DAY + timedelta(minutes=BATCH_MINUTES * (seq - 1))
            assert path.name == f"{seq:06d}-{window:%Y%m%dT%H%M}.jsonl"
            for line in path.read_text(encoding="utf-8").splitlines():
                message = json.loads(line)
                assert ms(window) <= message["es"] < ms(window + timedelta(minutes=BATCH_MINUTES))
                if message["id"] <= last_id:  # a duplicate re-emitted later
                    continue
                assert message["id"] == last_id + 1
                assert message["es"] >= last_es
                last_id, last_es = message["id"], message["es"]


def test_canal_flat_message_shape(day_run: tuple[Path, SimulationSummary]) -> None:
    landing, _ = day_run
    for db, table, _, message in messages(landing, data_only=False):
        assert set(message) == CANAL_FIELDS
        assert (message["database"], message["table"]) == (db, table)
        assert message["pkNames"] == ["id"] and message["isDdl"] is False and message["sql"] == ""
        assert message["es"] < message["ts"] < message["es"] + 1000
        assert message["sqlType"] == {c: JDBC[t.split("(")[0]] for c, t in message["mysqlType"].items()}
        for row in message["data"]:
            assert list(row) == list(message["mysqlType"])
            assert all(value is None or isinstance(value, str) for value in row.values())
        if message["type"] == "UPDATE":
            assert len(message["old"]) == len(message["data"])
            for old, new in zip(message["old"], message["data"], strict=True):
                assert old and all(new[column] != value for column, value in old.items())
        else:
            assert message["old"] is None
        if table != "heartbeat":
            assert LOGICAL_TABLES[logical_name(table)].physical_table(message["data"][0]) == table


def test_counts_equal_row_images_in_files(day_run: tuple[Path, SimulationSummary]) -> None:
    landing, summary = day_run
    counted = source_counts(landing)
    assert counted == row_counts(landing)
    assert all(len(hours) == 24 for hours in source_counts(landing, include_zero=True).values())
    for stream, hours in counted.items():
        assert sum(hours.values()) == summary.tables[stream].rows


REFERENCES = {
    "lesson": [("course", "course_id")],
    "order": [("user", "user_id"), ("course", "course_id")],
    "attendance": [("user", "user_id"), ("lesson", "lesson_id"), ("course", "course_id")],
}


def test_foreign_keys_point_at_earlier_inserts(day_messages: list[Located]) -> None:
    inserted: dict[str, dict[str, tuple[int, dict[str, Any]]]] = {name: {} for name in LOGICAL_TABLES}
    seen: set[tuple[str, int]] = set()
    for _, table, _, message in day_messages:
        if (table, message["id"]) in seen:
            continue
        seen.add((table, message["id"]))
        if message["type"] == "INSERT":
            for row in message["data"]:
                assert row["id"] not in inserted[logical_name(table)], "ids are never reused"
                inserted[logical_name(table)][row["id"]] = (message["es"], row)
    checked = 0
    for name, targets in REFERENCES.items():
        for es, row in inserted[name].values():
            assert ms(row["create_time"]) <= es < ms(row["create_time"]) + 300_000
            for target, column in targets:
                assert inserted[target][row[column]][0] < ms(row["create_time"])
                checked += 1
            if name == "attendance":
                assert inserted["lesson"][row["lesson_id"]][1]["course_id"] == row["course_id"]
    assert checked > 1000


def test_one_day_has_updates_deletes_multi_rows_and_duplicates(
    day_run: tuple[Path, SimulationSummary], day_messages: list[Located]
) -> None:
    landing, summary = day_run
    kinds = Counter((logical_name(table), message["type"]) for _, table, _, message in day_messages)
    assert kinds["order", "UPDATE"] > 0 and kinds["user", "UPDATE"] > 0 and kinds["attendance", "UPDATE"] > 0
    assert kinds["order", "DELETE"] + kinds["user", "DELETE"] > 0
    assert any(len(message["data"]) > 1 for *_, message in day_messages)
    result = replay_detailed(landing)
    assert result.duplicates > 0 and result.malformed == 0
    assert result.duplicates == sum(t.duplicates for t in summary.tables.values())


def test_quiet_windows_have_empty_segments(day_run: tuple[Path, SimulationSummary]) -> None:
    landing, _ = day_run
    empty = Counter(table for _, table, path in segment_files(landing) if path.stat().st_size == 0)
    assert empty["course"] > 80
    assert "heartbeat" not in empty
    night = [path for db, table, path in segment_files(landing) if table == "user_00" and "T03" in path.name]
    assert all(path.stat().st_size == 0 for path in night)


def test_oracle_replay_and_gmv(day_run: tuple[Path, SimulationSummary]) -> None:
    landing, _ = day_run
    tables = replay_detailed(landing).tables
    assert {row["status"] for row in tables["order"].values()} <= {"created", "paid", "refunded", "cancelled"}
    assert all(row["pay_time"] for row in tables["order"].values() if row["status"] in ("paid", "refunded"))
    gmv = daily_gmv(tables["order"])
    assert list(gmv) == [DAY.date()] and gmv[DAY.date()] > 0
    assert replay_until(landing, ms(DAY))["user"] == {}
    noon = replay_until(landing, ms(DAY + timedelta(hours=12)))
    assert noon["order"] and noon["order"] != tables["order"]
    assert all(row["_es"] < ms(DAY + timedelta(hours=12)) for row in noon["order"].values())


def test_lagging_shard_stops_early_but_is_counted(tmp_path: Path) -> None:
    config = SimulationConfig(scale=0.05, batch_minutes=15, lag={"order_03": timedelta(hours=1)})
    start = DAY + timedelta(hours=8)
    simulate(tmp_path, start, start + timedelta(hours=5), config)
    segments = Counter(table for _, table, _ in segment_files(tmp_path))
    assert segments["order_02"] == 20 and segments["order_03"] == 16
    counted, written = source_counts(tmp_path), row_counts(tmp_path)
    assert counted["edu_trade.order_02"] == written["edu_trade.order_02"]
    assert "2024-03-01T12" in counted["edu_trade.order_03"]  # the source did produce that hour
    assert max(written["edu_trade.order_03"]) < "2024-03-01T12"


def test_idle_database_and_malformed_lines(tmp_path: Path) -> None:
    start = DAY + timedelta(hours=8)
    idle = (start + timedelta(hours=3), start + timedelta(hours=4))
    config = SimulationConfig(scale=0.05, batch_minutes=15, malformed_rate=0.05, idle=(("edu_trade", *idle),))
    simulate(tmp_path, start, start + timedelta(hours=5), config)
    trade = [m for db, _, _, m in messages(tmp_path, data_only=False) if db == "edu_trade"]
    assert not [m for m in trade if m["table"] != "heartbeat" and ms(idle[0]) <= m["es"] < ms(idle[1])]
    assert sum(1 for m in trade if m["table"] == "heartbeat" and ms(idle[0]) <= m["es"] < ms(idle[1])) == 60
    result = replay_detailed(tmp_path)
    assert result.malformed > 0
    source_rows = sum(sum(hours.values()) for hours in source_counts(tmp_path).values())
    assert source_rows > result.rows  # the source produced the rows of the malformed lines too


def test_schema_drift_adds_phone_column(tmp_path: Path) -> None:
    drift = DAY + timedelta(hours=1)
    simulate(tmp_path, DAY, DAY + timedelta(hours=3), SimulationConfig(scale=0.05, schema_drift_at=drift))
    users = [m for _, table, _, m in messages(tmp_path) if table.startswith("user_")]
    before = [m for m in users if m["es"] < ms(drift)]
    after = [m for m in users if m["es"] >= ms(drift)]
    assert before and after
    assert all("phone" not in m["mysqlType"] for m in before)
    assert all(m["mysqlType"]["phone"] == "varchar(20)" and "phone" in m["data"][0] for m in after)
    assert any(m["data"][0]["phone"] for m in after)
    assert all("phone" not in m["mysqlType"] for _, table, _, m in messages(tmp_path) if table.startswith("order_"))


def test_unplaced_moves_re_date_orders_by_updates_without_old(tmp_path: Path) -> None:
    start = DAY + timedelta(hours=8)
    config = SimulationConfig(scale=0.05, batch_minutes=15, unplaced_move_rate=0.5)
    simulate(tmp_path, start, start + timedelta(hours=4), config)
    created: dict[str, str] = {}
    moves: list[tuple[str, str, Any]] = []  # (hour before, hour after, old as written)
    for _, table, _, m in messages(tmp_path):
        if not table.startswith("order_"):
            continue
        for i, row in enumerate(m["data"]):
            before = created.get(row["id"])
            if m["type"] == "UPDATE" and before is not None and before[:13] != row["create_time"][:13]:
                old = m["old"] if m["old"] is None else m["old"][i]
                moves.append((before[:13], row["create_time"][:13], old))
            created[row["id"]] = row["create_time"]
    assert len(moves) >= 5
    # every move hides where the row was: old null
    assert all(old is None for _, _, old in moves)
    truth = replay_detailed(tmp_path).tables["order"]
    assert all(truth[int(i)]["create_time"] == t for i, t in created.items() if int(i) in truth)


def test_a_burst_multiplies_the_new_rows_of_its_hour_and_survives_a_resumed_run(tmp_path: Path) -> None:
    start, hour = DAY + timedelta(hours=8), DAY + timedelta(hours=10)
    plain = SimulationConfig(scale=0.05, batch_minutes=15)
    burst = SimulationConfig(scale=0.05, batch_minutes=15, bursts=((hour, hour + timedelta(hours=1), 10.0),))
    simulate(tmp_path / "plain", start, start + timedelta(hours=4), plain)
    simulate(tmp_path / "burst", start, start + timedelta(hours=3), burst)
    simulate(tmp_path / "burst", start, start + timedelta(hours=4), burst)  # resumed: the burst is in its state

    def inserts(landing: Path, at: datetime) -> int:
        return sum(
            len(m["data"])
            for _, _, _, m in messages(landing)
            if m["type"] == "INSERT" and ms(at) <= m["es"] < ms(at + timedelta(hours=1))
        )

    assert inserts(tmp_path / "burst", hour) >= 6 * inserts(tmp_path / "plain", hour) > 0
    before = DAY + timedelta(hours=9)
    assert inserts(tmp_path / "burst", before) == inserts(tmp_path / "plain", before)  # the hour before: untouched
    with pytest.raises(ValueError, match="bursts"):  # the landing remembers its burst
        simulate(tmp_path / "burst", start, start + timedelta(hours=5), plain)
    with pytest.raises(ValueError, match="burst .* factor"):
        simulate(tmp_path / "bad", start, start + timedelta(hours=1), SimulationConfig(bursts=((hour, start, 2.0),)))


def test_refuses_a_different_configuration(tmp_path: Path) -> None:
    config = SimulationConfig(scale=0.02, batch_minutes=30)
    simulate(tmp_path, DAY, DAY + timedelta(hours=2), config)
    with pytest.raises(ValueError, match="seed"):
        simulate(tmp_path, DAY, DAY + timedelta(hours=2), SimulationConfig(seed=8, scale=0.02, batch_minutes=30))
    with pytest.raises(ValueError, match="start"):
        simulate(tmp_path, DAY + timedelta(hours=1), DAY + timedelta(hours=2), config)
    assert simulate(tmp_path, DAY, DAY + timedelta(hours=1), config).messages == 0
    with pytest.raises(ValueError, match="aligned"):
        simulate(tmp_path / "other", DAY + timedelta(minutes=7), DAY + timedelta(hours=1), config)
    (tmp_path / "stray" / "binlog" / "edu_user" / "user_00").mkdir(parents=True)
    (tmp_path / "stray" / "binlog" / "edu_user" / "user_00" / "000001-20240301T0000.jsonl").write_text("")
    with pytest.raises(ValueError, match="simulation.json"):
        simulate(tmp_path / "stray", DAY, DAY + timedelta(hours=1), config)


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    landing = str(tmp_path / "landing")
    common = ["--landing", landing, "--scale", "0.02", "--batch-minutes", "30"]
    assert main([*common, "--start", "2024-03-01", "--end", "2024-03-01T02:00"]) == 0
    assert main(["--landing", landing, "--append-until", "2024-03-01T03:10"]) == 0
    output = capsys.readouterr().out
    assert "2024-03-01:" in output and "edu_trade.order_03" in output and "total" in output
    recorded = read_simulation(Path(landing))
    assert recorded is not None and recorded[2] == datetime(2024, 3, 1, 3, tzinfo=TZ)
    assert main([*common, "--seed", "9", "--start", "2024-03-01", "--days", "1"]) == 2
    assert "different configuration" in capsys.readouterr().err
