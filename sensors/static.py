"""Build each static table when it has never been built, and again when its SQL changes.

A static table (reference data: country codes, a city's tier) has no partitions, so no window ends and
no upstream arrives to name it: nothing in the dependency center would ever start it. This sensor compares the
code version its latest materialization was built with to its SQL's now, and requests a run when they differ. The
run key is the table and that version: a failed build (its SQL wrong) is not requested again until the SQL
changes, and ``warehouse why`` shows its downstream waiting for it meanwhile.
"""

from dagster import (
    AssetKey,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from warehouse_assets.catalog import Catalog
from warehouse_assets.instance.lanes import FIRST_BUILD_LANE, REBUILD_LANE, lane_tags
from warehouse_assets.materialize.compiler import code_version

CODE_VERSION_TAG = "dagster/code_version"  # Dagster's tag on a materialization: the asset's code version then


def build_static_sensor(catalog: Catalog) -> list[SensorDefinition]:
    """The ``static_tables`` sensor, if the catalog has static tables."""
    statics = {t.fqn: t for t in catalog.statics()}
    if not statics:
        return []
    versions = {fqn: code_version(t) for fqn, t in statics.items()}

    @sensor(
        name="static_tables",
        asset_selection=[AssetKey(t.key) for t in statics.values()],
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description="Builds each static table when it has never been built, and again when its SQL changes.",
    )
    def static_tables(context: SensorEvaluationContext) -> SensorResult:
        requests = []
        for fqn, table in sorted(statics.items()):
            event = context.instance.get_latest_materialization_event(AssetKey(table.key))
            materialization = event.asset_materialization if event is not None else None
            built = materialization.tags.get(CODE_VERSION_TAG) if materialization and materialization.tags else None
            if built != versions[fqn]:
                requests.append(
                    RunRequest(
                        run_key=f"{fqn}@{versions[fqn]}",
                        asset_selection=[AssetKey(table.key)],
                        # never built: a first build; built from other SQL: a rebuild
                        tags={
                            "warehouse/table": fqn,
                            **lane_tags(REBUILD_LANE if materialization is not None else FIRST_BUILD_LANE),
                        },
                    )
                )
        return SensorResult(run_requests=requests)

    return [static_tables]
