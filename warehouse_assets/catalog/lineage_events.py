"""OpenLineage events: what each build read and wrote, and each partition's change of state, for a data catalog
(Marquez, DataHub, OpenMetadata) to listen to, through the ``openlineage-python`` client and its transports.

Off by default. On when ``WAREHOUSE_OPENLINEAGE_URL`` names an HTTP endpoint (the client's HTTP transport to it), or
when the client's own settings are there: ``OPENLINEAGE_URL``, ``OPENLINEAGE_CONFIG`` (its YAML file) or the
``OPENLINEAGE__TRANSPORT__…`` variables (any transport: file, console, Kafka…); ``OPENLINEAGE_DISABLED=true`` turns it
off. Off, :func:`lineage_events` returns None after reading a few variables: the client is not even imported.

The mapping (docs/architecture.md):

* a build of a derived table's partitions is an OpenLineage run of the job ``<layer>.<table>``: START when it begins,
  COMPLETE or FAIL when it ends, its run id derived from the Dagster run's and the table; inputs are the tables it
  reads, the output the table, each a Delta table named by its lake URI with a schema facet; the output carries the
  column-lineage facet (``warehouse lineage``'s: each column's input columns DIRECT, the rows' columns INDIRECT); the
  run carries a ``partitions`` facet (the partition keys) and the Dagster run as its parent;
* an ingestion is a run of the job ``ods_ingest.<layer>.<table>`` per ODS table: input the CDC source, output the ODS
  table, the hours it made ready in the ``partitions`` facet;
* a partition's change of state (ready, tainted, repaired, stale, released) is a dataset event on its table with a
  ``partitionState`` facet: partition, state, and what the store knows of why.

Emitting never fails what emits: an error is logged and the work goes on.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from resources.settings import Settings
from resources.storage import normalize_root
from warehouse_assets.catalog.lineage import TableLineage

if TYPE_CHECKING:
    from openlineage.client import OpenLineageClient

log = logging.getLogger(__name__)

PRODUCER = "urn:lakehouse-warehouse"  # the project has no public URL to name: a URN is a URI too
STATES = ("ready", "tainted", "repaired", "stale", "released")
_CLIENT_VARIABLES = ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG")


def client_configured(env: Mapping[str, str]) -> bool:
    """Whether the OpenLineage client's own settings are there (and it is not disabled)."""
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in _CLIENT_VARIABLES) or any(
        name.startswith("OPENLINEAGE__TRANSPORT") for name in env
    )


def lineage_events(settings: Settings, env: Mapping[str, str] | None = None) -> LineageEvents | None:
    """The process's emitter, None when OpenLineage is off."""
    env = os.environ if env is None else env
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return None
    if not settings.openlineage_url and not client_configured(env):
        return None
    signature = tuple(sorted((k, v) for k, v in env.items() if k.startswith("OPENLINEAGE")))
    return _emitter(settings.openlineage_url, settings.openlineage_namespace, settings.lake_root, signature)


@functools.cache
def _emitter(url: str, namespace: str, lake_root: str, signature: tuple[tuple[str, str], ...]) -> LineageEvents | None:
    try:
        from openlineage.client import OpenLineageClient

        # the product's own endpoint: the HTTP transport with a short timeout, so a slow catalog cannot hold a build
        retry = {"total": 1, "read": 1, "connect": 1}
        config = {"transport": {"type": "http", "url": url, "timeout": 5, "retry": retry}} if url else None
        return LineageEvents(OpenLineageClient(config=config), namespace, normalize_root(lake_root))
    except Exception:  # a bad client setting: logged, and the warehouse goes on without events
        log.exception("OpenLineage client not created: no lineage events will be sent")
        return None


def dataset_name(uri: str) -> tuple[str, str]:
    """A Delta table's OpenLineage namespace and name from its location: ``s3://bucket`` and the key's path for an
    object store, ``file`` and the absolute path for a local one (OpenLineage's dataset naming)."""
    parts = urlsplit(uri)
    if parts.scheme and parts.netloc:
        return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")
    return "file", uri


@dataclass(frozen=True)
class Build:
    """One build of one table's partitions as OpenLineage sees it; ``inputs``: each table read with its columns."""

    table: str
    key: Sequence[str]
    dagster_run_id: str
    job_name: str
    partitions: Sequence[str]
    columns: Sequence[str]
    inputs: Mapping[str, Sequence[str]]
    lineage: TableLineage | None = None
    source: str | None = None  # an ingestion's CDC source (database.tables), read instead of tables

    @property
    def run_id(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.dagster_run_id}/{self.job_name}/{self.table}"))


