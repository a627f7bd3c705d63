"""Read-only SQL over the lake's tables by name (``SELECT … FROM dwd.order_detail``), on two engines.

* **datafusion**: delta-rs's DataFusion reader in this process, no JVM: it prunes partitions and skips files by the
  statistics in the Delta log, then reads what is left. Answers a selective query in milliseconds.
* **spark**: Spark's Delta reader (the Spark Connect server when it runs, else a local session), whose catalog
  resolves the same names (``warehouse.spark.LakeCatalog``). For large scans and joins.

``auto`` plans the query on delta-rs first (an ``EXPLAIN``, no data read): the files it would read after pruning
and their bytes decide. Past ``scan_budget`` bytes, or when DataFusion cannot plan the query (Spark SQL it does
not speak), Spark answers; and a query that runs out of DataFusion's memory budget is answered by Spark instead
of failing. Only queries run: one ``SELECT`` (``WITH``, ``UNION`` …) over the lake's ``layer.table`` tables.

What an analyst may not do is refused by the plan of the engine, with the analysts' server's words ("analysts'
access is read-only: … is not allowed"): DataFusion's logical plan may hold reads and nothing else (its writes,
DDL and settings named as the server names them); Spark answers in a read-only session, whose plans the
warehouse's JVM check refuses as on the analysts' server (resources/jvm/warehouse/spark/ReadOnly.java). What
DataFusion cannot plan (Spark's own SQL: ``ADD JAR``, ``TRANSFORM``, ``reflect``, reads by path …) is refused by
Spark's plan, which knows it, so the words are the same whichever engine was asked. The syntax tree (sqlglot)
only finds the lake's tables and their time travel.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import sqlglot
from deltalake import DeltaTable, QueryBuilder
from sqlglot import exp

from resources.delta_read import arrow_table
from resources.storage import normalize_root, spark_uri

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Engine = Literal["auto", "datafusion", "spark"]
ENGINES: tuple[Engine, ...] = ("auto", "datafusion", "spark")

# a layer or table name: what the warehouse creates, and nothing that could name a folder outside the lake
NAME = re.compile(r"[a-z][a-z0-9_]{0,127}")
DEFAULT_MEMORY_BUDGET = 1 << 30  # DataFusion's memory pool in this process
DEFAULT_SCAN_BUDGET = 512 << 20  # bytes of Parquet after pruning above which Spark reads instead

READ_ONLY_ROOTS = (exp.Select, exp.SetOperation, exp.Subquery)

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # "falling back to parsing as a Command": refused below


class SqlRefused(ValueError):
    """The statement is not a read-only query over the lake's tables; the message says what is wrong."""


class Unparsed(SqlRefused):
    """The syntax tree cannot read the statement (Spark's own SQL may still be one its plan refuses)."""


class NoSuchTable(SqlRefused):
    """A name of the statement is no table of the lake."""


# how the JVM's read-only check begins its refusals (ReadOnly.PREFIX): the same words whichever engine refuses
READ_ONLY_PREFIX = "analysts' access is read-only: "
# the nodes of a DataFusion logical plan that only read (`Inner Join`, `LeftSemi Join` … end in "Join")
DATAFUSION_READS = {
    "Projection", "Aggregate", "Filter", "TableScan", "Subquery", "SubqueryAlias", "EmptyRelation", "Sort",
    "Limit", "Union", "Distinct", "Distinct On", "Window", "Values", "Unnest", "RecursiveQuery", "Repartition",
}  # fmt: skip


def read_only_refusal(what: str) -> SqlRefused:
    return SqlRefused(f"{READ_ONLY_PREFIX}{what} is not allowed")


