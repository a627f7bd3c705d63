"""A Delta table's rows as the product reads them without a JVM, for tests that look at what a run wrote: through
the Delta seam's one reader (delta-rs's DataFusion reader), which applies the deletion vectors of the tables Spark
merges into. Never ``DeltaTable.to_pyarrow_table()``: delta-rs refuses those tables on its Arrow path."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from resources.delta_read import DeltaReader
from resources.storage import normalize_root


def table_rows(table_dir: Path | str, columns: Sequence[str] | None = None, version: int | None = None) -> pa.Table:
    """Every row of the Delta table at ``table_dir`` (at ``version`` if given); fails if there is no table."""
    path = Path(table_dir)
    reader = DeltaReader(normalize_root(str(path.parent)))
    if not reader.exists(path.name):
        raise AssertionError(f"no Delta table at {path}")
    rows, _ = reader.read_rows(path.name, columns=columns, version=version)
    return rows


def row_dicts(table_dir: Path | str, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    return table_rows(table_dir, columns).to_pylist()
