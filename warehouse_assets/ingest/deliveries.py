"""External tables: their producers' deliveries, and which of them to report, once. A delivery is
reported when it has truly arrived (its marker, or a new producer version), never from a partial write.

What :func:`delivery_tick` decides is reported by the dependency center's engine as deliveries land
(:class:`ExternalWatcher`, every engine round), by one sensor per external producer (:mod:`sensors.external`) while
no engine watches, and by the headless CLI.

A partition is reported with an ``AssetMaterialization`` (observations would not start downstream runs)
when a delivery has truly arrived — a ``_SUCCESS`` marker *and* data files, or a new version of the
producer's Delta table holding that ``dt`` — its day is over, and its partition value is valid. Rejected,
with one warning line each and never reported:

* a malformed partition value (``dt=2026-3-5``, ``dt=20260305``), or one before the first partition;
* a future partition (its day has not begun, or the delivery was made before it began);
* a duplicate: a new marker, or a new Delta version, whose content is the same as what was reported;
* a marker without data files, or data files whose header is not the declared columns.

Re-delivery is reported again on purpose: a delivery of a partition already reported whose *content*
changed (corrected files under a new marker, a new Delta version rewriting the day with other rows) is
a new materialization with ``redelivery: true``, so the dependency center re-runs its downstream partitions.

The cursor holds, per delivery, the signature already decided (marker and file stats, or the Delta
version) and, per partition, the fingerprint reported; so a restarted daemon neither repeats nor loses a
report. If the cursor is lost, the fingerprint in the partition's latest materialization (looked up in
the instance) still keeps an unchanged delivery from being reported twice.
"""

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dagster import AssetKey, AssetMaterialization, AssetRecordsFilter, DagsterInstance

from resources.external import Delivery, ExternalResource, ExternalSource
from warehouse_assets.catalog import Catalog, ExternalTable, Table, business_zone, periods

log = logging.getLogger("warehouse.engine")

MAX_REPORTS_PER_TICK = 200
WATCH_KEY = "warehouse/engine/external_watch"  # instance key-value: when the engine last looked for deliveries
WATCH_STALE_SECONDS = 30.0  # an engine silent this long is gone: the sensors report again
HEARTBEAT_SECONDS = 5.0
HORIZON = timedelta(days=400)  # cursor entries older than this are forgotten (the instance still dedupes)
Clock = Callable[[], datetime]


def external_source(external: ExternalResource, table: Table) -> ExternalSource:
    if not isinstance(table, ExternalTable):
        raise ValueError(f"{table.fqn} is not an external table")
    daily = periods().daily  # the process's (or a test's) settings, not those of import time
    return external.source(
        table.fqn,
        table.external.location,
        table.external.format,
        table.columns,
        timezone=daily.timezone,
        first=daily.get_first_partition_key(),
        marker=table.external.marker,
        producer=table.external.producer,
    )


def now_in_business_tz() -> datetime:
    return datetime.now(business_zone())


@dataclass
class DeliveryCursor:
    decided: dict[str, str] = field(default_factory=dict)  # delivery name -> signature already decided
    reported: dict[str, str] = field(default_factory=dict)  # partition -> fingerprint reported
    version: int | None = None  # Delta: the last producer version looked at
    pending: list[str] = field(default_factory=list)  # Delta: valid partitions waiting for their day to end

    @classmethod
    def load(cls, raw: str | None) -> "DeliveryCursor":
        data = json.loads(raw) if raw else {}
        return cls(data.get("decided", {}), data.get("reported", {}), data.get("version"), data.get("pending", []))

    def dump(self) -> str:
        data = {"decided": self.decided, "reported": self.reported, "version": self.version, "pending": self.pending}
        return json.dumps(data, sort_keys=True)

    def forget_before(self, cutoff: str) -> None:
        self.reported = {k: v for k, v in self.reported.items() if k >= cutoff}
        self.decided = {k: v for k, v in self.decided.items() if not k.startswith("dt=") or k[3:] >= cutoff}


@dataclass
class DeliveryTick:
    events: list[AssetMaterialization] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # one line per rejected delivery (logged as warnings)
    waiting: list[str] = field(default_factory=list)  # valid deliveries whose day is not over yet


def delivery_tick(
    source: ExternalSource,
    cursor: DeliveryCursor,
    now: datetime,
    last_reported: Callable[[str], str | None] = lambda key: None,
) -> tuple[DeliveryTick, DeliveryCursor]:
    """What one tick reports for one external table, and the cursor after it (pure but for the reads)."""
    cursor = DeliveryCursor(dict(cursor.decided), dict(cursor.reported), cursor.version, list(cursor.pending))
    tick = DeliveryTick()
    if source.format == "delta":
        deliveries, cursor.version = source.delta_deliveries(cursor.version, cursor.pending)
        cursor.pending = []
    else:
        deliveries = [d for d in source.file_deliveries(cursor.decided) if cursor.decided.get(d.name) != d.signature]
    for delivery in deliveries:
        if len(tick.events) >= MAX_REPORTS_PER_TICK:
            if source.format == "delta":
                cursor.pending.append(delivery.value)
            continue
        problem = delivery.problem or source.key_problem(delivery.value, delivery.delivered_at, now)
        if problem:
            tick.rejected.append(f"{source.name}: rejected delivery {delivery.name} — {problem}; not reported")
            cursor.decided[delivery.name] = delivery.signature
            continue
        if not source.is_due(delivery.value, now):
            tick.waiting.append(delivery.value)
            if source.format == "delta":
                cursor.pending.append(delivery.value)
            continue
        previous = cursor.reported.get(delivery.value) or last_reported(delivery.value)
        cursor.decided[delivery.name] = delivery.signature
        if previous == delivery.fingerprint:
            if delivery.value in cursor.reported:  # a new marker / version with the same content
                tick.rejected.append(
                    f"{source.name}: duplicate delivery {delivery.name} — same content as already reported "
                    f"(fingerprint {delivery.fingerprint}); not reported again"
                )
            cursor.reported[delivery.value] = delivery.fingerprint
            continue
        cursor.reported[delivery.value] = delivery.fingerprint
        tick.events.append(_materialization(source, delivery, redelivery=previous is not None))
    cursor.forget_before(f"{now - HORIZON:%Y-%m-%d}")
    return tick, cursor


