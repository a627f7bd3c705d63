"""The warehouse's settings: every ``WAREHOUSE_*`` environment variable, read once and validated, in one place.

Each field is the variable of the same name in upper case with the ``WAREHOUSE_`` prefix (``timezone`` is
``WAREHOUSE_TIMEZONE``); an unset or empty variable takes the default. A bad value fails with an error
naming the variable and what it expects. Other modules take a :class:`Settings` (or :func:`current`) and
never read the environment themselves.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from datetime import date
from typing import Any, Literal, get_args
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator

from resources.clock import EXAMPLE as CLOCK_EXAMPLE
from resources.clock import Clock

ENV_PREFIX = "WAREHOUSE_"
DEFAULT_TIMEZONE = "Asia/Shanghai"

SparkMode = Literal["local", "connect", "master"]
RunExecutor = Literal["in_process", "multiprocess"]
SparkLogLevel = Literal["ERROR", "WARN", "INFO", "DEBUG"]


def parse_start(value: str, source: str = ENV_PREFIX + "START") -> date:
    """The warehouse start date from ``value``; a clear error when it is not a YYYY-MM-DD date."""
    try:
        if len(value.strip()) != 10:
            raise ValueError(value)
        return date.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"{source} must be the first day of the warehouse's data as YYYY-MM-DD (e.g. 2026-01-01), got {value!r}"
        ) from None


def parse_spark_conf(value: str) -> dict[str, str]:
    """``key=value,key=value`` as a dict."""
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, sep, setting = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{ENV_PREFIX}SPARK_CONF={value!r}: expected key=value pairs separated by commas")
        conf[key.strip()] = setting.strip()
    return conf


class Settings(BaseModel):
    """Every setting the product reads, with the embedded warehouse's defaults (README, "Configuration")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timezone: str = Field(DEFAULT_TIMEZONE, description="an IANA timezone name, e.g. Asia/Shanghai")
    start: date = Field(date(2026, 1, 1), description="the first day of the warehouse's data, YYYY-MM-DD")
    lake_root: str = Field("data/lake", description="a path or an object-store URI")
    landing_root: str = Field("data/landing", description="a path")
    external_root: str = Field("", description="a path (empty: <landing root>/external)")
    catalog_dir: str = Field("", description="a folder of table declarations (empty: the product's own)")
    log_dir: str = Field("data", description="a path")
    spark_mode: SparkMode = Field("local", description="one of connect, local, master")
    spark_master: str = Field("local[2]", description="a Spark master URL")
    spark_connect_url: str = Field("sc://127.0.0.1:15002", description="a Spark Connect URL, sc://host:port")
    spark_driver_memory: str = Field("4g", description="a JVM memory size, e.g. 4g")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="key=value pairs separated by commas")
    # several Spark endpoints, each run placed on one; the Dagster instance's plugins read and check the same variable
    # (warehouse_assets/instance/pools.py), a run reads its pool's URL, token included, from here
    spark_pools: str = Field("", description='JSON: {"name": {"url": "sc://host:port", "capacity": 2, "labels": {}}}')
    # second lakes that tables replicate partitions to (``replicate_to: <site>``), each a path or object-store URI
    sites: str = Field("", description='JSON: {"site": "a path or s3://, gs://, abfss:// URI of its lake root"}')
    spark_log_level: SparkLogLevel = Field("WARN", description="one of ERROR, WARN, INFO, DEBUG")
    spark_server_nice: int = Field(10, ge=0, le=19, description="a whole number from 0 to 19")
    time_travel_hours: int = Field(168, ge=0, description="a whole number of hours, 0 or more")
    simulate_live: bool = Field(False, description="1 or 0")
    run_executor: RunExecutor = Field("in_process", description="one of in_process, multiprocess")
    engine_poll_seconds: float = Field(0.1, gt=0, description="a positive number of seconds")
    # the dependency center's time where simulated sources run faster than real time (resources/clock.py)
    clock: str = Field("", description="START@ANCHOR*SPEED, e.g. " + CLOCK_EXAMPLE + " (empty: real time)")
    reconcile_seconds: float = Field(300.0, ge=0, description="a number of seconds, 0 or more (0: never)")
    webserver_url: str = Field("http://127.0.0.1:3000", description="the Dagster webserver's URL")
    code_location: str = Field("warehouse", description="the code location's name in workspace.yaml")
    # seconds between ticks of ods_landing and ods_readiness: a new segment waits up to this long for its ingestion
    ods_sensor_interval: int = Field(15, gt=0, description="a positive whole number of seconds")
    ods_checks_interval: int = Field(10, gt=0, description="a positive whole number of seconds")
    external_sensor_interval: int = Field(10, gt=0, description="a positive whole number of seconds")
    freshness_sensor_interval: int = Field(60, gt=0, description="a positive whole number of seconds")
    freshness_horizon_hours: float = Field(48.0, ge=0, description="a number of hours, 0 or more")
    capture_source: str = Field("", description="the capture connector's source, mysql://USER@HOST:PORT")
    capture_password: SecretStr = Field(SecretStr(""), description="the capture connector's source password")
    lineage_at_load: bool = Field(True, description="1 or 0")
    lineage_cache_dir: str = Field("", description="a path (empty: $DAGSTER_HOME, else beside the catalog)")
    openlineage_url: str = Field("", description="an OpenLineage HTTP endpoint, http(s)://host[:port] (empty: none)")
    openlineage_namespace: str = Field("warehouse", description="the OpenLineage namespace of the warehouse's jobs")

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"{variable('timezone')}={value!r}: expected an IANA timezone name, e.g. Asia/Shanghai"
            ) from None
        return value

    @field_validator("clock")
    @classmethod
    def _clock(cls, value: str) -> str:
        try:
            Clock.parse(value)
        except ValueError as exc:
            raise ValueError(f"{variable('clock')}: {exc}") from None
        return value

    @property
    def center_clock(self) -> Clock:
        """The clock the dependency center's time rules follow: real time unless ``clock`` names a simulated one."""
        return Clock.parse(self.clock)

    @field_validator("spark_pools")
    @classmethod
    def _pools(cls, value: str) -> str:
        pool_urls(value)
        return value

    @field_validator("sites")
    @classmethod
    def _sites(cls, value: str, info: ValidationInfo) -> str:
        lake = str(info.data.get("lake_root", "")).rstrip("/")
        for name, root in site_roots(value).items():
            if root.rstrip("/") == lake:
                raise ValueError(f"{variable('sites')}: site {name}'s root {root!r} is the lake root itself")
        return value

    @property
    def site_roots(self) -> dict[str, str]:
        """Each replication site's lake root, by name (none configured: {})."""
        return site_roots(self.sites)

    @property
    def spark_pool_urls(self) -> dict[str, str]:
        """Each compute pool's URL, by name (none: the one endpoint of the spark_* settings)."""
        return pool_urls(self.spark_pools)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def external_dir(self) -> str:
        """Where external producers deliver: ``external_root``, by default ``<landing root>/external``."""
        return self.external_root or self.landing_root.rstrip("/") + "/external"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings from ``env`` (default: this process's environment); ValueError naming a bad variable."""
        env = os.environ if env is None else env
        raw: dict[str, Any] = {}
        for name in cls.model_fields:
            value = env.get(variable(name), "")
            if value.strip():
                raw[name] = value.strip()
        if "start" in raw:
            raw["start"] = parse_start(raw["start"])
        if "spark_conf" in raw:
            raw["spark_conf"] = parse_spark_conf(raw["spark_conf"])
        if str(raw.get("spark_log_level", "")).upper() in get_args(SparkLogLevel):  # warn or WARN
            raw["spark_log_level"] = raw["spark_log_level"].upper()
        try:
            return cls(**raw)
        except ValidationError as exc:
            raise ValueError("; ".join(_message(error, raw) for error in exc.errors())) from None


def pool_urls(text: str) -> dict[str, str]:
    """The URL of each pool ``WAREHOUSE_SPARK_POOLS`` declares; ValueError naming the variable when it has none."""
    if not text.strip():
        return {}
    try:
        spec = json.loads(text)
        return {str(name): str(fields["url"]) for name, fields in spec.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ValueError(
            f'{variable("spark_pools")}: expected a JSON object of pools, e.g. {{"a": {{"url": "sc://host:15002"}}}}'
        ) from None


_SITE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_SITE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "file")


def site_roots(text: str) -> dict[str, str]:
    """The lake root of each site ``WAREHOUSE_SITES`` names; ValueError naming the variable and what is wrong."""
    if not text.strip():
        return {}
    example = '{"dc2": "s3://bucket/lake"}'
    try:
        spec = json.loads(text)
    except ValueError:
        raise ValueError(
            f"{variable('sites')}: expected a JSON object of sites and lake roots, e.g. {example}"
        ) from None
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"{variable('sites')}: expected a JSON object of sites and lake roots, e.g. {example}")
    roots = {}
    for name, root in spec.items():
        if not _SITE_NAME.match(name):
            raise ValueError(f"{variable('sites')}: site {name!r}: a site is named in lower case, e.g. dc2")
        if not isinstance(root, str) or not root.strip():
            raise ValueError(f"{variable('sites')}: site {name}: its lake root must be a path or URI, got {root!r}")
        scheme = urlsplit(root).scheme if "://" in root else "file"
        if scheme not in _SITE_SCHEMES:
            raise ValueError(
                f"{variable('sites')}: site {name}: unsupported scheme {scheme!r} in {root!r} (a path, s3://, gs:// "
                "or abfss://)"
            )
        roots[name] = root.strip()
    return roots


