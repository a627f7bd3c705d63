"""Which column type is which, from the MySQL source to the lake: the one place the type tables live.

* a MySQL column as the binlog describes it → Canal's ``mysqlType`` spelling and ``sqlType`` code (the
  ``java.sql.Types`` code of the MySQL type): :func:`canal_column_type`, :func:`jdbc_type` — what the capture
  connector and the simulated source write into their Canal messages;
* a MySQL type as Canal spells it → the Spark SQL type of its ODS column: :func:`spark_type_of_mysql`;
* a Spark SQL type as the catalog declares it → its Arrow type: :func:`arrow_type` (the types a catalog may
  declare: :func:`is_spark_type`); columns → a Spark DDL schema: :func:`spark_schema`;
* an Arrow type → its Spark SQL type: :func:`spark_type` (:func:`spark_type_of_arrow` as the catalog spells
  it), and an Arrow schema as Delta stores it: :func:`normalize_arrow_schema`.

How a value of one type becomes a value of another (Spark's casts of strings, reproduced in process) is not
here: ``warehouse_assets/ingest/casts.py``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from resources.storage import DeltaLayerError

UTC_MICROS = pa.timestamp("us", tz="UTC")
"""The Arrow type of Spark's ``timestamp``: an instant, in microseconds."""


# --- MySQL → Canal ---------------------------------------------------------------------------------------------

# Canal's sqlType: the java.sql.Types code of a MySQL type, by its name without width or sign (``bigint(20)
# unsigned`` is a ``bigint``)
JDBC_TYPES: dict[str, int] = {
    "tinyint": -6,
    "smallint": 5,
    "mediumint": 4,
    "int": 4,
    "bigint": -5,
    "float": 7,
    "double": 8,
    "decimal": 3,
    "date": 91,
    "year": 91,
    "time": 92,
    "datetime": 93,
    "timestamp": 93,
    "bit": -7,
    "set": -7,
    "enum": 4,
    "json": 12,
    "char": 1,
    "varchar": 12,
    "tinytext": 2005,
    "mediumtext": 2005,
    "longtext": 2005,
    "text": 2005,
    "geometry": -2,
}

# a binlog column's type code → Canal's mysqlType spelling (decimals and variable strings are spelled with their
# size, see canal_column_type; any other code is a varchar)
_BINLOG_TYPES: dict[int, str] = {
    1: "tinyint(4)",
    2: "smallint(6)",
    3: "int(11)",
    4: "float",
    5: "double",
    7: "timestamp",
    8: "bigint(20)",
    9: "mediumint(9)",
    10: "date",
    11: "time",
    12: "datetime",
    13: "year",
    14: "date",
    16: "bit",
    17: "timestamp",
    18: "datetime",
    19: "time",
    245: "json",
    247: "enum",
    248: "set",
    249: "tinytext",
    250: "mediumtext",
    251: "longtext",
    252: "text",
    254: "char",
    255: "geometry",
}
_BINLOG_DECIMALS = (0, 246)
_BINLOG_VARCHARS = (15, 253)
_BINLOG_INTEGERS = (1, 2, 3, 8, 9)  # the codes whose spelling says "unsigned" when the column is
_BYTES_PER_CHAR = {"utf8mb4": 4, "utf8mb3": 3, "utf8": 3, "latin1": 1, "ascii": 1, "binary": 1}


def jdbc_type(mysql_type: str) -> int:
    """Canal's ``sqlType`` of a MySQL type as Canal spells it (``bigint(20)`` → -5)."""
    return JDBC_TYPES[mysql_type.split("(")[0]]


