"""Spark's string casts and JSON text, in plain Python and Arrow: what the in-process CDC preparation needs to
type a Canal row image exactly as Spark's ``try_cast`` / ``try_to_timestamp`` / ``from_json`` / ``to_json`` do.

Every rule here was checked against Spark 4.2 (ANSI mode, the session settings of ``resources/spark.py``) and is
pinned by ``tests/test_preparation.py``, which runs both engines on the same lines and compares every column.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from resources.column_types import UTC_MICROS, arrow_type

# Spark trims the characters up to U+0020 around a string it casts to a number or a boolean (UTF8String.trimAll)
_TRIM = "".join(chr(c) for c in range(0x21))
_PLAIN_INT = r"^-?[0-9]+$"
_PLAIN_DECIMAL = r"^-?[0-9]+(\.[0-9]+)?$"
_SPARK_INT = re.compile(r"[+-]?[0-9]+")
_SPARK_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")  # java.math.BigDecimal (Unicode digits)
_SPARK_DOUBLE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[dDfF]?", re.ASCII)
_SPARK_DOUBLE_WORDS = {"nan": math.nan, "infinity": math.inf, "inf": math.inf, "+infinity": math.inf}
_SPARK_DOUBLE_WORDS |= {"+inf": math.inf, "-infinity": -math.inf, "-inf": -math.inf}
_TIMESTAMP_TEXT = r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}$"  # 'yyyy-MM-dd HH:mm:ss', strict
_DATE = re.compile(r"([0-9]{4})(?:-([0-9]{1,2})(?:-([0-9]{1,2})(?:[ T].*)?)?)?", re.DOTALL)
_INT_RANGES = {"bigint": 63, "int": 31, "smallint": 15, "tinyint": 7}
_TRUE = {"t", "true", "y", "yes", "1"}
_FALSE = {"f", "false", "n", "no", "0"}


# --- JSON: Spark's from_json of a string field, to_json of a map -------------------------------------------


def java_double(value: float) -> str:
    """``Double.toString``: what Spark's JSON parser makes of a number where a string is expected."""
    if math.isnan(value) or math.isinf(value):
        return '"NaN"' if math.isnan(value) else ('"Infinity"' if value > 0 else '"-Infinity"')
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    point = len(text) + int(exponent)  # digits before the decimal point
    prefix = "-" if sign else ""
    if 1e-3 <= abs(value) < 1e7:
        if point <= 0:
            return f"{prefix}0.{'0' * -point}{text}"
        if point >= len(text):
            return f"{prefix}{text}{'0' * (point - len(text))}.0"
        return f"{prefix}{text[:point]}.{text[point:]}"
    return f"{prefix}{text[0]}.{text[1:] or '0'}E{point - 1}"


def spark_json_text(value: Any) -> str:
    """A JSON value as Jackson's generator writes it back (Spark's text of a non-string token)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_string(str(k))}:{spark_json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(spark_json_text(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, str):
        return _json_string(value)
    return spark_string(value) or "null"


def spark_string(value: Any) -> str | None:
    """Spark's ``from_json`` of a string-typed field: a string as is, any other token as its JSON text."""
    if value is None or value.__class__ is str:
        return value  # type: ignore[no-any-return]
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return java_double(value)
    return spark_json_text(value)


def spark_long(value: Any) -> int | None:
    """Spark's ``from_json`` of a bigint field: an integer token within 64 bits, else null."""
    if value.__class__ is int and -(1 << 63) <= value < (1 << 63):
        return value  # type: ignore[no-any-return]
    return None


def spark_string_map(value: Any) -> dict[str, str | None] | None:
    """Spark's ``from_json`` of a ``map<string,string>`` field: an object, its values as strings."""
    if value.__class__ is not dict:
        return None
    if {*map(type, value.values())} <= _STRINGS:
        return value  # type: ignore[no-any-return]
    return {k: spark_string(v) for k, v in value.items()}


def spark_map_array(value: Any) -> list[dict[str, str | None] | None] | None:
    """Spark's ``from_json`` of an ``array<map<string,string>>`` field: null unless every element is an object
    or null."""
    if value.__class__ is not list:
        return None
    out: list[dict[str, str | None] | None] = []
    for item in value:
        if item is None:
            out.append(None)
        elif item.__class__ is dict:
            out.append(spark_string_map(item))
        else:
            return None
    return out


_STRINGS = {str, type(None)}
_CONTROL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u00([0-9a-f]{2})")


def map_to_json(row: dict[str, str | None]) -> bytes:
    """Spark's ``to_json`` of a ``map<string,string>``: compact, UTF-8, Jackson's escapes (``\\u001F``)."""
    text = orjson.dumps(row)
    if b"\\u00" in text:  # a control character: Jackson writes the hex digits in upper case
        fixed = _CONTROL_ESCAPE.sub(lambda m: f"{m.group(1)}\\u00{m.group(2).upper()}", text.decode())
        return fixed.encode()
    return text


def _json_string(text: str) -> str:
    return map_to_json({"": text}).decode()[4:-1]


# --- casts of a column of strings ---------------------------------------------------------------------------


