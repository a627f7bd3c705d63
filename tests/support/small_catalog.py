"""Writing small catalogs for tests: the smallest ODS declaration and a declaration writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from warehouse_assets.catalog import Catalog, CatalogError, load_catalog

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