def canal_column_type(column: Any) -> tuple[str, int]:
    """Canal's ``mysqlType`` and ``sqlType`` for a binlog column (``bigint(20)``, ``decimal(10,2)``, ...): a
    column of a table map event with its metadata (type code, precision, decimals, character set, sign)."""
    code = int(column.type)
    if code in _BINLOG_DECIMALS:
        return f"decimal({column.precision},{column.decimals})", JDBC_TYPES["decimal"]
    if code in _BINLOG_VARCHARS:
        per_char = _BYTES_PER_CHAR.get(str(getattr(column, "character_set_name", None) or ""), 1)
        return f"varchar({int(column.max_length) // per_char})", JDBC_TYPES["varchar"]
    spelled = _BINLOG_TYPES.get(code, "varchar")
    jdbc = jdbc_type(spelled)
    if getattr(column, "unsigned", False) and code in _BINLOG_INTEGERS:
        spelled += " unsigned"
    return spelled, jdbc


# --- MySQL → Spark ---------------------------------------------------------------------------------------------

# a MySQL type's name (no width, no sign) → the Spark type of its ODS column; any other is a string, and a
# decimal keeps its precision and scale
_SPARK_OF_MYSQL: dict[str, str] = {
    "tinyint": "tinyint",
    "smallint": "smallint",
    "mediumint": "int",
    "int": "int",
    "integer": "int",
    "bigint": "bigint",
    "float": "double",
    "double": "double",
    "datetime": "timestamp",
    "timestamp": "timestamp",
    "date": "date",
    "bit": "boolean",
}


def spark_type_of_mysql(mysql_type: str) -> str:
    """The Spark type an ODS column gets for a MySQL column type (as Canal's ``mysqlType`` spells it)."""
    t = mysql_type.lower().strip()
    base = t.split("(")[0].replace(" unsigned", "").strip()
    if base == "decimal" and "(" in t:
        return "decimal" + t[t.index("(") : t.index(")") + 1].replace(" ", "")
    return _SPARK_OF_MYSQL.get(base, "string")


# --- Spark → Arrow ---------------------------------------------------------------------------------------------

_ARROW_TYPES: dict[str, pa.DataType] = {
    "bigint": pa.int64(),
    "int": pa.int32(),
    "smallint": pa.int16(),
    "tinyint": pa.int8(),
    "string": pa.string(),
    "timestamp": UTC_MICROS,
    "date": pa.date32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}
SPARK_TYPES = set(_ARROW_TYPES)
"""The Spark types a catalog column may be declared with, besides ``decimal(p,s)``."""
_DECIMAL = re.compile(r"^decimal\(\d+,\s*\d+\)$")


def is_spark_type(ctype: Any) -> bool:
    """Whether a catalog may declare a column of this type: one of :data:`SPARK_TYPES` or ``decimal(p,s)``."""
    return ctype in SPARK_TYPES or bool(_DECIMAL.match(str(ctype)))


def arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type of a column of a Spark type (as the catalog and the source's MySQL types name it)."""
    if spark_type.startswith("decimal"):
        precision, scale = spark_type[len("decimal(") : -1].split(",")
        return pa.decimal128(int(precision), int(scale))
    return _ARROW_TYPES[spark_type]


def spark_schema(columns: Sequence[tuple[str, str]]) -> str:
    """A Spark DDL schema string of (name, Spark type) columns."""
    return ", ".join(f"`{name}` {ctype}" for name, ctype in columns)


# --- Arrow → Spark ---------------------------------------------------------------------------------------------


def spark_type(t: pa.DataType) -> str:
    """The Spark type name of an Arrow type (``timestamp`` for an aware timestamp, ``timestamp_ntz`` otherwise)."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t):
        return "tinyint"
    if pa.types.is_int16(t):
        return "smallint"
    if pa.types.is_int32(t):
        return "int"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    raise DeltaLayerError(f"unsupported column type {t}")


def spark_type_of_arrow(t: pa.DataType) -> str:
    """The Spark type a column of this Arrow type is declared with in the catalog (every timestamp is a
    ``timestamp``)."""
    name = spark_type(t)
    return "timestamp" if name.startswith("timestamp") else name


def normalize_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """Arrow schema as Delta stores it: plain strings, microsecond UTC timestamps."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            t = pa.string()
        elif pa.types.is_timestamp(t):
            t = pa.timestamp("us", tz="UTC") if t.tz else pa.timestamp("us")
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)