def variable(field: str) -> str:
    """The environment variable of a settings field."""
    return ENV_PREFIX + field.upper()


def _message(error: Any, raw: Mapping[str, Any]) -> str:
    field = str(error["loc"][0])
    if error["type"] == "value_error":  # a validator's own message, which names the variable
        return str(error["ctx"]["error"])
    expected = Settings.model_fields[field].description
    return f"{variable(field)}={raw.get(field)!r}: expected {expected}"


# --- the process's settings ----------------------------------------------------------------------------------

_OVERRIDE: ContextVar[Settings | None] = ContextVar("warehouse_settings", default=None)


@functools.cache
def _from_process_env() -> Settings:
    return Settings.from_env()


def current() -> Settings:
    """This process's settings: read from the environment once (or those of :func:`using`)."""
    return _OVERRIDE.get() or _from_process_env()


@contextlib.contextmanager
def using(settings: Settings) -> Iterator[Settings]:
    """Make ``settings`` the current ones inside the block (building definitions for another configuration)."""
    token = _OVERRIDE.set(settings)
    try:
        yield settings
    finally:
        _OVERRIDE.reset(token)


def dagster_home(env: Mapping[str, str] | None = None) -> str:
    """Dagster's own ``DAGSTER_HOME`` ('' when unset): where the instance keeps its files, the lineage cache too."""
    env = os.environ if env is None else env
    return env.get("DAGSTER_HOME", "").strip()


S3_ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"


def s3_endpoint(env: Mapping[str, str] | None = None) -> str:
    """The S3-compatible endpoint of the lake (``AWS_ENDPOINT_URL``, the AWS SDKs' own variable, so that Spark,
    delta-rs and the aws CLI agree), '' for AWS's own; ValueError for a value that is no http(s)://host[:port]."""
    env = os.environ if env is None else env
    value = env.get(S3_ENDPOINT_VARIABLE, "").strip()
    if not value:
        return ""
    parsed = urlsplit(value)
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok or parsed.path not in ("", "/"):
        raise ValueError(
            f"{S3_ENDPOINT_VARIABLE}={value!r}: expected an http(s)://host[:port] URL, e.g. http://127.0.0.1:9000"
        )
    return value.rstrip("/")
