"""A snapshot of the asset graph: a renamed table or a changed offset shows up as a reviewed diff.

Regenerate after an intended change with ``UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/test_graph_snapshot.py``
and commit the new ``tests/snapshots/asset_graph.json`` with the change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dagster import (
    MultiPartitionsDefinition,
    MultiToSingleDimensionPartitionMapping,
    StaticPartitionsDefinition,
    TimeWindowPartitionMapping,
    TimeWindowPartitionsDefinition,
)

from warehouse_assets.definitions import defs

SNAPSHOT = Path(__file__).parent / "snapshots" / "asset_graph.json"


def _partitions(pdef: Any) -> dict[str, Any] | list[str] | None:
    if isinstance(pdef, MultiPartitionsDefinition):  # a table with regions: dates × regions
        return {"dimensions": {d.name: _partitions(d.partitions_def) for d in pdef.partitions_defs}}
    if isinstance(pdef, StaticPartitionsDefinition):
        return pdef.get_partition_keys()
    if not isinstance(pdef, TimeWindowPartitionsDefinition):
        return None
    return {
        "cron": pdef.cron_schedule,
        "start": pdef.start.isoformat(),
        "timezone": pdef.timezone,
        "fmt": pdef.fmt,
    }


def _mapping(mapping: Any) -> dict[str, Any]:
    if isinstance(mapping, TimeWindowPartitionMapping):
        return {"type": "TimeWindow", "start_offset": mapping.start_offset, "end_offset": mapping.end_offset}
    if isinstance(mapping, MultiToSingleDimensionPartitionMapping):
        return {"type": "MultiToSingleDimension", "dimension": mapping.partition_dimension_name}
    return {"type": type(mapping).__name__}


def graph_snapshot() -> dict[str, Any]:
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "group": node.group_name,
            "executable": node.is_executable,
            "partitions": _partitions(node.partitions_def),
            "deps": {
                parent.to_user_string(): _mapping(graph.get_partition_mapping(key, parent))
                for parent in sorted(node.parent_keys, key=lambda k: k.to_user_string())
            },
        }
    return {
        "assets": assets,
        "jobs": sorted(j.name for j in defs.jobs or []),
        "sensors": sorted(s.name for s in defs.sensors or []),
        "schedules": sorted(s.name for s in defs.schedules or []),
    }


def test_asset_graph_matches_the_reviewed_snapshot() -> None:
    current = json.dumps(graph_snapshot(), indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(current)
    assert SNAPSHOT.exists(), f"{SNAPSHOT} is missing: create it with UPDATE_SNAPSHOTS=1 and commit it"
    assert current == SNAPSHOT.read_text(), (
        "the asset graph changed: review the diff, then UPDATE_SNAPSHOTS=1 to accept it"
    )
