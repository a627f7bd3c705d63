"""`warehouse sql`'s JVM-free side: only read-only queries over the lake's `layer.table` names pass; delta-rs's
DataFusion answers them with partition pruning and file skipping, says how many files it read, and a query over its
memory budget is a clear error, never an out-of-memory crash. (Same rows on Spark: test_lake_sql_spark.py.)"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from resources.lake_sql import (
    READ_ONLY_PREFIX,
    AsOf,
    LakeSql,
    SqlRefused,
    datafusion_refusal,
    files_in_plan,
    parse_query,
)
from resources.settings import Settings, using
from resources.spark import (
    CONNECT_TOKEN_VARIABLE,
    connect_client_url,
    connect_token_file,
    lake_conf,
    write_connect_token,
)
from tests.support.hostile import DATAFUSION_PLANS, SQL
from warehouse_assets.cli.main import main

DAYS = ("2026-03-01", "2026-03-02", "2026-03-03")


def build_lake(root: Path) -> Path:
    """dwd.orders: 3 days x 2 files (ids 0-599, each file a disjoint id range), 6 versions; dwd.users: 7 users."""
    for n in range(6):
        ids = range(n * 100, (n + 1) * 100)
        batch = pa.table(
            {
                "order_id": pa.array(ids, pa.int64()),
                "user_id": pa.array([i % 7 for i in ids], pa.int64()),
                "amount": pa.array([float(i % 50) for i in ids]),
                "dt": [DAYS[n % 3]] * 100,
            }
        )
        write_deltalake(str(root / "dwd" / "orders"), batch, partition_by=["dt"], mode="append")
    users = pa.table({"user_id": pa.array(range(7), pa.int64()), "name": [f"user {i}" for i in range(7)]})
    write_deltalake(str(root / "dwd" / "users"), users)
    return root


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return build_lake(tmp_path / "lake")


# every kind of column the lake holds, and a row of nulls: what `warehouse sql` must write in every format
TYPED_QUERY = "SELECT id, name, at, amount, day, paid, NULL AS nothing FROM dwd.typed ORDER BY id"
TYPED_ROWS = [
    {
        "id": 1,
        "name": 'Zoë, "the" first',
        "at": datetime(2026, 3, 1, 16, 30, tzinfo=UTC),
        "amount": Decimal("12.30"),
        "day": date(2026, 3, 2),
        "paid": True,
        "nothing": None,
    },
    {"id": 2, "name": None, "at": None, "amount": None, "day": None, "paid": None, "nothing": None},
]
# each format's text of those rows, the same whichever engine answered (instants in the business timezone, with its
# offset: the partition keys' own)
TYPED_CSV = [
    {
        "id": "1",
        "name": 'Zoë, "the" first',
        "at": "2026-03-02 00:30:00+08:00",
        "amount": "12.30",
        "day": "2026-03-02",
        "paid": "true",
        "nothing": "",
    },
    {"id": "2", "name": "", "at": "", "amount": "", "day": "", "paid": "", "nothing": ""},
]
TYPED_JSON = [
    {
        "id": 1,
        "name": 'Zoë, "the" first',
        "at": "2026-03-02 00:30:00+08:00",
        "amount": "12.30",
        "day": "2026-03-02",
        "paid": True,
        "nothing": None,
    },
    {"id": 2, "name": None, "at": None, "amount": None, "day": None, "paid": None, "nothing": None},
]
TYPED_TABLE = [
    ["id", "name", "at", "amount", "day", "paid", "nothing"],
    ["1", 'Zoë, "the" first', "2026-03-02 00:30:00+08:00", "12.30", "2026-03-02", "True", "NULL"],
    ["2", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL"],
]
FORMATS = ("table", "csv", "json", "parquet")


def build_typed_table(root: Path) -> None:
    """dwd.typed: a string, an instant, a decimal, a date and a boolean column, and a row of nulls."""
    rows = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "name": pa.array(['Zoë, "the" first', None], pa.string()),
            "at": pa.array([TYPED_ROWS[0]["at"], None], pa.timestamp("us", tz="UTC")),
            "amount": pa.array([Decimal("12.30"), None], pa.decimal128(18, 2)),
            "day": pa.array([date(2026, 3, 2), None], pa.date32()),
            "paid": pa.array([True, None], pa.bool_()),
        }
    )
    write_deltalake(str(root / "dwd" / "typed"), rows)


def assert_every_format_is_written(
    engine: str, root: Path, here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`warehouse sql --engine ENGINE --format F` on every type, to stdout and to a file: the same rows in each."""
    build_typed_table(root)
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(root))
    monkeypatch.chdir(here)
    for fmt in FORMATS:
        if fmt == "table":
            assert main(["sql", "--engine", engine, TYPED_QUERY]) == 0
            shown = capsys.readouterr().out.splitlines()
            cells = [[c.strip() for c in line.strip("|").split("|")] for line in shown if line.startswith("| ")]
            assert cells == TYPED_TABLE, shown
            continue
        target = here / f"typed-{engine}.{fmt}"
        assert main(["sql", "--engine", engine, "--format", fmt, "--output", target.name, TYPED_QUERY]) == 0, fmt
        said = capsys.readouterr().err
        assert "2 row(s) in " in said and f" on {engine}" in said, said
        if fmt == "parquet":
            written = pq.read_table(target)
            assert written.to_pylist() == TYPED_ROWS
            assert written.schema.field("name").type == pa.string()  # no view layout, which other readers may not take
            assert written.schema.field("at").type == pa.timestamp("us", tz="UTC")
            continue
        text = target.read_text(encoding="utf-8")
        if fmt == "csv":
            assert list(csv.DictReader(text.splitlines())) == TYPED_CSV
        else:
            assert [json.loads(line) for line in text.splitlines()] == TYPED_JSON
        assert main(["sql", "--engine", engine, "--format", fmt, TYPED_QUERY]) == 0  # and the same to stdout
        assert capsys.readouterr().out == text