class LineageEvents:
    """Sends the warehouse's events through one OpenLineage client; every method logs a failure and returns."""

    def __init__(self, client: OpenLineageClient, namespace: str, lake_root: str):
        self.client = client
        self.namespace = namespace
        self.lake_root = lake_root.rstrip("/")

    def table_uri(self, key: Sequence[str]) -> str:
        return "/".join([self.lake_root, *key])

    def dataset(self, fqn: str) -> tuple[str, str]:
        return dataset_name(self.table_uri(fqn.split(".")))

    def started(self, build: Build) -> None:
        self._send(build, "START")

    def completed(self, build: Build) -> None:
        self._send(build, "COMPLETE")

    def failed(self, build: Build, error: BaseException) -> None:
        self._send(build, "FAIL", error)

    def state_changed(
        self, fqn: str, partition: str, state: str, detail: Mapping[str, Any] | None = None, at: float | None = None
    ) -> None:
        """A partition's change of state, as a dataset event on its table."""
        try:
            from openlineage.client.event_v2 import DatasetEvent, StaticDataset

            namespace, name = self.dataset(fqn)
            facet = _facet("PartitionStateDatasetFacet", table=fqn, partition=partition, state=state, **(detail or {}))
            event = DatasetEvent(
                eventTime=_time(at),
                producer=PRODUCER,
                dataset=StaticDataset(namespace=namespace, name=name, facets={"partitionState": facet}),
            )
            self.client.emit(event)
        except Exception as exc:
            log.warning("OpenLineage: the %s event of %s %s was not sent: %s", state, fqn, partition, exc)

    def _send(self, build: Build, kind: str, error: BaseException | None = None) -> None:
        try:
            self.client.emit(self._run_event(build, kind, error))
        except Exception as exc:  # never the build's failure
            log.warning("OpenLineage: the %s event of %s was not sent: %s", kind, build.table, exc)

    def _run_event(self, build: Build, kind: str, error: BaseException | None) -> Any:
        from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
        from openlineage.client.facet_v2 import error_message_run, parent_run

        run_facets: dict[str, Any] = {
            "partitions": _facet("PartitionsRunFacet", table=build.table, keys=list(build.partitions)),
            "parent": parent_run.ParentRunFacet(
                run=parent_run.Run(runId=build.dagster_run_id),
                job=parent_run.Job(namespace=self.namespace, name=build.job_name),
            ),
        }
        if error is not None:
            run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=str(error)[:2000], programmingLanguage="python"
            )
        inputs = [InputDataset(*self.dataset(t), facets={"schema": _schema(c)}) for t, c in build.inputs.items()]
        if build.source is not None:
            inputs.append(InputDataset("cdc", build.source))
        output_facets: dict[str, Any] = {"schema": _schema(build.columns)}
        if build.lineage is not None:
            output_facets["columnLineage"] = self._column_lineage(build.lineage)
        namespace, name = self.dataset(build.table)
        job = build.table if build.source is None else f"{build.job_name}.{build.table}"
        return RunEvent(
            eventType=RunState[kind],
            eventTime=_time(),
            producer=PRODUCER,
            run=Run(runId=build.run_id, facets=run_facets),
            job=Job(namespace=self.namespace, name=job),
            inputs=inputs,
            outputs=[OutputDataset(namespace, name, facets=output_facets)],
        )

    def _column_lineage(self, lineage: TableLineage) -> Any:
        from openlineage.client.facet_v2 import column_lineage_dataset as cl

        def fields(refs: Iterable[Any], kind: str, subtype: str) -> list[Any]:
            return [
                cl.InputField(*self.dataset(ref.table), ref.column, transformations=[cl.Transformation(kind, subtype)])
                for ref in sorted(refs)
            ]

        return cl.ColumnLineageDatasetFacet(
            fields={
                c: cl.Fields(inputFields=fields(r, "DIRECT", "TRANSFORMATION")) for c, r in lineage.columns.items()
            },
            dataset=fields(lineage.rows, "INDIRECT", "FILTER"),  # filters, joins and groupings: which rows
        )


def _schema(columns: Iterable[str]) -> Any:
    from openlineage.client.facet_v2 import schema_dataset

    return schema_dataset.SchemaDatasetFacet(fields=[schema_dataset.SchemaDatasetFacetFields(name=c) for c in columns])


def _facet(kind: str, **fields: Any) -> Any:
    """A facet of the warehouse's own (OpenLineage's custom facets: any fields, a producer and a schema URL)."""
    from openlineage.client.generated.base import BaseFacet

    facet = BaseFacet(producer=PRODUCER).with_additional_properties(**fields)
    facet._schemaURL = f"{PRODUCER}:facets:{kind}"  # documented in docs/architecture.md
    return facet


def _time(at: float | None = None) -> str:
    moment = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    return moment.isoformat()
