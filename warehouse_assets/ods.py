"""The ODS ingestion job: applies pending landing segments to every ODS table (or a chosen few)."""

from dagster import Config, OpExecutionContext, Output, in_process_executor, job, op

from resources.delta_lake import DeltaLakeResource
from resources.landing import LandingResource
from resources.spark import SparkResource
from warehouse_assets.catalog import Catalog
from warehouse_assets.ingestion import BatchReport, ingest_table


class IngestConfig(Config):  # type: ignore[misc]
    tables: list[str] = []  # ODS tables (e.g. "ods.order"); empty = all
    max_segments_per_stream: int = 288


def build_ingest_job(catalog: Catalog):  # type: ignore[no-untyped-def]
    known = {t.fqn for t in catalog.ods()}

    @op(name="ingest_ods", description="Merge new CDC segments into the ODS Delta tables.")
    def ingest_ods(
        context: OpExecutionContext,
        config: IngestConfig,
        spark: SparkResource,
        lake: DeltaLakeResource,
        landing: LandingResource,
    ) -> Output[dict[str, dict[str, int]]]:
        unknown = sorted(set(config.tables) - known)
        if unknown:
            raise ValueError(f"unknown ODS table(s) {unknown}; known: {sorted(known)}")
        session, store, land = spark.session(), lake.store(), landing.landing()
        summary: dict[str, dict[str, int]] = {}

        def progress(batch: BatchReport) -> None:
            context.log.info(
                f"{batch.table}: {batch.segments} segments, {batch.rows_in} records in = {batch.rows_applied} "
                f"applied + {batch.rows_quarantined} quarantined + {batch.rows_duplicate} duplicates + "
                f"{batch.rows_superseded} superseded + {batch.ddl_lines} ddl ({batch.seconds:.1f}s)"
                + (f"; new source column(s) added: {', '.join(batch.new_columns)}" if batch.new_columns else "")
            )

        for table in catalog.ods():
            if config.tables and table.fqn not in config.tables:
                continue
            report = ingest_table(
                session,
                store,
                land,
                table,
                max_segments_per_stream=config.max_segments_per_stream,
                progress=progress,
            )
            summary[table.fqn] = {k: int(v) for k, v in report.metadata().items()}
        flat = {f"{t}.{k}": v for t, m in summary.items() for k, v in m.items() if k != "seconds"}
        flat["rows_applied"] = sum(m["rows_applied"] for m in summary.values())
        flat["rows_quarantined"] = sum(m["rows_quarantined"] for m in summary.values())
        return Output(summary, metadata=flat)

    @job(
        name="ods_ingest",
        executor_def=in_process_executor,
        tags={"warehouse/ingest": "ods"},
        description="Apply pending CDC landing segments to the ODS Delta tables (merge-into).",
    )
    def ods_ingest() -> None:
        ingest_ods()

    return ods_ingest
