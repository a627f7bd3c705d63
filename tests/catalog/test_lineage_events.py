"""OpenLineage events without Spark: the file transport set by the client's own ``OPENLINEAGE__…`` variables, a
build's column-lineage facet against ``warehouse lineage`` (the rows' columns as INDIRECT), the ingestion's runs, a
release and a stale partition as state events (after the ledger commits, never for what it rolled back), nothing when
off, and a catalog that is down failing nothing. The runs on Spark: tests/test_semantics.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterEvent, DagsterEventType, DagsterInstance, instance_for_test
from dagster._core.utils import make_new_run_id

from resources.settings import Settings, using
from tests.support.lineage_receiver import lineage_receiver
from tests.support.small_catalog import VALUED_ODS, sql_catalog
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.catalog.lineage import ColumnRef, WarehouseLineage
from warehouse_assets.catalog.lineage_events import Build, LineageEvents, lineage_events
from warehouse_assets.center.ledger import Ledger, Stale
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.ingest.job import ingestion_lineage
from warehouse_assets.materialize.lineage_run import with_lineage_events
from warehouse_assets.materialize.validity import Taint, release_evaluation, taint_evaluation

LAKE = "s3://lake/warehouse"


@pytest.fixture
def file_transport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The client's own settings: the file transport, one JSON event a line."""
    path = tmp_path / "events.jsonl"
    for name, value in {"TYPE": "file", "LOG_FILE_PATH": str(path), "APPEND": "true"}.items():
        monkeypatch.setenv(f"OPENLINEAGE__TRANSPORT__{name}", value)
    return path


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def refs(fields: list[dict[str, Any]]) -> frozenset[ColumnRef]:
    """Input fields named by their object-store path as ``layer.table.column``s."""
    return frozenset(ColumnRef(f["name"].removeprefix("warehouse/").replace("/", "."), f["field"]) for f in fields)


def test_a_builds_events_through_the_file_transport_carry_warehouse_lineage(file_transport: Path) -> None:
    catalog = load_catalog()
    lineage = WarehouseLineage(catalog)
    events = lineage_events(Settings(lake_root=LAKE))
    assert events is not None
    table = catalog["ads.retention_d1"]
    found = lineage.of(table.fqn)
    build = Build(table.fqn, table.key, make_new_run_id(), "__ASSET_JOB", ["2026-03-05"], lineage.columns(table.fqn),
                  {t: lineage.columns(t) for t in found.inputs}, found)  # fmt: skip
    events.started(build)
    events.completed(build)
    start, complete = read(file_transport)
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["run"]["runId"] == complete["run"]["runId"] == build.run_id
    assert complete["job"] == {"namespace": "warehouse", "name": "ads.retention_d1", "facets": {}}
    assert complete["run"]["facets"]["partitions"]["keys"] == ["2026-03-05"]
    assert complete["run"]["facets"]["parent"]["run"]["runId"] == build.dagster_run_id
    # Delta tables by their lake URI: the bucket is the namespace
    assert sorted(i["name"] for i in complete["inputs"]) == [
        "warehouse/dwd/user_snapshot",
        "warehouse/dws/user_active_daily",
    ]
    [output] = complete["outputs"]
    assert (output["namespace"], output["name"]) == ("s3://lake", "warehouse/ads/retention_d1")
    facet = output["facets"]["columnLineage"]
    assert {c: refs(f["inputFields"]) for c, f in facet["fields"].items()} == dict(found.columns)
    assert (
        refs(facet["dataset"])
        == found.rows
        == {  # the rows' columns, hand-checked as in test_lineage.py
            ColumnRef("dwd.user_snapshot", "register_dt"),
            ColumnRef("dwd.user_snapshot", "user_id"),
            ColumnRef("dws.user_active_daily", "user_id"),
        }
    )
    assert {t["type"] for f in facet["dataset"] for t in f["transformations"]} == {"INDIRECT"}


def test_an_ingestion_is_a_run_per_ods_table_from_its_source_with_the_hours_it_reported(file_transport: Path) -> None:
    catalog = load_catalog()
    context = SimpleNamespace(run_id=make_new_run_id())
    with using(Settings(lake_root=LAKE)):
        with ingestion_lineage(context, catalog, [catalog["ods.order"]]) as reported:  # type: ignore[arg-type, list-item]
            reported["ods.order"].extend(["2026-03-05-00:00", "2026-03-05-01:00"])
        with pytest.raises(RuntimeError), ingestion_lineage(context, catalog, [catalog["ods.user"]]):  # type: ignore[arg-type, list-item]
            raise RuntimeError("the landing area is gone")
    events = read(file_transport)
    assert [(e["job"]["name"], e["eventType"]) for e in events] == [
        ("ods_ingest.ods.order", "START"),
        ("ods_ingest.ods.order", "COMPLETE"),
        ("ods_ingest.ods.user", "START"),
        ("ods_ingest.ods.user", "FAIL"),
    ]
    complete = events[1]
    assert complete["run"]["facets"]["partitions"]["keys"] == ["2026-03-05-00:00", "2026-03-05-01:00"]
    source = catalog["ods.order"]
    assert [(i["namespace"], i["name"]) for i in complete["inputs"]] == [
        ("cdc", f"{source.source_database}.{source.source_tables}")  # type: ignore[attr-defined]
    ]
    assert complete["outputs"][0]["name"] == "warehouse/ods/order"
    assert "the landing area is gone" in events[3]["run"]["facets"]["errorMessage"]["message"]


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def small(root: Path) -> Catalog:
    return sql_catalog(root, {"dwd/day.sql": ("period: daily\n", "SELECT id, v FROM ods.src")}, ods=VALUED_ODS)