def _materialization(source: ExternalSource, delivery: Delivery, redelivery: bool) -> AssetMaterialization:
    metadata: dict[str, Any] = {
        "files": delivery.files,
        "rows": delivery.rows,
        "delivered_at": delivery.delivered_at.isoformat(timespec="seconds"),
        "fingerprint": delivery.fingerprint,
        "redelivery": redelivery,
        "location": str(source.location / delivery.name),
    }
    if delivery.delta_version is not None:
        metadata["delta_version"] = delivery.delta_version
    return AssetMaterialization(
        asset_key=AssetKey(source.key),
        partition=delivery.value,
        description=f"delivered by {source.producer or 'its producer'}",
        metadata=metadata,
    )


def last_reported(instance: DagsterInstance, key: Sequence[str]) -> Callable[[str], str | None]:
    """The fingerprint of a partition's latest materialization: keeps an unchanged delivery from being reported
    twice when the cursor is lost."""

    def lookup(partition: str) -> str | None:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(list(key)), asset_partitions=[partition]), limit=1
        ).records
        if not records or records[0].asset_materialization is None:
            return None
        value = records[0].asset_materialization.metadata.get("fingerprint")
        return str(value.value) if value is not None else None

    return lookup


def watched_ago(instance: DagsterInstance) -> float | None:
    """Seconds since the engine last looked for external deliveries (None: no engine watches)."""
    raw = instance.run_storage.get_cursor_values({WATCH_KEY}).get(WATCH_KEY)
    if not raw or float(raw) <= 0:
        return None
    return max(0.0, time.time() - float(raw))


class ExternalWatcher:
    """Reports external deliveries as they land, from the engine's loop (every round, a fraction of a second).

    Why in the engine and not only the sensors: a sensor ticks when the sensor daemon's loop comes round (every 5 s
    at best, ``minimum_interval_seconds`` on top), and the report then waits for the engine's next read of the event
    log; here the delivery is reported and its downstream resolved in the same round (detection within
    0.5 s). A round lists the producer's directories and stats their files (contents are read only for a delivery
    whose files changed), or reads the producer's Delta log version. Each table's cursor is kept in the instance's
    key-value store, so a restarted engine repeats neither a report nor a rejection warning. While the engine
    watches (its heartbeat under :data:`WATCH_STALE_SECONDS` old), the sensors skip; when it stops they take over,
    and the fingerprint of a partition's latest report keeps either from reporting a delivery twice.
    """

    def __init__(self, instance: DagsterInstance, catalog: Catalog, external: ExternalResource, clock: Clock):
        self.instance, self.clock = instance, clock
        self.tables = list(catalog.externals())
        self.sources = {t.fqn: external_source(external, t) for t in self.tables}
        stored = instance.run_storage.get_cursor_values({self._key(t.fqn) for t in self.tables})
        self.cursors = {t.fqn: DeliveryCursor.load(stored.get(self._key(t.fqn))) for t in self.tables}
        self._beat = 0.0
        self._failing: str | None = None  # the error of the current outage, logged once

    @staticmethod
    def _key(fqn: str) -> str:
        return f"warehouse/engine/external/{fqn}"

    def poll(self) -> int:
        """One look at every producer; reports what arrived and returns how many partitions were reported."""
        if not self.tables:
            return 0
        now = time.time()
        if now - self._beat >= HEARTBEAT_SECONDS:
            self.instance.run_storage.set_cursor_values({WATCH_KEY: repr(now)})
            self._beat = now
        reported = 0
        for table in self.tables:
            try:
                reported += self._poll(table)
            except Exception as exc:  # a producer's storage unreachable: the others are still watched
                error = f"{table.fqn}: {type(exc).__name__}: {exc}"
                if self._failing != error:
                    log.warning("cannot look for external deliveries (%s); retrying every round", error)
                    self._failing = error
        return reported

    def _poll(self, table: ExternalTable) -> int:
        cursor = self.cursors[table.fqn]
        tick, advanced = delivery_tick(
            self.sources[table.fqn], cursor, self.clock(), last_reported(self.instance, table.key)
        )
        for line in tick.rejected:
            log.warning(line)
        for event in tick.events:
            self.instance.report_runless_asset_event(event)
        if tick.events:
            log.info(
                "%s: %d partition(s) arrived: %s",
                table.fqn,
                len(tick.events),
                ", ".join(
                    f"{e.partition}{' (re-delivered)' if e.metadata['redelivery'].value else ''}" for e in tick.events
                ),
            )
        if advanced != cursor:  # kept only once its reports are stored: a failed report is retried next round
            self.instance.run_storage.set_cursor_values({self._key(table.fqn): advanced.dump()})
            self.cursors[table.fqn] = advanced
        return len(tick.events)

    def close(self) -> None:
        """The engine stops: the sensors take over at their next tick."""
        if self.tables:
            self.instance.run_storage.set_cursor_values({WATCH_KEY: "0"})
