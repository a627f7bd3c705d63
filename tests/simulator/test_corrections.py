"""The simulated source's bad hour and its fix: corrupted in place, then the corrected rows re-sent, as an
independent replay of the landing area sees them."""

from __future__ import annotations

import shutil
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from simulator.cdc import SimulationConfig, simulate
from simulator.corrections import confined_rows, corrupt_hour, resend_corrected
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
