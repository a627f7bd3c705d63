"""What the ``warehouse`` commands share: the repository root, their progress lines, the settings and the
warehouse start."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resources.settings import Settings

ROOT = Path(__file__).resolve().parents[2]  # the repository: warehouse_assets/cli/common.py


def in_process_run_tags(lane: str) -> dict[str, str]:
    """The tags of a run this process executes itself (``execute_in_process``, ``materialize``): its lane of run slots,
    and this process as its run worker, so that the daemon's run monitoring, which asks the warm launcher after every
    started run, sees it alive while it runs instead of failing it as UNKNOWN (as for a run the launcher forked)."""
    from warehouse_assets.instance.lanes import lane_tags
    from warehouse_assets.instance.warm_launcher import this_process_as_worker

    return {**lane_tags(lane), **this_process_as_worker()}


def with_running_spark(resources: dict[str, Any]) -> dict[str, Any]:
    """``resources`` with their local Spark replaced by the running stack's Spark Connect server when one listens at
    the settings' URL: a command run beside ``make dev`` (a re-ingestion) then merges on the server the stack's runs
    use, instead of starting a JVM of its own for a minute beside it."""
    from resources.spark import SparkResource, connect_server_listening

    spark = resources.get("spark")
    if not isinstance(spark, SparkResource) or spark.mode != "local":
        return resources  # a cluster, or Connect already, is what was asked for
    if not connect_server_listening(spark.connect_url):
        return resources
    fields = {name: getattr(spark, name) for name in ("connect_url", "timezone", "conf", "lake_root")}
    return {**resources, "spark": SparkResource(mode="connect", **fields)}


def say(message: str) -> None:
    print(message, flush=True)


def load_settings(env: Mapping[str, str]) -> Settings:
    """The settings ``env`` gives; a bad value is a clear error naming its variable."""
    from resources.settings import Settings

    try:
        return Settings.from_env(env)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def warehouse_start(env: Mapping[str, str]) -> str | None:
    """The warehouse start every command works with: ``WAREHOUSE_START`` when set, else the first day of the
    simulated landing area (``make dev``'s sources), else None (the settings' default applies).

    The simulated landing area records where it starts and keeps it when it is extended, so ``warehouse dev``,
    ``why``, ``status`` and the others agree on the first partition of every table across restarts, without the
    user exporting anything. Real sources record no such day: set ``WAREHOUSE_START`` for them.
    """
    from simulator.cdc import read_simulation

    if env.get("WAREHOUSE_START", "").strip():
        return env["WAREHOUSE_START"].strip()
    simulated = read_simulation(Path(load_settings(env).landing_root))
    if simulated is None:
        return None
    _, first, _ = simulated
    return first.strftime("%Y-%m-%d")


def adopt_warehouse_start(env: MutableMapping[str, str] | None = None) -> str | None:
    """Resolve the start (:func:`warehouse_start`) and put it in ``env`` (default: this process's environment, so
    that the settings read later and the processes started from here see it); a bad value fails naming the variable.
    Call it before anything reads the settings: they are read once per process."""
    env = os.environ if env is None else env
    start = warehouse_start(env)
    if start is not None:
        load_settings({**env, "WAREHOUSE_START": start})
        env["WAREHOUSE_START"] = start
    return start
