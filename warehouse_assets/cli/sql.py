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
from typing import TYPE_CHECKING, Any

from warehouse_assets.cli.common import load_settings

if TYPE_CHECKING:
    import pyarrow as pa
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
    from resources.spark import connect_server_listening, get_session

    url = settings.spark_connect_url
    if connect_server_listening(url):
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
            return _prompt(engine, args, as_of, settings.timezone)
        return _answer(engine, args.query, args, as_of, settings.timezone)
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


def _answer(engine: LakeSql, query: str, args: argparse.Namespace, as_of: object, zone: str) -> int:
    answer = engine.run(query, args.engine, as_of)  # type: ignore[arg-type]
    if args.format == "table":
        print(render_table(answer.rows, args.max_rows, zone))
    else:
        text = export(answer.rows, args.format, args.output, zone)
        if text is not None:
            sys.stdout.write(text)
    if args.output:
        print(f"wrote {answer.rows.num_rows} row(s) to {args.output} ({args.format})", file=sys.stderr)
    print(answer.summary(), file=sys.stderr if args.format != "table" else sys.stdout)
    return 0


def _prompt(engine: LakeSql, args: argparse.Namespace, as_of: object, zone: str) -> int:
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
            _answer(engine, text.rstrip(";"), args, as_of, zone)
        except SqlRefused as exc:
            print(f"error: {exc}")
        except Exception as exc:  # a failed query leaves the prompt up
            print(f"error: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
    with contextlib.suppress(OSError):
        readline.write_history_file(HISTORY)
    return 0


# --- what the terminal shows and what --output writes -------------------------------------------------------


def instants_as_text(rows: pa.Table, zone: str) -> pa.Table:
    """Every timestamp column as text of one form, whichever engine answered and whatever the format: in ``zone``
    (the business timezone, the partition keys' own) with its offset, to the second, or to the microsecond in a column
    where a value has them (``2026-03-02 00:30:00+08:00``). A timestamp without a zone (DataFusion's ``CAST(x AS
    TIMESTAMP)``, Spark's ``TIMESTAMP_NTZ``) is read as a wall time of ``zone``, as Spark's session reads one.
    Arrow's compute functions only: building a column from Python values imports pandas, a quarter of a second of a
    cold ``warehouse sql``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for n, column in enumerate(rows.columns):
        kind = column.type
        if not pa.types.is_timestamp(kind):
            continue
        micros = column.cast(pa.timestamp("us", kind.tz), safe=False)  # nanoseconds shown to the microsecond
        if kind.tz:
            local = micros.cast(pa.timestamp("us", zone))
        else:
            local = pc.assume_timezone(micros, zone, ambiguous="earliest", nonexistent="earliest")
        whole = local.cast(pa.timestamp("s", zone), safe=False)
        # compared with the whole seconds as a column: a Python scalar in a compute call would import pandas
        fraction = pc.any(pc.not_equal(local, whole.cast(pa.timestamp("us", zone))))
        text = pc.strftime(local if fraction.as_py() else whole, format="%Y-%m-%d %H:%M:%S%Ez")
        rows = rows.set_column(n, rows.field(n).with_type(pa.string()), text)
    return rows


def render_table(rows: pa.Table, max_rows: int, zone: str) -> str:
    """The rows as an aligned text table, at most ``max_rows`` of them, instants in ``zone``."""
    names = rows.column_names
    shown = instants_as_text(rows.slice(0, max_rows), zone).to_pylist()
    cells = [[_cell(r[n]) for n in names] for r in shown]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)) + " |", line]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    out.append(line)
    if rows.num_rows > max_rows:
        out.append(f"… {rows.num_rows - max_rows} more row(s): --output FILE exports them all")
    return "\n".join(out)


def _cell(value: Any) -> str:
    return "NULL" if value is None else str(value)


def export(rows: pa.Table, fmt: str, path: str | None, zone: str) -> str | None:
    """Write the rows as csv, json (one object per line) or parquet to ``path`` (csv/json: stdout text without).
    Parquet keeps the instants typed; the text formats write them as the table shows them (in ``zone``)."""
    import io
    import json

    from resources.lake_sql import SqlRefused, portable

    rows = portable(rows)
    if fmt == "parquet":
        if not path:
            raise SqlRefused("--format parquet needs --output FILE")
        import pyarrow.parquet as pq

        pq.write_table(rows, path)
        return None
    if fmt == "csv":
        import pyarrow.csv as pacsv

        buffer = io.BytesIO()
        pacsv.write_csv(_flat(instants_as_text(rows, zone)), buffer)
        text = buffer.getvalue().decode()
    elif fmt == "json":
        shown = instants_as_text(rows, zone).to_pylist()
        text = "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in shown)
    else:
        raise SqlRefused(f"--format {fmt!r}: expected one of table, csv, json, parquet")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return None
    return text


def _flat(rows: pa.Table) -> pa.Table:
    """The rows with each nested column (a list, a struct, a map: ``collect_list`` on Spark) as JSON text, the one
    thing a CSV cell can hold of them."""
    import json

    import pyarrow as pa

    for n, column in enumerate(rows.columns):
        if pa.types.is_nested(column.type):
            text = [None if v is None else json.dumps(v, default=str, ensure_ascii=False) for v in column.to_pylist()]
            rows = rows.set_column(n, rows.field(n).with_type(pa.string()), pa.array(text, pa.string()))
    return rows