def test_the_jvm_free_engine_writes_every_format_for_every_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # delta-rs's DataFusion answers strings as string_view, which pyarrow's CSV writer refused
    assert_every_format_is_written("datafusion", tmp_path / "lake", tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("SELECT * FROM dwd.orders; DROP TABLE dwd.orders", "one query at a time"),
        ("SELECT * FROM `dwd`.`../ods/order`", "the JVM-free engine cannot run this query: .* not found"),
        ("SELECT * FROM spark_catalog.dwd.orders", "tables are named layer.table"),
        ("SELECT * FROM DWD.Orders", "tables are named layer.table"),
        ("SELECT 1", "reads no table of the lake"),
        ("SELECT * FROM read_files('/etc')", "only the lake's tables"),
    ],
)
def test_names_outside_the_lake_are_refused(lake: Path, statement: str, message: str) -> None:
    with pytest.raises(SqlRefused, match=message):
        LakeSql(str(lake)).run(statement, engine="datafusion")


def test_a_query_names_its_tables_and_each_gets_the_time_travel() -> None:
    query = parse_query(
        "WITH big AS (SELECT * FROM dwd.orders WHERE amount > 10) "
        "SELECT u.name, count(*) FROM big JOIN dwd.users VERSION AS OF 0 u ON big.user_id = u.user_id GROUP BY u.name",
        AsOf(version=3),
    )
    assert sorted(((t.name, t.as_of) for t in query.tables), key=str) == [
        ("dwd.orders", AsOf(version=3)),
        ("dwd.users", AsOf(version=0)),  # its own clause wins
    ]
    assert "dwd.orders VERSION AS OF 3" in query.tree.sql(dialect="spark")


def test_as_of_reads_a_version_or_a_timestamp() -> None:
    assert AsOf.parse("12") == AsOf(version=12)
    moment = AsOf.parse("2026-03-02T08:00:00+08:00").timestamp
    assert moment is not None and moment.utcoffset() is not None and moment.hour == 8
    naive = AsOf.parse("2026-03-02T08:00", ZoneInfo("Asia/Shanghai")).timestamp
    assert naive is not None and naive.utcoffset() == timedelta(hours=8)  # the business time zone's 08:00
    with pytest.raises(SqlRefused, match="expected a table version"):
        AsOf.parse("yesterday")


def test_datafusion_prunes_partitions_and_skips_files_by_statistics(lake: Path) -> None:
    sql = LakeSql(str(lake))
    day = sql.run("SELECT count(*) AS n, sum(amount) AS s FROM dwd.orders WHERE dt = '2026-03-02'")
    assert day.engine == "datafusion"
    assert day.rows.to_pylist() == [{"n": 200, "s": sum(float(i % 50) for i in [*range(100, 200), *range(400, 500)])}]
    assert day.plan is not None and (day.plan.files_read, day.plan.files_total) == (2, 6)  # the day's two files

    lookup = sql.run("SELECT order_id, dt FROM dwd.orders WHERE order_id = 250")
    assert lookup.rows.to_pylist() == [{"order_id": 250, "dt": "2026-03-03"}]
    assert lookup.plan is not None and (lookup.plan.files_read, lookup.plan.files_skipped) == (1, 5)  # min/max stats
    assert "1 scanned, 5 skipped of 6" in lookup.summary() and "on datafusion" in lookup.summary()


