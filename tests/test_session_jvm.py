"""The Spark session each test worker starts (tests/conftest.py): compiled by C1 alone, in a full-sized code cache."""

from __future__ import annotations

from pyspark.sql import SparkSession

from tests.support.jvm import SESSION_CODE_CACHE_MB


def test_the_workers_session_is_compiled_by_c1_alone_in_a_full_sized_code_cache(spark: SparkSession) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hotspot = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(hotspot)
    assert diagnostics.getVMOption("TieredStopAtLevel").getValue() == "1"
    assert int(diagnostics.getVMOption("ReservedCodeCacheSize").getValue()) == SESSION_CODE_CACHE_MB * 1024 * 1024
