"""What DataFusion plans for the aggregates the Delta seam runs (``DeltaReader.live_aggregates``): the queries a call
runs, recorded, and the Parquet scans in each one's physical plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from deltalake import QueryBuilder

from resources.delta_lake import DeltaStore

Query = tuple[dict[str, tuple[Any, int]], str]  # the tables a query reads (name -> key and version), and its SQL


def recorded(store: DeltaStore, monkeypatch: pytest.MonkeyPatch) -> list[Query]:
    """The queries ``store`` runs through ``live_aggregates`` from now on (run as before), in order."""
    queries: list[Query] = []
    run: Callable[..., dict[str, Any]] = store.live_aggregates

    def recording(tables: dict[str, tuple[Any, int]], query: str) -> dict[str, Any]:
        queries.append((tables, query))
        return run(tables, query)

    monkeypatch.setattr(store, "live_aggregates", recording)
    return queries


def scans(store: DeltaStore, query: Query) -> int:
    """The Parquet scans in DataFusion's physical plan of ``query``: each a read of a table's files."""
    tables, sql = query
    builder = QueryBuilder()
    for name, (key, version) in tables.items():
        builder = builder.register(name, store.table(key, version))
    plans = pa.RecordBatchReader.from_stream(builder.execute(f"EXPLAIN {sql}")).read_all().to_pylist()
    [physical] = [p["plan"] for p in plans if p["plan_type"] == "physical_plan"]
    return str(physical).count("DataSourceExec")
