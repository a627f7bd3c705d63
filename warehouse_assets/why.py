"""Why is this partition waiting? Every mapped upstream partition with its state, and a verdict.

Used by ``warehouse why TABLE PARTITION`` and by the ``why_waiting`` job (launch it from the UI with the
table and partition in its config; the answer is in the run's log and output metadata).
"""

from dataclasses import dataclass, field

from dagster import AssetKey, AssetPartitionStatus, Config, DagsterInstance, OpExecutionContext, Output, job, op

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.external import ExternalResource
from resources.landing import Landing, LandingResource
from sensors.ods_readiness import readiness
from warehouse_assets.catalog import Catalog
from warehouse_assets.compiler import upstream_partitions
from warehouse_assets.partitions import BY_PERIOD
from warehouse_assets.quality import failed_blocking_checks


@dataclass
class UpstreamState:
    table: str
    partition: str
    state: str  # materialized | missing | in progress | failed | does not exist | not ready | external not arrived
    detail: str = ""


@dataclass
class WhyReport:
    table: str
    partition: str
    own_state: str
    upstream: list[UpstreamState] = field(default_factory=list)
    verdict: str = ""

    def lines(self) -> list[str]:
        out = [f"{self.table} {self.partition}: {self.own_state}"]
        for u in self.upstream:
            out.append(f"  {u.table:<28} {u.partition:<18} {u.state}" + (f" — {u.detail}" if u.detail else ""))
        out.append(f"verdict: {self.verdict}")
        return out


_STATUS = {
    AssetPartitionStatus.MATERIALIZED: "materialized",
    AssetPartitionStatus.IN_PROGRESS: "in progress",
    AssetPartitionStatus.FAILED: "failed",
}


def _statuses(instance: DagsterInstance, catalog: Catalog, fqn: str, keys: list[str]) -> dict[str, str]:
    table = catalog[fqn]
    pdef = BY_PERIOD[table.period]
    raw = instance.get_status_by_partition(AssetKey(table.key), keys, pdef) or {}
    return {k: _STATUS.get(raw.get(k), "missing") for k in keys}  # type: ignore[arg-type]


def explain(
    instance: DagsterInstance,
    catalog: Catalog,
    store: DeltaStore,
    landing: Landing,
    fqn: str,
    partition: str,
    external: ExternalResource | None = None,
) -> WhyReport:
    if fqn not in catalog.tables:
        raise ValueError(f"unknown table {fqn!r}; known: {', '.join(sorted(catalog.tables))}")
    table = catalog[fqn]
    pdef = BY_PERIOD[table.period]
    if not pdef.has_partition_key(partition):
        raise ValueError(
            f"{partition!r} is not a partition of {fqn} ({table.period}, e.g. {pdef.get_first_partition_key()})"
        )
    report = WhyReport(fqn, partition, _statuses(instance, catalog, fqn, [partition])[partition])
    for dep in table.deps:
        up = upstream_partitions(catalog, table, dep, partition)
        states = _statuses(instance, catalog, dep.table, up.keys) if up.keys else {}
        upstream = catalog[dep.table]
        ods_state = readiness(store, landing, upstream) if upstream.is_ods else None
        failed = failed_blocking_checks(instance, upstream, [k for k in up.keys if states[k] == "materialized"])
        for key in up.keys:
            entry = UpstreamState(dep.table, key, states[key])
            if entry.state == "missing" and upstream.is_external:
                entry.state = "external not arrived"
                entry.detail = (
                    external.source(upstream).describe(key) if external is not None else "producer location unknown"
                )
            if key in failed:
                names = ", ".join(failed[key])
                if dep.ignore_dq:
                    entry.detail = f"check failed: {names} (ignored: the dependency says ignore_dq)"
                else:
                    entry.state, entry.detail = "check failed", f"blocking check(s) failed: {names}"
            if entry.state == "missing" and ods_state is not None:
                end = BY_PERIOD[upstream.period].time_window_for_partition_key(key).end
                behind = [s for s in ods_state.streams if s.watermark is None or s.watermark < end]
                counts = ods_state.completeness(key)
                shortest = sorted(counts.missing_by_stream.items(), key=lambda kv: -kv[1])
                short = ", ".join(f"{stream} {n:,} missing" for stream, n in shortest[:3])
                if behind:
                    entry.state = "not ready"
                    worst = ods_state.lagging[0]
                    mark = worst.watermark.strftime("%Y-%m-%d %H:%M") if worst.watermark else "nothing yet"
                    entry.detail = (
                        f"{len(behind)} of {len(ods_state.streams)} shard stream(s) not applied past "
                        f"{end:%H:%M}; {worst.stream} is applied through {mark}; {counts.describe()}"
                        + (f" ({short})" if short else "")
                    )
                elif not counts.complete:
                    entry.state = "not ready"
                    entry.detail = (
                        f"all shards applied past {end:%H:%M} but incomplete: {counts.missing:,} row(s) missing — "
                        f"{counts.describe()}" + (f" ({short})" if short else "")
                    )
                else:
                    entry.detail = (
                        "all shards applied past the hour and complete; the readiness sensor reports it on its "
                        "next tick (or an earlier hour is still incomplete)"
                    )
            report.upstream.append(entry)
        for key in up.nonexistent:
            report.upstream.append(
                UpstreamState(dep.table, key, "does not exist", "in the future or before the table's first partition")
            )
    waiting = [u for u in report.upstream if u.state != "materialized"]
    if report.own_state == "in progress":
        report.verdict = "running now"
    elif not waiting:
        report.verdict = f"all {len(report.upstream)} upstream partition(s) are materialized: ready" + (
            " (already materialized)" if report.own_state == "materialized" else ""
        )
    else:
        first = waiting[0]
        report.verdict = (
            f"waiting for {len(waiting)} of {len(report.upstream)} upstream partition(s); "
            f"first: {first.table} {first.partition} ({first.state})"
        )
    return report


class WhyConfig(Config):  # type: ignore[misc]
    table: str  # e.g. "dwd.order_detail"
    partition: str  # e.g. "2026-03-02"


def build_why_job(catalog: Catalog):  # type: ignore[no-untyped-def]
    @op(name="explain_partition")
    def explain_partition(
        context: OpExecutionContext,
        config: WhyConfig,
        lake: DeltaLakeResource,
        landing: LandingResource,
        external: ExternalResource,
    ) -> Output[list[str]]:
        report = explain(
            context.instance, catalog, lake.store(), landing.landing(), config.table, config.partition, external
        )
        for line in report.lines():
            context.log.info(line)
        return Output(
            report.lines(),
            metadata={
                "verdict": report.verdict,
                "upstream_partitions": len(report.upstream),
                "waiting_on": sum(1 for u in report.upstream if u.state != "materialized"),
                "report": "\n".join(report.lines()),
            },
        )

    @job(name="why_waiting", description="Explain why a table partition waits: launch with table and partition.")
    def why_waiting() -> None:
        explain_partition()

    return why_waiting
