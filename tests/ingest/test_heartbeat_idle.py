"""Heartbeats prove a shard idle only when a table opts in, and only past what was delivered."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from warehouse_assets.catalog import load_catalog
from warehouse_assets.ingest.merge import ingest_table
from warehouse_assets.ingest.readiness import readiness, ready_hours

TZ = ZoneInfo("Asia/Shanghai")
START = datetime(2026, 3, 2, tzinfo=TZ)


def _segments(landing: Path, stream: str, count: int) -> None:
    db, table = stream.split(".")
    directory = landing / "binlog" / db / table
    directory.mkdir(parents=True, exist_ok=True)
    for seq in range(1, count + 1):
        start = START + timedelta(minutes=5 * (seq - 1))
        (directory / f"{seq:06d}-{start:%Y%m%dT%H%M}.jsonl").write_text("")


def test_heartbeat_moves_an_idle_shard_only_when_the_table_opts_in(spark: SparkSession, tmp_path: Path) -> None:
    landing_dir = tmp_path / "landing"
    _segments(landing_dir, "edu_trade.order_00", 24)  # two hours delivered
    _segments(landing_dir, "edu_trade.order_01", 2)  # then nothing more: real Canal writes no empty segments
    _segments(landing_dir, "edu_trade.heartbeat", 24)  # the source's heartbeat reached 02:00
    store, landing = DeltaStore(str(tmp_path / "lake")), Landing(landing_dir)
    table = load_catalog()["ods.order"]
    ingest_table(spark, store, landing, table)

    strict = readiness(store, landing, table)
    assert strict.watermark == START + timedelta(minutes=10)
    assert ready_hours(strict, None) == []

    trusting = replace(table, heartbeat_idle_grace_minutes=10)
    state = readiness(store, landing, trusting)
    by_stream = {s.stream: s for s in state.streams}
    assert by_stream["edu_trade.order_01"].idle_by_heartbeat
    assert by_stream["edu_trade.order_01"].watermark == START + timedelta(hours=2, minutes=-10)
    assert not by_stream["edu_trade.order_00"].idle_by_heartbeat
    assert state.watermark == START + timedelta(hours=1, minutes=50)
    assert ready_hours(state, None) == ["2026-03-02-00:00"]

    # a segment waiting to be applied means the shard is not idle: the heartbeat proves nothing then
    _segments(landing_dir, "edu_trade.order_01", 3)
    pending = readiness(store, landing, trusting)
    assert {s.stream: s.idle_by_heartbeat for s in pending.streams}["edu_trade.order_01"] is False
    assert pending.watermark == START + timedelta(minutes=10)
