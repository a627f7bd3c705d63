"""A repair command run beside the running stack uses the stack's Spark Connect server, not a JVM of its own."""

from __future__ import annotations

import socket

from resources.spark import SparkResource
from warehouse_assets.cli.common import with_running_spark


def test_a_local_spark_gives_way_to_the_connect_server_that_listens_and_only_to_it() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"sc://127.0.0.1:{server.getsockname()[1]}"
        local = SparkResource(mode="local", connect_url=url, lake_root="/lake", timezone="Asia/Shanghai")
        chosen = with_running_spark({"spark": local, "lake": "kept"})
        assert chosen["spark"].mode == "connect" and chosen["lake"] == "kept"
        assert (chosen["spark"].connect_url, chosen["spark"].lake_root) == (url, "/lake")
        assert chosen["spark"].timezone == "Asia/Shanghai"
        cluster = SparkResource(mode="master", master="spark://elsewhere:7077", connect_url=url)
        assert with_running_spark({"spark": cluster})["spark"] is cluster  # what was asked for stays
    # nothing listens any more: the local session, as asked
    assert with_running_spark({"spark": local})["spark"] is local
