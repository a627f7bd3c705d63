"""The typed catalog: one model per kind of table, and one class per check kind (parse, describe, validate)."""

from __future__ import annotations

from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest
from dagster import AssetsDefinition
from pydantic import ValidationError

from tests.support.small_catalog import ODS, assert_refused, write
from warehouse_assets.catalog import (
    DerivedTable,
    ExternalTable,
    OdsTable,
    StaticTable,
    Table,
    load_catalog,
)
from warehouse_assets.catalog.checks import CHECK_KINDS, Anomaly, CheckSpecError, parse_checks

EXT = """table: ext.spend
period: daily
external: {format: csv_files, location: spend}
columns: {channel: string, spend: double}
"""


def _derived(name: str, body: str, header: str = "") -> str:
    return f"/* ---\ntable: dwd.{name}\nperiod: daily\n{header}--- */\n{body}\n"


def test_each_kind_of_table_is_its_own_model_with_its_fields_required() -> None:
    catalog = load_catalog()
    kinds = {type(t) for t in catalog}
    assert kinds == {OdsTable, DerivedTable, ExternalTable, StaticTable}
    assert catalog.ods() and all(
        isinstance(t, OdsTable) and t.source_database and t.partition_time for t in catalog.ods()
    )
    assert all(isinstance(t, ExternalTable) and t.external.location for t in catalog.externals())
    assert all(isinstance(t, DerivedTable) and t.sql for t in catalog.derived())
    assert all(isinstance(t, StaticTable) and t.sql and t.columns and not t.deps for t in catalog.statics())
    # a kind's fields are its own: no optional ODS or external field hangs on a derived table
    derived = {f.name for f in fields(DerivedTable)}
    assert not derived & {"source_database", "source_tables", "partition_time", "external", "completeness_threshold"}
    required = {f.name for f in fields(OdsTable) if f.default is MISSING and f.default_factory is MISSING}
    assert {"source_database", "source_tables", "partition_time"} <= required
    assert {f.name for f in fields(Table)} < {f.name for f in fields(OdsTable)}


def test_a_table_revalidates_when_a_field_is_replaced() -> None:
    order = load_catalog()["ods.order"]
    assert replace(order, completeness_threshold=0.9).completeness_threshold == 0.9
    with pytest.raises(ValidationError, match=r"completeness.threshold must be a fraction in \[0, 1\]"):
        replace(order, completeness_threshold=1.5)
    with pytest.raises(ValidationError, match="'nope' is not a declared column"):
        replace(order, partition_time="nope")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"ods/src.yaml": ODS.replace("partition_time: t\n", "")}, "partition_time is required: the timestamp column"),
        ({"ods/src.yaml": ODS.replace('source: {database: db, tables: "src"}\n', "")}, "source needs database"),
        ({"ods/src.yaml": ODS + "completeness: {threshold: true}\n"}, "completeness.threshold must be a fraction"),
        ({"ods/src.yaml": ODS + "idle_proof: {heartbeat_grace_minutes: -1}\n"}, "must be a non-negative integer"),
        ({"ext/spend.yaml": EXT.replace("columns: {channel: string, spend: double}\n", "")}, "columns must map"),
        ({"ext/spend.yaml": EXT.replace("format: csv_files", "format: parquet")}, "external needs format"),
        ({"ext/spend.yaml": EXT.replace("daily", "hourly")}, "external tables are delivered per day"),
        ({"ext/spend.yaml": EXT + "primary_key: 3\n"}, "primary_key must be a list of column names"),
        ({"dwd/a.sql": _derived("a", "SELECT id FROM ods.src", "checks: {bogus: true}\n")}, "unknown check 'bogus'"),
        (
            {"dwd/a.sql": _derived("a", "SELECT id FROM ods.src", "checks: {references: {id: dwd.b.id}}\n")},
            "checks.references.id points at dwd.b, which is not a dependency",
        ),
        (
            {
                "dws/h.sql": "/* ---\ntable: dws.h\nperiod: hourly\nsla: {deadline: '09:00'}\n--- */\n"
                "SELECT id FROM ods.src\n"
            },
            "sla.deadline \\(next morning\\) is for daily tables",
        ),
        ({"ods/src.yaml": ODS + "checks: {anomaly: {metric: rows}}\n"}, "anomaly checks are for derived tables"),
        ({"ods/src.yaml": ODS + "zorder: {by: [id], file_size: big}\n"}, "zorder.file_size must be a size such as"),
        ({"ods/src.yaml": ODS + "zorder: {by: [id], file_size: 100KB}\n"}, "must be between 1MB and 2GB"),
        ({"ods/src.yaml": ODS + "zorder: {file_size: 8MB}\n"}, "zorder.by must list the columns"),
        ({"ods/src.yaml": ODS + "zorder: {by: [id], size: 8MB}\n"}, "zorder takes by and file_size, not size"),
        ({"ods/src.yaml": ODS + "domain: Orders/Paid\n"}, "domain is a lower-case name"),
    ],
)
def test_declaration_errors_name_the_file_and_the_field(tmp_path: Path, files: dict[str, str], message: str) -> None:
    assert_refused(tmp_path, files, message)


