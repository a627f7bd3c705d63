"""`warehouse spark-server` and `--analysts` start two different servers: the product's, which writes, and the
analysts', read-only by its own configuration; each with a token of its own in a file of its own, so that nothing an
analyst is handed opens the product's server. (The analysts' server itself: tests/resources/test_analysts_server.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from resources import spark
from resources.settings import Settings
from warehouse_assets.cli import services


def test_the_products_and_the_analysts_servers_differ_in_mode_and_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[dict[str, Any]] = []

    def start(**kwargs: Any) -> object:
        started.append(kwargs)
        return object()  # a started server

    monkeypatch.setattr(spark, "start_connect_server", start)
    # recorded absent, then absent: what the command sets in this process is undone after the test
    monkeypatch.setenv(spark.CONNECT_TOKEN_VARIABLE, "")
    monkeypatch.delenv(spark.CONNECT_TOKEN_VARIABLE)
    settings = Settings.from_env({"WAREHOUSE_LOG_DIR": str(tmp_path), "WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake")})
    for analysts in (False, True):
        services.start_server_with_token(
            settings, host="127.0.0.1", port=1, log_path=tmp_path / "x.log", analysts=analysts
        )
    product, analysts_server = started
    assert (product["confined"], analysts_server["confined"]) == (False, True)
    products_token = spark.read_connect_token(tmp_path / "spark-connect.token")
    analysts_token = spark.read_connect_token(tmp_path / "spark-connect-analysts.token")
    assert products_token == product["token"] and analysts_token == analysts_server["token"]
    assert products_token and analysts_token and products_token != analysts_token
    # the product's own processes are handed the product's token, never the analysts'
    assert spark.connect_token() == products_token
    # and only the analysts' server is read-only in its own configuration
    assert spark.lake_conf(str(tmp_path / "lake"), confined=True)[spark.READ_ONLY] == "true"
    assert spark.READ_ONLY not in spark.lake_conf(str(tmp_path / "lake"))
    assert spark.READ_ONLY not in {**spark.DELTA_CONF, **spark.DEFAULT_CONF}