@dataclass(frozen=True)
class AsOf:
    """A point of time travel for every table of a query: a Delta version, or a timestamp."""

    version: int | None = None
    timestamp: datetime | None = None

    @classmethod
    def parse(cls, text: str, zone: tzinfo | None = None) -> AsOf:
        """``12`` (a version) or an ISO timestamp (``2026-03-02``, ``2026-03-02T08:00:00+08:00``); one without an
        offset is in ``zone`` (the warehouse's business time zone), else this machine's."""
        value = text.strip()
        if value.isdigit():
            return cls(version=int(value))
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise SqlRefused(
                f"--as-of {text!r}: expected a table version (a whole number) or an ISO timestamp, "
                "e.g. 2026-03-02T08:00"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=zone) if zone is not None else moment.astimezone()
        return cls(timestamp=moment)

    def spark_clause(self) -> exp.Version:
        if self.version is not None:
            return exp.Version(this="VERSION", kind="AS OF", expression=exp.Literal.number(self.version))
        assert self.timestamp is not None
        # the instant as a number: a timestamp string would be read in the Spark session's time zone
        micros = round(self.timestamp.timestamp() * 1_000_000)
        instant = exp.Anonymous(this="timestamp_micros", expressions=[exp.Literal.number(micros)])
        return exp.Version(this="TIMESTAMP", kind="AS OF", expression=instant)


@dataclass(frozen=True)
class TableRef:
    layer: str
    table: str
    as_of: AsOf | None  # the query's own `VERSION AS OF` / `TIMESTAMP AS OF` on this reference

    @property
    def name(self) -> str:
        return f"{self.layer}.{self.table}"

    @property
    def view(self) -> str:
        """The name DataFusion knows it by: one identifier, unique per version read."""
        suffix = ""
        if self.as_of is not None:
            suffix = f"__v{self.as_of.version}" if self.as_of.version is not None else f"__t{_stamp(self.as_of)}"
        return f"{self.layer}__{self.table}{suffix}"


def _stamp(as_of: AsOf) -> str:
    assert as_of.timestamp is not None
    return re.sub(r"\W", "_", as_of.timestamp.isoformat()).lower()  # DataFusion folds unquoted names to lowercase


@dataclass
class ReadQuery:
    """A statement checked to be one read-only query; its lake tables, each reference's own time travel applied."""

    sql: str
    tree: exp.Expression
    tables: list[TableRef]


def _literal_as_of(version: exp.Version) -> AsOf:
    value = version.expression
    if isinstance(value, exp.Anonymous) and str(value.this).lower() == "timestamp_micros":
        return AsOf(timestamp=datetime.fromtimestamp(int(value.expressions[0].name) / 1_000_000, tz=UTC))
    text = value.name if isinstance(value, exp.Literal) else value.sql()
    kind = str(version.this).upper()
    return AsOf.parse(text) if kind == "VERSION" else AsOf(timestamp=AsOf.parse(text).timestamp or None)


