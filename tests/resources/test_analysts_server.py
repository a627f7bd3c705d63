"""`warehouse spark-server --analysts` is read-only for real, whatever the client: a Spark Connect client holding its
token is refused every write, DDL, read by path, reflection, user code, code loading and setting but a few harmless
ones, each with a message naming what was refused, by the server (the warehouse's JVM check and Connect gate); the
lake is left as it was, nothing is created, and the server goes on answering the same reads as before.

One server for the module (a JVM of its own), started with the product's command on a free port, and stopped."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from resources.lake_sql import READ_ONLY_PREFIX, LakeSql
from resources.spark import connect_client_url, connect_token_file, port_open, read_connect_token
from tests.resources.test_lake_sql import build_lake
from tests.resources.test_lake_sql_spark import QUERIES
from tests.support.dev_stack import free_port
from tests.support.hostile import CATALOG_CHANGES, DATAFRAME, SQL
from tests.support.jvm import QUICK_JIT

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
START_S = 180


@dataclass
class Server:
    url: str
    root: Path  # its working directory, holding the lake, a folder outside it and its logs
    lake: Path
    outside: Path
    logs: Path

    def client_url(self, token: str | None) -> str:
        return connect_client_url(self.url, token) if token else self.url.replace("127.0.0.1", "localhost")


def lake_state(lake: Path) -> dict[str, Any]:
    """Every file under the lake (with its size) and each table's Delta version."""
    files = {str(p.relative_to(lake)): p.stat().st_size for p in sorted(lake.rglob("*")) if p.is_file()}
    versions = {f"dwd.{t}": DeltaTable(str(lake / "dwd" / t)).version() for t in ("orders", "users")}
    return {"files": files, "versions": versions}


@pytest.fixture(scope="module")
def analysts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("analysts")
    lake = build_lake(root / "lake")
    outside = root / "outside"
    (outside / "secret").mkdir(parents=True)
    pq.write_table(pa.table({"secret": [42]}), outside / "secret" / "part-0.parquet")
    (outside / "evil.py").write_text("open('/tmp/never', 'w').close()\n")
    port = free_port()
    env = {
        **os.environ,
        "WAREHOUSE_LAKE_ROOT": str(lake),
        "WAREHOUSE_LOG_DIR": str(root / "logs"),
        "WAREHOUSE_SPARK_MASTER": "local[1]",
        "PYTHONPATH": str(ROOT),
        # the server's JVM lives the module's minute: C1's compiles alone, which cost less than C2's in so short a life
        "JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {QUICK_JIT}".strip(),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "warehouse_assets.cli", "spark-server", "--analysts", "--port", str(port)],
        cwd=root,  # where Spark would put what a client made it create (spark-warehouse/, …)
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_S
        # the command writes the token file once its server listens
        while not (port_open("127.0.0.1", port) and connect_token_file(root / "logs", analysts=True).exists()):
            assert proc.poll() is None, f"the analysts' server exited with {proc.returncode}; logs in {root / 'logs'}"
            assert time.monotonic() < deadline, f"the analysts' server did not listen within {START_S} s"
            time.sleep(0.2)
        yield Server(f"sc://127.0.0.1:{port}", root, lake, outside, root / "logs")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the command stops its Spark's process group too
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_client(server: Server, token: str | None, mark: Path, reads: list[str]) -> subprocess.CompletedProcess[str]:
    # the client in a process of its own: a Connect session would switch this one, which may hold the tests'
    # classic Spark, to Connect mode
    args = [server.client_url(token), str(server.lake), str(server.outside), str(mark), json.dumps(reads)]
    return subprocess.run(
        [sys.executable, "-m", "tests.support.hostile", *args],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"},
        capture_output=True,
        text=True,
        timeout=900,
    )


def normalized(rows: list[list[Any]]) -> list[tuple[Any, ...]]:
    def value(v: Any) -> Any:
        return round(v, 6) if isinstance(v, float) and math.isfinite(v) else v

    return sorted((tuple(value(v) for v in row) for row in rows), key=repr)


def test_every_hostile_request_is_refused_and_nothing_changes(analysts: Server, tmp_path: Path) -> None:
    token = read_connect_token(connect_token_file(analysts.logs, analysts=True))
    assert token, "the analysts' server wrote no token file"
    before = lake_state(analysts.lake)
    mark = tmp_path / "code-ran"

    def visible() -> list[str]:
        """Every file and folder of the server's directory and of the test's, but its logs and the empty folder of
        Spark's default database, which Spark makes when its catalog is first used (what a CREATE would put in
        it would show)."""
        seen = [*analysts.root.rglob("*"), *tmp_path.rglob("*")]
        own = (analysts.logs, analysts.root / "spark-warehouse")
        return sorted(str(p) for p in seen if p not in own and analysts.logs not in p.parents)

    seen_before = visible()

    done = run_client(analysts, token, mark, QUERIES)

    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert len(SQL) + len(DATAFRAME) >= 25
    for request, said in [*SQL.items(), *DATAFRAME.items()]:
        assert outcome[request].startswith(f"refused: {READ_ONLY_PREFIX}"), (request, outcome[request])
        assert said in outcome[request], (request, outcome[request])
    # `warehouse sql` refuses each SQL request by an engine's plan with exactly the server's words, on both engines
    for request in SQL:
        by_engine = outcome["warehouse_sql_refusals"][request]
        assert by_engine == {"spark": outcome[request], "datafusion": outcome[request]}, (request, by_engine)
    # the Catalog API's calls that change the server are refused; its reads answer
    for call, said in CATALOG_CHANGES.items():
        assert outcome["catalog"][call] == f"refused: {READ_ONLY_PREFIX}{said}", (call, outcome["catalog"][call])
    reads = outcome["catalog_reads"]
    assert reads["currentDatabase"] == "default" and reads["databaseExists"] is True
    assert "spark_catalog" in reads["listCatalogs"] and reads["isCached"] is False
    # nothing written, created or run: the lake's files and versions; no file or folder anywhere in the server's
    # directory (the lake, a folder outside it, where Spark puts tables it creates) or the test's (user code's mark)
    assert lake_state(analysts.lake) == before
    assert visible() == seen_before
    assert not mark.exists()
    # and the server answers the reads of `warehouse sql`'s tests with the rows DataFusion reads from the lake
    jvm_free = LakeSql(str(analysts.lake))
    for query in QUERIES:
        expected = normalized([list(r.values()) for r in jvm_free.run(query, engine="datafusion").rows.to_pylist()])
        assert normalized(outcome["reads"][query]) == expected, query
    assert normalized(outcome["warehouse_sql"]) == normalized(outcome["reads"][QUERIES[0]])


def test_only_the_analysts_token_opens_it(analysts: Server) -> None:
    """The analysts' token is its own (its own file beside the product's); the server runs nothing for a client
    without it or with another (the product's server, likewise, accepts only its own)."""
    token_file = connect_token_file(analysts.logs, analysts=True)
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert not connect_token_file(analysts.logs).exists()  # the product's token is not written by it
    client = (
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "SparkSession.builder.remote(sys.argv[1]).create().sql('SELECT 1').collect()\n"
    )
    for token in (None, "the-products-token"):
        done = subprocess.run(
            [sys.executable, "-c", client, analysts.client_url(token)],
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode != 0
        assert "UNAUTHENTICATED" in done.stderr, done.stderr[-2000:]
