"""The simulated source's bad hour and its fix: corrupted in place, then the corrected rows re-sent, as an
independent replay of the landing area sees them."""

from __future__ import annotations

import shutil
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

from simulator.cdc import SimulationConfig, simulate
from simulator.corrections import confined_rows, confined_rows_of_day, corrupt_hour, resend_corrected
from tests.support import oracle

HOUR = datetime(2026, 1, 2, 13)


def test_a_corrupted_hour_is_seen_by_a_replay_and_the_resend_restores_every_row(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    simulate(landing, datetime(2026, 1, 1), datetime(2026, 1, 3), SimulationConfig(seed=3, scale=0.2, batch_minutes=60))
    truth = oracle.replay(landing)["order"]
    counts = oracle.source_counts(landing)
    keys = confined_rows(landing, "order", HOUR)
    assert keys, "the simulation should create orders confined to the hour"
    assert all(truth[k]["create_time"].startswith("2026-01-02 13") for k in keys)
    shutil.copytree(landing, tmp_path / "before")

    assert corrupt_hour(landing, "order", HOUR) == keys
    bad = oracle.replay(landing)["order"]
    assert {k: Decimal(bad[k]["amount"]) for k in keys} == {k: 100 * Decimal(truth[k]["amount"]) for k in keys}
    assert {k: r for k, r in bad.items() if k not in keys} == {k: r for k, r in truth.items() if k not in keys}

    assert resend_corrected(landing, "order", HOUR, keys) == len(keys)
    fixed = oracle.replay(landing)["order"]
    assert {k: {c: v for c, v in r.items() if c != "_es"} for k, r in fixed.items()} == {
        k: {c: v for c, v in r.items() if c != "_es"} for k, r in truth.items()
    }
    # the source counted what it re-sent in that hour, and nothing else
    recounted = oracle.source_counts(landing)
    added = {
        (stream, hour): n - counts[stream].get(hour, 0)
        for stream, hours in recounted.items()
        for hour, n in hours.items()
        if n != counts[stream].get(hour, 0)
    }
    assert sum(added.values()) == len(keys) and {h for _, h in added} == {"2026-01-02T13"}


def test_the_confined_rows_of_a_day_are_each_hours_keys_created_there_and_changed_only_there(tmp_path: Path) -> None:
    """:func:`confined_rows_of_day` reads the streams once for the 24 hours: per hour, exactly the keys created in it
    whose every change's binlog time falls in it, as the hour's own definition over every message gives them."""
    landing = tmp_path / "landing"
    simulate(landing, datetime(2026, 1, 1), datetime(2026, 1, 3), SimulationConfig(seed=3, scale=0.2, batch_minutes=60))
    times: dict[int, list[int]] = {}
    created: dict[int, set[str]] = {}
    for path in sorted((landing / "binlog" / "edu_trade").glob("order*/*.jsonl")):
        for line in path.read_text().splitlines():
            message = oracle.parse_line(line)
            for row in (message or {}).get("data") or []:
                times.setdefault(int(row["id"]), []).append(message["es"])  # type: ignore[index]
                created.setdefault(int(row["id"]), set()).add(str(row.get("create_time", ""))[:13])
    found = confined_rows_of_day(landing, "order", HOUR.date())
    assert sorted(found) == [datetime(2026, 1, 2, h) for h in range(24)]
    for hour, keys in found.items():
        start = int(hour.replace(tzinfo=ZoneInfo("Asia/Shanghai")).timestamp() * 1000)
        expected = {
            key
            for key, es in times.items()
            if all(start <= t < start + 3_600_000 for t in es) and f"{hour:%Y-%m-%d %H}" in created[key]
        }
        assert keys == expected, hour
    assert sum(len(keys) for keys in found.values()) > 24, "the simulation should confine orders to the day's hours"
    assert found[HOUR] == confined_rows(landing, "order", HOUR)
