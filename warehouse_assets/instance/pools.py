"""Compute pools: several Spark endpoints, each with a capacity of concurrent runs and labels, and the rule that
places a run on one of them when it starts.

``WAREHOUSE_SPARK_POOLS`` names them as JSON; unset, the warehouse has its one endpoint (the settings' own) and
nothing here runs::

    {"batch": {"url": "sc://spark-a:15002", "capacity": 3, "labels": {"region": "eu", "size": "large"}},
     "adhoc": {"url": "sc://spark-b:15002", "capacity": 1}}

A run is placed when it starts (the warm launcher calls :func:`place_run`) on the eligible pool with the most free
capacity: eligible, a pool with every label the run's ``warehouse/compute`` tag requires (a table's ``compute:``);
free, its capacity less its runs in progress; ties go to the pool declared first. The pool is probed first (a TCP
connect to its host and port): one that does not answer is marked offline, skipped, and probed again once
``RETRY_SECONDS`` passed. The choice is recorded in the run's tags (``warehouse/pool``, ``warehouse/pool_url``
without the URL's token, which the UI would show), and the run's Spark resource connects to that pool's URL as the
variable declares it. When every eligible pool is full or offline the run stays in Dagster's queue: the run
coordinator caps the queue's limits by the room the pools have (:func:`queue_limits`), and :func:`waiting_message`
says why ("waiting for compute: pool a full (3/3), pool b offline since 14:05").

Offline pools are kept in a small JSON file in the instance's directory, shared by the processes of one host
(webserver, daemon, CLI); placements take a file lock there, so two launches cannot both take a pool's last slot.

This module imports none of the product: the instance plugins, the Spark resource and the CLI all read it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from warehouse_assets.instance.file_lock import held

POOLS_VARIABLE = "WAREHOUSE_SPARK_POOLS"
POOL_TAG = "warehouse/pool"  # the pool a run was placed on
POOL_URL_TAG = "warehouse/pool_url"  # its endpoint, which the run's Spark resource connects to
REQUIRES_TAG = "warehouse/compute"  # "region=eu,size=large": the labels the run's pool must have
ASSET_TAG_PREFIX = "warehouse/compute."  # an asset's tag per required label (warehouse/compute.region: eu)
RETRY_SECONDS = 10.0  # an offline pool is probed again after this long
PROBE_TIMEOUT_S = 0.5
REGISTRY_FILE = ".compute_pools.json"
LOCK_FILE = ".compute_pools.lock"


class Pool(BaseModel):
    """One Spark endpoint: a Spark Connect URL (``sc://host:port``) or a master URL (``spark://host:port``, ...)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    url: str
    capacity: int = Field(1, ge=1)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.strip() or (value.startswith("sc://") and endpoint(value) is None):
            raise ValueError(f"expected a Spark Connect URL sc://host:port or a master URL, got {value!r}")
        return value.strip()

    def serves(self, required: Mapping[str, str]) -> bool:
        return all(self.labels.get(label) == value for label, value in required.items())


def parse_pools(text: str, source: str = POOLS_VARIABLE) -> tuple[Pool, ...]:
    """The pools ``text`` (JSON: name -> {url, capacity, labels}) declares; ValueError naming ``source``."""
    if not text.strip():
        return ()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not JSON ({exc.msg}); expected {{name: {{url, capacity, labels}}}}") from None
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f'{source}: expected a JSON object of pools, e.g. {{"a": {{"url": "sc://host:15002"}}}}')
    pools = []
    for name, fields in spec.items():
        if not isinstance(fields, dict):
            raise ValueError(f"{source}: pool {name!r} must be an object with url, capacity and labels")
        try:
            pools.append(Pool(name=name, **fields))
        except (ValidationError, TypeError) as exc:
            raise ValueError(f"{source}: pool {name!r}: {_reason(exc)}") from None
    return tuple(pools)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'pool'}: {e['msg']}" for e in exc.errors())
    return str(exc)


def pools_from_env(env: Mapping[str, str] | None = None) -> tuple[Pool, ...]:
    return parse_pools((os.environ if env is None else env).get(POOLS_VARIABLE, ""))


