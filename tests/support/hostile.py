"""Hostile requests an analyst's client might send to the warehouse's read-only paths, and the refusal each must get:
SQL (for `warehouse spark-server --analysts` and `warehouse sql`) and Spark Connect DataFrame calls (for the server).

The lake is tests.resources.test_lake_sql.build_lake's (dwd.orders, dwd.users). `{lake}`, `{outside}` and `{mark}`
in a request are the lake root, a folder outside it and a file whose existence would show that code ran."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

REFLECTION = "reflect/java_method (calling Java methods by reflection) is not allowed"
WRITE_ORDERS = "writing dwd.orders (INSERT, MERGE, UPDATE, DELETE) is not allowed"

# (request, what the refusal names): the same words on the server and in `warehouse sql`, on either engine
SQL: dict[str, str] = {
    "SELECT reflect('java.lang.System', 'getProperty', 'user.name')": REFLECTION,
    "SELECT reflect('java.lang.System', 'exit', 0) FROM dwd.orders": REFLECTION,
    "SELECT java_method('java.lang.System', 'exit', 0) FROM dwd.orders": REFLECTION,
    "SELECT try_reflect('java.lang.System', 'exit', 0) FROM dwd.orders": "try_reflect (calling Java methods",
    "SELECT * FROM dwd.users WHERE name IN (SELECT reflect('java.lang.System', 'getProperty', 'user.name'))": (
        REFLECTION
    ),
    "SELECT TRANSFORM(order_id) USING 'touch {mark}' FROM dwd.orders": "TRANSFORM … USING (running an operating-sys",
    "SET spark.sql.runSQLOnFiles=true": "SET spark.sql.runSQLOnFiles is not allowed",
    "SET spark.sql.extensions=x": "SET spark.sql.extensions is not allowed",
    "SET spark.warehouse.readOnly=false": "SET spark.warehouse.readOnly is not allowed",
    "CREATE TABLE dwd.evil2 AS SELECT 1 AS x": "CREATE TABLE … AS SELECT is not allowed",
    "CREATE SCHEMA evil": "CREATE SCHEMA is not allowed",
    "CREATE TEMPORARY VIEW v AS SELECT * FROM dwd.orders": "CREATE VIEW is not allowed",
    "CREATE FUNCTION f AS 'java.lang.String'": "CREATE FUNCTION (loading code) is not allowed",
    "DROP TABLE dwd.users": "DROP TABLE is not allowed",
    "ALTER TABLE dwd.orders ADD COLUMNS (x int)": "ALTER TABLE is not allowed",
    "MERGE INTO dwd.orders t USING dwd.users s ON t.user_id = s.user_id WHEN MATCHED THEN DELETE": WRITE_ORDERS,
    "INSERT INTO dwd.orders VALUES (9999, 1, 1.0, '2026-03-01')": WRITE_ORDERS,
    "DELETE FROM dwd.orders WHERE dt = '2026-03-01'": WRITE_ORDERS,
    "UPDATE dwd.orders SET amount = 0": WRITE_ORDERS,
    "INSERT OVERWRITE DIRECTORY '{outside}/dir' USING parquet SELECT * FROM dwd.orders": "INSERT OVERWRITE DIRECTORY",
    "CACHE TABLE dwd.users": "CACHE TABLE is not allowed",
    "ADD JAR {outside}/evil.jar": "ADD JAR (loading code) is not allowed",
    "OPTIMIZE dwd.orders": "OPTIMIZE is not allowed",
    "VACUUM dwd.orders": "VACUUM is not allowed",
    "SELECT * FROM delta.`{lake}/dwd/orders`": "reading files by path (delta.`",
    "SELECT * FROM parquet.`{outside}/secret`": "reading files by path (parquet.`",
}
# the requests delta-rs's DataFusion plans itself (and refuses by its plan, in the server's words, with no JVM);
# the others only Spark's plan knows, so `warehouse sql` asks it for the refusal whichever engine was chosen
DATAFUSION_PLANS = [
    "SET spark.sql.runSQLOnFiles=true",
    "SET spark.sql.extensions=x",
    "SET spark.warehouse.readOnly=false",
    "CREATE TABLE dwd.evil2 AS SELECT 1 AS x",
    "CREATE SCHEMA evil",
    "CREATE TEMPORARY VIEW v AS SELECT * FROM dwd.orders",
    "DROP TABLE dwd.users",
    "MERGE INTO dwd.orders t USING dwd.users s ON t.user_id = s.user_id WHEN MATCHED THEN DELETE",
    "INSERT INTO dwd.orders VALUES (9999, 1, 1.0, '2026-03-01')",
    "DELETE FROM dwd.orders WHERE dt = '2026-03-01'",
    "UPDATE dwd.orders SET amount = 0",
]

# DataFrame calls of a Spark Connect client (the names of CLIENT's functions below) and what the refusal names
DATAFRAME: dict[str, str] = {
    "write_delta_into_the_lake": "writing by path (DataFrameWriter.save) is not allowed",
    "write_parquet_outside": "writing files (INSERT or DataFrameWriter) is not allowed",
    "read_parquet_by_path": "reading files by path (spark.read … load",
    "read_the_lake_by_path": "reading files by path (spark.read … load",
    "read_table_by_path": "reading files by path (delta.`",
    "python_udf_creating_a_file": "a Python UDF (touch: user code) is not allowed",
    "python_udtf": "a Python UDTF (Rows: user code) is not allowed",
    "map_in_pandas": "Python code (MapInPandas, user code) is not allowed",
    "map_in_arrow": "Python code (MapInArrow, user code) is not allowed",
    "apply_in_pandas": "Python code (FlatMapGroupsInPandas, user code) is not allowed",
    "register_a_udf": "registering a function (user code) is not allowed",
    "reflect_in_select_expr": REFLECTION,
    "exit_by_call_function": REFLECTION,
    "conf_set_run_sql_on_files": "setting spark.sql.runSQLOnFiles is not allowed",
    "conf_unset_read_only": "setting spark.warehouse.readOnly is not allowed",
    "add_artifacts": "uploading artifacts (jars, Python files: loading code) is not allowed",
    "save_as_table": "saveAsTable (creating a table) is not allowed",
    "write_to_append": "INSERT (writing a table) is not allowed",
    "temp_view": "CREATE VIEW is not allowed",
    "persist": "caching (persist) is not allowed",
    "local_checkpoint": "checkpoint (writing the plan's data) is not allowed",
    "write_stream": "a streaming write is not allowed",
}
# the Catalog API's calls that change the server (its cache, its tables and views), each refused by name; Spark
# serves most of them with no plan for the read-only check to see
CATALOG_CHANGES: dict[str, str] = {
    "cacheTable": "catalog.cacheTable (it changes the server) is not allowed",
    "uncacheTable": "catalog.uncacheTable (it changes the server) is not allowed",
    "clearCache": "catalog.clearCache (it changes the server) is not allowed",
    "refreshTable": "catalog.refreshTable (it changes the server) is not allowed",
    "refreshByPath": "catalog.refreshByPath (it changes the server) is not allowed",
    "createTable": "catalog.createTable (it changes the server) is not allowed",
    "createExternalTable": "catalog.createTable (it changes the server) is not allowed",  # the client sends one
    "dropTempView": "catalog.dropTempView (it changes the server) is not allowed",
    "dropGlobalTempView": "catalog.dropGlobalTempView (it changes the server) is not allowed",
    "recoverPartitions": "catalog.recoverPartitions (it changes the server) is not allowed",
    "dropTable": "catalog.dropTable (it changes the server) is not allowed",
    "createDatabase": "catalog.createDatabase (it changes the server) is not allowed",
    "truncateTable": "catalog.truncateTable (it changes the server) is not allowed",
    "analyzeTable": "catalog.analyzeTable (it changes the server) is not allowed",
    "registerFunction": "registering a function (user code) is not allowed",
}


def run_client(url: str, lake: str, outside: str, mark: str, reads: list[str]) -> dict[str, Any]:
    """Every request of the matrix from one Spark Connect client; what each did, and the reads' rows after."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.functions import udf, udtf

    from resources.lake_sql import LakeSql, SqlRefused, read_only_message

    spark = SparkSession.builder.remote(url).create()

    @udf("int")
    def touch(x: int) -> int:
        with open(mark, "w") as out:
            out.write("ran")
        return x

    @udtf(returnType="x: int")
    class Rows:
        def eval(self, n: int):  # type: ignore[no-untyped-def]
            open(mark, "w").close()
            yield (n,)

    def frames() -> dict[str, Callable[[], object]]:
        rows = spark.range(3)
        return {
            "write_delta_into_the_lake": lambda: rows.write.format("delta").save(f"{lake}/dwd/evil"),
            "write_parquet_outside": lambda: rows.write.parquet(f"{outside}/written"),
            "read_parquet_by_path": lambda: spark.read.parquet(f"{outside}/secret").collect(),
            "read_the_lake_by_path": lambda: spark.read.format("delta").load(f"{lake}/dwd/orders").collect(),
            "read_table_by_path": lambda: spark.read.table(f"delta.`{lake}/dwd/orders`").collect(),
            "python_udf_creating_a_file": lambda: rows.select(touch("id")).collect(),
            "python_udtf": lambda: Rows(F.lit(1)).collect(),
            "map_in_pandas": lambda: rows.mapInPandas(lambda batches: batches, "id long").collect(),
            "map_in_arrow": lambda: rows.mapInArrow(lambda batches: batches, "id long").collect(),
            "apply_in_pandas": lambda: rows.groupBy("id").applyInPandas(lambda frame: frame, "id long").collect(),
            "register_a_udf": lambda: spark.udf.register("touch", touch),
            "reflect_in_select_expr": lambda: rows.selectExpr("reflect('java.lang.System', 'getenv')").collect(),
            "exit_by_call_function": lambda: rows.select(
                F.call_function("java_method", F.lit("java.lang.System"), F.lit("exit"), F.lit(0))
            ).collect(),
            "conf_set_run_sql_on_files": lambda: spark.conf.set("spark.sql.runSQLOnFiles", "true"),
            "conf_unset_read_only": lambda: spark.conf.unset("spark.warehouse.readOnly"),
            "add_artifacts": lambda: spark.addArtifacts(f"{outside}/evil.py", pyfile=True),
            "save_as_table": lambda: rows.write.saveAsTable("dwd.evil3"),
            "write_to_append": lambda: spark.table("dwd.users").writeTo("dwd.users").append(),
            "temp_view": lambda: rows.createOrReplaceTempView("evil"),
            "persist": lambda: rows.persist(),
            "local_checkpoint": lambda: rows.localCheckpoint(),
            "write_stream": lambda: (
                spark.readStream.format("rate")
                .load()
                .writeStream.format("parquet")
                .option("path", f"{outside}/stream")
                .option("checkpointLocation", f"{outside}/checkpoint")
                .start()
            ),
        }

    def catalog_changes() -> dict[str, Callable[[], object]]:
        catalog = spark.catalog
        return {
            "cacheTable": lambda: catalog.cacheTable("dwd.users"),
            "uncacheTable": lambda: catalog.uncacheTable("dwd.users"),
            "clearCache": lambda: catalog.clearCache(),
            "refreshTable": lambda: catalog.refreshTable("dwd.users"),
            "refreshByPath": lambda: catalog.refreshByPath(f"{lake}/dwd/users"),
            "createTable": lambda: catalog.createTable("dwd.evil4", path=f"{outside}/evil4", source="parquet"),
            "createExternalTable": lambda: catalog.createExternalTable("dwd.evil5", path=f"{outside}/evil5"),
            "dropTempView": lambda: catalog.dropTempView("evil"),
            "dropGlobalTempView": lambda: catalog.dropGlobalTempView("evil"),
            "recoverPartitions": lambda: catalog.recoverPartitions("dwd.orders"),
            "dropTable": lambda: catalog.dropTable("dwd.users"),
            "createDatabase": lambda: catalog.createDatabase("evil"),
            "truncateTable": lambda: catalog.truncateTable("dwd.users"),
            "analyzeTable": lambda: catalog.analyzeTable("dwd.users"),
            "registerFunction": lambda: catalog.registerFunction("touch2", touch),
        }

    def attempt(request: Callable[[], object]) -> str:
        try:
            request()
        except Exception as exc:
            return f"refused: {read_only_message(exc) or str(exc)[:500]}"
        return "ran"

    def warehouse_sql(text: str, engine: str) -> str:
        try:
            LakeSql(lake, spark=lambda: (spark, "the analysts' server")).run(text, engine=engine)  # type: ignore[arg-type]
        except SqlRefused as exc:
            return f"refused: {exc}"
        return "ran"

    outcome: dict[str, Any] = {"warehouse_sql_refusals": {}}
    for sql in SQL:
        text = sql.format(lake=lake, outside=outside, mark=mark)
        outcome[sql] = attempt(lambda text=text: spark.sql(text).collect())  # type: ignore[misc]
        # the same request through `warehouse sql` pointed at this server, on each engine
        outcome["warehouse_sql_refusals"][sql] = {e: warehouse_sql(text, e) for e in ("spark", "datafusion")}
    for name, request in frames().items():
        outcome[name] = attempt(request)
    outcome["catalog"] = {name: attempt(request) for name, request in catalog_changes().items()}
    # the Catalog API's reads still answer, and the server's cache holds nothing of the lake
    outcome["catalog_reads"] = {
        "currentDatabase": spark.catalog.currentDatabase(),
        "databaseExists": spark.catalog.databaseExists("default"),
        "listCatalogs": [c.name for c in spark.catalog.listCatalogs()],
        "isCached": spark.catalog.isCached("dwd.users"),
    }
    # still answering, the harmless settings still allowed
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.sql("SET spark.sql.shuffle.partitions=3").collect()
    outcome["reads"] = {query: [list(row) for row in spark.sql(query).collect()] for query in reads}
    # `warehouse sql` pointed at this server answers on it too
    on_spark = LakeSql(lake, spark=lambda: (spark, "the analysts' server")).run(reads[0], engine="spark")
    outcome["warehouse_sql"] = [list(row.values()) for row in on_spark.rows.to_pylist()]
    spark.stop()
    return outcome


if __name__ == "__main__":  # python -m tests.support.hostile URL LAKE OUTSIDE MARK READS_JSON
    print(json.dumps(run_client(*sys.argv[1:5], json.loads(sys.argv[5])), default=str))