def verdict(instance: DagsterInstance, evaluation: Any) -> None:
    event = DagsterEvent(DagsterEventType.ASSET_CHECK_EVALUATION.value, "taint_repair", event_specific_data=evaluation)
    instance.report_dagster_event(event, make_new_run_id())


def test_a_release_is_told_after_the_taint_and_off_nothing_is_sent(instance: DagsterInstance, tmp_path: Path) -> None:
    table = small(tmp_path / "tables")["dwd.day"]
    with lineage_receiver() as receiver:
        with using(Settings(lake_root=str(tmp_path / "lake"))):  # off: no OpenLineage setting
            assert lineage_events(Settings(), {}) is None
            assert lineage_events(Settings(openlineage_url=receiver.url), {"OPENLINEAGE_DISABLED": "true"}) is None
            off = PartitionStateStore(instance, tmp_path / "off.db")
            assert off.events is None
        with using(Settings(lake_root=str(tmp_path / "lake"), openlineage_url=receiver.url)):
            store = PartitionStateStore(instance, tmp_path / "states.db")
            instance.report_runless_asset_event(AssetMaterialization(AssetKey(table.key), partition="2026-03-05"))
            [record] = instance.fetch_materializations(AssetKey(table.key), limit=1).records
            target = (record.storage_id, record.run_id, record.timestamp)
            taint = Taint("duplicated rows", "ods.src 2026-03-05-10:00", "oncall", record.timestamp)
            store.update()
            verdict(instance, taint_evaluation(table, "2026-03-05", taint, target))
            store.update()
            verdict(instance, release_evaluation(table, "2026-03-05", target, "checked by hand", "oncall", taint))
            store.update()
        off.update()  # the same events, OpenLineage off: nothing more
        store.close()
        off.close()
    assert receiver.states("dwd.day") == [
        ("2026-03-05", "ready"),
        ("2026-03-05", "tainted"),
        ("2026-03-05", "released"),
    ]
    facets = [e["dataset"]["facets"]["partitionState"] for e in receiver.events]
    assert facets[1]["reason"] == "duplicated rows" and facets[1]["by"] == "oncall"
    assert facets[2]["note"] == "accepted as is: checked by hand (by oncall)"
    assert len(receiver.events) == 3


def test_a_stale_partition_is_told_once_the_ledger_commits(tmp_path: Path) -> None:
    stale = Stale("dws.total", "2026-03-05", 1.0, 2.0, 1, "k", "every 1 h", "")
    with lineage_receiver() as receiver, using(Settings(openlineage_url=receiver.url)):
        ledger = Ledger(tmp_path / "ledger.db")
        with pytest.raises(RuntimeError), ledger.batch():
            ledger.mark_stale([stale])
            raise RuntimeError("the resolver's call failed: its writes are undone")
        assert receiver.events == []
        with ledger.batch():
            ledger.mark_stale([stale])
            assert receiver.events == []  # not before the commit
        ledger.close()
    assert receiver.states("dws.total") == [("2026-03-05", "stale")]
    assert receiver.events[0]["dataset"]["facets"]["partitionState"]["due"] == 2.0


class Failing:
    def emit(self, event: object) -> None:
        raise ConnectionError("the catalog is down")


def test_a_catalog_that_is_down_fails_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    events = LineageEvents(Failing(), "warehouse", LAKE)  # type: ignore[arg-type]
    build = Build("dwd.day", ["dwd", "day"], make_new_run_id(), "job", ["2026-03-05"], ["id"], {})
    events.started(build)
    events.failed(build, RuntimeError("boom"))
    events.state_changed("dwd.day", "2026-03-05", "tainted")
    told = [r.getMessage() for r in caplog.records if "was not sent" in r.getMessage()]
    assert len(told) == 3 and all(m.endswith("the catalog is down") for m in told)
    # and a real client against a port nobody listens on
    with lineage_receiver() as receiver:
        url = receiver.url
    real = lineage_events(Settings(lake_root=LAKE, openlineage_url=url), {})
    assert real is not None
    real.started(build)
    assert "event of dwd.day was not sent" in caplog.records[-1].getMessage()


class Untouched:
    """A build's context that fails any use: off, the build runs without its run being described."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the build's context was read ({name}) with OpenLineage off")


def test_off_a_build_sends_nothing_and_runs_as_it_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(name)
    catalog = load_catalog()
    table = catalog["ads.retention_d1"]
    body = [object(), object()]  # the build's own events, passed on as they are
    with lineage_receiver() as receiver:
        with using(Settings(lake_root=LAKE)):  # off: no OpenLineage setting
            passed = list(with_lineage_events(Untouched(), catalog, table, None, iter(body)))  # type: ignore[arg-type]
        assert passed == body and receiver.events == []
        # the same build with the product's endpoint set: its START and COMPLETE
        context = SimpleNamespace(partition_keys=["2026-03-05"], assets_def=SimpleNamespace(partitions_def=object()),
                                  run_id=make_new_run_id(), job_name="__ASSET_JOB")  # fmt: skip
        with using(Settings(lake_root=LAKE, openlineage_url=receiver.url)):
            passed = list(with_lineage_events(context, catalog, table, None, iter(body)))  # type: ignore[arg-type]
    assert passed == body
    assert [e["eventType"] for e in receiver.runs("ads.retention_d1")] == ["START", "COMPLETE"]