def parse_requirement(text: str, source: str = REQUIRES_TAG) -> dict[str, str]:
    """``region=eu,size=large`` as labels; ValueError naming ``source`` for an item that is no label=value."""
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        label, sep, value = item.partition("=")
        if not sep or not label.strip() or not value.strip():
            raise ValueError(f"{source}={text!r}: expected label=value pairs separated by commas")
        labels[label.strip()] = value.strip()
    return labels


def requirement_tags(labels: Mapping[str, str]) -> dict[str, str]:
    """The run tags that make a run need a pool with ``labels`` (none for no labels)."""
    return {REQUIRES_TAG: ",".join(f"{k}={v}" for k, v in sorted(labels.items()))} if labels else {}


def compute_asset_tags(labels: Mapping[str, str]) -> dict[str, str]:
    """The asset tags that make every run of an asset need a pool with ``labels`` (a run of the UI's Materialize too):
    one tag a label, as Dagster's asset tags allow (a value of letters, digits, ``-``, ``_`` and ``.``)."""
    return {ASSET_TAG_PREFIX + label: value for label, value in sorted(labels.items())}


def endpoint(url: str) -> tuple[str, int] | None:
    """The host and port a pool's URL reaches: ``sc://host:port/;...``, ``spark://host:port[,host2:port]``;
    None for a master with no address of its own (``local[2]``, ``yarn``, ``k8s://`` goes to its API server)."""
    head = url.split(",")[0]
    if not (head.startswith("sc://") or head.startswith("spark://") or head.startswith("k8s://")):
        return None
    parsed = urlsplit(head.removeprefix("k8s://") if head.startswith("k8s://") else head)
    try:
        port = parsed.port
    except ValueError:
        return None
    if not parsed.hostname or port is None:
        return None
    return parsed.hostname, port


def without_token(url: str) -> str:
    """``url`` without its ``token=`` parameter: what may be shown (run tags, ``warehouse status``)."""
    head, sep, params = url.partition("/;")
    kept = [p for p in params.split(";") if p and not p.startswith("token=")]
    return f"{head}/;{';'.join(kept)}" if sep and kept else head


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Does ``url``'s endpoint answer (accept a TCP connection)? True for a master that has no address."""
    address = endpoint(url)
    if address is None:
        return True
    try:
        with socket.create_connection(address, timeout=timeout):
            return True
    except OSError:
        return False


# --- offline pools ---------------------------------------------------------------------------------------------


class PoolRegistry:
    """Which pools did not answer, since when, and when last probed: ``<instance dir>/.compute_pools.json``."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / REGISTRY_FILE

    def offline(self) -> dict[str, dict[str, float]]:
        """name -> {"since": epoch seconds, "probed": epoch seconds}."""
        try:
            found = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return found if isinstance(found, dict) else {}

    def mark_offline(self, name: str, now: float) -> None:
        found = self.offline()
        found[name] = {"since": found.get(name, {}).get("since", now), "probed": now}
        self._write(found)

    def mark_online(self, name: str) -> None:
        found = self.offline()
        if found.pop(name, None) is not None:
            self._write(found)

    def _write(self, found: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(found))
        partial.replace(self.path)  # readers never see half a file


@contextlib.contextmanager
def placement_lock(directory: str | Path) -> Iterator[None]:
    with held(Path(directory) / LOCK_FILE):
        yield


# --- placement ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolLoad:
    """A pool's runs in progress, and since when it is offline (None: it answered when last probed)."""

    pool: Pool
    running: int
    offline_since: float | None = None
    probed: float | None = None

    @property
    def free(self) -> int:
        return max(0, self.pool.capacity - self.running)

    def retry_due(self, now: float) -> bool:
        return self.offline_since is None or self.probed is None or now - self.probed >= RETRY_SECONDS

    def describe(self) -> str:
        if self.offline_since is not None:
            return f"pool {self.pool.name} offline since {time.strftime('%H:%M', time.localtime(self.offline_since))}"
        state = "full" if self.free == 0 else "free"
        return f"pool {self.pool.name} {state} ({self.running}/{self.pool.capacity})"


