"""Writing small catalogs for tests: the smallest ODS declaration, a declaration writer, a part of the product's."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest

from warehouse_assets.catalog import TABLES_DIR, Catalog, CatalogError, load_catalog

# an hourly ODS table with one key column: the root most test catalogs read
ODS = """table: ods.src
period: hourly
source: {database: db, tables: "src"}
primary_key: [id]
partition_time: t
columns: {id: bigint, t: timestamp}
"""
# the same with a value column, for SQL that sums or carries one
VALUED_ODS = ODS.replace("t: timestamp}", "t: timestamp, v: bigint}")


def write(root: Path, rel: str, text: str) -> Path:
    """Write ``text`` as the declaration ``root/rel`` (e.g. ``dwd/day.sql``)."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def assert_refused(root: Path, files: dict[str, str], message: str) -> None:
    """``ods.src`` and ``files`` under ``root`` do not load: the error matches ``message`` and names the file."""
    write(root, "ods/src.yaml", ODS)
    for rel, text in files.items():
        write(root, rel, text)
    with pytest.raises(CatalogError, match=message) as info:
        load_catalog(root)
    assert str(root) in str(info.value)


def sql_catalog(root: Path, tables: dict[str, tuple[str, str]], ods: str = ODS) -> Catalog:
    """``ods.src`` (declared as ``ods``) and the SQL tables ``tables`` (``layer/name.sql`` → (header lines after
    ``table:``, SQL)) under ``root``, loaded."""
    write(root, "ods/src.yaml", ods)
    for rel, (header, sql) in tables.items():
        layer, name = rel.removesuffix(".sql").split("/")
        write(root, rel, f"/* ---\ntable: {layer}.{name}\n{header}--- */\n{sql}\n")
    return load_catalog(root)


def product_tables(dest: Path, tables: Iterable[str]) -> Path:
    """A catalog folder (for ``WAREHOUSE_CATALOG_DIR``) at ``dest``: the product's declarations of ``tables`` and of
    every table they read, however far up, beside the product's lineage cache when a load left one (git-ignored)."""
    catalog = load_catalog(TABLES_DIR)
    wanted: set[str] = set()
    todo = list(tables)
    while todo:
        fqn = todo.pop()
        if fqn not in wanted:
            wanted.add(fqn)
            todo.extend(dep.table for dep in getattr(catalog[fqn], "deps", ()))
    for fqn in sorted(wanted):
        layer, name = fqn.split(".")
        [declaration] = [p for p in (TABLES_DIR / layer).glob(f"{name}.*") if p.suffix in (".sql", ".yaml")]
        (dest / layer).mkdir(parents=True, exist_ok=True)
        shutil.copy(declaration, dest / layer / declaration.name)
    cache = TABLES_DIR / ".column_lineage.json"
    if cache.is_file():
        shutil.copy(cache, dest / cache.name)
    return dest
