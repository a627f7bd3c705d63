"""The predicted finishes the product gave, kept so that they can be scored against what happened.

The ``sla_forecast`` sensor's ticks and ``warehouse why`` record each prediction they make: when it was made, by
which of them, for which partition, the finish it predicted, the pessimistic finish its SLA warning reads when an
overdue source starts its critical path (:attr:`~warehouse_assets.explain.eta.Prediction.latest`), the partition's
SLA deadline (if it has one) and the critical path. ``warehouse eta --accuracy``
(:mod:`warehouse_assets.explain.accuracy`) compares them with the finishes Dagster's event log holds.

The rows live in the dependency center's SQLite file (``$DAGSTER_HOME/storage/partition_states.db``, beside the
center's own tables), on every instance storage, so they survive a restart of any process. Dagster's own storage has
no place that fits: an observation per prediction would grow the event log the center reads by one event per
partition per tick, forever, and the instance's key-value store holds values, not rows to prune. The writes are
kept cheap and bounded:

* at most one row per partition per tick, and a prediction equal to the partition's last row (within
  :data:`MOVED_S`) made less than :data:`REFRESH_S` after it is not written again: a stable prediction costs a row
  every 10 minutes, which still leaves one inside each horizon the scoring reads;
* rows older than :data:`RETAIN` are deleted on each write.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster import DagsterInstance

    from warehouse_assets.explain.eta import Prediction

FORECAST, WHY = "forecast", "why"  # who made a prediction
SOURCES = (FORECAST, WHY)
RETAIN = timedelta(days=14)  # rows older than this are pruned
REFRESH_S = 600.0  # an unchanged prediction is written again after this long
MOVED_S = 30.0  # a prediction this far from the partition's last row is a new one

_SCHEMA = """
CREATE TABLE IF NOT EXISTS eta_predictions (table_fqn TEXT NOT NULL, partition TEXT NOT NULL, made_at REAL NOT NULL,
    source TEXT NOT NULL, finish REAL NOT NULL, deadline REAL, path TEXT NOT NULL,
    PRIMARY KEY (table_fqn, partition, source, made_at)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS eta_predictions_made ON eta_predictions (made_at);
"""
# the pessimistic finish (NULL: the finish itself), a column added after the table: an older file gains it on open
_LATEST = "ALTER TABLE eta_predictions ADD COLUMN latest REAL"
_COLUMNS = "table_fqn, partition, made_at, source, finish, deadline, path, latest"


@dataclass(frozen=True)
class PathStep:
    """One partition of a recorded critical path: how its time was set (materialized, arrives, running, queued,
    runs) and when it was predicted ready."""

    table: str
    partition: str
    kind: str
    finish: float


@dataclass(frozen=True)
class Recorded:
    """A prediction as it was made."""

    table: str
    partition: str
    made_at: float  # epoch seconds
    source: str  # forecast | why
    finish: float  # the predicted finish, epoch seconds
    deadline: float | None  # the partition's SLA deadline; None: no SLA
    path: tuple[PathStep, ...]
    latest: float | None = None  # the pessimistic finish an overdue source gives; None: the finish itself

    @property
    def warns(self) -> bool:
        """Predicted past its deadline (the pessimistic finish, as the forecast sensor judges) before the deadline:
        what the forecast sensor warns about."""
        judged = self.finish if self.latest is None else max(self.finish, self.latest)
        return self.deadline is not None and self.made_at < self.deadline < judged


def default_path(instance: DagsterInstance) -> Path:
    from warehouse_assets.center.state_store import default_path as store_path

    return store_path(instance)


class PredictionLog:
    """The recorded predictions in the SQLite file at ``path`` (the state store's by default)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        # the engine writes the same file: wait for its transaction rather than fail the sensor's tick
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        if "latest" not in {row[1] for row in self._db.execute("PRAGMA table_info(eta_predictions)")}:
            try:
                self._db.execute(_LATEST)
            except sqlite3.OperationalError as exc:  # another process added it first
                if "duplicate column" not in str(exc):
                    raise

    @classmethod
    def of(cls, instance: DagsterInstance) -> PredictionLog:
        return cls(default_path(instance))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> PredictionLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def record(
        self,
        predictions: Sequence[Prediction],
        made_at: float,
        source: str,
        deadlines: Mapping[tuple[str, str], float | None] | None = None,
    ) -> int:
        """Record the predictions made at ``made_at`` by ``source`` (one row per partition at most, unchanged ones
        thinned out, old rows pruned); returns the rows written. Materialized partitions predict nothing."""
        if source not in SOURCES:
            raise ValueError(f"unknown prediction source {source!r}: expected one of {', '.join(SOURCES)}")
        latest: dict[tuple[str, str], Prediction] = {}
        for prediction in predictions:
            if not prediction.known:
                latest[(prediction.table, prediction.partition)] = prediction
        rows = []
        for (table, partition), prediction in latest.items():
            last = self._db.execute(
                "SELECT made_at, finish, coalesce(latest, finish) FROM eta_predictions WHERE table_fqn = ? "
                "AND partition = ? AND source = ? ORDER BY made_at DESC LIMIT 1",
                (table, partition, source),
            ).fetchone()
            pessimistic_finish = prediction.latest
            if (
                last is not None
                and made_at - last[0] < REFRESH_S
                and abs(prediction.finish - last[1]) < MOVED_S
                and abs(pessimistic_finish - last[2]) < MOVED_S
            ):
                continue
            deadline = (deadlines or {}).get((table, partition))
            path = [[s.table, s.partition, s.kind, s.finish] for s in prediction.path]
            pessimistic = pessimistic_finish if pessimistic_finish != prediction.finish else None
            rows.append((table, partition, made_at, source, prediction.finish, deadline, json.dumps(path), pessimistic))
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(
                f"INSERT OR REPLACE INTO eta_predictions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows
            )
            self._db.execute("DELETE FROM eta_predictions WHERE made_at < ?", (made_at - RETAIN.total_seconds(),))
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return len(rows)

    def read(self, since: float | None = None, until: float | None = None) -> list[Recorded]:
        """The predictions made in [``since``, ``until``), oldest first."""
        low = since if since is not None else float("-inf")
        high = until if until is not None else float("inf")
        return list(self._rows(low, high))

    def _rows(self, low: float, high: float) -> Iterator[Recorded]:
        for table, partition, made_at, source, finish, deadline, path, latest in self._db.execute(
            f"SELECT {_COLUMNS} FROM eta_predictions WHERE made_at >= ? AND made_at < ? ORDER BY made_at",
            (low, high),
        ):
            steps = tuple(PathStep(str(t), str(p), str(k), float(f)) for t, p, k, f in json.loads(path))
            yield Recorded(table, partition, made_at, source, finish, deadline, steps, latest)


def record_predictions(
    instance: DagsterInstance,
    predictions: Sequence[Prediction],
    made_at: float,
    source: str,
    deadlines: Mapping[tuple[str, str], float | None] | None = None,
    log: Any = None,
) -> int:
    """Record ``predictions`` in ``instance``'s prediction log. A log that cannot be written (its file locked past the
    timeout, a full disk) costs the record, never the answer or the tick that made them: a warning on ``log``."""
    try:
        with PredictionLog.of(instance) as predictions_log:
            return predictions_log.record(predictions, made_at, source, deadlines)
    except sqlite3.Error as exc:
        (log or logging.getLogger(__name__)).warning(f"predictions not recorded ({source}): {exc}")
        return 0
