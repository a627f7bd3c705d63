"""One sensor per external producer: reports each partition that has truly arrived, once, while the dependency
center's engine does not (it reports deliveries as they land:
:class:`warehouse_assets.ingest.deliveries.ExternalWatcher`).

What counts as arrived, what is rejected and why: :mod:`warehouse_assets.ingest.deliveries`. The cursor holds, per
delivery, the signature already decided and, per partition, the fingerprint reported, so a restarted daemon neither
repeats nor loses a report.
"""

from dagster import DefaultSensorStatus, SensorDefinition, SensorEvaluationContext, SensorResult, SkipReason, sensor

from resources.external import ExternalResource
from resources.settings import current
from warehouse_assets.catalog import Catalog, ExternalTable
from warehouse_assets.ingest.deliveries import (
    WATCH_STALE_SECONDS,
    Clock,
    DeliveryCursor,
    delivery_tick,
    external_source,
    last_reported,
    now_in_business_tz,
    watched_ago,
)


def sensor_interval() -> int:
    """``WAREHOUSE_EXTERNAL_SENSOR_INTERVAL`` seconds between ticks (read when the code location loads)."""
    return current().external_sensor_interval


def build_external_sensor(table: ExternalTable, clock: Clock = now_in_business_tz) -> SensorDefinition:
    what = "a _SUCCESS marker with data files" if table.external.format == "csv_files" else "a new Delta version"

    @sensor(
        name=f"ext_{table.name}",
        minimum_interval_seconds=sensor_interval(),
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Reports a partition of {table.fqn} when {what} for that day has arrived (validated).",
    )
    def _external(context: SensorEvaluationContext, external: ExternalResource) -> SensorResult | SkipReason:
        ago = watched_ago(context.instance)
        if ago is not None and ago < WATCH_STALE_SECONDS:
            return SkipReason(f"the engine reports {table.fqn}'s deliveries as they land (it looked {ago:.0f} s ago)")
        cursor = DeliveryCursor.load(context.cursor)
        tick, new_cursor = delivery_tick(
            external_source(external, table), cursor, clock(), last_reported(context.instance, table.key)
        )
        for line in tick.rejected:
            context.log.warning(line)
        if tick.events:
            context.log.info(
                f"{table.fqn}: {len(tick.events)} partition(s) arrived: "
                + ", ".join(
                    f"{e.partition}{' (re-delivered)' if e.metadata['redelivery'].value else ''}" for e in tick.events
                )
            )
        if not tick.events:
            waiting = f"; {len(tick.waiting)} waiting for their day to end" if tick.waiting else ""
            message = f"no new partition of {table.fqn} arrived{waiting}"
            return SensorResult(skip_reason=SkipReason(message), cursor=new_cursor.dump())
        return SensorResult(asset_events=tick.events, cursor=new_cursor.dump())

    return _external


def build_external_sensors(catalog: Catalog, clock: Clock = now_in_business_tz) -> list[SensorDefinition]:
    return [build_external_sensor(table, clock) for table in catalog.externals()]