def test_joins_aggregates_and_time_travel_on_datafusion(lake: Path) -> None:
    sql = LakeSql(str(lake))
    joined = sql.run(
        "SELECT u.name, count(*) AS n FROM dwd.orders o JOIN dwd.users u ON o.user_id = u.user_id "
        "WHERE o.order_id < 14 GROUP BY u.name ORDER BY u.name"
    )
    assert joined.rows.to_pylist() == [{"name": f"user {i}", "n": 2} for i in range(7)]
    first = sql.run("SELECT count(*) AS n FROM dwd.orders", as_of=AsOf(version=0))
    assert first.rows.to_pylist() == [{"n": 100}]
    own = sql.run("SELECT count(*) AS n FROM dwd.orders VERSION AS OF 2")
    assert own.rows.to_pylist() == [{"n": 300}]
    with pytest.raises(SqlRefused, match="no table dwd.nothing in the lake"):
        sql.run("SELECT * FROM dwd.nothing")
    with pytest.raises(SqlRefused, match="has no readable version 99"):
        sql.run("SELECT * FROM dwd.orders", as_of=AsOf(version=99))


def test_over_the_memory_budget_datafusion_says_so_and_never_runs_out_of_memory(lake: Path) -> None:
    small = LakeSql(str(lake), memory_budget=16 << 10)
    query = "SELECT order_id, count(*) AS n FROM dwd.orders GROUP BY order_id ORDER BY n, order_id"
    with pytest.raises(SqlRefused, match=r"over the JVM-free engine's memory budget \(16.0 KB\); run it on Spark"):
        small.run(query, engine="datafusion")
    # auto goes to Spark instead (test_lake_sql_spark.py runs it there); without a Spark it says it needs one
    with pytest.raises(SqlRefused, match=r"needs Spark \(over the JVM-free engine's memory budget"):
        small.run(query)
    assert LakeSql(str(lake)).run(query, engine="datafusion").rows.num_rows == 600  # the default budget suffices


def test_a_large_scan_goes_to_spark(lake: Path) -> None:
    with pytest.raises(SqlRefused, match=r"needs Spark \(reads .* after pruning, above the JVM-free engine's 1.0 KB"):
        LakeSql(str(lake), scan_budget=1024).run("SELECT * FROM dwd.orders")


def test_files_are_counted_per_scan_of_the_plan() -> None:
    plan = (
        "DataSourceExec: file_groups={2 groups: [[a/x.parquet, a/y.parquet:0..10], "
        "[a/y.parquet:10..20, a/z.parquet]]}, projection=[id]\n"
        "  DataSourceExec: file_groups={1 group: [[b/w.parquet]]}, projection=[id]"
    )
    assert files_in_plan(plan) == ["a/x.parquet", "a/y.parquet", "a/z.parquet", "b/w.parquet"]


def test_the_cli_refuses_a_write_and_changes_nothing(
    lake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(lake))
    before = DeltaTable(str(lake / "dwd" / "orders")).version()
    assert main(["sql", "DELETE FROM dwd.orders WHERE dt = '2026-03-01'"]) == 2
    said = "error: analysts' access is read-only: writing dwd.orders (INSERT, MERGE, UPDATE, DELETE) is not allowed"
    assert said in capsys.readouterr().err
    assert DeltaTable(str(lake / "dwd" / "orders")).version() == before
    assert len(DeltaTable(str(lake / "dwd" / "orders")).file_uris()) == 6


@pytest.mark.parametrize("request_sql", list(SQL))
def test_the_hostile_matrix_is_refused_on_the_jvm_free_engine(lake: Path, tmp_path: Path, request_sql: str) -> None:
    """The SQL an analyst's client sends to the analysts' server, through `warehouse sql` with no Spark: what
    DataFusion plans is refused by its plan in the server's words (the same on Spark and on the server:
    test_lake_sql_spark.py, test_analysts_server.py); what only Spark's plan knows is never run."""
    text = request_sql.format(lake=lake, outside=tmp_path, mark=tmp_path / "code-ran")
    for engine in ("datafusion", "auto"):
        with pytest.raises(SqlRefused) as refused:
            LakeSql(str(lake)).run(text, engine=engine)  # type: ignore[arg-type]
        message = str(refused.value)
        if request_sql in DATAFUSION_PLANS:
            assert message.startswith(READ_ONLY_PREFIX) and SQL[request_sql] in message, message
        else:
            assert message.startswith(
                ("cannot parse the query", "the JVM-free engine cannot run this query", "this query needs Spark")
            ), message
    assert not (tmp_path / "code-ran").exists()
    assert DeltaTable(str(lake / "dwd" / "orders")).version() == 5


