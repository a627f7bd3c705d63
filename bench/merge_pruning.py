"""Benchmark: does an ODS change batch's cost grow with the table? The same 100,000-change batch applied end to
end to ODS tables of several sizes, pruned and unpruned, with and without deletion vectors.

For each size (default 20M and 100M rows; ``--grow history``, the default: the larger table holds more days at the
same orders per day, 180 and 900 days, as an ODS table's history accumulates; ``--grow density``: the same 180 days,
more orders in each) it builds an ODS ``order``-like Delta table in the product's ODS layout: partitioned by the
local day and hour of ``create_time`` (``dt``, ``hh``, as ``ods.order``), one file per hour as the day's appends
leave it (``--layout daily``: by ``dt`` only). Primary keys are NOT correlated with the partition columns, so file
min/max statistics on ``id`` cannot prune anything. The ops tables hold the history production's do
(``--history-batches`` earlier 5-minute batches recorded by ``record_batch``, default a day). The batch (changes to
orders of the 2 newest days) is written as Canal flat-message segments (one per shard) and every run applies it the
way ``ingest_batch`` does, on a fresh copy of the table and of the ops tables: ``read_lines`` + ``prepare_changes``,
``record_batch`` (the ops tables' commits, the journaled positions) and ``DeltaStore.merge`` (Spark's Delta
``MERGE INTO``, tombstones, the batch number as app transaction).

Modes, interleaved run by run: ``pruned-dv`` (the product: the condition names the batch's partitions, the table
has deletion vectors, turned on as ``warehouse upgrade-lake`` does), ``unpruned-dv`` (no partition predicate) and
``pruned`` (no deletion vectors: the merge rewrites every file holding a changed key). Files scanned, rows copied
and the scan time are Delta's own merge metrics. Per size it prints pruned_s and unpruned_s (end to end), the
unpruned scan's slope in seconds per million rows, and the end-to-end ratio a table of 20 billion rows (a large
company's order table, where partition pruning was reported to make merges 6.7x faster) would give on that slope: a
model, not a measurement. Every mode's merge is checked against the batch's expected outcome and the others' rows
(the bench exits with the difference otherwise). The last line is one ``RESULT`` line, with the machine's ``calib_ms``
and ``calib_spark_ms`` (``bench/calibration.py``, the latter on the bench's own Spark session).

    .venv/bin/python bench/merge_pruning.py                                 # 20M and 100M rows
    .venv/bin/python bench/merge_pruning.py --sizes 2000000,10000000 --partitions 60   # a quick look
    .venv/bin/python bench/merge_pruning.py --quick     # 300,000 rows, a 2,000-change batch, no warm-up: a smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calibration import calib_ms, calib_spark_ms
from resources.delta_lake import DeltaStore, MergeResult
from resources.landing import Landing, Segment, count_window, read_lines, segment_name, stream_dir, stream_name
from resources.spark import engine_label, get_session
from simulator.cdc import LOGICAL_TABLES
from warehouse_assets.catalog import START, Table, load_catalog, periods
from warehouse_assets.ingest.merge import (
    PreparedBatch,
    ods_arrow_schema,
    position_app_id,
    prepare_changes,
    record_batch,
)
from warehouse_assets.ingest.preparation import Engine

KEY = ("ods", "order")
SHARDS = 8
DB = "edu_trade"
STATUSES = ("created", "paid", "cancelled", "refunded")
DAY = 86_400
NEWEST_DAY_SPAN = 16 * 3600  # the newest partition is "today": orders until 16:00, the batch runs at 20:00
BATCH_WINDOW = 300  # a 5-minute micro-batch
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
HOURS = [f"{h:02d}" for h in range(24)]


def log(message: str) -> None:
    print(message, flush=True)


# --- the table's rows, as a pure function of the row number ------------------------------------------------


def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64 of ``x`` (uint64 arithmetic wraps, which is the point)."""
    z = x.astype(np.uint64) + np.uint64((0x9E3779B97F4A7C15 * (salt + 1)) & 0xFFFFFFFFFFFFFFFF)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))) & M64


