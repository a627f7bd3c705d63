"""Delta Lake on Spark: the jars `make install` fetches (pom.xml) and the Delta SQL every Spark of the warehouse has.

A table Spark writes, merges and time-travels with Delta is one delta-rs reads as the same rows and versions.
test_embedded_stack.py runs the same round over the Spark Connect server the embedded default starts.
"""

from __future__ import annotations

import importlib.metadata
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from resources import spark as spark_module
from resources.spark import DELTA_CONF, jars_dir, jvm_dependency_conf, spark_home
from tests.support.lake import table_rows

ROOT = Path(__file__).resolve().parents[2]
# a jar's artifact and version: `log4j-1.2-api-2.25.4.jar`, `zstd-jni-1.5.7-7.jar`, `orc-core-2.3.0-shaded-protobuf.jar`
JAR_NAME = re.compile(r"^(?P<artifact>.+)-(?P<version>\d+\.[^-]*(-[\w.-]+)?)\.jar$")

ORIGINAL = [(1, 10, "2026-03-01"), (2, 20, "2026-03-01"), (3, 30, "2026-03-02")]
# the merge updates order 1 and inserts order 4, on a condition that names the partitions it touches
MERGED = [(1, 11, "2026-03-01"), (2, 20, "2026-03-01"), (3, 30, "2026-03-02"), (4, 40, "2026-03-02")]


def spark_delta_round(session: Any, path: str) -> dict[str, Any]:
    """Write a partitioned Delta table, MERGE INTO it, read it now and VERSION AS OF 0: what Spark saw."""
    session.createDataFrame(ORIGINAL, "order_id int, amount int, day string").write.format("delta").partitionBy(
        "day"
    ).save(path)
    session.sql(
        f"""MERGE INTO delta.`{path}` AS t
        USING (SELECT * FROM VALUES (1, 11, '2026-03-01'), (4, 40, '2026-03-02') AS s(order_id, amount, day)) AS s
        ON t.day IN ('2026-03-01', '2026-03-02') AND t.day = s.day AND t.order_id = s.order_id
        WHEN MATCHED THEN UPDATE SET *
        WHEN NOT MATCHED THEN INSERT *"""
    )

    def rows(query: str, *columns: str) -> list[list[Any]]:
        return sorted([list(row) for row in session.sql(query).select(*columns).collect()])

    return {
        "current": rows(f"SELECT * FROM delta.`{path}`", "order_id", "amount", "day"),
        "version_0": rows(f"SELECT * FROM delta.`{path}` VERSION AS OF 0", "order_id", "amount", "day"),
        "history": rows(f"DESCRIBE HISTORY delta.`{path}`", "version", "operation"),
    }


def assert_round(path: str, seen_by_spark: dict[str, Any]) -> None:
    """Spark's Delta and delta-rs agree on the table of :func:`spark_delta_round`."""
    assert seen_by_spark["current"] == [list(row) for row in MERGED]
    assert seen_by_spark["version_0"] == [list(row) for row in ORIGINAL]
    assert seen_by_spark["history"] == [[0, "WRITE"], [1, "MERGE"]]

    def delta_rs_rows(version: int | None = None) -> list[list[Any]]:
        data = table_rows(path, version=version).to_pydict()
        return sorted([list(row) for row in zip(data["order_id"], data["amount"], data["day"], strict=True)])

    table = DeltaTable(path)
    assert table.version() == 1
    assert table.metadata().partition_columns == ["day"]
    assert delta_rs_rows() == seen_by_spark["current"]
    assert delta_rs_rows(version=0) == seen_by_spark["version_0"]


def test_spark_writes_merges_and_time_travels_delta_that_delta_rs_reads(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "orders")
    assert_round(path, spark_delta_round(spark, path))


