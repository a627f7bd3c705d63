"""``warehouse status TABLE --as-of TIME``: each partition as it was at that moment, replayed from the event log.

A day of ``dwd.order_detail`` is built (Delta version 3), tainted through ``warehouse taint --apply``, and repaired
(built again, Delta version 5); the status at a moment after each step gives the state of that moment, and the Delta
version with the ``warehouse sql --as-of`` command that reads the data as it was. Times in the future, before the
log's first event, or that do not parse are refused, naming the value. The events are written as the product writes
them (a temp-dir instance; no Spark, no code location).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, instance_for_test

from tests.center.test_state_store import materializations, report, taint
from tests.center.test_taint import build, hours
from warehouse_assets.catalog import load_catalog
from warehouse_assets.cli import main

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-02"
TABLE = "dwd.order_detail"


def moment() -> str:
    """Now, in the business time zone without its offset, as an on-call engineer types it (to the microsecond: the
    steps of this test are milliseconds apart); then a pause, so that the next event is logged after it."""
    at = datetime.now(TZ).replace(tzinfo=None).isoformat()
    time.sleep(0.05)
    return at


def status(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[str], str]:
    code = main(["status", TABLE, "--range", DAY, DAY, *extra])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_status_as_of_gives_the_state_before_and_after_a_taint_and_its_repair_with_the_delta_version_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("WAREHOUSE_LANDING_ROOT", str(tmp_path / "landing"))
    catalog = load_catalog()
    key = AssetKey(["dwd", "order_detail"])
    before_anything = moment()
    with instance_for_test(temp_dir=str(home)) as instance:
        build(instance, catalog, {"ods.order": hours(DAY)})
        ods_only = moment()
        report(instance, key, DAY, version=3)
    built = moment()
    taint = ["taint", "ods.order", f"{DAY}-08:00", f"{DAY}-17:00", "--reason", "amounts 100x", "--by", "me"]
    assert main([*taint, "--apply"]) == 0
    capsys.readouterr()
    tainted = moment()
    with instance_for_test(temp_dir=str(home)) as instance:  # the repair: built again, a new Delta version
        report(instance, key, DAY, version=5)
        assert len(materializations(instance, key, DAY)) == 2
    repaired = moment()

    code, out, _ = status(capsys, "--as-of", built)
    assert code == 0
    header = f"{TABLE} (daily): 1 partition(s), 1 materialized, 0 tainted"
    assert out[0] == f"as of {built[:10]} {built[11:19]}+08:00: {header}"
    assert "Delta v3)  valid" in out[1]
    assert out[-1] == (
        f"{TABLE} was at Delta version 3 then; its data as it was: "
        f"warehouse sql --as-of 3 \"SELECT * FROM {TABLE} WHERE dt BETWEEN '{DAY}' AND '{DAY}'\""
    )

    code, out, _ = status(capsys, "--as-of", tainted)
    assert code == 0
    assert out[0].endswith(f"{TABLE} (daily): 1 partition(s), 1 materialized, 1 tainted")
    assert f"Delta v3)  tainted: amounts 100x, from ods.order {DAY}-08:00 .. {DAY}-17:00" in out[1]
    assert "warehouse sql --as-of 3 " in out[-1]

    code, out, _ = status(capsys, "--as-of", repaired)
    assert code == 0
    assert out[0].endswith(f"{TABLE} (daily): 1 partition(s), 1 materialized, 0 tainted")
    assert "Delta v5)  valid" in out[1]
    assert "warehouse sql --as-of 5 " in out[-1]

    # before the table was built: nothing materialized, and no version to read
    code, out, _ = status(capsys, "--as-of", ods_only)
    assert code == 0 and out[0].endswith(f"{TABLE} (daily): 1 partition(s), 0 materialized, 0 tainted")
    assert out[1].split() == [DAY, "missing"]
    assert out[-1] == f"no Delta version of {TABLE} was recorded by then"
    code, out, _ = main_status(capsys, "ods.order", f"{DAY}-08:00", "--as-of", built)
    assert code == 0 and out[0].endswith("ods.order (hourly): 1 partition(s), 1 materialized, 0 tainted")
    code, out, _ = main_status(capsys, "ods.order", f"{DAY}-08:00", "--as-of", tainted)
    assert out[0].endswith("1 materialized, 1 tainted")

    # today's state, without --as-of, is the repaired one
    code, out, _ = status(capsys)
    assert code == 0 and "Delta v5)  valid" in out[1]

    # bad moments, each named
    code, out, err = status(capsys, "--as-of", before_anything)
    assert code == 2 and out == []
    assert err.startswith(f"error: --as-of '{before_anything}': ") and "before the instance's first event" in err
    future = (datetime.now(TZ) + timedelta(days=1)).replace(tzinfo=None).isoformat(timespec="minutes")
    code, _, err = status(capsys, "--as-of", future)
    assert code == 2 and f"error: --as-of '{future}': " in err and "is in the future" in err
    code, _, err = status(capsys, "--as-of", "yesterday at nine")
    assert code == 2 and "--as-of 'yesterday at nine' is not a time" in err and "2026-11-20T09:00" in err
    assert main(["status", "--as-of", repaired]) == 2
    assert "name the table" in capsys.readouterr().err


def main_status(
    capsys: pytest.CaptureFixture[str], table: str, partition: str, *extra: str
) -> tuple[int, list[str], str]:
    code = main(["status", table, "--range", partition, partition, *extra])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_a_taint_reported_by_its_own_verdict_is_replayed_at_its_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The state at a moment between two verdicts on one materialization is the first verdict's."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("WAREHOUSE_LANDING_ROOT", str(tmp_path / "landing"))
    key = AssetKey(["dwd", "order_detail"])
    with instance_for_test(temp_dir=str(home)) as instance:
        report(instance, key, DAY, version=7)
        [target] = materializations(instance, key, DAY)
        valid = moment()
        taint(instance, key, DAY, target, reason="late refunds missing", root=f"ods.order {DAY}-09:00")
        bad = moment()
        taint(instance, key, DAY, target, passed=True)
    _, out, _ = status(capsys, "--as-of", valid)
    assert "Delta v7)  valid" in out[1]
    _, out, _ = status(capsys, "--as-of", bad)
    assert f"Delta v7)  tainted: late refunds missing, from ods.order {DAY}-09:00" in out[1]
    _, out, _ = status(capsys)
    assert "Delta v7)  valid" in out[1]
