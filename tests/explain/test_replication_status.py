"""``warehouse status``'s replication lines: each site's lag P50/P90 over the partitions its replica runs published in
the last day (source commit -> replica published, from their metadata); a replica run that published nothing new and
a partition published twice count once, the latest publication."""

import json
import time
from pathlib import Path

from dagster import AssetKey, AssetMaterialization, instance_for_test

from tests.support.small_catalog import VALUED_ODS, write
from warehouse_assets.catalog import load_catalog
from warehouse_assets.explain.replication import replication_lines

REPLICA = AssetKey(["dc2", "dwd", "hour"])


def _published(lags: dict[str, float | None]) -> AssetMaterialization:
    now = time.time()
    replicated = {
        key: {
            "source_committed_at": now - (lag or 0.0),
            "published_at": now,
            "replica_version": None if lag is None else 1,
        }
        for key, lag in lags.items()
    }
    key = sorted(lags)[0]
    return AssetMaterialization(REPLICA, partition=key, metadata={"replicated": json.dumps(replicated)})


def test_each_site_shows_its_lag_percentiles(tmp_path: Path) -> None:
    write(tmp_path, "ods/src.yaml", VALUED_ODS)
    write(
        tmp_path,
        "dwd/hour.sql",
        "/* ---\ntable: dwd.hour\nperiod: hourly\nreplicate_to: dc2\n--- */\nSELECT id FROM ods.src",
    )
    catalog = load_catalog(tmp_path)
    sites = {"dc2": "/lake2", "dc3": "s3://lake3"}
    with instance_for_test() as instance:
        assert replication_lines(instance, catalog, sites)[0] == (
            "dc2 (/lake2): 1 tables, no partition published in the last 24 h"
        )
        for hour, lag in enumerate([1.0, 2.0, 3.0, 4.0, 50.0]):
            instance.report_runless_asset_event(_published({f"2026-01-01-{hour:02d}:00": lag}))
        # the first hour published again, later and faster; a run that found it already published
        instance.report_runless_asset_event(_published({"2026-01-01-00:00": 2.0}))
        instance.report_runless_asset_event(_published({"2026-01-01-03:00": None}))
        dc2, dc3 = replication_lines(instance, catalog, sites)
    # lags 2, 2, 3, 4, 50: P50 3, P90 (inclusive) 4 + 0.6 * 46
    assert dc2 == "dc2 (/lake2): 1 tables, lag P50 3.0 s, P90 31.6 s over 5 partitions published in the last 24 h"
    assert dc3 == "dc3 (s3://lake3): 0 tables, no partition published in the last 24 h"
