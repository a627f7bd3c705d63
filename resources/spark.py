"""Spark session configuration, in one place.

Two modes, so that nothing in the product depends on running beside the Spark driver:

* ``local``   — a ``local[N]`` session inside this process (tests, scripts, single runs);
* ``connect`` — a client of a Spark Connect server (``sc://host:port``). The embedded default starts one
  warm server (``warehouse spark-server``) that every Dagster run shares, so a run pays ~0.5 s to connect
  instead of ~5 s to boot a JVM, and the machine never holds more than one Spark JVM;
* ``master``  — a classic session against a cluster master URL (``spark://…``, ``yarn``, ``k8s://…``).

A process holds at most one session: :func:`get_session` caches it.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from resources.settings import DEFAULT_TIMEZONE, SparkMode, s3_endpoint
from resources.storage import normalize_root, spark_uri

if TYPE_CHECKING:  # imported when a session is made: `warehouse why` loads resources without PySpark
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

# the run tags naming the compute pool a run was placed on and its endpoint without its token
# (warehouse_assets/instance/pools.py sets them; the lake seam imports none of the warehouse, so the names are spelled
# here too and a test keeps them equal)
POOL_TAG = "warehouse/pool"
POOL_URL_TAG = "warehouse/pool_url"

_LOCK = threading.Lock()
_SESSION: SparkSession | None = None
_SESSION_KEY: tuple[object, ...] | None = None

# Settings sized for a 2-core / 24 GiB machine and small partitions; every one can be overridden through
# ``SparkResource.conf``.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.files.maxRecordsPerFile": "0",
    # Spark writes no _SUCCESS markers: the Delta log is the only commit record.
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # no Parquet summary files; by the key Parquet reads today (the older parquet.enable.summary-metadata logs a
    # deprecation warning on every write: 211 of the Connect server's 263 log lines in `make dev`'s first minutes)
    "spark.hadoop.parquet.summary.metadata.level": "NONE",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Delta rebuilds a table's state from its log in this many tasks (default 50): 2 cores, small logs
    "spark.databricks.delta.snapshotPartitions": "2",
    # Delta skips by default a commit that adds and removes nothing (an empty hour written over an empty
    # partition): every write commits, so that a run finds its own commit, version and metrics in the log
    "spark.databricks.delta.skipRecordingEmptyCommits": "false",
    # Delta computes each commit's checksum (.crc) incrementally; in a session whose time zone is not UTC (the
    # warehouse's business time zone) it also re-derives the table's whole state after every commit to verify it,
    # a Spark job that grows with the table: measured over Spark Connect, commit → MERGE returned 0.8-1.7 s with
    # it and 0.15 s without, on every ODS handoff's path. UTC sessions never run it.
    "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def spark_home() -> Path:
    """The Spark distribution shipped inside the pyspark wheel."""
    import pyspark

    return Path(pyspark.__file__).parent


# Delta Lake on every Spark the warehouse starts: its SQL (MERGE INTO, OPTIMIZE, VERSION AS OF, delta.`path`)
# and its catalog for `format("delta")` tables, extended by the warehouse's own (resources/jvm, built by `make
# install`), which also resolves a table's name, `layer.table`, to its Delta table in the lake; and the warehouse's
# extension, whose check makes a read-only session (READ_ONLY) refuse every plan that is not a read
LAKE_CATALOG = "warehouse.spark.LakeCatalog"
DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension,warehouse.spark.WarehouseExtensions",
    "spark.sql.catalog.spark_catalog": LAKE_CATALOG,
}
# `true` in a server's own configuration (which no client can change): every session of it is read-only; in a
# session's settings, that session is (a tool's guard on a shared Spark; it cannot unset it again)
READ_ONLY = "spark.warehouse.readOnly"
# the analysts' Connect server's gate for what a client can do outside a plan (artifacts, config requests, …)
READ_ONLY_INTERCEPTOR = "warehouse.spark.ReadOnlyInterceptor"
# a session's own lake for the names (the product's tools on a session shared across lakes, e.g. in tests); a
# confined catalog ignores it
SESSION_LAKE = "spark.warehouse.lake"


def lake_conf(lake_root: str, *, confined: bool = False) -> dict[str, str]:
    """The settings that make ``layer.table`` name the Delta table ``<lake_root>/<layer>/<table>``. ``confined``:
    for the Spark analysts reach, read-only: names only inside this lake, nothing by path, no writes, no user code,
    no settings but harmless ones (resources/jvm/warehouse/spark/ReadOnly.java says what is refused)."""
    if not lake_root:
        return {}
    conf = {"spark.sql.catalog.spark_catalog.lake": spark_uri(normalize_root(lake_root))}
    if confined:
        conf["spark.sql.catalog.spark_catalog.confined"] = "true"
        conf[READ_ONLY] = "true"
        conf["spark.connect.grpc.interceptor.classes"] = READ_ONLY_INTERCEPTOR
        # `csv.`/path``, `parquet.`/path``: Spark's own reads of files by path, outside any catalog
        conf["spark.sql.runSQLOnFiles"] = "false"
    return conf


def jars_dir() -> Path:
    """Where `make install` puts the JVM dependencies of pom.xml: inside this virtualenv."""
    return Path(sys.prefix) / "jars"


# the jars of Spark's s3a:// file system (pom.xml's hadoop-aws and what it brings: the AWS SDK's bundle alone is
# 690 MB of the 700), by their names' stems
S3A_JARS = ("hadoop-aws", "bundle", "analyticsaccelerator-s3", "wildfly-openssl")


def s3a_jar(jar: Path) -> bool:
    """Whether ``jar`` is one of :data:`S3A_JARS` (its name: the artifact, a hyphen, the version)."""
    return re.sub(r"-\d.*$", "", jar.name) in S3A_JARS


def lake_on_object_store(lake_root: str) -> bool:
    """Whether a Spark whose lake is ``lake_root`` may need an object store's file system: a URI, or no lake named
    (a session told its lake later)."""
    return not lake_root or "://" in lake_root


def jvm_dependency_conf(master: str, lake_root: str = "") -> dict[str, str]:
    """The settings that give a Spark started on ``master`` the fetched jars and Delta Lake; a cluster's executors
    get the s3a jars only when ``lake_root`` is not a local path."""
    folder = jars_dir()
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise RuntimeError(
            f"Delta Lake's Spark jars are missing from {folder}: run `make install` "
            "(it fetches pom.xml's dependencies with Maven)"
        )
    conf = dict(DELTA_CONF)
    if master.split("[")[0] == "local":
        # local executors run in the driver's JVM: the jars join its classpath where they lie, whereas
        # spark.jars would copy them (700 MB with the AWS SDK) into every session's work folder
        conf["spark.driver.extraClassPath"] = str(folder / "*")
    else:
        # a cluster's executors receive the jars from the session, each application its own copy in the worker's
        # work folder: the AWS SDK's 690 MB took about 7 s per application, useless to a lake on a shared path
        if not lake_on_object_store(lake_root):
            jars = [jar for jar in jars if not s3a_jar(jar)]
        conf["spark.jars"] = ",".join(str(jar) for jar in jars)
    return conf


# Hadoop's local file system sets each new folder's and file's permissions by starting a `chmod` process when its
# native library is missing (the pyspark wheel ships none): a Delta write of many small partitions started thousands.
# The warehouse's (resources/jvm) sets them in process; a local Spark uses it for file: paths once `make install` has
# compiled it (an install from before it keeps Hadoop's). A cluster's executors keep their own.
LOCAL_FILE_SYSTEM = "warehouse.spark.LocalFileSystem"


def local_file_system_conf(master: str) -> dict[str, str]:
    """The setting that gives a Spark started on ``master`` the warehouse's local file system: local masters only."""
    if master.split("[")[0] != "local" or not _installed_class(LOCAL_FILE_SYSTEM):
        return {}
    return {"spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM}


@functools.cache
def _installed_class(name: str) -> bool:
    """Whether a jar of :func:`jars_dir` holds the class ``name``."""
    entry = name.replace(".", "/") + ".class"
    for jar in jars_dir().glob("warehouse-*.jar"):
        with zipfile.ZipFile(jar) as archive:
            if entry in archive.namelist():
                return True
    return False


class SparkResource(ConfigurableResource):  # type: ignore[misc]
    """How assets reach Spark. Configure with environment variables in production (see README)."""

    mode: SparkMode = Field(default="local", description="local | connect | master")
    master: str = Field(default="local[2]", description="master URL for local/master modes")
    connect_url: str = Field(default="sc://127.0.0.1:15002", description="Spark Connect URL (connect mode)")
    driver_memory: str = Field(default="4g", description="driver heap for local mode")
    timezone: str = Field(default=DEFAULT_TIMEZONE, description="business timezone = Spark session timezone")
    ui: bool = Field(default=False, description="start the Spark UI (local/master modes)")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark settings")
    lake_root: str = Field(default="", description="the lake whose tables `layer.table` names (local/master modes)")
    # the compute pool's endpoint the run was placed on (its warehouse/pool_url tag), over the settings' own
    _pool_url: str = PrivateAttr(default="")

    def setup_for_execution(self, context: InitResourceContext) -> None:
        from resources.settings import current

        tags = context.dagster_run.tags if context.dagster_run is not None else {}
        # the pool's URL as declared (its token is kept out of the tags the UI shows); the tag's without a declaration
        declared = current().spark_pool_urls.get(tags.get(POOL_TAG, ""), "")
        self._pool_url = declared or tags.get(POOL_URL_TAG, "")

    def session(self) -> SparkSession:
        mode, master, connect_url = self.mode, self.master, self.connect_url
        if self._pool_url.startswith("sc://"):
            mode, connect_url = "connect", self._pool_url
        elif self._pool_url:
            mode, master = "master", self._pool_url
        return get_session(
            mode=mode,
            master=master,
            connect_url=connect_url,
            driver_memory=self.driver_memory,
            timezone=self.timezone,
            ui=self.ui,
            conf=self.conf,
            lake_root=self.lake_root,
        )


def s3a_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark's ``s3a://`` file system, configured from the standard AWS variables: the endpoint of an
    S3-compatible store (``AWS_ENDPOINT_URL``, addressed by path, http allowed) and ``AWS_REGION``.

    Delta's commits on ``s3a://`` go through its default S3SingleDriverLogStore: concurrent writers inside
    one Spark driver (this process's one session) are serialised by it, writers in two drivers at once on
    one table are not (that needs S3DynamoDBLogStore and a DynamoDB table, not configured here)."""
    env = os.environ if env is None else env
    conf: dict[str, str] = {}
    endpoint = s3_endpoint(env)
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "true" if endpoint.startswith("https://") else "false"
    if env.get("AWS_REGION"):
        conf["spark.hadoop.fs.s3a.endpoint.region"] = env["AWS_REGION"]
    # no credentials provider is set: s3a's default chain already reads AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY
    # (and the session token) from the environment before the instance profile, and keeps the keys out of conf
    return conf


def _settings(timezone: str, conf: dict[str, str]) -> dict[str, str]:
    settings = dict(DEFAULT_CONF)
    settings.update(s3a_conf())
    settings["spark.sql.session.timeZone"] = timezone
    settings.update(conf)
    return settings


def get_session(
    *,
    mode: SparkMode = "local",
    master: str = "local[2]",
    connect_url: str = "sc://127.0.0.1:15002",
    driver_memory: str = "4g",
    timezone: str = DEFAULT_TIMEZONE,
    ui: bool = False,
    conf: dict[str, str] | None = None,
    lake_root: str = "",
) -> SparkSession:
    """Return this process's Spark session, creating it on first use. A session it starts resolves ``layer.table``
    to ``lake_root``'s tables; over Spark Connect the server's lake is the one its names resolve to."""
    global _SESSION, _SESSION_KEY
    conf = conf or {}
    # the lake is not part of the session's identity: a process that works on another lake (a test's, a bench's)
    # keeps its one session and points the names at that lake
    key = (mode, master, connect_url, driver_memory, timezone, ui, tuple(sorted(conf.items())))
    with _LOCK:
        if _SESSION is not None:
            if key != _SESSION_KEY:
                raise RuntimeError(
                    "a Spark session with another configuration already runs in this process; "
                    "one process holds one session"
                )
            if lake_root and mode != "connect":
                _SESSION.conf.set(SESSION_LAKE, spark_uri(normalize_root(lake_root)))
            return _SESSION
        from pyspark.sql import SparkSession

        settings = _settings(timezone, conf)
        if mode == "connect":
            session = SparkSession.builder.remote(connect_client_url(connect_url)).getOrCreate()
            for name in ("spark.sql.session.timeZone", "spark.sql.shuffle.partitions"):
                session.conf.set(name, settings[name])
        else:
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            os.environ.setdefault("SPARK_HOME", str(spark_home()))
            builder = SparkSession.builder.master(master).appName("warehouse")
            builder = builder.config("spark.driver.memory", driver_memory)
            builder = builder.config("spark.ui.enabled", "true" if ui else "false")
            dependencies = {**jvm_dependency_conf(master, lake_root), **local_file_system_conf(master)}
            for name, value in {**dependencies, **lake_conf(lake_root), **settings}.items():
                builder = builder.config(name, value)
            session = builder.getOrCreate()
            session.sparkContext.setLogLevel("ERROR")
        _SESSION, _SESSION_KEY = session, key
        return session


def stop_session() -> None:
    global _SESSION, _SESSION_KEY
    with _LOCK:
        if _SESSION is not None:
            _SESSION.stop()
        _SESSION, _SESSION_KEY = None, None


# --- the embedded Spark Connect server -------------------------------------------------------------------


def engine_label(spark: SparkSession) -> str:
    """Which engine a figure was measured on, for benchmark output: ``delta-spark-4.4.0/spark-4.2.0/local[2]``
    (the Delta Lake jar of the session's classpath, Spark's version and master)."""
    from importlib.metadata import version

    master = spark.conf.get("spark.master", None) or "connect"
    return f"delta-spark-{version('delta-spark')}/spark-{spark.version}/{master}"


# Delta's MERGE reports how many files and partitions it scanned only as the SQL metrics of its command (its commit's
# operationMetrics leave them out); these are their names on the command's node, and the product's names for them
MERGE_SCAN_METRICS = {
    "numTargetFilesBeforeSkipping": "files_in_table",
    "numTargetFilesAfterSkipping": "files_scanned",
    "numTargetPartitionsAfterSkipping": "partitions_scanned",
}


def merge_scan_metrics(result: Any) -> dict[str, int]:
    """What the ``MERGE INTO`` that returned ``result`` scanned, as Delta's command measured it: files in the
    table, files left after data skipping, partitions left, read from the command's plan in a classic session.
    Over Spark Connect the command runs on the server and its client gets no plan metrics back: empty then, the
    numbers are reported, never inferred."""
    try:
        plan = result._jdf.queryExecution().executedPlan()
    except Exception:  # Spark Connect: no JVM on this side
        return {}
    inner = plan.commandPhysicalPlan() if hasattr(plan, "commandPhysicalPlan") else plan
    found: dict[str, int] = {}
    metrics = inner.metrics()
    for name, ours in MERGE_SCAN_METRICS.items():
        value = metrics.get(name)
        if value.isDefined():
            found[ours] = int(value.get().value())
    return found


def arrow_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A Spark DataFrame of an Arrow table, its chunks combined first: PySpark's ``createDataFrame`` loses the rows
    of the record batches after an empty one (batches of 1, 0 and 1 rows gave a DataFrame of 1 row), and a
    filtered or concatenated Arrow table often holds empty batches."""
    return spark.createDataFrame(table.combine_chunks())


# Spark's pre-shared key for Spark Connect: the server (Spark 4's spark.connect.authenticate.token, read from this
# variable too, so the key stays out of the command line other users see) refuses a client without it; pyspark's
# client sends it from the same variable
CONNECT_TOKEN_VARIABLE = "SPARK_CONNECT_AUTHENTICATE_TOKEN"


def new_connect_token() -> str:
    return secrets.token_urlsafe(32)


def connect_token_file(log_dir: str | Path, *, analysts: bool = False) -> Path:
    """Where a started server's token is kept for the tools started later (readable by its owner only, who hands
    the analysts' one to analysts): ``<log dir>/spark-connect.token``, ``spark-connect-analysts.token``."""
    return Path(log_dir) / ("spark-connect-analysts.token" if analysts else "spark-connect.token")


def write_connect_token(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)


def read_connect_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def connect_token() -> str | None:
    """The product's Connect token: ``$SPARK_CONNECT_AUTHENTICATE_TOKEN`` (the processes a server's starter started),
    else the token file the server's starter wrote in the warehouse's log dir (a tool started later); None without."""
    from resources.settings import current

    return os.environ.get(CONNECT_TOKEN_VARIABLE) or read_connect_token(connect_token_file(current().log_dir))


def connect_client_url(url: str, token: str | None = None) -> str:
    """``url`` as pyspark's client must be given it to send ``token`` (default: :func:`connect_token`).

    pyspark sends a token only over a secure channel: TLS, or gRPC's local credentials, which it picks for the host
    name ``localhost`` alone; so a loopback address is named ``localhost``. Without a token: ``url`` unchanged."""
    token = token or connect_token()
    if not token:
        return url
    head, sep, params = url.partition("/;")
    head = head.replace("sc://127.0.0.1:", "sc://localhost:").replace("sc://[::1]:", "sc://localhost:")
    if "token=" not in params:
        params = f"{params};token={token}" if params else f"token={token}"
    return f"{head}/;{params}" if sep or params else head


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def connect_server_listening(url: str) -> bool:
    """Whether a Spark Connect server listens at ``url`` (``sc://host:port/…``): a command beside a running stack
    uses the stack's server rather than start a JVM of its own."""
    host, _, port = url.removeprefix("sc://").split("/")[0].rpartition(":")
    return port.isdigit() and port_open(host or "127.0.0.1", int(port))


LOG_FILE_BYTES = 10 * 1024 * 1024  # the Connect server's log rolls over at this size
LOG_FILES_KEPT = 2  # rolled-over files kept beside the current one: the log never exceeds 30 MB


def connect_log_config(log_path: Path, level: str) -> str:
    """Log4j 2 settings of the Connect server: ``level`` and up (WARN by default; at INFO the server writes a line
    per task, about 25 MB in a dev stack's first ten minutes) into ``log_path``, rolled over at ``LOG_FILE_BYTES``
    with ``LOG_FILES_KEPT`` older files (``<log>.1``, ``<log>.2``), so a long-running server cannot fill the disk."""
    path = str(log_path.resolve())
    return "\n".join(
        [
            "status = error",
            "appender.file.type = RollingFile",
            "appender.file.name = file",
            f"appender.file.fileName = {path}",
            f"appender.file.filePattern = {path}.%i",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex",
            "appender.file.policies.type = Policies",
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy",
            f"appender.file.policies.size.size = {LOG_FILE_BYTES}",
            "appender.file.strategy.type = DefaultRolloverStrategy",
            f"appender.file.strategy.max = {LOG_FILES_KEPT}",
            f"rootLogger.level = {level.lower()}",
            "rootLogger.appenderRef.file.ref = file",
            # as Spark's own defaults: warnings about statistics of files written by old Parquet writers
            "logger.parquet.name = org.apache.parquet.CorruptStatistics",
            "logger.parquet.level = error",
            "",
        ]
    )


def start_connect_server(
    *,
    host: str = "127.0.0.1",
    port: int = 15002,
    master: str = "local[2]",
    driver_memory: str = "6g",
    timezone: str = DEFAULT_TIMEZONE,
    log_path: Path,
    log_level: str = "WARN",
    timeout_s: float = 120.0,
    token: str | None = None,
    lake_root: str = "",
    confined: bool = False,
    nice: int = 0,
) -> subprocess.Popen[bytes] | None:
    """Start a Spark Connect server from the pyspark wheel; return None if one already listens there.

    With ``token`` it refuses every client that does not send it; ``layer.table`` names ``lake_root``'s tables
    (``confined``: :func:`lake_conf`). Its log4j log goes to ``log_path`` at ``log_level`` (:func:`connect_log_config`);
    what the JVM itself prints (a crash, a start-up failure) to ``<log_path without .log>.out``. A positive ``nice``
    lowers the server's CPU priority (and its JVM's): Spark's bulk work then yields to the processes that start runs."""
    if port_open(host, port):
        return None
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RuntimeError("java was not found: Spark needs Java 17 (install openjdk-17-jre-headless)")
    home = spark_home()
    env = dict(os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable)
    env.pop(CONNECT_TOKEN_VARIABLE, None)
    if token:
        env[CONNECT_TOKEN_VARIABLE] = token
    log_path.parent.mkdir(parents=True, exist_ok=True)
    config = log_path.with_suffix(".log4j2.properties")
    config.write_text(connect_log_config(log_path, log_level))
    args = [
        str(home / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        master,
        "--driver-memory",
        driver_memory,
        "--driver-java-options",
        f"-Dlog4j2.configurationFile={config.resolve().as_uri()}",
        "--conf",
        f"spark.connect.grpc.binding.address={host}",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.ui.enabled=false",
    ]
    for name, value in {
        **jvm_dependency_conf(master, lake_root),
        **local_file_system_conf(master),
        **lake_conf(lake_root, confined=confined),
        **_settings(timezone, {}),
    }.items():
        args += ["--conf", f"{name}={value}"]
    args.append("spark-internal")
    if nice:
        args = ["nice", "-n", str(nice), *args]
    output = log_path.with_suffix(".out")
    log = output.open("ab")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited with {proc.returncode}; see {log_path} and {output}")
        if port_open(host, port):
            return proc
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"the Spark Connect server did not listen on {host}:{port} within {timeout_s:.0f}s")