def test_datafusion_plans_holding_anything_but_reads_are_refused() -> None:
    read = "Projection: o.dt\n  Filter: o.order_id > Int64(1)\n    LeftSemi Join: o.id = s.id\n      TableScan: o"
    assert datafusion_refusal(read) is None
    for plan, said in [
        ("Dml: op=[Insert Into] table=[o]\n  Values: (Int64(1))", "writing dwd.o (INSERT, MERGE, UPDATE, DELETE)"),
        ("Dml: op=[Delete] table=[x]\n  TableScan: x", "Dml (not a read)"),
        ("CopyTo: format=csv output_url=/tmp/x options: ()\n  TableScan: o", "CopyTo (not a read)"),
        ('CreateExternalTable: Bare { table: "x" }', "CREATE TABLE"),
        ('SetVariable: set "spark.sql.runsqlonfiles" to "true"', "SET spark.sql.runSQLOnFiles"),
    ]:
        refused = datafusion_refusal(plan, {"o": "dwd.o"}, "SET spark.sql.runSQLOnFiles = true")
        assert refused is not None and str(refused) == f"{READ_ONLY_PREFIX}{said} is not allowed"


def test_the_output_is_a_new_file_in_the_working_directory_unless_forced(
    lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(lake))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    query = "SELECT count(*) AS n FROM dwd.orders"
    outside = tmp_path / "elsewhere.csv"
    (here / "kept.csv").write_text("precious\n")
    (here / "link.csv").symlink_to(outside)  # a new name inside whose file is outside
    for target, said in [
        (str(outside), f"--output {outside}: {outside} is outside the working directory {here} (--force writes it)"),
        ("../elsewhere.csv", f"is outside the working directory {here}"),
        ("link.csv", f"is outside the working directory {here}"),
        ("kept.csv", "--output kept.csv: the file exists (--force replaces it)"),
    ]:
        assert main(["sql", "--output", target, query]) == 2
        assert said in capsys.readouterr().err
    assert not outside.exists() and (here / "kept.csv").read_text() == "precious\n"
    assert main(["sql", "--output", "new.csv", query]) == 0
    assert (here / "new.csv").read_text() == '"n"\n600\n'
    assert main(["sql", "--force", "--output", "kept.csv", query]) == 0
    assert main(["sql", "--force", "--output", str(outside), query]) == 0
    assert (here / "kept.csv").read_text() == outside.read_text() == '"n"\n600\n'


