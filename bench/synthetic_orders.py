"""``ods.order``'s rows as the ingestion leaves them, generated on Spark for the benches that seed a large order table
without simulating and ingesting its change stream (``ranged_run``, ``key_scoped_rebuild``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def order_rows(
    spark: SparkSession, orders: int, start_us: int, step_us: int, users: int, courses: int, streams: int
) -> DataFrame:
    """``orders`` orders, ids from 1 increasing with ``create_time`` (``start_us`` + id × ``step_us``, in
    microseconds), each one's user and course drawn by hash among ``users`` and ``courses``, 80 % paid, 10 % created
    (unpaid), 10 % refunded, spread over ``streams`` shard streams, partitioned by their hour (``dt``, ``hh``)."""
    df = spark.range(orders).selectExpr(
        "id + 1 AS id",
        f"pmod(xxhash64(id, 'user'), {users}) + 1 AS user_id",
        f"pmod(xxhash64(id, 'course'), {courses}) + 1 AS course_id",
        "CAST(10 + pmod(id * 37, 9000) / 100 AS DECIMAL(10,2)) AS amount",
        "CASE WHEN pmod(id, 10) < 8 THEN 'paid' WHEN pmod(id, 10) = 8 THEN 'created' ELSE 'refunded' END AS status",
        f"timestamp_micros({start_us} + id * {step_us}) AS create_time",
    )
    return df.selectExpr(
        "id",
        "user_id",
        "course_id",
        "amount",
        "status",
        "CASE WHEN status = 'created' THEN NULL ELSE create_time END AS pay_time",
        "create_time",
        "create_time AS update_time",
        "CAST(unix_micros(create_time) DIV 1000 AS BIGINT) AS _es",
        "id AS _pos",
        f"concat('edu_trade.order_', lpad(CAST(pmod(id, {streams}) AS STRING), 2, '0')) AS _stream",
        "false AS _deleted",
        "date_format(create_time, 'yyyy-MM-dd') AS dt",
        "date_format(create_time, 'HH') AS hh",
    )