def test_every_spark_gets_the_jars_delta_sql_and_catalog() -> None:
    jars = sorted(jars_dir().glob("*.jar"))
    local = jvm_dependency_conf("local[2]")
    # a local session's executors share the driver's JVM: the jars join its classpath in place
    assert local == {**DELTA_CONF, "spark.driver.extraClassPath": str(jars_dir() / "*")}
    # a cluster's executors receive every jar from the session
    cluster = jvm_dependency_conf("spark://spark-master:7077")
    assert cluster == {**DELTA_CONF, "spark.jars": ",".join(str(jar) for jar in jars)}
    assert jvm_dependency_conf("local-cluster[2,1,1024]") == cluster


def test_a_cluster_is_sent_the_s3a_jars_only_when_its_lake_may_be_on_an_object_store(tmp_path: Path) -> None:
    """Each application on a cluster copies the jars it is sent into the worker's work folder: the AWS SDK (690 MB)
    goes only to a session whose lake is a URI, or not named when the session starts."""
    every = {jar.name for jar in jars_dir().glob("*.jar")}

    def sent(lake_root: str) -> set[str]:
        conf = jvm_dependency_conf("spark://spark-master:7077", lake_root)
        return {Path(jar).name for jar in conf["spark.jars"].split(",")}

    s3a = every - sent(str(tmp_path / "lake"))
    # hadoop-aws and the AWS SDK it is built against are what a lake on a shared path goes without, nothing of Delta's
    assert {"hadoop-aws", "bundle"} <= {JAR_NAME.match(name)["artifact"] for name in s3a}, s3a  # type: ignore[index]
    assert not any(name.startswith(("delta-", "warehouse-")) for name in s3a), s3a
    assert sent("s3://bucket/lake") == sent("s3a://bucket/lake") == sent("") == every
    # a local session's classpath is the folder itself, whatever its lake
    assert jvm_dependency_conf("local[2]", str(tmp_path)) == jvm_dependency_conf("local[2]", "s3://bucket/lake")


def test_missing_jars_say_to_run_make_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(spark_module, "jars_dir", lambda: tmp_path)
    with pytest.raises(RuntimeError, match=r"jars are missing from .*: run `make install`"):
        jvm_dependency_conf("local[2]")


def _pom_property(name: str) -> str:
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    value = ET.parse(ROOT / "pom.xml").getroot().findtext(f"m:properties/m:{name}", namespaces=namespace)
    assert value, f"pom.xml has no property {name}"
    return value


def _jar_versions(folder: Path) -> dict[str, str]:
    found = {}
    for jar in folder.glob("*.jar"):
        match = JAR_NAME.match(jar.name)
        assert match, f"unexpected jar name {jar.name}"
        found[match["artifact"]] = match["version"]
    return found


def test_pom_matches_the_locked_python_packages() -> None:
    wheel = _jar_versions(spark_home() / "jars")
    pyspark_version = importlib.metadata.version("pyspark")
    assert _pom_property("delta.version") == importlib.metadata.version("delta-spark")
    assert _pom_property("spark.binary.version") == ".".join(pyspark_version.split(".")[:2])
    assert _pom_property("scala.binary.version") == wheel["scala-library"].rsplit(".", 1)[0]
    assert _pom_property("hadoop.version") == wheel["hadoop-client-api"]
    assert _pom_property("jackson.version") == wheel["jackson-databind"]


def test_fetched_jars_are_installed_and_shadow_no_jar_of_pyspark() -> None:
    fetched = _jar_versions(jars_dir())
    delta = f"delta-spark_{_pom_property('spark.binary.version')}_{_pom_property('scala.binary.version')}"
    assert fetched[delta] == _pom_property("delta.version")
    assert fetched["hadoop-aws"] == _pom_property("hadoop.version")
    assert "bundle" in fetched  # the AWS SDK hadoop-aws is built against
    # two versions of one jar on Spark's classpath break it
    wheel = _jar_versions(spark_home() / "jars")
    shadowing = {name: (version, wheel[name]) for name, version in fetched.items() if name in wheel}
    assert not shadowing, f"fetched jars that pyspark already carries (fetched, wheel): {shadowing}"
