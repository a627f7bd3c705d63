"""Column lineage at the code location's load: a cold load computes each table's lineage once and stores it, a warm
load reads it and parses no SQL; a changed SQL is computed again; a broken cache costs a computation, never the load.
The lineage shown on the asset's page (a Markdown table) and its split under the UI's inline limit. No Spark."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetKey

from resources.settings import Settings
from tests.support.small_catalog import VALUED_ODS, sql_catalog, write
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.catalog import lineage as lineage_module
from warehouse_assets.catalog.lineage import ColumnRef, TableLineage, WarehouseLineage
from warehouse_assets.catalog.lineage_cache import cache_path, lineage_at_load
from warehouse_assets.catalog.lineage_markdown import INLINE_LIMIT, lineage_markdown, lineage_metadata
from warehouse_assets.definitions import build_definitions

TOTAL = "/* ---\ntable: dws.total\nperiod: daily\n--- */\n"


def small(root: Path, day_sql: str = "SELECT id, sum(v) AS v FROM ods.src WHERE v > 0 GROUP BY id") -> Catalog:
    """ods.src → dwd.day → dws.total, under ``root/tables``."""
    tables = {
        "dwd/day.sql": ("period: daily\n", day_sql),
        "dws/total.sql": ("period: daily\n", "SELECT sum(v) AS v FROM dwd.day"),
    }
    return sql_catalog(root / "tables", tables, ods=VALUED_ODS)


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tables whose lineage was computed from their SQL."""
    calls: list[str] = []
    real = lineage_module.table_lineage

    def counted(table: str, *args: object, **kwargs: object) -> TableLineage:
        calls.append(table)
        return real(table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lineage_module, "table_lineage", counted)
    return calls


def test_a_cold_load_computes_each_table_once_and_a_warm_load_computes_none(
    tmp_path: Path, computed: list[str]
) -> None:
    catalog = small(tmp_path)
    home = str(tmp_path / "home")
    cold, cold_cache = lineage_at_load(catalog, home)
    assert sorted(computed) == ["dwd.day", "dws.total"] and cold_cache.computed == 2
    path = cache_path(catalog, home)
    assert path is not None and path.parent == tmp_path / "home" / "column_lineage" and path.exists()

    computed.clear()
    warm, warm_cache = lineage_at_load(load_catalog(tmp_path / "tables"), home)
    assert computed == [] and (warm_cache.computed, warm_cache.read) == (0, 2)
    assert [warm.of(t) for t in ("dwd.day", "dws.total")] == [cold.of(t) for t in ("dwd.day", "dws.total")]
    assert warm.of("dwd.day").rows == frozenset({ColumnRef("ods.src", "id"), ColumnRef("ods.src", "v")})


def test_a_changed_sql_is_computed_again_with_the_tables_whose_inputs_it_changes(
    tmp_path: Path, computed: list[str]
) -> None:
    home = str(tmp_path / "home")
    lineage_at_load(small(tmp_path), home)
    computed.clear()
    # a new column of dwd.day changes its readers' input schema: dws.total's key changes too
    changed = small(tmp_path, "SELECT id, sum(v) AS v, max(v) AS top FROM ods.src GROUP BY id")
    found, _ = lineage_at_load(changed, home)
    assert sorted(computed) == ["dwd.day", "dws.total"]
    assert found.of("dwd.day").columns["top"] == frozenset({ColumnRef("ods.src", "v")})
    computed.clear()
    # the SQL of the reader alone: only it
    write(tmp_path / "tables", "dws/total.sql", f"{TOTAL}SELECT max(v) AS v FROM dwd.day\n")
    lineage_at_load(load_catalog(tmp_path / "tables"), home)
    assert computed == ["dws.total"]


def test_an_unreadable_cache_is_computed_again_and_rewritten(tmp_path: Path, computed: list[str]) -> None:
    catalog = small(tmp_path)
    home = str(tmp_path / "home")
    path = cache_path(catalog, home)
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    found, cache = lineage_at_load(catalog, home)
    assert cache.computed == 2 and found.of("dws.total").columns["v"] == frozenset({ColumnRef("dwd.day", "v")})
    computed.clear()
    lineage_at_load(catalog, home)
    assert computed == []


def test_without_dagster_home_the_cache_is_kept_beside_the_catalog(tmp_path: Path) -> None:
    catalog = small(tmp_path)
    lineage_at_load(catalog, None)
    assert (tmp_path / "tables" / ".column_lineage.json").exists()


def test_the_definitions_carry_the_lineage_table_and_can_go_without(tmp_path: Path, computed: list[str]) -> None:
    catalog = small(tmp_path)
    settings = Settings(lineage_cache_dir=str(tmp_path / "cache"))
    specs = {s.key: s for s in build_definitions(catalog, settings).resolve_all_asset_specs()}
    markdown = specs[AssetKey(["dwd", "day"])].metadata["column_lineage"].value
    assert "| `v` | ods.src.v |" in markdown
    assert "**rows decided by:** ods.src.id, ods.src.v" in markdown  # GROUP BY id, WHERE v > 0
    assert "| `v` | dwd.day.v |" in specs[AssetKey(["dws", "total"])].metadata["column_lineage"].value
    computed.clear()
    off = Settings(lineage_cache_dir=str(tmp_path / "other"), lineage_at_load=False)
    specs = {s.key: s for s in build_definitions(catalog, off).resolve_all_asset_specs()}
    assert "column_lineage" not in specs[AssetKey(["dwd", "day"])].metadata and computed == []


def test_the_example_warehouse_shows_daily_gmv_sources_inline() -> None:
    lineage = WarehouseLineage(load_catalog())
    [markdown] = lineage_markdown(lineage.of("ads.daily_gmv"))
    assert len(markdown) < INLINE_LIMIT
    assert "| `gmv` | dws.user_order_daily.paid_amount |" in markdown
    assert "| `paying_users` | dws.user_order_daily.paid_orders |" in markdown


def test_a_long_lineage_is_split_into_entries_the_ui_shows_inline() -> None:
    inputs = {f"dwd.input_{i}": [f"column_{j}" for j in range(6)] for i in range(8)}
    columns = {
        f"out_{i}_{j}": frozenset({ColumnRef(t, c) for t, cs in inputs.items() for c in cs[:j]})
        for i in range(10)
        for j in range(1, 3)
    }
    lineage = TableLineage("dws.wide", tuple(inputs), columns, frozenset({ColumnRef("dwd.input_0", "column_0")}))
    entries = lineage_metadata(lineage)
    assert len(entries) > 1 and all(len(str(v.value)) < INLINE_LIMIT for v in entries.values())
    text = "\n".join(str(v.value) for v in entries.values())
    assert all(f"| `{name}` |" in text for name in columns)  # every column, in one entry or another
    assert "dwd.input_3.{column_0, column_1}" in text  # each input named once per row to save room
    assert list(entries)[:2] == ["column_lineage", "column_lineage (2)"]