def parse_query(sql: str, as_of: AsOf | None = None, pin: Callable[[str, str, AsOf], AsOf] | None = None) -> ReadQuery:
    """``sql`` as a read-only query; SqlRefused naming what is refused. ``as_of`` applies to every lake table the
    query names (a reference's own ``VERSION AS OF`` wins). ``pin`` turns each reference's point of time travel into
    the version it reads, so that every engine reads that version."""
    try:
        statements = [s for s in sqlglot.parse(sql, read="spark") if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise Unparsed(f"cannot parse the query: {str(exc).splitlines()[0]}") from None
    if not statements:
        raise SqlRefused("no query given")
    if len(statements) > 1:
        raise SqlRefused(f"one query at a time: {len(statements)} statements given")
    tree = statements[0]
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    reads = isinstance(tree, READ_ONLY_ROOTS)
    tables: list[TableRef] = []

    def to_lake(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Table):
            return node
        if isinstance(node.this, exp.Func):  # a table-valued function: it could read anything by path
            raise SqlRefused(f"only the lake's tables can be read: {node.sql(dialect='spark')} is refused")
        if not node.name or (not node.db and node.name in ctes):
            return node
        if node.db and "/" in node.name:
            return node  # a read by path: refused by the engines' plans (no lake table, Spark's catalog refuses it)
        layer, table = node.db, node.name
        if node.catalog or not layer or not NAME.fullmatch(layer) or not NAME.fullmatch(table):
            if not reads:  # a statement's own names (a view, a function, a schema): its plan refuses it
                return node
            raise SqlRefused(
                f"{node.sql(dialect='spark')}: tables are named layer.table in lowercase (e.g. dwd.order_detail)"
            )
        own = node.args.get("version")
        point = _literal_as_of(own) if own is not None else as_of
        if point is not None and pin is not None:
            point = pin(layer, table, point)
        ref = TableRef(layer, table, point)
        tables.append(ref)
        if ref.as_of is not None and (own is None or pin is not None):
            node = node.copy()
            node.set("version", ref.as_of.spark_clause())
        return node

    tree = tree.transform(to_lake)
    return ReadQuery(sql, tree, tables)


def _statement_kind(node: exp.Expr) -> str:
    """What a statement does, as its keywords say it: ``INSERT``, ``CREATE TABLE``, ``ADD JAR``, ``SET``."""
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    kind = node.args.get("kind")
    return f"{node.key.upper()} {str(kind).upper()}" if isinstance(kind, str) and kind else node.key.upper()


# DataFusion's plan nodes that change something, named as the analysts' server names the same statement
DATAFUSION_AS_SPARK = {
    "CreateMemoryTable": "CREATE TABLE … AS SELECT",
    "CreateExternalTable": "CREATE TABLE",
    "CreateCatalogSchema": "CREATE SCHEMA",
    "CreateCatalog": "CREATE SCHEMA",
    "CreateView": "CREATE VIEW",
    "CreateFunction": "CREATE FUNCTION (loading code)",
    "DropTable": "DROP TABLE",
    "DropView": "DROP TABLE",
    "DropCatalogSchema": "DROP SCHEMA",
    "DropFunction": "DROP FUNCTION",
}
DML_TABLE = re.compile(r"table=\[([^\]]*)\]")
SET_VARIABLE = re.compile(r'set "([^"]*)"')


def datafusion_refusal(
    logical_plan: str, tables: dict[str, str] | None = None, statement: str = ""
) -> SqlRefused | None:
    """The refusal of a DataFusion logical plan (``EXPLAIN``'s text) holding anything but reads, or None, in the
    analysts' server's words where the plan says what the server's would: a write names its lake table (``tables``:
    DataFusion's name of each, its ``layer.table``), a setting its key."""
    for line in logical_plan.splitlines():
        node = line.strip().split(":")[0]
        if not node or node in DATAFUSION_READS or node.endswith("Join"):
            continue
        if node == "Dml" and (target := DML_TABLE.search(line)) and target[1] in (tables or {}):
            return read_only_refusal(f"writing {(tables or {})[target[1]]} (INSERT, MERGE, UPDATE, DELETE)")
        if node == "SetVariable" and (key := SET_VARIABLE.search(line)):
            # DataFusion folds the key to lowercase: the server names it as the statement spells it
            spelt = re.search(re.escape(key[1]), statement, re.IGNORECASE)
            return read_only_refusal(f"SET {spelt[0] if spelt else key[1]}")
        return read_only_refusal(DATAFUSION_AS_SPARK.get(node, f"{node} (not a read)"))
    return None


# --- the outcome ------------------------------------------------------------------------------------------


@dataclass
class ScanPlan:
    """What delta-rs would read for the query: files in the tables it names and those left after pruning."""

    files_total: int
    files_read: int
    bytes_read: int

    @property
    def files_skipped(self) -> int:
        return self.files_total - self.files_read


@dataclass
class Answer:
    rows: pa.Table  # in the same Arrow types whichever engine answered (:func:`portable`)
    engine: Literal["datafusion", "spark"]
    seconds: float
    plan: ScanPlan | None  # None when delta-rs could not plan the query
    why: str  # why this engine answered
    spark_where: str = ""  # which Spark: the Connect URL or the local master

    def summary(self) -> str:
        where = f" ({self.spark_where})" if self.spark_where else ""
        text = f"{self.rows.num_rows} row(s) in {self.seconds:.3f} s on {self.engine}{where}: {self.why}"
        if self.plan is not None:
            # Spark's own scan metrics stay on its server over Connect: its answers show delta-rs's plan of the query
            source = "" if self.engine == "datafusion" else " in delta-rs's plan"
            text += (
                f"; files{source}: {self.plan.files_read} scanned, {self.plan.files_skipped} skipped of "
                f"{self.plan.files_total} ({_size(self.plan.bytes_read)} read after pruning)"
            )
        return text


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


FILE_GROUPS = re.compile(r"file_groups=\{[^:]*: \[(.*?)\]\}")
FILE_RANGE = re.compile(r":\d+\.\.\d+$")


def files_in_plan(plan_text: str) -> list[str]:
    """The files every scan of a DataFusion physical plan reads (one entry per scan and file)."""
    files: list[str] = []
    for groups in FILE_GROUPS.findall(plan_text):
        scan: dict[str, None] = {}
        for group in re.findall(r"\[([^\[\]]*)\]", groups):
            # a large file is read in byte ranges (`path:0..1048576`), maybe in two groups: one file
            scan.update({FILE_RANGE.sub("", f.strip()): None for f in group.split(",") if f.strip()})
        files += list(scan)
    return files


# --- the engines ------------------------------------------------------------------------------------------


def _resources_exhausted(exc: BaseException) -> bool:
    return "Resources exhausted" in str(exc)


@dataclass
class LakeSql:
    """Read-only SQL over the tables of the lake at ``root``.

    ``spark`` returns the Spark to answer on (called only when Spark answers) and a label saying which one."""

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)
    spark: Callable[[], tuple[SparkSession, str]] | None = None
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    scan_budget: int = DEFAULT_SCAN_BUDGET
    _read_only: tuple[SparkSession, str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = normalize_root(self.root)

    def table_uri(self, ref: TableRef) -> str:
        return f"{self.root}/{ref.layer}/{ref.table}"

    def _open(self, ref: TableRef) -> DeltaTable:
        uri = self.table_uri(ref)
        options = self.storage_options or None
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            raise NoSuchTable(f"no table {ref.name} in the lake ({uri} is no Delta table)")
        dt = DeltaTable(uri, storage_options=options)
        if ref.as_of is not None and ref.as_of.version is not None and ref.as_of.version > dt.version():
            latest = dt.version()
            raise SqlRefused(
                f"{ref.name} has no readable version {ref.as_of.version}: its latest version is {latest} "
                f"(--as-of takes a version from 0 to {latest}, or a timestamp)"
            )
        if ref.as_of is not None:
            try:
                point = ref.as_of.version if ref.as_of.version is not None else ref.as_of.timestamp
                assert point is not None
                dt.load_as_version(point)
            except Exception as exc:
                raise SqlRefused(
                    f"{ref.name} has no readable version {_as_of_text(ref.as_of)} (its latest version is "
                    f"{DeltaTable(uri, storage_options=options).version()}; the log of older ones may have been "
                    f"cleaned up): {_first_line(exc)}"
                ) from None
        return dt

    def _pin(self, layer: str, table: str, as_of: AsOf) -> AsOf:
        """A timestamp as the version delta-rs finds at it: Spark would find it by its own reading of the commits'
        times, and the two engines must answer from the same version."""
        if as_of.version is not None:
            return as_of
        return AsOf(version=self._open(TableRef(layer, table, as_of)).version())

    def _datafusion(self, query: ReadQuery) -> tuple[QueryBuilder, str, ScanPlan]:
        """A DataFusion session with the query's tables, the query in its dialect, and its scan plan; SqlRefused
        when its plan holds anything but reads (before anything runs: the plan is an ``EXPLAIN``)."""
        builder = QueryBuilder()
        sizes: dict[str, int] = {}
        files_total = 0
        registered: dict[str, str] = {}  # DataFusion's name of each table: its layer.table
        missing: list[NoSuchTable] = []  # a write's new table, or a name to report once the plan needs it
        for ref in query.tables:
            try:
                dt = self._open(ref)
            except NoSuchTable as exc:
                missing.append(exc)
                continue
            actions = arrow_table(dt.get_add_actions(flatten=True))
            files_total += actions.num_rows
            for path, size in zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True):
                sizes[path] = int(size)
            if ref.view not in registered:
                builder.register(ref.view, dt)
                registered[ref.view] = ref.name
        # DataFusion's pool takes whole kibibytes: a query that needs more fails "Resources exhausted" (caught)
        list(builder.execute(f"SET datafusion.runtime.memory_limit = '{max(1, self.memory_budget // 1024)}K'"))
        by_view = {(r.layer, r.table, r.as_of): r.view for r in query.tables}

        def rename(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Table) and any((la, ta) == (node.db, node.name) for la, ta, _ in by_view):
                own = node.args.get("version")
                key = (node.db, node.name, _literal_as_of(own) if own is not None else None)
                view = by_view.get(key) or next(v for (la, ta, _), v in by_view.items() if (la, ta) == key[:2])
                alias = node.alias or (node.name if isinstance(query.tree, READ_ONLY_ROOTS) else "")
                return exp.Table(
                    this=exp.to_identifier(view), alias=exp.TableAlias(this=exp.to_identifier(alias)) if alias else None
                )
            return node

        sql = query.tree.transform(rename).sql(dialect="postgres")
        try:
            initial, physical = _explain(builder, sql)
        except Exception:
            if missing:
                raise missing[0] from None
            raise
        refused = datafusion_refusal(initial, registered, query.sql)
        if refused is not None:
            raise refused
        if missing:
            raise missing[0]
        files = files_in_plan(physical)
        read = sum(_size_of(f, sizes) for f in files)
        return builder, sql, ScanPlan(files_total, len(files), read)

    def run(self, sql: str, engine: Engine = "auto", as_of: AsOf | None = None) -> Answer:
        """The query's rows from ``engine`` (``auto``: chosen from what it would read after pruning)."""
        if engine not in ENGINES:
            raise SqlRefused(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
        begun = time.perf_counter()
        try:
            query = parse_query(sql, as_of, pin=self._pin)
        except Unparsed as exc:  # Spark SQL the syntax tree does not know: its plan may refuse it, in its words
            raise self._spark_refusal(sql) or exc from None
        if engine == "spark":
            return self._forced_spark(query, begun)
        plan: ScanPlan | None = None
        try:
            builder, dialect_sql, plan = self._datafusion(query)
        except SqlRefused:
            raise
        except Exception as exc:
            if engine == "datafusion":
                refused = self._spark_refusal(sql)  # what DataFusion cannot plan, Spark's plan names
                raise refused or SqlRefused(f"the JVM-free engine cannot run this query: {_first_line(exc)}") from None
            return self._on_spark(query, begun, None, f"DataFusion cannot plan it ({_first_line(exc)})")
        assert plan is not None
        _only_a_query(query)
        if engine == "auto" and plan.bytes_read > self.scan_budget:
            why = f"reads {_size(plan.bytes_read)} after pruning, above the JVM-free engine's {_size(self.scan_budget)}"
            return self._on_spark(query, begun, plan, why)
        try:
            rows = arrow_table(builder.execute(dialect_sql))
        except Exception as exc:
            if not _resources_exhausted(exc):
                raise SqlRefused(f"the JVM-free engine failed: {_first_line(exc)}") from None
            why = f"over the JVM-free engine's memory budget ({_size(self.memory_budget)})"
            if engine == "datafusion":
                raise SqlRefused(f"{why}; run it on Spark (--engine spark or auto)") from None
            return self._on_spark(query, begun, plan, why)
        why = "--engine datafusion" if engine == "datafusion" else f"reads {_size(plan.bytes_read)} after pruning"
        return Answer(portable(rows), "datafusion", time.perf_counter() - begun, plan, why)

    def _forced_spark(self, query: ReadQuery, begun: float) -> Answer:
        """``--engine spark``: delta-rs's plan chooses nothing here, it only tells which files the query reads, so it
        is made while Spark answers (both wait outside Python's lock: delta-rs in Rust, the Spark client on its
        socket) instead of adding its tens of milliseconds before Spark starts."""
        if not query.tables or not isinstance(query.tree, READ_ONLY_ROOTS):
            raise self._spark_refusal(query.sql) or _not_a_query(query)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-rs-plan") as pool:
            planning = pool.submit(self._datafusion, query)
            try:
                answer = self._on_spark(query, begun, None, "--engine spark")
            except SqlRefused:
                raise  # Spark's plan refused it: its words
            except Exception:
                missing = planning.exception()
                if isinstance(missing, SqlRefused):  # a missing table or version: said as on DataFusion
                    raise missing from None
                raise
            try:
                plan: ScanPlan | None = planning.result()[2]
            except Exception:  # SQL that DataFusion cannot plan, which Spark answered: no file figures
                plan = None
        return replace(answer, plan=plan, seconds=time.perf_counter() - begun)

    def _session(self) -> tuple[SparkSession, str]:
        """The read-only Spark session of this engine, its names resolving in this lake."""
        from resources.spark import SESSION_LAKE

        if self._read_only is None:
            assert self.spark is not None
            session, where = self.spark()
            self._read_only = (read_only_session(session), where)
        session, where = self._read_only
        # the names resolve in this lake (ignored by a confined server, which has its own)
        session.conf.set(SESSION_LAKE, spark_uri(self.root))
        return session, where

    def _spark_refusal(self, sql: str) -> SqlRefused | None:
        """Spark's read-only plan check's refusal of ``sql`` as written, or None (no Spark, or nothing refused:
        the statement is analysed, never run, but for the commands the check allows, which change nothing shared)."""
        if self.spark is None:
            return None
        session, _ = self._session()
        try:
            _ = session.sql(sql).schema  # a Connect client's analysis runs on the server, its check included
        except Exception as exc:
            said = read_only_message(exc)
            return SqlRefused(said) if said is not None else None
        return None

    def _on_spark(self, query: ReadQuery, begun: float, plan: ScanPlan | None, why: str) -> Answer:
        """Spark's answer, from a read-only session. A missing table or version has been named already by delta-rs's
        planning, which every path to Spark begins with (and which refuses it with ``SqlRefused``)."""
        if self.spark is None:
            raise SqlRefused(f"this query needs Spark ({why}), and none is configured")
        if not query.tables or not isinstance(query.tree, READ_ONLY_ROOTS):
            raise self._spark_refusal(query.sql) or _not_a_query(query)
        session, where = self._session()
        try:
            rows = session.sql(query.tree.sql(dialect="spark")).toArrow()  # every time travel pinned to a version
        except Exception as exc:
            said = read_only_message(exc)
            if said is None:
                raise
            raise SqlRefused(said) from None
        return Answer(portable(rows), "spark", time.perf_counter() - begun, plan, why, where)


def _explain(builder: QueryBuilder, sql: str) -> tuple[str, str]:
    """DataFusion's initial logical plan and physical plan of ``sql``, nothing run."""
    explained = arrow_table(builder.execute("EXPLAIN VERBOSE " + sql))
    plans = dict(zip(explained["plan_type"].to_pylist(), explained["plan"].to_pylist(), strict=True))
    return plans["initial_logical_plan"], plans.get("physical_plan", "")


def _not_a_query(query: ReadQuery) -> SqlRefused:
    if not isinstance(query.tree, READ_ONLY_ROOTS):
        return SqlRefused(f"only queries run here (SELECT, WITH …): {_statement_kind(query.tree)} is not one")
    return SqlRefused("the query reads no table of the lake (name one as layer.table, e.g. dwd.order_detail)")


def _only_a_query(query: ReadQuery) -> None:
    """A statement whose plan only reads may still be no query over the lake (``SHOW``, ``SELECT 1``)."""
    if not query.tables or not isinstance(query.tree, READ_ONLY_ROOTS):
        raise _not_a_query(query)


def read_only_session(session: SparkSession) -> SparkSession:
    """A session of ``session``'s Spark in which the warehouse's JVM check refuses every plan but a read (and which
    cannot be made writable again). A classic one is a new session of the same Spark, so that the process's other
    users of it keep theirs; a Connect client's session is this process's own."""
    from resources.spark import READ_ONLY

    if session.conf.get(READ_ONLY, "false") == "true":  # the analysts' server: read-only by its own configuration
        return session
    if not type(session).__module__.startswith("pyspark.sql.connect"):
        session = session.newSession()
    # Spark's own reads of files by path (`parquet.`/path``) off, before the flag makes the setting unchangeable
    session.conf.set("spark.sql.runSQLOnFiles", "false")
    session.conf.set(READ_ONLY, "true")
    return session


def read_only_message(exc: BaseException) -> str | None:
    """The read-only check's refusal inside a Spark error (a JVM exception's text, through Py4J or gRPC), or None."""
    text = str(exc)
    at = text.find(READ_ONLY_PREFIX)
    if at < 0:
        return None
    return re.split(r"[\n\"]", text[at:], maxsplit=1)[0].strip()


def _size_of(path: str, sizes: dict[str, int]) -> int:
    """A file's size from the log, by the path a DataFusion plan shows (relative to the table or to `/`)."""
    for relative, size in sizes.items():
        if path.endswith(relative):
            return size
    return 0


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _as_of_text(as_of: AsOf) -> str:
    return str(as_of.version) if as_of.version is not None else str(as_of.timestamp)


def _plain_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` without Arrow's view layouts (delta-rs's DataFusion answers strings as ``string_view``, which no Arrow
    writer but Parquet's takes), and an instant in UTC whatever zone its engine labelled it with (Spark labels its
    session's), nested types included."""
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_timestamp(kind) and kind.tz:
        return pa.timestamp(kind.unit, "UTC")
    if pa.types.is_list(kind) or pa.types.is_list_view(kind):
        return pa.list_(kind.value_field.with_type(_plain_type(kind.value_type)))
    if pa.types.is_large_list(kind) or pa.types.is_large_list_view(kind):
        return pa.large_list(kind.value_field.with_type(_plain_type(kind.value_type)))
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(kind.value_field.with_type(_plain_type(kind.value_type)), kind.list_size)
    if pa.types.is_map(kind):
        return pa.map_(
            kind.key_field.with_type(_plain_type(kind.key_type)), kind.item_field.with_type(_plain_type(kind.item_type))
        )
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in kind])
    return kind


def portable(rows: pa.Table) -> pa.Table:
    """The rows in the same Arrow types whichever engine answered: no view layouts, instants in UTC (as the UI shows
    them). Every output format takes them."""
    schema = pa.schema([f.with_type(_plain_type(f.type)) for f in rows.schema], metadata=rows.schema.metadata)
    return rows if schema.equals(rows.schema) else rows.cast(schema)


__all__: Sequence[str] = [
    "ENGINES",
    "READ_ONLY_PREFIX",
    "Answer",
    "AsOf",
    "LakeSql",
    "ReadQuery",
    "SqlRefused",
    "parse_query",
    "portable",
    "read_only_session",
]