@dataclass(frozen=True)
class Placement:
    pool: Pool | None  # None: every eligible pool is full or offline
    loads: tuple[PoolLoad, ...]  # the eligible pools, as found

    @property
    def message(self) -> str:
        return waiting_text(self.loads)


def waiting_text(loads: Sequence[PoolLoad]) -> str:
    return "waiting for compute: " + ", ".join(load.describe() for load in loads)


def loads_of(
    pools: Sequence[Pool], running: Mapping[str, int], offline: Mapping[str, Mapping[str, float]]
) -> tuple[PoolLoad, ...]:
    return tuple(
        PoolLoad(
            pool,
            running.get(pool.name, 0),
            offline.get(pool.name, {}).get("since"),
            offline.get(pool.name, {}).get("probed"),
        )
        for pool in pools
    )


def eligible(pools: Sequence[Pool], required: Mapping[str, str]) -> tuple[Pool, ...]:
    """The pools with every required label; ValueError when none has them (the run could never be placed)."""
    found = tuple(pool for pool in pools if pool.serves(required))
    if not found:
        wanted = ",".join(f"{k}={v}" for k, v in sorted(required.items()))
        known = "; ".join(f"{p.name}: {p.labels or 'no labels'}" for p in pools)
        raise ValueError(f"no compute pool has the labels {wanted} the run requires (pools: {known})")
    return found


def place(
    pools: Sequence[Pool],
    running: Mapping[str, int],
    required: Mapping[str, str],
    registry: PoolRegistry,
    now: float,
    probe_fn: Callable[[str], bool] = probe,
) -> Placement:
    """The eligible pool with the most free capacity that answers; a pool that does not is marked offline."""
    candidates = eligible(pools, required)
    offline = registry.offline()
    loads = list(loads_of(candidates, running, offline))
    for index in sorted(range(len(loads)), key=lambda i: -loads[i].free):  # stable: declared order on ties
        load = loads[index]
        if load.free == 0 or not load.retry_due(now):
            continue
        if probe_fn(load.pool.url):
            if load.offline_since is not None:
                registry.mark_online(load.pool.name)
                loads[index] = PoolLoad(load.pool, load.running)
            return Placement(load.pool, tuple(loads))
        registry.mark_offline(load.pool.name, now)
        loads[index] = PoolLoad(load.pool, load.running, offline.get(load.pool.name, {}).get("since", now), now)
    return Placement(None, tuple(loads))


# --- on a Dagster instance -------------------------------------------------------------------------------------


def running_by_pool(instance: Any, excluding: str | None = None) -> dict[str, int]:
    """The runs in progress on each pool (by their ``warehouse/pool`` tag)."""
    from dagster import RunsFilter
    from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES

    counts: dict[str, int] = {}
    for run in instance.get_runs(RunsFilter(statuses=ACTIVE_RUN_STATUSES)):
        name = run.tags.get(POOL_TAG)
        if name and run.run_id != excluding:
            counts[name] = counts.get(name, 0) + 1
    return counts


def pool_loads(instance: Any, pools: Sequence[Pool]) -> tuple[PoolLoad, ...]:
    """Every pool's load on ``instance`` now (no probing: offline as last found)."""
    return loads_of(pools, running_by_pool(instance), PoolRegistry(instance.root_directory).offline())


def run_requirement(run: Any, workspace: Any = None) -> dict[str, str]:
    """The labels ``run``'s pool must have: its ``warehouse/compute`` tag's, and with the ``workspace`` it is launched
    from, those its assets' tags require (a run of the UI's Materialize carries no tag of its own). ValueError when
    two of them want different values of one label."""
    required = parse_requirement(run.tags.get(REQUIRES_TAG, ""))
    graph = getattr(workspace, "asset_graph", None) if workspace is not None else None
    keys = [key for key in run.asset_selection or () if graph.has(key)] if graph is not None else []
    for key in keys:
        for tag, value in graph.get(key).tags.items():  # type: ignore[union-attr]  # keys is empty without a graph
            label = tag.removeprefix(ASSET_TAG_PREFIX)
            if tag.startswith(ASSET_TAG_PREFIX) and required.setdefault(label, value) != value:
                raise ValueError(
                    f"the run's assets require compute {label}={required[label]} and {label}={value}: no one pool "
                    "can build them together; launch them apart"
                )
    return required