@dataclasses.dataclass
class Layout:
    """Row ``r`` (0 ≤ r < rows) lives in partition ``p`` (rows of a partition are contiguous and in
    create_time order); its id is ``r + 1`` (correlated) or an affine permutation of it (uncorrelated)."""

    rows: int
    partitions: int  # days
    correlated: bool
    hourly: bool = True  # partitioned by (dt, hh) as the product's ODS tables, or by dt only

    def __post_init__(self) -> None:
        base, extra = divmod(self.rows, self.partitions)
        self.counts = np.array([base + (1 if p < extra else 0) for p in range(self.partitions)], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        tz = ZoneInfo(periods().timezone)
        first = datetime.fromisoformat(START).replace(tzinfo=tz)
        self.days = [(first + timedelta(days=p)).date().isoformat() for p in range(self.partitions)]
        self.day_start = np.array(
            [int((first + timedelta(days=p)).timestamp()) for p in range(self.partitions)], dtype=np.int64
        )
        offset = first.utcoffset()
        assert offset is not None
        self.utc_offset = int(offset.total_seconds())  # assumes a business timezone without DST (the default)
        self.spans = np.full(self.partitions, DAY, dtype=np.int64)
        self.spans[-1] = NEWEST_DAY_SPAN
        # the batch runs at 20:00 of the newest day; every stored change is older
        self.batch_start = int(self.day_start[-1]) + 20 * 3600
        n = self.rows
        a = int(n * 0.6180339887) | 1
        while math.gcd(a, n) != 1:
            a += 2
        self.mult, self.add = a, n // 3

    def ids(self, r: np.ndarray) -> np.ndarray:
        if self.correlated:
            return r + 1
        return (self.mult * r + self.add) % self.rows + 1

    def partition_of(self, r: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, r, side="right") - 1

    def values(self, r: np.ndarray) -> dict[str, np.ndarray]:
        """The stored columns of rows ``r`` as numpy arrays (seconds since the epoch, UTC, for times)."""
        p = self.partition_of(r)
        offset = r - self.starts[p]
        create = self.day_start[p] + (offset * self.spans[p]) // self.counts[p]
        h = [_mix(r, i) for i in range(6)]
        status = np.searchsorted(np.array([15, 88, 96]), (h[0] % np.uint64(100)).astype(np.int64), side="right")
        paid = (status == 1) | (status == 3)
        pay = create + 60 + (h[1] % np.uint64(1800)).astype(np.int64)
        update = np.where(paid, pay, create)
        update = np.where(status == 2, create + 900 + (h[2] % np.uint64(3600)).astype(np.int64), update)
        update = np.where(status == 3, pay + 3600 + (h[2] % np.uint64(7200)).astype(np.int64), update)
        update = np.minimum(update, self.batch_start - 1)
        user = (h[3] % np.uint64(2_000_000)).astype(np.int64) + 1
        return {
            "row": r,
            "partition": p,
            "id": self.ids(r),
            "user_id": user,
            "course_id": (h[4] % np.uint64(5_000)).astype(np.int64) + 1,
            "amount_cents": ((h[5] % np.uint64(2_000)).astype(np.int64) + 1) * 100 - 1,
            "status": status,
            "pay_time": np.where(paid, pay, -1),
            "create_time": create,
            "update_time": update,
        }

    def arrow(self, r: np.ndarray, schema: pa.Schema) -> pa.Table:
        v = self.values(r)
        n = len(r)
        shard = (v["user_id"] % SHARDS).astype(np.int32)
        p = v["partition"]
        cents = v["amount_cents"]
        dec = np.empty((n, 2), dtype=np.int64)
        dec[:, 0], dec[:, 1] = cents, np.where(cents < 0, -1, 0)
        amount = pa.Array.from_buffers(pa.decimal128(10, 2), n, [None, pa.py_buffer(dec.tobytes())])
        ts = pa.timestamp("us", tz="UTC")
        columns = {
            "id": pa.array(v["id"]),
            "user_id": pa.array(v["user_id"]),
            "course_id": pa.array(v["course_id"]),
            "amount": amount,
            "status": _strings(v["status"], STATUSES),
            "pay_time": pa.array(v["pay_time"] * 1_000_000, ts, mask=v["pay_time"] < 0),
            "create_time": pa.array(v["create_time"] * 1_000_000, ts),
            "update_time": pa.array(v["update_time"] * 1_000_000, ts),
            "_es": pa.array(v["update_time"] * 1000),
            "_pos": pa.array(r),
            "_stream": _strings(shard, [f"{DB}.order_{i:02d}" for i in range(SHARDS)]),
            "_deleted": pa.array(np.zeros(n, dtype=bool)),
            "dt": _strings(p - p.min(), self.days[int(p.min()) : int(p.max()) + 1]),
            "hh": _strings((v["create_time"] + self.utc_offset) % DAY // 3600, HOURS),
        }
        return pa.table([columns[f.name] for f in schema], schema=schema)

    @property
    def partition_by(self) -> list[str]:
        return ["dt", "hh"] if self.hourly else ["dt"]


def _strings(indices: np.ndarray, values: Sequence[str]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), pa.array(list(values))).cast(pa.string())


def build_table(
    uri: str, layout: Layout, schema: pa.Schema, files_per_partition: int, chunk_rows: int, label: str
) -> dict[str, Any]:
    """Write the table with ``write_deltalake``: one append per (file slice, group of partitions).

    Pass ``k`` writes the k-th time slice of every partition, so each partition gets ``files_per_partition``
    files, like a partition filled by successive appends during its day.
    """
    started = time.monotonic()
    per_group = max(1, int(chunk_rows * files_per_partition // max(1, int(layout.counts.max()))))
    commits = 0
    written = 0
    for k in range(files_per_partition):
        for first in range(0, layout.partitions, per_group):
            parts = range(first, min(layout.partitions, first + per_group))
            pieces = []
            for p in parts:
                lo = layout.starts[p] + layout.counts[p] * k // files_per_partition
                hi = layout.starts[p] + layout.counts[p] * (k + 1) // files_per_partition
                pieces.append(np.arange(lo, hi, dtype=np.int64))
            rows = np.concatenate(pieces)
            data = layout.arrow(rows, schema)
            write_deltalake(uri, data, partition_by=layout.partition_by, mode="append", target_file_size=1 << 30)
            commits += 1
            written += len(rows)
        log(
            f"  [{label}] slice {k + 1}/{files_per_partition}: {written:,} rows, {commits} commits, "
            f"{time.monotonic() - started:.1f}s"
        )
    dt = DeltaTable(uri)
    dt.create_checkpoint()
    files = len(dt.file_uris())
    size = sum(int(s) for s in pa.table(dt.get_add_actions(flatten=True)).column("size_bytes").to_pylist())
    seconds = time.monotonic() - started
    log(
        f"  [{label}] {written:,} rows, {files} files, {size / 2**20:,.0f} MiB, "
        f"checkpoint at v{dt.version()}, {seconds:.1f}s"
    )
    return {"rows": written, "files": files, "bytes": size, "seconds": seconds}


def clone_table(src: Path, dst: Path) -> None:
    """An identical copy of a table, or of a lake of tables: data files hard-linked (Delta never rewrites them),
    the logs copied (``_last_checkpoint`` is rewritten in place)."""
    for dirpath, _dirs, files in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        in_log = "_delta_log" in rel.parts
        for name in files:
            if in_log:
                shutil.copy2(Path(dirpath) / name, dst / rel / name)
            else:
                os.link(Path(dirpath) / name, dst / rel / name)


# --- change batches as Canal flat messages ------------------------------------------------------------------


@dataclasses.dataclass
class BatchPlan:
    name: str
    partitions: list[int]  # touched partitions (indices); inserts go to the newest
    changes: int
    insert_share: float
    delete_share: float
    followup_share: float  # updates of orders inserted in the same batch (their insert is superseded)


def _fmt_local(seconds: np.ndarray, utc_offset: int) -> list[str]:
    text = np.datetime_as_string((seconds + utc_offset).astype("datetime64[s]"), unit="s")
    return [s.replace("T", " ") for s in text.tolist()]


def _row_images(layout: Layout, v: dict[str, np.ndarray]) -> list[dict[str, str | None]]:
    create = _fmt_local(v["create_time"], layout.utc_offset)
    update = _fmt_local(v["update_time"], layout.utc_offset)
    pay = _fmt_local(np.maximum(v["pay_time"], 0), layout.utc_offset)
    images = []
    for i in range(len(v["id"])):
        cents = int(v["amount_cents"][i])
        images.append(
            {
                "id": str(int(v["id"][i])),
                "user_id": str(int(v["user_id"][i])),
                "course_id": str(int(v["course_id"][i])),
                "amount": f"{cents // 100}.{cents % 100:02d}",
                "status": STATUSES[int(v["status"][i])],
                "pay_time": pay[i] if v["pay_time"][i] >= 0 else None,
                "create_time": create[i],
                "update_time": update[i],
            }
        )
    return images


def _changed(layout: Layout, v: dict[str, np.ndarray], es: np.ndarray) -> dict[str, np.ndarray]:
    """The row after an update at ``es``: created→paid, paid→refunded, cancelled/refunded→amount fixed."""
    new = {k: a.copy() for k, a in v.items()}
    status = v["status"]
    new["status"] = np.select([status == 0, status == 1], [1, 3], status)
    new["pay_time"] = np.where(status == 0, es, v["pay_time"])
    new["amount_cents"] = np.where(status >= 2, np.maximum(v["amount_cents"] - 100, 99), v["amount_cents"])
    new["update_time"] = es
    return new


def generate_batch(layout: Layout, plan: BatchPlan, seed: int) -> tuple[list[tuple[str, int, dict[str, Any]]], dict]:
    """The batch's messages as (physical table, es ms, message) plus the expected outcome."""
    rng = np.random.default_rng(seed)
    n_ins = int(plan.changes * plan.insert_share)
    n_follow = int(plan.changes * plan.followup_share)
    n_del = int(plan.changes * plan.delete_share)
    n_upd = plan.changes - n_ins - n_follow - n_del
    # existing rows of the touched partitions, uniformly
    ranges = [(int(layout.starts[p]), int(layout.counts[p])) for p in plan.partitions]
    total = sum(c for _, c in ranges)
    if n_upd + n_del > total:
        raise SystemExit(
            f"batch {plan.name}: {n_upd + n_del:,} updates/deletes but only {total:,} rows in its partitions; "
            "use more --rows or fewer changes"
        )
    picks = np.sort(rng.choice(total, size=n_upd + n_del, replace=False))
    offsets = np.concatenate([[0], np.cumsum([c for _, c in ranges])])
    which = np.searchsorted(offsets, picks, side="right") - 1
    existing = np.array([ranges[w][0] for w in which], dtype=np.int64) + (picks - offsets[which])
    existing = rng.permutation(existing)
    window = layout.batch_start
    messages: list[tuple[str, int, dict[str, Any]]] = []

    def emit(kind: str, images: list[dict[str, str | None]], olds: list[dict[str, str | None]] | None, es: np.ndarray):
        for i, image in enumerate(images):
            table = f"order_{int(image['user_id'] or 0) % SHARDS:02d}"  # type: ignore[arg-type]
            messages.append(
                (table, int(es[i]), {"type": kind, "data": [image], "old": None if olds is None else [olds[i]]})
            )

    # updates and deletes of stored rows
    old_v = layout.values(existing)
    es_s = window + rng.integers(0, BATCH_WINDOW, size=len(existing))
    upd = {k: a[:n_upd] for k, a in old_v.items()}
    new_v = _changed(layout, upd, es_s[:n_upd])
    before, after = _row_images(layout, upd), _row_images(layout, new_v)
    olds = [
        {k: b[k] for k in ("status", "pay_time", "amount", "update_time") if b[k] != a[k]}
        for b, a in zip(before, after, strict=True)
    ]
    emit("UPDATE", after, olds, es_s[:n_upd] * 1000 + rng.integers(0, 1000, size=n_upd))
    dele = {k: a[n_upd:] for k, a in old_v.items()}
    emit("DELETE", _row_images(layout, dele), None, es_s[n_upd:] * 1000 + rng.integers(0, 1000, size=n_del))
    # inserts of new orders (ids above every stored id), created during the window: the newest partition
    fresh = np.arange(layout.rows, layout.rows + n_ins, dtype=np.int64)
    ins = layout.values(fresh % layout.rows)
    ins_es = window + np.sort(rng.integers(0, BATCH_WINDOW - 60, size=n_ins))
    ins["id"] = fresh + 1
    ins["row"] = fresh
    ins["partition"] = np.full(n_ins, layout.partitions - 1)
    ins["create_time"] = ins_es
    ins["update_time"] = ins_es
    ins["status"] = np.zeros(n_ins, dtype=np.int64)
    ins["pay_time"] = np.full(n_ins, -1)
    emit("INSERT", _row_images(layout, ins), None, ins_es * 1000)
    # some of them are paid within the same window: the insert is superseded by the update
    follow = {k: a[:n_follow] for k, a in ins.items()}
    paid_at = follow["create_time"] + rng.integers(1, 60, size=n_follow)
    paid = _changed(layout, follow, paid_at)
    olds = [
        {"status": "created", "pay_time": None, "update_time": b["update_time"]} for b in _row_images(layout, follow)
    ]
    emit("UPDATE", _row_images(layout, paid), olds, paid_at * 1000 + 500)
    expected = {
        "changes": plan.changes,
        "applied": plan.changes - n_follow,
        "superseded": n_follow,
        "inserted": n_ins,
        "updated": n_upd + n_del,
        "touched_partitions": sorted({layout.days[p] for p in [*plan.partitions, layout.partitions - 1]}),
        # the Delta partitions the batch's rows fall in: (dt,) or (dt, hh) of their creation time
        "touched_keys": sorted(
            set(_partition_keys(layout, old_v["partition"], old_v["create_time"]))
            | set(_partition_keys(layout, ins["partition"], ins["create_time"]))
        ),
    }
    return messages, expected


def _partition_keys(layout: Layout, partition: np.ndarray, create: np.ndarray) -> list[tuple[str, ...]]:
    days = [layout.days[int(p)] for p in partition]
    if not layout.hourly:
        return [(d,) for d in days]
    hours = ((create + layout.utc_offset) % DAY // 3600).tolist()
    return [(d, HOURS[int(h)]) for d, h in zip(days, hours, strict=True)]


def write_segments(root: Path, layout: Layout, messages: list[tuple[str, int, dict[str, Any]]], seq: int) -> Landing:
    """One segment per shard (number ``seq``) holding the window's messages in binlog order, as Canal writes them."""
    mysql_type = LOGICAL_TABLES["order"].mysql_types()
    sql_type = {c.name: c.sql_type for c in LOGICAL_TABLES["order"].columns}
    start = datetime.fromtimestamp(layout.batch_start, ZoneInfo(periods().timezone))
    by_shard: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for table, es, message in messages:
        by_shard.setdefault(table, []).append((es, message))
    for table, items in by_shard.items():
        items.sort(key=lambda item: item[0])
        lines = []
        for i, (es, m) in enumerate(items, start=1):
            obj = {
                "data": m["data"],
                "database": DB,
                "es": es,
                "id": i,
                "isDdl": False,
                "mysqlType": mysql_type,
                "old": m["old"],
                "pkNames": ["id"],
                "sql": "",
                "sqlType": sql_type,
                "table": table,
                "ts": es + 20,
                "type": m["type"],
            }
            lines.append(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
        directory = stream_dir(root, DB, table)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / segment_name(seq, start)).write_text("\n".join(lines) + "\n")
    return Landing(root, periods().timezone)


# --- preparing and merging a batch the way the ODS ingestion does -------------------------------------------


def bench_schema(table: Table, layout: Layout) -> pa.Schema:
    """The ODS row of ``table``: the product's, without ``hh`` when the table is partitioned by ``dt`` only."""
    return pa.schema([f for f in ods_arrow_schema(table) if layout.hourly or f.name != "hh"])


@dataclasses.dataclass
class Prepared:
    batch: pa.Table  # one row per key, the ODS row plus _op: what DeltaStore.merge receives
    moved_out: pa.Table  # the partitions moved keys left (none in these batches)
    positions: dict[str, int]  # stream → last segment: the app transactions committed with the merge
    counts: dict[str, int]  # records per status
    quarantined: int
    seconds: float  # read_lines + prepare_changes
    engine: str
    product: PreparedBatch  # what ingest_batch records before its merge


def segments_of(landing: Landing, table: Table, after_seq: int) -> list[Segment]:
    """The batch's segments: those after the ``after_seq`` the ops history committed, as the sensor lists them."""
    assert table.source_database and table.source_tables
    streams = landing.streams(table.source_database, table.source_tables)
    segments = [s for stream in streams for s in landing.segments(stream, after_seq)]
    if not segments:
        raise SystemExit(f"no segment after {after_seq} in {landing.root}: the batch would apply nothing")
    return segments


def prepare(
    spark: Any, store: DeltaStore, table: Table, schema: pa.Schema, segments: Sequence[Segment], engine: Engine
) -> Prepared:
    """What ``ingest_batch`` does before its merge: read the segments and ``prepare_changes`` (parse, validate,
    type, dedupe against the changes the lake recorded, classify, project to ODS rows)."""
    started = time.monotonic()
    positions: dict[str, int] = {}
    for segment in segments:
        positions[segment.stream] = max(positions.get(segment.stream, 0), segment.seq)
    lines = read_lines(segments)
    prepared = prepare_changes(spark, store, table, lines, list(positions), tz=periods().timezone, engine=engine)
    seconds = time.monotonic() - started
    # the bench's schema: without ``hh`` when the table is partitioned by day only
    target = pa.schema([*schema, pa.field("_op", pa.string())])
    return Prepared(
        prepared.applied.select(target.names).cast(target),
        prepared.moved_out.select(target.names).cast(target),
        positions,
        prepared.counts,
        prepared.quarantined.num_rows,
        seconds,
        prepared.engine,
        prepared,
    )


def merge_args(
    table: Table, prepared: Prepared, prune: bool, txn: tuple[str, int], partition_by: Sequence[str]
) -> dict[str, Any]:
    """The arguments ``ingest_batch`` gives ``DeltaStore.merge`` for an ODS batch."""
    return {
        "primary_key": table.primary_key,
        "partition_by": list(partition_by),
        "app_transaction": txn,
        "prune": prune,
        "tombstone_column": "_deleted",
        "moved_out": prepared.moved_out,
    }


def ingest(
    spark: Any,
    store: RecordingStore,
    table: Table,
    schema: pa.Schema,
    segments: Sequence[Segment],
    prune: bool,
    engine: Engine,
) -> tuple[Prepared, MergeResult, float]:
    """One batch end to end as ``ingest_batch`` runs it: prepare, record (quarantine, changes, counts, positions:
    the ops tables' commits), then the merge that commits the batch number. Returns the wall time of all three."""
    started = time.monotonic()
    prepared = prepare(spark, store, table, schema, segments, engine)
    txn = record_batch(store, table, prepared.product, segments, prepared.positions)
    partition_by = [c for c in ("dt", "hh") if c in schema.names]  # the bench table's layout
    result = store.merge(spark, KEY, prepared.batch, **merge_args(table, prepared, prune, txn, partition_by))
    return prepared, result, time.monotonic() - started


def _rchar(pid: int | None = None) -> int:
    """Bytes a process (the Spark JVM, which reads the table) has read through read(2)/pread(2) so far (Linux;
    page-cache hits included)."""
    try:
        with open(f"/proc/{pid or 'self'}/io") as handle:
            for line in handle:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _jvm_pid(spark: Any) -> int | None:
    """The local Spark JVM's process id: pyspark starts it with ``spark-submit``, which execs java in place."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    return getattr(proc, "pid", None)


class RecordingStore(DeltaStore):
    """The product's store, also noting how many bytes the Spark JVM read during its last merge."""

    read_bytes: int = 0

    def merge(self, spark: Any, key: Sequence[str] | str, batch: pa.Table, **kwargs: Any) -> MergeResult:  # type: ignore[override]
        pid = _jvm_pid(spark)
        before = _rchar(pid)
        result = self._merge(spark, key, batch, **kwargs)
        self.read_bytes = _rchar(pid) - before
        return result

    def _merge(self, spark: Any, key: Sequence[str] | str, batch: pa.Table, **kwargs: Any) -> MergeResult:
        return DeltaStore.merge(self, spark, key, batch, **kwargs)


# --- one batch, pruned and unpruned -------------------------------------------------------------------------


@dataclasses.dataclass
class MergeRun:
    seconds: float  # DeltaStore.merge, as the product measures it
    metrics: dict[str, Any]
    read_bytes: int


@dataclasses.dataclass
class ModeResult:
    mode: str
    scope_files: int
    scope_bytes: int
    merges: list[MergeRun] = dataclasses.field(default_factory=list)
    prepares: list[float] = dataclasses.field(default_factory=list)  # read_lines + prepare_changes, per run
    end_to_end: list[float] = dataclasses.field(default_factory=list)  # prepare + record + merge, per run

    @property
    def files_scanned(self) -> int | str:
        """Files the merge scanned after data skipping, as Delta's MERGE reported it (the first run's)."""
        return self.merges[0].metrics.get("num_target_files_scanned", "not reported")

    @property
    def merge_s(self) -> float:
        return statistics.median(m.seconds for m in self.merges)

    @property
    def best_s(self) -> float:
        return min(m.seconds for m in self.merges)

    @property
    def prepare_s(self) -> float:
        return statistics.median(self.prepares)

    @property
    def end_to_end_s(self) -> float:
        return statistics.median(self.end_to_end)

    def lines(self, table_files: int) -> list[str]:
        m = self.merges[0].metrics
        times = " ".join(f"{r.seconds:.2f}" for r in self.merges)
        read = statistics.median(r.read_bytes for r in self.merges)
        return [
            f"  merge {self.mode:<8} {self.merge_s:7.2f}s  (median of {len(self.merges)}: {times}; first run: "
            f"Spark's merge {m['execution_time_ms'] / 1000:.2f}s, of which scan+join {m['scan_time_ms'] / 1000:.2f}s"
            f" and rewrite {m['rewrite_time_ms'] / 1000:.2f}s)",
            f"    Delta's MERGE scanned {self.files_scanned} file(s) in {m.get('num_target_partitions_scanned', '?')} "
            f"partition(s) of {m.get('num_target_files_in_table', '?')} (the batch's partitions hold "
            f"{self.scope_files} files, {self.scope_bytes / 2**20:,.0f} MiB; the Spark JVM read "
            f"{read / 2**20:,.0f} MiB during the merge, "
            f"page cache included); files rewritten: removed {m['num_target_files_removed']}, added "
            f"{m['num_target_files_added']}, deletion vectors added {m.get('num_target_deletion_vectors_added', 0)}",
            f"    rows: source {m['num_source_rows']:,}, inserted {m['num_target_rows_inserted']:,}, updated "
            f"{m['num_target_rows_updated']:,}, copied {m['num_target_rows_copied']:,}",
        ]


def fresh_lake(base: Path, lake: Path, kind: type[RecordingStore] = RecordingStore) -> RecordingStore:
    """A copy of the base lake: the ODS table and the ops tables with their history."""
    if lake.exists():
        shutil.rmtree(lake)
    clone_table(base, lake)
    return kind(str(lake))


# --- the ops tables' history: what a batch's dedupe and positions read in production -------------------------


def build_ops_history(lake: Path, table: Table, layout: Layout, batches: int, changes: int, seed: int) -> float:
    """``batches`` earlier 5-minute batches recorded in ``lake`` as the ingestion records them (``record_batch``:
    the changes taken in, the ingested counts and the journaled positions, then the ODS table's commit of the
    batch number), ending where the bench's batch starts, each with ``changes`` change hashes across the shards.
    The bench's batch then reads what production reads before its merge: the recorded changes of its binlog hours
    (the last dozen batches share them) and the committed positions. Returns the seconds it took."""
    started = time.monotonic()
    store = DeltaStore(str(lake))
    rng = np.random.default_rng(seed)
    tz = ZoneInfo(periods().timezone)
    streams = [stream_name(DB, f"order_{i:02d}") for i in range(SHARDS)]
    empty = pa.table({})
    for k in range(1, batches + 1):
        at = datetime.fromtimestamp(layout.batch_start - (batches - k + 1) * BATCH_WINDOW, tz)
        hour = f"{at:%Y-%m-%dT%H}"
        stream = pa.array([streams[i % SHARDS] for i in range(changes)], pa.string())
        hashes = rng.integers(0, 2**63 - 1, size=(changes, 2), dtype=np.int64)
        recorded = pa.table(
            {
                "table": pa.array([table.fqn] * changes, pa.string()),
                "stream": stream,
                "hour": pa.array([hour] * changes, pa.string()),
                "change": pa.array([f"{a:016x}{b:016x}" for a, b in hashes.tolist()], pa.string()),
                "seq": pa.array([k] * changes, pa.int64()),
                "window": pa.array([count_window(at)] * changes, pa.string()),  # what the source counts by
            }
        )
        prepared = PreparedBatch(empty, empty, empty, empty, recorded, {}, [], [])
        app_id, version = record_batch(store, table, prepared, [], dict.fromkeys(streams, k))
        store.commit_app_transactions(KEY, {app_id: version})
        if k % 48 == 0 or k == batches:
            log(f"  ops history: {k}/{batches} batches recorded, {time.monotonic() - started:.0f}s")
    return time.monotonic() - started


def partition_files(base: Path) -> dict[tuple[str, ...], tuple[int, int]]:
    """Live files and bytes per Delta partition of a table: (dt,) or (dt, hh)."""
    dt = DeltaTable(str(base))
    actions = pa.table(dt.get_add_actions(flatten=True))
    columns = [actions.column(f"partition.{c}").to_pylist() for c in dt.metadata().partition_columns]
    out: dict[tuple[str, ...], tuple[int, int]] = {}
    for key, size in zip(zip(*columns, strict=True), actions.column("size_bytes").to_pylist(), strict=True):
        files, total = out.get(key, (0, 0))
        out[key] = (files + 1, total + int(size))
    return out


def snapshot(lake: Path, days: Sequence[str]) -> pa.Table:
    """The touched partitions' rows (the columns a merge changes), sorted: to compare merge results."""
    columns = ["id", "status", "amount", "pay_time", "update_time", "_es", "_pos", "_deleted", "dt"]
    # the product's reader without a JVM: it applies deletion vectors
    data, _ = DeltaStore(str(lake)).read_rows(KEY, [{"dt": d} for d in days], columns=columns)
    return data.sort_by([("id", "ascending")])


def check(prepared: Prepared, result: MergeResult, lake: Path, expected: dict[str, Any], label: str) -> None:
    m = result.metrics
    got = {
        "changes": sum(prepared.counts.values()),
        "applied": prepared.counts.get("ok", 0),
        "superseded": prepared.counts.get("superseded", 0),
        "quarantined": prepared.quarantined,
        "inserted": m.get("num_target_rows_inserted"),
        "updated": m.get("num_target_rows_updated"),
    }
    want = {k: expected.get(k, 0) for k in got}
    if got != want:
        raise SystemExit(f"batch {label}: expected {want}, got {got}")
    dt = DeltaTable(str(lake / KEY[0] / KEY[1]))
    if dt.transaction_version(position_app_id(load_catalog()["ods.order"])) != expected["batch_number"]:
        raise SystemExit(f"batch {label}: the batch number was not committed with the merge")


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    prune: bool  # the merge condition names the batch's partitions
    deletion_vectors: bool  # the table has delta.enableDeletionVectors=true (the product's ODS tables)
    runs: int


def scenario(
    spark: Any,
    table: Table,
    schema: pa.Schema,
    workdir: Path,
    base: Path,
    layout: Layout,
    plan: BatchPlan,
    label: str,
    seed: int,
    modes: Sequence[Mode],
    engine: Engine = "auto",
    compare_spark: bool = False,
    history: int = 0,
) -> dict[str, Any]:
    kind = "correlated" if layout.correlated else "uncorrelated"
    first, last = layout.days[plan.partitions[0]], layout.days[plan.partitions[-1]]
    log(
        f"\n== batch {label}: {plan.changes:,} changes over {len(plan.partitions)} partitions "
        f"({first} .. {last}), {kind} keys"
    )
    started = time.monotonic()
    messages, expected = generate_batch(layout, plan, seed)
    expected["batch_number"] = history + 1  # the next batch after the ops tables' history
    landing = write_segments(workdir / "landing" / label, layout, messages, history + 1)
    log(
        f"  generated {len(messages):,} Canal flat messages in {SHARDS} shard segments "
        f"({time.monotonic() - started:.1f}s)"
    )
    per_partition = partition_files(base / KEY[0] / KEY[1])
    touched = expected["touched_partitions"]  # days
    table_files = sum(f for f, _ in per_partition.values())
    keys = [k for k in expected["touched_keys"] if k in per_partition]  # an hour with no order yet has no files
    pruned_scope = (sum(per_partition[k][0] for k in keys), sum(per_partition[k][1] for k in keys))
    whole = (table_files, sum(b for _, b in per_partition.values()))
    results = {m.name: ModeResult(m.name, *(pruned_scope if m.prune else whole)) for m in modes}
    snapshots: dict[str, pa.Table] = {}
    prepared: Prepared | None = None
    segments = segments_of(landing, table, history)
    # every run is the whole batch as ingest_batch runs it (prepare, record, merge) on a fresh copy of the table
    # and of the ops tables, the modes interleaved so that all see the same machine
    for _ in range(max(m.runs for m in modes)):
        for mode in modes:
            outcome = results[mode.name]
            if len(outcome.merges) >= mode.runs:
                continue
            lake = workdir / "lakes" / f"{label}-{mode.name}"
            store = fresh_lake(base, lake)
            if mode.deletion_vectors:  # as `warehouse upgrade-lake` does it, not timed
                store.enable_deletion_vectors(spark, KEY)
            prepared, result, seconds = ingest(spark, store, table, schema, segments, mode.prune, engine)
            outcome.merges.append(MergeRun(result.duration_s, result.metrics, store.read_bytes))
            outcome.prepares.append(prepared.seconds)
            outcome.end_to_end.append(seconds)
            if mode.name not in snapshots:
                check(prepared, result, lake, expected, label)
                snapshots[mode.name] = snapshot(lake, touched)
            shutil.rmtree(lake)
    reference = snapshots[modes[0].name]
    for name, taken in snapshots.items():
        if not taken.equals(reference):
            raise SystemExit(f"batch {label}: the {name} merge left other rows than the {modes[0].name} one")
    assert prepared is not None
    counts = prepared.counts
    prepares = " ".join(f"{t:.2f}" for r in results.values() for t in r.prepares)
    log(
        f"  prepare ({prepared.engine}: read_lines + prepare_changes): median "
        f"{statistics.median(t for r in results.values() for t in r.prepares):.2f}s (all runs {prepares}); records "
        f"in {sum(counts.values()):,}: ok {counts.get('ok', 0):,}, superseded {counts.get('superseded', 0):,}, "
        f"quarantined {prepared.quarantined}"
    )
    spark_prepare_s = None
    if compare_spark:
        lake = workdir / "lakes" / f"{label}-spark-prepare"
        on_spark = prepare(spark, fresh_lake(base, lake), table, schema, segments, "spark")
        shutil.rmtree(lake)
        if on_spark.counts != counts or not on_spark.batch.sort_by("id").equals(prepared.batch.sort_by("id")):
            raise SystemExit(f"batch {label}: the Spark preparation classified the batch otherwise")
        spark_prepare_s = on_spark.seconds
        log(f"  the same batch prepared on Spark ({on_spark.engine}, one run): {spark_prepare_s:.2f}s, same rows")
    for outcome in results.values():
        for line in outcome.lines(table_files):
            log(line)
        log(f"    end to end {outcome.end_to_end_s:.2f}s [{' '.join(f'{t:.2f}' for t in outcome.end_to_end)}]")
    log(f"  check: every merge left identical rows in the {len(touched)} touched days, positions committed")
    return {"modes": results, "spark_prepare_s": spark_prepare_s, "expected": expected, "table_files": table_files}


def warm_up(
    spark: Any, table: Table, schema: pa.Schema, workdir: Path, base: Path, layout: Layout, history: int
) -> None:
    """A batch through the whole path first, so JVM start-up, JIT and code generation are not timed."""
    started = time.monotonic()
    changes = min(100_000, int(layout.counts[-1]) // 2)
    plan = BatchPlan("warm-up", [layout.partitions - 1], changes, 0.4, 0.05, 0.05)
    messages, _ = generate_batch(layout, plan, seed=7)
    landing = write_segments(workdir / "landing" / "warm-up", layout, messages, history + 1)
    lake = workdir / "lakes" / "warm-up"
    segments = segments_of(landing, table, history)
    ingest(spark, fresh_lake(base, lake), table, schema, segments, True, "auto")
    shutil.rmtree(lake)
    log(f"warm-up batch ({changes:,} changes, not timed): {time.monotonic() - started:.1f}s")


def _millions(rows: int) -> str:
    return f"{rows / 1e6:g}m"


LARGE_TABLE_ROWS = 20_000_000_000  # a large company's order table, where pruning was reported to give 6.7x


def size_figures(rows: int, a: dict[str, Any]) -> dict[str, Any]:
    """One size's figures: the product's batch (deletion vectors, pruned) end to end and what it is made of, the
    same unpruned, the unpruned scan's slope, and the ratio that slope models for a table of 20 billion rows."""
    modes = a["modes"]
    pruned, unpruned, rewriting = modes["pruned-dv"], modes["unpruned-dv"], modes["pruned"]
    scan_s = statistics.median(r.metrics["scan_time_ms"] for r in unpruned.merges) / 1000
    slope = scan_s / (rows / 1e6)  # seconds of unpruned scan per million rows
    # the model: the pruned batch stays as measured (its growth is measured between sizes), the unpruned one grows
    # by its scan's slope up to 20 billion rows
    modelled = (unpruned.end_to_end_s + slope * (LARGE_TABLE_ROWS - rows) / 1e6) / pruned.end_to_end_s
    record_s = statistics.median(
        e - p - m.seconds for e, p, m in zip(pruned.end_to_end, pruned.prepares, pruned.merges, strict=True)
    )
    return {
        "pruned_s": round(pruned.end_to_end_s, 2),
        "unpruned_s": round(unpruned.end_to_end_s, 2),
        "e2e_ratio": round(unpruned.end_to_end_s / pruned.end_to_end_s, 2),
        "prepare_s": round(pruned.prepare_s, 2),
        "record_s": round(record_s, 2),
        "merge_dv_s": round(pruned.merge_s, 2),
        "merge_rewrite_s": round(rewriting.merge_s, 2),
        "merge_unpruned_dv_s": round(unpruned.merge_s, 2),
        "dv_merge_speedup": round(rewriting.merge_s / pruned.merge_s, 2),
        "rows_copied_dv": pruned.merges[0].metrics["num_target_rows_copied"],
        "rows_copied_rewrite": rewriting.merges[0].metrics["num_target_rows_copied"],
        "files_scanned": pruned.files_scanned,
        "files_scanned_unpruned": unpruned.files_scanned,
        "files": a["table_files"],
        "unpruned_scan_s": round(scan_s, 2),
        "slope_s_per_mrows": round(slope, 4),
        "model_ratio_20b": round(modelled, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes", default="20000000,100000000", help="table sizes in rows, comma-separated, smallest first"
    )
    parser.add_argument("--partitions", type=int, default=180, help="days of orders in the table of the smallest size")
    parser.add_argument(
        "--grow",
        choices=["history", "density"],
        default="history",
        help="history: a larger table holds more days at the smallest size's orders per day (an ODS table grows "
        "as its history accumulates; the batch's days are alike at every size); density: the same days, more "
        "orders in each (the batch's partitions grow with the table)",
    )
    parser.add_argument(
        "--layout",
        choices=["product", "daily"],
        default="product",
        help="product: partitioned by (dt, hh) as the ODS tables are; daily: by dt only",
    )
    parser.add_argument(
        "--files-per-partition",
        type=int,
        default=4,
        help="appends per day while building (each hour's rows land in one of them: one file per hour, or "
        "this many files per day with --layout daily)",
    )
    parser.add_argument("--batch-a", type=int, default=100_000, help="changes in the batch: the 2 newest partitions")
    parser.add_argument(
        "--history-batches",
        type=int,
        default=288,
        help="earlier 5-minute batches recorded in the ops tables before the timed one (default a day: 288)",
    )
    parser.add_argument(
        "--history-changes", type=int, default=None, help="changes per history batch (default: the batch / 12)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of each pruned mode (the median is reported)")
    parser.add_argument("--repeat-unpruned", type=int, default=3, help="unpruned runs (the median is reported)")
    parser.add_argument("--chunk-rows", type=int, default=2_000_000, help="rows generated per write while building")
    parser.add_argument("--workdir", type=Path, default=None, help="where to build (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--seed", type=int, default=20260629)
    parser.add_argument(
        "--engine",
        choices=["auto", "in-process", "spark"],
        default="auto",
        help="where batches are prepared (default: the product's choice, in process at this size)",
    )
    parser.add_argument(
        "--no-spark-prepare", action="store_true", help="skip preparing the batch once on Spark for comparison"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="300,000 rows over 4 days, a batch of 2,000 changes after 12, each mode once, no untimed warm-up",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.partitions, args.batch_a, args.history_batches = "300000", 4, 2_000, 12
        args.repeat = args.repeat_unpruned = 1
    calib = calib_ms()
    sizes = [int(v) for v in args.sizes.split(",")]
    if args.partitions < 2 or min(args.repeat, args.repeat_unpruned) < 1 or sizes != sorted(sizes):
        parser.error("--partitions must be at least 2, repeats at least 1, --sizes in increasing order")

    t0 = time.monotonic()
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="merge-pruning-")) if temporary else args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    spread = "growing by history from" if args.grow == "history" else "over"
    log(
        f"merge bench: the same {args.batch_a:,}-change batch on tables of {', '.join(map(_millions, sizes))} rows "
        f"{spread} {args.partitions} days, partitioned by {'dt, hh' if args.layout == 'product' else 'dt'}, "
        f"workdir {workdir}"
    )
    modes = [
        Mode("pruned-dv", prune=True, deletion_vectors=True, runs=args.repeat),  # the product
        Mode("unpruned-dv", prune=False, deletion_vectors=True, runs=args.repeat_unpruned),
        Mode("pruned", prune=True, deletion_vectors=False, runs=args.repeat),  # the files rewritten
    ]
    try:
        table = load_catalog()["ods.order"]
        hourly = args.layout == "product"
        spark = None
        per_size: dict[int, dict[str, Any]] = {}
        for rows in sizes:
            days = args.partitions if args.grow == "density" else round(args.partitions * rows / sizes[0])
            layout = Layout(rows, days, correlated=False, hourly=hourly)
            schema = bench_schema(table, layout)
            size_dir = workdir / _millions(rows)
            log(f"\n=== {rows:,} rows over {days} days: building the table ...")
            build = build_table(
                str(size_dir / "base"), layout, schema, args.files_per_partition, args.chunk_rows, _millions(rows)
            )
            history_changes = args.history_changes or max(1, args.batch_a // 12)
            log(f"recording the ops tables' history: {args.history_batches} batches of {history_changes:,} changes")
            lake = size_dir / "history"
            clone_table(size_dir / "base", lake / KEY[0] / KEY[1])
            build["history_s"] = build_ops_history(
                lake, table, layout, args.history_batches, history_changes, args.seed
            )
            shutil.rmtree(size_dir / "base")
            if spark is None:
                started = time.monotonic()
                spark = get_session()
                log(f"Spark session (local): {time.monotonic() - started:.1f}s")
                if not args.quick:  # the quick run's times are not figures: its JIT may as well be in them
                    warm_up(spark, table, schema, size_dir, lake, layout, args.history_batches)
                calib_spark = calib_spark_ms(spark)
            plan = BatchPlan("a", [days - 2, days - 1], args.batch_a, 0.40, 0.05, 0.05)
            a = scenario(
                spark,
                table,
                schema,
                size_dir,
                lake,
                layout,
                plan,
                label=_millions(rows),
                seed=args.seed,
                modes=modes,
                engine=args.engine,
                compare_spark=rows == sizes[0] and not args.no_spark_prepare,
                history=args.history_batches,
            )
            figures = size_figures(rows, a)
            figures["build_s"] = round(build["seconds"], 1)
            if a["spark_prepare_s"] is not None:
                figures["spark_prepare_s"] = round(a["spark_prepare_s"], 2)
            per_size[rows] = figures
            log(f"SIZE rows={rows} " + " ".join(f"{k}={v}" for k, v in figures.items()))
            shutil.rmtree(size_dir, ignore_errors=True)
        assert spark is not None
        smallest, largest = per_size[sizes[0]], per_size[sizes[-1]]
        fields: dict[str, Any] = {
            "engine": engine_label(spark),
            "sizes": ",".join(_millions(r) for r in sizes),
            "batch_changes": args.batch_a,
            "grow": args.grow,
            "dv_merge_speedup": smallest["dv_merge_speedup"],  # at the smallest size (the target's 20M)
            "pruned_growth": round(largest["pruned_s"] / smallest["pruned_s"] - 1, 3),
            f"e2e_ratio_{_millions(sizes[-1])}": largest["e2e_ratio"],
        }
        if len(sizes) > 1:  # the scan's growth between sizes, free of its fixed cost (what a per-size slope includes)
            growth = (largest["unpruned_scan_s"] - smallest["unpruned_scan_s"]) / ((sizes[-1] - sizes[0]) / 1e6)
            fields["slope_between_sizes_s_per_mrows"] = round(growth, 4)
            fields["model_ratio_20b"] = round(
                (largest["unpruned_s"] + growth * (LARGE_TABLE_ROWS - sizes[-1]) / 1e6) / largest["pruned_s"], 1
            )
        for rows, figures in per_size.items():
            for name in ("pruned_s", "unpruned_s", "merge_dv_s", "merge_rewrite_s", "slope_s_per_mrows"):
                fields[f"{name}_{_millions(rows)}"] = figures[name]
            fields[f"model_ratio_20b_from_{_millions(rows)}"] = figures["model_ratio_20b"]
        fields["total_s"] = round(time.monotonic() - t0, 1)
        fields["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)
        fields["calib_ms"], fields["calib_spark_ms"] = calib, calib_spark
        log("\nRESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))
    finally:
        if temporary and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
