"""A tiny code location for the compute pools' test: one asset that runs a query on the Spark its run was placed on,
and, when its run carries ``test/hold``, holds its pool until that file exists."""

import time
from pathlib import Path

from dagster import AssetExecutionContext, Definitions, MaterializeResult, asset, define_asset_job, in_process_executor

from resources.spark import SparkResource

HOLD_TAG = "test/hold"


@asset
def on_spark(context: AssetExecutionContext, spark: SparkResource) -> MaterializeResult:
    session = spark.session()
    assert session.range(5).count() == 5
    hold = context.run.tags.get(HOLD_TAG)
    while hold and not Path(hold).exists():
        time.sleep(0.2)
    # the server's own port: which Spark the run was on, as that Spark says
    return MaterializeResult(metadata={"port": int(session.conf.get("spark.connect.grpc.binding.port"))})


defs = Definitions(
    assets=[on_spark],
    jobs=[define_asset_job("spark_job", [on_spark])],
    # no Spark answers there: a run not placed on a pool fails
    resources={"spark": SparkResource(mode="connect", connect_url="sc://127.0.0.1:9")},
    executor=in_process_executor,
)