def test_a_cold_command_loads_neither_dagster_nor_pandas_and_shows_instants_in_their_zone(tmp_path: Path) -> None:
    # in a fresh interpreter, as an analyst runs it: the two imports were most of a cold command's second
    root = tmp_path / "lake"
    instants = pa.array([0, 3_600_000_000, None], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    write_deltalake(str(root / "dwd" / "events"), pa.table({"id": [1, 2, 3], "at": instants}))
    script = (
        "import sys\n"
        "from warehouse_assets.cli.main import main\n"
        "status = main(['sql', '--engine', 'datafusion', 'SELECT id, at FROM dwd.events ORDER BY id'])\n"
        "print('loaded:', sorted(m for m in ('dagster', 'pandas', 'pyspark') if m in sys.modules), status)\n"
    )
    env = {**os.environ, "WAREHOUSE_LAKE_ROOT": str(root)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| 1  | 1970-01-01 08:00:00+08:00 |" in done.stdout and "| 3  | NULL" in done.stdout
    assert done.stdout.rstrip().endswith("loaded: [] 0")


def test_the_cli_prints_rows_engine_time_and_files_and_exports(
    lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(lake))
    monkeypatch.chdir(tmp_path)  # --output writes inside the working directory
    query = "SELECT order_id, amount FROM dwd.orders WHERE order_id IN (7, 307) ORDER BY order_id"
    assert main(["sql", query]) == 0
    out = capsys.readouterr().out
    assert "| order_id | amount |" in out and "| 307      | 7.0    |" in out
    assert "2 row(s) in " in out and " s on datafusion" in out and "2 scanned, 4 skipped of 6" in out

    for fmt in ("csv", "json", "parquet"):
        target = tmp_path / f"rows.{fmt}"
        assert main(["sql", "--format", fmt, "--output", str(target), query]) == 0
        if fmt == "csv":
            rows = list(csv.DictReader(target.open()))
            assert [(r["order_id"], r["amount"]) for r in rows] == [("7", "7"), ("307", "7")]
        elif fmt == "json":
            assert [json.loads(line) for line in target.read_text().splitlines()] == [
                {"order_id": 7, "amount": 7.0},
                {"order_id": 307, "amount": 7.0},
            ]
        else:
            assert pq.read_table(target).to_pylist() == [
                {"order_id": 7, "amount": 7.0},
                {"order_id": 307, "amount": 7.0},
            ]
    assert main(["sql", "--as-of", "0", "--format", "json", "SELECT count(*) AS n FROM dwd.orders"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == {"n": 100}


def test_connect_clients_send_the_token_over_a_local_channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pyspark sends a token only over TLS or to the host named `localhost` (gRPC's local credentials)
    assert connect_client_url("sc://127.0.0.1:15002", "t0k") == "sc://localhost:15002/;token=t0k"
    assert connect_client_url("sc://spark:15002/;use_ssl=true", "t0k") == "sc://spark:15002/;use_ssl=true;token=t0k"
    # no token anywhere: the URL as given
    monkeypatch.delenv(CONNECT_TOKEN_VARIABLE, raising=False)
    with using(Settings(log_dir=str(tmp_path))):
        assert connect_client_url("sc://127.0.0.1:15002") == "sc://127.0.0.1:15002"
        # a tool started later finds the token its server's starter left (its owner's alone) in the log dir
        write_connect_token(connect_token_file(tmp_path), "from-file")
        assert (connect_token_file(tmp_path).stat().st_mode & 0o777) == 0o600
        assert connect_client_url("sc://127.0.0.1:15002") == "sc://localhost:15002/;token=from-file"
        # the processes the starter started have it in their environment
        monkeypatch.setenv(CONNECT_TOKEN_VARIABLE, "from-env")
        assert connect_client_url("sc://127.0.0.1:15002") == "sc://localhost:15002/;token=from-env"


def test_the_catalog_settings_confine_an_analysts_spark(tmp_path: Path) -> None:
    assert lake_conf(str(tmp_path / "lake")) == {"spark.sql.catalog.spark_catalog.lake": str(tmp_path / "lake")}
    assert lake_conf("s3://bucket/lake", confined=True) == {
        "spark.sql.catalog.spark_catalog.lake": "s3a://bucket/lake",
        "spark.sql.catalog.spark_catalog.confined": "true",
        # read-only by the server's own settings, which no client changes, and its Connect gate
        "spark.warehouse.readOnly": "true",
        "spark.connect.grpc.interceptor.classes": "warehouse.spark.ReadOnlyInterceptor",
        "spark.sql.runSQLOnFiles": "false",
    }
    assert lake_conf("") == {}


def test_without_a_query_the_cli_is_a_prompt_with_history(
    lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from warehouse_assets.cli import sql as sql_cli

    history = tmp_path / "history"
    monkeypatch.setattr(sql_cli, "HISTORY", history)
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(lake))
    typed = iter(
        [
            "SELECT count(*) AS n",
            "FROM dwd.orders;",
            "DELETE FROM dwd.orders;",
            "SELECT max(order_id) AS m",
            "FROM dwd.orders",
            "",
        ]
    )

    def prompt(_: str) -> str:
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", prompt)
    assert main(["sql"]) == 0
    out = capsys.readouterr().out
    assert "| 600 |" in out and "| 599 |" in out  # ended by ';', then by an empty line
    assert "error: analysts' access is read-only: writing dwd.orders (INSERT" in out  # the prompt stays up
    assert "SELECT max(order_id) AS m" in history.read_text()


def test_a_version_past_the_latest_is_named_with_the_tables_latest_version(
    lake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(lake))
    assert main(["sql", "--as-of", "12", "SELECT count(*) AS n FROM dwd.orders"]) == 2
    said = capsys.readouterr().err
    assert said.startswith(
        "error: dwd.orders has no readable version 12: its latest version is 5 (--as-of takes a version from 0 to 5, "
        "or a timestamp)"
    ), said
    assert "kernel" not in said.lower()