def test_a_table_declares_its_zorder_columns_and_file_size(tmp_path: Path) -> None:
    write(tmp_path, "ods/src.yaml", ODS + "zorder: {by: [id, t], file_size: 8MB}\n")
    write(tmp_path, "dwd/a.sql", _derived("a", "SELECT id FROM ods.src", "zorder: [id]\n"))
    catalog = load_catalog(tmp_path)
    assert (catalog["ods.src"].zorder, catalog["ods.src"].zorder_file_size) == (("id", "t"), 8 * 2**20)
    assert (catalog["dwd.a"].zorder, catalog["dwd.a"].zorder_file_size) == (("id",), None)  # Delta's default size
    # the example warehouse's detail tables analysts look up by learner and course
    for fqn in ("dwd.order_detail", "dwd.attendance_detail"):
        table = load_catalog()[fqn]
        assert table.zorder == ("user_id", "course_id") and table.zorder_file_size == 4 * 2**20


def test_each_check_kind_parses_and_describes_itself_in_one_class() -> None:
    assert list(CHECK_KINDS) == ["unique", "not_null", "range", "references", "row_count", "anomaly"]
    checks = parse_checks(
        {
            "unique": True,
            "not_null": ["a", "b"],
            "range": {"rate": [0, 1], "amount": [0, None]},
            "references": {"user_id": "dwd.order_detail.user_id", "blocking": False},
            "row_count": {"upstream": "ods.order", "min_ratio": 0.99, "max_ratio": 1.0, "min_rows": 1},
            "anomaly": {"metric": "sum( gmv )", "max_deviation": 0.5},
        }
    )
    assert [type(c) for c in checks] == list(CHECK_KINDS.values())
    assert [c.name for c in checks] == list(CHECK_KINDS)
    assert [c.blocking for c in checks] == [True, True, True, False, True, True]
    assert [c.describe() for c in checks] == [
        "no duplicate primary key in the partition",
        "no null in a, b",
        "values in range: rate in [0.0, 1.0], amount in [0.0, None]",
        "keys present in the mapped partitions: user_id → dwd.order_detail.user_id",
        "at least 1 rows; rows / rows of ods.order's mapped partitions in [0.99, 1.0]",
        "sum(gmv) within ±50% of its trailing 7-period mean",
    ]
    anomaly = checks[-1]
    assert isinstance(anomaly, Anomaly) and (anomaly.periods, anomaly.min_periods) == (7, 3)


def test_only_an_anomaly_check_looks_back_at_history() -> None:
    catalog = load_catalog()
    gmv = catalog["ads.daily_gmv"]
    for check in gmv.checks:
        keys = check.history_keys(gmv, "2026-03-10")
        if check.kind == "anomaly":
            assert keys[:2] == ["2026-03-09", "2026-03-08"] and len(keys) == 7
        else:
            assert keys == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"not_null": []}, "checks.not_null needs a list of column names"),
        ({"range": {"x": [2, 1]}}, "checks.range.x: low 2.0 is above high 1.0"),
        ({"references": {"x": "a.b"}}, "checks.references.x must be layer.table.column"),
        ({"row_count": {"min_ratio": 0.5}}, "a ratio needs the upstream table"),
        ({"anomaly": {"metric": "median(x)"}}, "checks.anomaly.metric 'median\\(x\\)'"),
        ({"unique": {"blocking": "no"}}, "checks.unique.blocking must be true or false"),
        ({"anomaly": {"metric": "rows", "max_deviation": None}}, "checks.anomaly.max_deviation must be a number"),
    ],
)
def test_a_check_kind_rejects_its_wrong_parameters(spec: dict[str, object], message: str) -> None:
    with pytest.raises(CheckSpecError, match=message):
        parse_checks(spec)


def test_a_domain_puts_a_table_in_its_layers_group_of_that_domain(tmp_path: Path) -> None:
    # a large catalog's layer is thousands of tables, and Dagster draws a group's graph whole: a domain splits it
    from warehouse_assets.materialize.compiler import build_assets

    write(tmp_path, "ods/src.yaml", ODS + "domain: orders\n")
    write(tmp_path, "dwd/a.sql", _derived("a", "SELECT id FROM ods.src", "domain: orders\n"))
    write(tmp_path, "dwd/b.sql", _derived("b", "SELECT id FROM ods.src"))
    write(tmp_path, "dws/m.sql", "/* ---\ntable: dws.m\nperiod: 5min\n--- */\nSELECT id FROM ods.src\n")
    catalog = load_catalog(tmp_path)
    specs = [s for b in build_assets(catalog) for s in (b.specs if isinstance(b, AssetsDefinition) else [b])]
    groups = {spec.key.to_user_string(): spec.group_name for spec in specs}
    assert groups == {
        "ods/src": "ods_orders",
        "ods/src_5min": "ods_orders",  # its completeness windows beside it
        "dwd/a": "dwd_orders",
        "dwd/b": "dwd",  # no domain: the layer's group, as before
        "dws/m": "dws",
    }
