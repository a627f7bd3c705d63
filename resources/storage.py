"""Where the lake lives: how a lake root or table URI maps to each engine's view of its object store.

A lake root is a local path or an object store URI (``s3://``, ``gs://``, ``abfss://``). From it come

* the delta-rs storage options (:func:`storage_options`), from dagster-deltalake's storage configuration
  (:func:`storage_config`) with the credentials each store's own SDKs read from the environment;
* the pyarrow file system that lists a table's files (:func:`filesystem`);
* the location Spark's Hadoop file systems give the same table (:func:`spark_uri`: ``s3a://`` for ``s3://``).

Spark's own S3 settings (endpoint, path-style addressing) are session settings: :func:`resources.spark.s3a_conf`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow.fs as pafs

from resources.settings import s3_endpoint

if TYPE_CHECKING:  # imported when used: dagster-deltalake brings Dagster, which `warehouse sql` does without
    from dagster_deltalake import AzureConfig, GcsConfig, LocalConfig, S3Config


class DeltaLayerError(RuntimeError):
    """A Delta operation could not be carried out; the message names the table and the reason."""


def normalize_root(root: str) -> str:
    """A lake root as an absolute URI-ish string: relative paths become absolute local paths."""
    if "://" in root:
        return root.rstrip("/")
    return str(Path(root).expanduser().resolve())


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system of a URI (local for a path) and the path within it."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    return pafs.FileSystem.from_uri(uri)  # type: ignore[no-any-return]


def spark_uri(uri: str) -> str:
    """A table's location as Spark's Hadoop file systems name it (``s3a://`` for ``s3://``)."""
    return "s3a://" + uri[len("s3://") :] if uri.startswith("s3://") else uri


# Where each object store's credentials come from: the variables its own SDKs read (dagster-deltalake's fields).
_STORAGE_ENV: dict[str, dict[str, str]] = {
    "s3": {
        "access_key_id": "AWS_ACCESS_KEY_ID",
        "secret_access_key": "AWS_SECRET_ACCESS_KEY",
        "token": "AWS_SESSION_TOKEN",
        "region": "AWS_REGION",
        "endpoint": "AWS_ENDPOINT_URL",
    },
    "gcs": {
        "service_account": "GOOGLE_SERVICE_ACCOUNT",
        "service_account_key": "GOOGLE_SERVICE_ACCOUNT_KEY",
        "application_credentials": "GOOGLE_APPLICATION_CREDENTIALS",
    },
    "azure": {
        "account_name": "AZURE_STORAGE_ACCOUNT_NAME",
        "account_key": "AZURE_STORAGE_ACCOUNT_KEY",
        "sas_key": "AZURE_STORAGE_SAS_KEY",
        "client_id": "AZURE_CLIENT_ID",
        "client_secret": "AZURE_CLIENT_SECRET",
        "tenant_id": "AZURE_TENANT_ID",
    },
}
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}


def storage_config(root: str, env: Mapping[str, str] | None = None) -> LocalConfig | S3Config | GcsConfig | AzureConfig:
    """dagster-deltalake's storage configuration for a lake root: local for a path, else the object store of
    the URI's scheme with its credentials from the environment (unset ones left to the store's own chain)."""
    from dagster_deltalake import AzureConfig, GcsConfig, LocalConfig, S3Config

    env = os.environ if env is None else env
    scheme = urlparse(root).scheme if "://" in root else "file"
    provider = _SCHEMES.get(scheme)
    if provider is None:
        if scheme != "file":
            raise DeltaLayerError(
                f"lake root {root!r}: unsupported scheme {scheme!r} (a path, s3://, gs:// or abfss://)"
            )
        return LocalConfig()
    values = {field_: env[var] for field_, var in _STORAGE_ENV[provider].items() if env.get(var)}
    config_class = {"s3": S3Config, "gcs": GcsConfig, "azure": AzureConfig}[provider]
    return config_class(**values)  # type: ignore[no-any-return]


def storage_options(root: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The delta-rs storage options of a lake root (see :func:`storage_config`)."""
    if "://" not in root:
        return {}
    config = storage_config(root, env).model_dump(exclude={"provider"})  # the discriminator is no store option
    options = {name: str(value) for name, value in config.items() if value is not None}
    if _SCHEMES.get(urlparse(root).scheme) == "s3":
        options = {**_s3_commit_options(env), **options}
    return options


def _s3_commit_options(env: Mapping[str, str] | None) -> dict[str, str]:
    """What delta-rs needs beyond credentials on S3: an S3-compatible endpoint (MinIO, moto) is addressed by
    path (bucket in the path, not the host name) and may be plain http. Commits need no option and no DynamoDB
    lock: delta-rs 1.x writes each log entry with S3's conditional put (``If-None-Match``), so two writers of
    one table never both write version N (tests/test_object_store.py)."""
    options: dict[str, str] = {}
    endpoint = s3_endpoint(env)
    if endpoint:
        options["virtual_hosted_style_request"] = "false"
        options["allow_http"] = "true" if endpoint.startswith("http://") else "false"
    return options