def cast_strings(raw: pa.Array, spark_type: str, timezone: str) -> pa.Array:
    """``raw`` (strings) cast to ``spark_type`` as Spark's ``try_cast`` does (``try_to_timestamp(raw,
    'yyyy-MM-dd HH:mm:ss')`` in ``timezone`` for timestamps): null where Spark's cast gives null."""
    if spark_type == "string":
        return raw
    if spark_type == "timestamp":
        return _timestamps(raw, timezone)
    if spark_type in _INT_RANGES:
        bits = _INT_RANGES[spark_type]
        return _fast_or_each(raw, _PLAIN_INT, arrow_type(spark_type), lambda s: _spark_int(s, bits))
    if spark_type.startswith("decimal"):
        precision, scale = (int(p) for p in spark_type[len("decimal(") : -1].split(","))
        return _fast_or_each(
            raw, _PLAIN_DECIMAL, pa.decimal128(precision, scale), lambda s: _spark_decimal(s, precision, scale)
        )
    if spark_type == "double":
        return pa.array([None if s is None else _spark_double(s) for s in raw.to_pylist()], pa.float64())
    if spark_type == "boolean":
        return pa.array([None if s is None else _spark_boolean(s) for s in raw.to_pylist()], pa.bool_())
    if spark_type == "date":
        return pa.array([None if s is None else _spark_date(s) for s in raw.to_pylist()], pa.date32())
    raise ValueError(f"no in-process cast to Spark type {spark_type!r}")


def _fast_or_each(raw: pa.Array, plain: str, arrow_type: pa.DataType, each: Callable[[str], Any]) -> pa.Array:
    """Arrow's cast where every value has the plain form both engines read alike; else value by value."""
    if raw.null_count == len(raw):
        return pa.nulls(len(raw), arrow_type)
    if pc.all(pc.match_substring_regex(raw, plain)).as_py():
        try:
            return pc.cast(raw, arrow_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # out of range, or more decimals than the scale: Spark's rules, value by value
    return pa.array([None if s is None else each(s) for s in raw.to_pylist()], arrow_type)


def _spark_int(text: str, bits: int) -> int | None:
    text = text.strip(_TRIM)
    if not _SPARK_INT.fullmatch(text):
        return None
    value = int(text)
    return value if -(1 << bits) <= value < (1 << bits) else None


def _spark_decimal(text: str, precision: int, scale: int) -> Decimal | None:
    text = text.strip(_TRIM)
    if not _SPARK_DECIMAL.fullmatch(text):
        return None
    try:
        value = Decimal(text).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
    except InvalidOperation:
        return None
    return value if len(value.as_tuple().digits) <= precision or value == 0 else None


def _spark_double(text: str) -> float | None:
    text = text.strip(_TRIM)
    word = _SPARK_DOUBLE_WORDS.get(text.lower())
    if word is not None:
        return word
    if not _SPARK_DOUBLE.fullmatch(text):
        return None
    return float(text.rstrip("dDfF"))


def _spark_boolean(text: str) -> bool | None:
    text = text.strip(_TRIM).lower()
    return True if text in _TRUE else (False if text in _FALSE else None)


def _spark_date(text: str) -> date | None:
    found = _DATE.fullmatch(text.strip(_TRIM))
    if not found:
        return None
    year, month, day = (int(g) if g else 1 for g in found.groups())
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _timestamps(raw: pa.Array, timezone: str) -> pa.Array:
    """'yyyy-MM-dd HH:mm:ss' local times of ``timezone`` → UTC instants; null for any other text or an
    impossible date or time (Spark's strict resolver: no 24:00, no :60, no February 30)."""
    if raw.null_count == len(raw):
        return pa.nulls(len(raw), UTC_MICROS)
    shaped = pc.match_substring_regex(raw, _TIMESTAMP_TEXT)
    candidates = pc.if_else(shaped, raw, pa.scalar(None, pa.string()))
    parsed = pc.strptime(candidates, format="%Y-%m-%d %H:%M:%S", unit="us", error_is_null=True)
    # Arrow rolls an impossible date or time over (02-30 → 03-02, 23:59:60 → 00:00:00): such a value's fields
    # differ from the text's
    exact = None
    for field, start in ((pc.day, 8), (pc.hour, 11), (pc.minute, 14), (pc.second, 17)):
        written = pc.cast(pc.utf8_slice_codeunits(candidates, start, start + 2), pa.int64())
        same = pc.equal(field(parsed), written)
        exact = same if exact is None else pc.and_(exact, same)
    local = pc.if_else(exact, parsed, pa.scalar(None, parsed.type))
    try:
        return pc.assume_timezone(local, timezone=timezone, ambiguous="earliest", nonexistent="raise").cast(UTC_MICROS)
    except pa.ArrowInvalid:  # a local time in a daylight-saving gap: Java moves it on by the gap, as fold=0 does
        zone, utc = ZoneInfo(timezone), datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))
        values = [None if v is None else (v.replace(tzinfo=zone) - utc) // _US for v in local.to_pylist()]
        return pa.array(values, pa.int64()).cast(UTC_MICROS)


_US = timedelta(microseconds=1)
