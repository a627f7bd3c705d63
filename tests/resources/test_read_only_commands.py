"""Every command plan class in the Spark and Delta jars the product ships is decided for a read-only session (the
analysts'): refused, or on ReadOnly.READ_ONLY_COMMANDS (resources/jvm/warehouse/spark/ReadOnly.java), as the
record in tests/snapshots/read_only_commands.json says. A Spark or Delta upgrade that adds a command fails here
until someone decides it (refused by default; on the allowlist only if it only reads); a class taken off the
allowlist fails here too.

The command classes are found from the jars' class files (each one's superclass and interfaces, read from its
header, followed to Catalyst's `Command`), checked by the JVM of the tests' Spark session, whose own check decides
each by the code it runs on every plan. Regenerate after a decision with ``UPDATE_SNAPSHOTS=1``."""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from resources.spark import jars_dir, spark_home

pytestmark = pytest.mark.spark

SNAPSHOT = Path(__file__).resolve().parents[1] / "snapshots" / "read_only_commands.json"
COMMAND = "org/apache/spark/sql/catalyst/plans/logical/Command"
INTERFACE_OR_ABSTRACT = 0x0200 | 0x0400
# the packages plans live in: Spark SQL's (Catalyst, execution, Hive, pipelines) and Delta's
PLAN_PACKAGES = ("org/apache/spark/sql/", "io/delta/")


def class_header(data: bytes) -> tuple[int, str, list[str]]:
    """A class file's access flags, name and direct supertypes (superclass and interfaces), from its header."""
    count = struct.unpack_from(">H", data, 8)[0]
    pos, index, utf8, classes = 10, 1, {}, {}
    while index < count:
        tag = data[pos]
        if tag == 1:  # Utf8
            size = struct.unpack_from(">H", data, pos + 1)[0]
            utf8[index] = data[pos + 3 : pos + 3 + size].decode("utf-8", "replace")
            pos += 3 + size
        elif tag == 7:  # Class
            classes[index] = struct.unpack_from(">H", data, pos + 1)[0]
            pos += 3
        elif tag in (8, 16, 19, 20):  # String, MethodType, Module, Package
            pos += 3
        elif tag == 15:  # MethodHandle
            pos += 4
        elif tag in (3, 4, 9, 10, 11, 12, 17, 18):  # 4-byte constants and references
            pos += 5
        elif tag in (5, 6):  # Long, Double: two entries
            pos += 9
            index += 1
        else:
            raise ValueError(f"unknown constant pool tag {tag}")
        index += 1
    flags, this, parent, interfaces = struct.unpack_from(">HHHH", data, pos)
    supertypes = [struct.unpack_from(">H", data, pos + 8 + 2 * n)[0] for n in range(interfaces)]
    names = [utf8[classes[k]] for k in ([parent] if parent else []) + supertypes]
    return flags, utf8[classes[this]], names


def shipped_jars() -> list[Path]:
    """Spark's jars (the pyspark wheel's) and Delta's (pom.xml's, in .venv/jars)."""
    return sorted((spark_home() / "jars").glob("spark-*.jar")) + sorted(jars_dir().glob("delta-*.jar"))


def command_classes(jars: list[Path]) -> list[str]:
    """Every concrete class of ``jars`` that is a Catalyst ``Command``, by binary name."""
    supertypes: dict[str, list[str]] = {}
    concrete: set[str] = set()
    for jar in jars:
        with zipfile.ZipFile(jar) as archive:
            for entry in archive.namelist():
                if entry.endswith(".class") and entry.startswith(PLAN_PACKAGES) and "$anonfun" not in entry:
                    flags, name, parents = class_header(archive.read(entry))
                    supertypes[name] = parents
                    if not flags & INTERFACE_OR_ABSTRACT:
                        concrete.add(name)
    known: dict[str, bool] = {COMMAND: True}

    def is_command(name: str) -> bool:
        if name not in known:
            known[name] = False  # a cycle cannot make it one
            known[name] = any(is_command(p) for p in supertypes.get(name, []))
        return known[name]

    return sorted(name.replace("/", ".") for name in concrete if is_command(name))


def test_every_command_class_is_refused_or_on_the_read_only_allowlist(spark: SparkSession) -> None:
    jars = shipped_jars()
    assert any("spark-sql_" in j.name for j in jars) and any("delta-spark" in j.name for j in jars), jars
    found = command_classes(jars)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    command = jvm.java.lang.Class.forName(COMMAND.replace("/", "."), False, loader)
    read_only = jvm.warehouse.spark.ReadOnly
    decisions: dict[str, str] = {}
    for name in found:
        cls = jvm.java.lang.Class.forName(name, False, loader)
        assert command.isAssignableFrom(cls), name  # the JVM agrees it is a command
        if name.endswith((".SetCommand", ".ResetCommand")):
            decisions[name] = "harmless settings only"  # decided by the key (ReadOnly.SETTABLE)
        else:
            decisions[name] = "read" if read_only.commandRefusal(cls) is None else "refused"
    # the allowlist names no class that is not a command of these jars (a typo allows nothing and hides a gap)
    assert set(read_only.READ_ONLY_COMMANDS) <= {n for n, d in decisions.items() if d == "read"}
    assert len(found) > 150  # Spark's and Delta's commands were found, not a handful
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(json.dumps(decisions, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(SNAPSHOT.read_text())
    new = sorted(set(decisions) - set(recorded))
    changed = sorted(n for n in set(decisions) & set(recorded) if decisions[n] != recorded[n])
    gone = sorted(set(recorded) - set(decisions))
    assert not (new or changed or gone), (
        f"command classes not decided for the analysts' read-only session: new {new}, decided otherwise "
        f"{[(n, recorded[n], decisions[n]) for n in changed]}, gone {gone}. Decide each in ReadOnly.java "
        "(READ_ONLY_COMMANDS only if it only reads), then UPDATE_SNAPSHOTS=1 and review the diff"
    )
