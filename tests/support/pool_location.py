"""A tiny code location for the compute pools' test: an asset that runs a query on the Spark its run was placed on,
and, when its run carries ``test/hold``, holds its pool until that file exists; the same asset again, requiring the
pool label ``size=small`` as a table's ``compute:`` does (by its asset tags)."""

import time
from pathlib import Path

from dagster import AssetExecutionContext, Definitions, MaterializeResult, asset, define_asset_job, in_process_executor

from resources.spark import SparkResource
from warehouse_assets.instance.pools import compute_asset_tags

HOLD_TAG = "test/hold"


def _query(context: AssetExecutionContext, spark: SparkResource) -> MaterializeResult:
    session = spark.session()
    assert session.range(5).count() == 5
    hold = context.run.tags.get(HOLD_TAG)
    while hold and not Path(hold).exists():
        time.sleep(0.2)
    # the server's own port: which Spark the run was on, as that Spark says
    return MaterializeResult(metadata={"port": int(session.conf.get("spark.connect.grpc.binding.port"))})


@asset
def on_spark(context: AssetExecutionContext, spark: SparkResource) -> MaterializeResult:
    return _query(context, spark)


@asset(tags=compute_asset_tags({"size": "small"}))
def on_small_spark(context: AssetExecutionContext, spark: SparkResource) -> MaterializeResult:
    return _query(context, spark)


defs = Definitions(
    assets=[on_spark, on_small_spark],
    jobs=[define_asset_job("spark_job", [on_spark]), define_asset_job("small_job", [on_small_spark])],
    # no Spark answers there: a run not placed on a pool fails
    resources={"spark": SparkResource(mode="connect", connect_url="sc://127.0.0.1:9")},
    executor=in_process_executor,
)
