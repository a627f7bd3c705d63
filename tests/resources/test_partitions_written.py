"""Which partitions the commits after a version changed, read from the Delta log: what every reporter of ODS hours
asks on each tick to find late changes nobody reported."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from resources.delta_lake import DeltaStore

KEY = ("ods", "events")


def _append(store: DeltaStore, dt: str, n: int = 2) -> int:
    rows = pa.table({"id": pa.array(range(n), pa.int64()), "dt": pa.array([dt] * n, pa.string())})
    return store.append(KEY, rows, ["dt"])


def test_the_commits_after_a_version_name_the_partitions_they_changed_and_a_later_commit_is_seen(
    tmp_path: Path,
) -> None:
    store = DeltaStore(str(tmp_path / "lake"))
    assert store.partitions_written(KEY, after=-1) == []  # no table yet
    first = _append(store, "2026-03-01")
    _append(store, "2026-03-02")
    _append(store, "2026-03-03")
    assert store.partitions_written(KEY, after=first) == [{"dt": "2026-03-02"}, {"dt": "2026-03-03"}]
    latest = store.version(KEY)
    assert latest is not None
    assert store.partitions_written(KEY, after=latest) == []
    # the entry probed and not found a moment ago is read once it is committed
    _append(store, "2026-03-01")
    assert store.partitions_written(KEY, after=latest) == [{"dt": "2026-03-01"}]


def test_each_partition_written_comes_with_the_time_of_the_latest_commit_that_changed_it(tmp_path: Path) -> None:
    store = DeltaStore(str(tmp_path / "lake"))
    first = _append(store, "2026-03-01")
    start = time.time()
    _append(store, "2026-03-01")
    _append(store, "2026-03-02")
    time.sleep(0.01)  # commit times are in milliseconds
    middle = time.time()
    time.sleep(0.01)
    _append(store, "2026-03-01")
    end = time.time()
    written = store.partitions_written_at(KEY, after=first)
    assert (
        [p for p, _ in written]
        == store.partitions_written(KEY, after=first)
        == [
            {"dt": "2026-03-01"},
            {"dt": "2026-03-02"},
        ]
    )
    times = {p["dt"]: at for p, at in written}
    assert times["2026-03-02"] is not None and start - 0.001 <= times["2026-03-02"] <= middle
    assert times["2026-03-01"] is not None and middle <= times["2026-03-01"] <= end + 0.001


def test_a_compaction_changes_no_row_and_entries_cleaned_up_past_a_checkpoint_are_passed_over(
    tmp_path: Path,
) -> None:
    store = DeltaStore(str(tmp_path / "lake"))
    for day in ("2026-03-01", "2026-03-01", "2026-03-02"):
        _append(store, day)
    compacted = store.optimize(KEY)["delta_version"]
    assert store.partitions_written(KEY, after=compacted - 1) == []  # a rewrite changes no row
    _append(store, "2026-03-04")
    dt = DeltaTable(store.table_uri(KEY))
    dt.create_checkpoint()
    log = Path(store.table_uri(KEY)) / "_delta_log"
    for version in (1, 2):  # what log clean-up removes: entries older than the checkpoint
        (log / f"{version:020d}.json").unlink()
    # the entries after version 0 are gone from version 1 on: the table is opened, the rest read
    assert store.partitions_written(KEY, after=0) == [{"dt": "2026-03-04"}]