def place_run(
    instance: Any, run: Any, pools: Sequence[Pool], probe_fn: Callable[[str], bool] = probe, workspace: Any = None
) -> Placement:
    """Place ``run`` and record the choice in its tags, under the instance's placement lock. The labels its assets
    require (found in ``workspace``) become its ``warehouse/compute`` tag, placed or not: the queue's limits of its
    next passes then count them (:func:`queue_limits` reads the tag)."""
    required = run_requirement(run, workspace)
    if required and run.tags.get(REQUIRES_TAG) != requirement_tags(required)[REQUIRES_TAG]:
        instance.add_run_tags(run.run_id, requirement_tags(required))
    with placement_lock(instance.root_directory):
        placement = place(
            pools,
            running_by_pool(instance, excluding=run.run_id),
            required,
            PoolRegistry(instance.root_directory),
            time.time(),
            probe_fn,
        )
        if placement.pool is not None:
            instance.add_run_tags(
                run.run_id, {POOL_TAG: placement.pool.name, POOL_URL_TAG: without_token(placement.pool.url)}
            )
    return placement


def waiting_message(instance: Any, run: Any, pools: Sequence[Pool]) -> str | None:
    """Why a queued ``run`` waits for compute ("waiting for compute: pool a full (1/1), ..."), None when an eligible
    pool has room (it waits for something else, if at all)."""
    try:
        candidates = eligible(pools, run_requirement(run))
    except ValueError as exc:
        return str(exc)
    loads = loads_of(candidates, running_by_pool(instance), PoolRegistry(instance.root_directory).offline())
    if any(load.free > 0 and load.offline_since is None for load in loads):
        return None
    return waiting_text(loads)


def queue_limits(instance: Any, pools: Sequence[Pool], max_concurrent_runs: int) -> tuple[int, list[dict[str, Any]]]:
    """The queue's limits capped by the pools' room: at most the runs in progress plus the free capacity of the pools
    that answer (or are due a new probe), and per required label set, the free capacity of the pools that have it."""
    from dagster import RunsFilter
    from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES

    now = time.time()
    active = instance.get_runs(RunsFilter(statuses=ACTIVE_RUN_STATUSES))
    running: dict[str, int] = {}
    for run in active:
        if run.tags.get(POOL_TAG):
            running[run.tags[POOL_TAG]] = running.get(run.tags[POOL_TAG], 0) + 1
    loads = loads_of(pools, running, PoolRegistry(instance.root_directory).offline())
    room = {load.pool.name: load.free if load.retry_due(now) else 0 for load in loads}
    cap = len(active) + sum(room.values())
    limit = cap if max_concurrent_runs == -1 else min(max_concurrent_runs, cap)
    tag_limits = []
    for _key, values in instance.get_run_tags(tag_keys=[REQUIRES_TAG]):
        for value in sorted(values):
            try:
                required = parse_requirement(value)
            except ValueError:
                continue  # the launcher fails such a run with the reason
            if not any(pool.serves(required) for pool in pools):
                continue  # no pool could ever take it: let it reach the launcher, which fails it saying so
            holding = sum(1 for run in active if run.tags.get(REQUIRES_TAG) == value)
            free = sum(room[pool.name] for pool in pools if pool.serves(required))
            tag_limits.append({"key": REQUIRES_TAG, "value": value, "limit": holding + free})
    return limit, tag_limits


def load_lines(instance: Any, pools: Sequence[Pool]) -> list[str]:
    """The pools' load as ``warehouse status`` prints it: one line a pool, its runs over its capacity, its labels,
    and since when it is offline."""
    lines = []
    for load in pool_loads(instance, pools):
        labels = ",".join(f"{k}={v}" for k, v in sorted(load.pool.labels.items()))
        state = f", {load.describe().split(' ', 2)[2]}" if load.offline_since is not None else ""
        lines.append(
            f"pool {load.pool.name}: {load.running}/{load.pool.capacity} runs{state}"
            f"{f' [{labels}]' if labels else ''} {without_token(load.pool.url)}"
        )
    return lines
