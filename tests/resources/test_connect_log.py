"""The embedded Spark Connect server's log: warnings by default, into a file that rolls over at a size cap, so a
long-running `make dev` cannot fill the disk (at INFO the server wrote about 25 MB in ten minutes). The server itself
is started by tests/test_embedded_stack.py, whose last test reads its log."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from resources import spark


def test_the_log_config_keeps_warnings_in_a_size_capped_rolling_file(tmp_path: Path) -> None:
    config = spark.connect_log_config(tmp_path / "spark-connect.log", "WARN")
    lines = set(config.splitlines())
    assert "rootLogger.level = warn" in lines
    assert {"appender.file.type = RollingFile", "appender.file.policies.size.type = SizeBasedTriggeringPolicy"} <= lines
    assert f"appender.file.fileName = {tmp_path / 'spark-connect.log'}" in lines
    assert f"appender.file.policies.size.size = {10 * 1024 * 1024}" in lines
    assert "appender.file.strategy.max = 2" in lines  # at most 3 files of 10 MB


def test_the_server_is_started_with_that_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []

    class Server:
        def __init__(self, args: list[str], **_: object) -> None:
            started.append(args)

        def poll(self) -> None:
            return None

    monkeypatch.setattr(spark, "port_open", lambda host, port: bool(started))  # listens once started
    monkeypatch.setattr(spark, "jvm_dependency_conf", lambda master, lake_root: {})
    monkeypatch.setattr(subprocess, "Popen", Server)
    spark.start_connect_server(port=1, log_path=tmp_path / "spark-connect.log", log_level="ERROR")
    [args] = started
    config = tmp_path / "spark-connect.log4j2.properties"
    assert args[args.index("--driver-java-options") + 1] == f"-Dlog4j2.configurationFile={config.as_uri()}"
    assert "rootLogger.level = error" in config.read_text().splitlines()
