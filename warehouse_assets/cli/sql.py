"""``warehouse sql``: read-only SQL over the warehouse's tables by name, for analysts.

    warehouse sql "SELECT count(*) FROM dwd.order_detail WHERE dt = '2026-03-02'"
    warehouse sql --engine spark --as-of 12 --format csv --output out.csv "SELECT …"
    warehouse sql                      an interactive prompt (history in ~/.warehouse_sql_history)

Selective queries run on delta-rs's DataFusion reader in this process (no JVM); large scans and joins on Spark:
the Spark Connect server when one listens at ``WAREHOUSE_SPARK_CONNECT_URL`` (with the product's token), else a
local session. Each answer says which engine answered, why, how long it took and how many files it read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from warehouse_assets.cli.common import load_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from resources.lake_sql import LakeSql
    from resources.settings import Settings

HISTORY = Path("~/.warehouse_sql_history").expanduser()
FORMATS = ("table", "csv", "json", "parquet")


def add_sql_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from resources.lake_sql import ENGINES

    sql = sub.add_parser("sql", help="read-only SQL over the warehouse's tables by name (prompt without a query)")
    sql.add_argument("query", nargs="?", help='e.g. "SELECT * FROM dwd.order_detail WHERE order_id = 42"')
    sql.add_argument(
        "--engine", choices=ENGINES, default="auto", help="auto (default): chosen from the files read after pruning"
    )
    sql.add_argument("--as-of", help="read every table as of a version (a number) or a timestamp (ISO)")
    sql.add_argument("--format", choices=FORMATS, default="table", help="table (default), csv, json, parquet")
    sql.add_argument(
        "--output", help="write the rows to this file (csv, json, parquet), inside the working directory, a new file"
    )
    sql.add_argument("--force", action="store_true", help="let --output replace a file or write outside the directory")
    sql.add_argument("--max-rows", type=int, default=50, help="rows shown as a table (default 50)")
    sql.add_argument("--memory-budget-mb", type=int, default=None, help="the JVM-free engine's memory (default 1024)")


def spark_for(settings: Settings) -> tuple[SparkSession, str]:
    """The Spark a query runs on: the Connect server when one listens (the product's token), else a local one."""
    from resources.spark import get_session, port_open

    url = settings.spark_connect_url
    host, _, port = url.removeprefix("sc://").split("/")[0].rpartition(":")
    if port.isdigit() and port_open(host or "127.0.0.1", int(port)):
        return get_session(mode="connect", connect_url=url, timezone=settings.timezone), f"Spark Connect {url}"
    master = settings.spark_master if settings.spark_mode != "connect" else "local[2]"
    session = get_session(
        mode="local" if settings.spark_mode == "connect" else settings.spark_mode,
        master=master,
        driver_memory=settings.spark_driver_memory,
        timezone=settings.timezone,
        conf=settings.spark_conf,
        lake_root=settings.lake_root,
    )
    return session, f"Spark {master}"


def lake_sql(settings: Settings, memory_budget_mb: int | None = None) -> LakeSql:
    from resources.lake_sql import DEFAULT_MEMORY_BUDGET, LakeSql
    from resources.storage import storage_options

    budget = memory_budget_mb * (1 << 20) if memory_budget_mb else DEFAULT_MEMORY_BUDGET
    return LakeSql(
        settings.lake_root,
        storage_options(settings.lake_root),
        spark=lambda: spark_for(settings),
        memory_budget=budget,
    )


def run_sql(args: argparse.Namespace) -> int:
    from resources.lake_sql import AsOf, SqlRefused

    settings = load_settings(os.environ)
    engine = lake_sql(settings, args.memory_budget_mb)
    try:
        as_of = AsOf.parse(args.as_of, settings.zone) if args.as_of else None
        if args.output:
            check_output(args.output, args.force)
        if args.output and args.format == "table":
            args.format = Path(args.output).suffix.lstrip(".") if Path(args.output).suffix else "csv"
        if args.query is None:
            return _prompt(engine, args, as_of)
        return _answer(engine, args.query, args, as_of)
    except SqlRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def check_output(path: str, force: bool) -> None:
    """``--output`` writes a new file inside the working directory (links followed), or anything with ``--force``."""
    from resources.lake_sql import SqlRefused

    if force:
        return
    here = Path.cwd().resolve()
    target = Path(path).resolve()
    if not target.is_relative_to(here):
        raise SqlRefused(f"--output {path}: {target} is outside the working directory {here} (--force writes it)")
    if target.exists() or Path(path).is_symlink():
        raise SqlRefused(f"--output {path}: the file exists (--force replaces it)")


def _answer(engine: LakeSql, query: str, args: argparse.Namespace, as_of: object) -> int:
    from resources.lake_sql import export, render_table

    answer = engine.run(query, args.engine, as_of)  # type: ignore[arg-type]
    if args.format == "table":
        print(render_table(answer.rows, args.max_rows))
    else:
        text = export(answer.rows, args.format, args.output)
        if text is not None:
            sys.stdout.write(text)
    if args.output:
        print(f"wrote {answer.rows.num_rows} row(s) to {args.output} ({args.format})", file=sys.stderr)
    print(answer.summary(), file=sys.stderr if args.format != "table" else sys.stdout)
    return 0


def _prompt(engine: LakeSql, args: argparse.Namespace, as_of: object) -> int:
    """Read queries until EOF (Ctrl-D), each ended by ';' or an empty line, with readline's editing and history."""
    import readline

    from resources.lake_sql import SqlRefused

    with contextlib.suppress(OSError):
        readline.read_history_file(HISTORY)
    print(
        "warehouse sql: read-only queries over layer.table, e.g. SELECT * FROM dwd.order_detail LIMIT 5; "
        "end each with ';' or an empty line; Ctrl-D quits"
    )
    pending: list[str] = []
    while True:
        try:
            line = input("sql> " if not pending else "...> ")
        except EOFError:
            print()
            break
        except KeyboardInterrupt:
            print()
            pending = []
            continue
        if line.strip():
            pending.append(line)
            if not line.rstrip().endswith(";"):
                continue  # a query ends with ';' or an empty line
        text = "\n".join(pending).strip()
        if not text:
            continue
        pending = []
        readline.add_history(text)  # the whole query as one entry (input() adds lines only on a terminal)
        try:
            _answer(engine, text.rstrip(";"), args, as_of)
        except SqlRefused as exc:
            print(f"error: {exc}")
        except Exception as exc:  # a failed query leaves the prompt up
            print(f"error: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
    with contextlib.suppress(OSError):
        readline.write_history_file(HISTORY)
    return 0
