"""Open a Consensus or Blob from a URL: the one place that maps schemes to classes.

Consensus URLs:

- ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` -> :class:`SqlConsensus`
- ``postgresql+psycopg://user@host:port/db`` (``postgresql://`` and ``postgres://`` are
  taken to mean psycopg 3) -> :class:`SqlConsensus`
- ``mem://`` -> a fresh :class:`MemoryConsensus`; ``mem://NAME`` -> the one shared in
  this process under ``NAME`` (so separately opened handles see the same data).

``UPSERT_CONSENSUS_RECONNECT_S`` (seconds, default 15) sets how long a PostgreSQL
consensus keeps trying to connect through a restart or network blip before it fails.

Blob URLs:

- ``file:///absolute/path`` or ``file://relative/path`` -> :class:`LocalBlob`
- ``s3://bucket/optional/prefix`` -> :class:`S3Blob`; the endpoint comes from the
  ``endpoint_url`` query parameter or ``AWS_ENDPOINT_URL`` (``AWS_ENDPOINT_URL_S3``), the
  region from ``region`` or boto3's usual chain.
- ``mem://`` / ``mem://NAME`` -> :class:`MemoryBlob` (fresh / shared by name).

Anything else is a :class:`ConfigError` naming the accepted forms.

Secrets: a URL may carry a password (``postgresql+psycopg://user:secret@host/db`` or
``...?password=secret``). Nothing here or in :class:`SqlConsensus` puts one in an error
message; text that may contain a URL goes through :func:`redact_url` first, the one
redaction of the code base (:mod:`upsert_core.redact`, re-exported here).
"""

from __future__ import annotations

import os
import sys
import threading
from urllib.parse import parse_qs, unquote, urlsplit

from upsert_core.errors import ConfigError
from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.consensus_sql import DEFAULT_RECONNECT_S, SqlConsensus
from upsert_core.redact import REDACTED, redact_url

__all__ = ["REDACTED", "open_blob", "open_consensus", "reconnect_seconds", "redact_url"]

CONSENSUS_FORMS = "sqlite:///path.db, postgresql+psycopg://user@host/db, mem://[name]"
BLOB_FORMS = "file:///abs/path, file://rel/path, s3://bucket/prefix, mem://[name]"

_registry_lock = threading.Lock()
_memory_consensus: dict[str, MemoryConsensus] = {}
_memory_blobs: dict[str, MemoryBlob] = {}


def _scheme(url: str) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"not a URL: {redact_url(repr(url))}")
    return url.split("://", 1)[0].lower()


def _mem_name(url: str) -> str:
    return url.split("://", 1)[1].strip("/")


def open_consensus(url: str) -> Consensus:
    """The :class:`Consensus` that ``url`` names (see the module docstring)."""
    scheme = _scheme(url)
    if scheme == "mem":
        name = _mem_name(url)
        if not name:
            return MemoryConsensus()
        with _registry_lock:
            return _memory_consensus.setdefault(name, MemoryConsensus())
    if scheme.startswith("sqlite"):
        return SqlConsensus(url)
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return SqlConsensus(
            "postgresql+psycopg://" + url.split("://", 1)[1], reconnect_s=reconnect_seconds()
        )
    raise ConfigError(
        f"unsupported consensus URL {redact_url(repr(url))}; use one of: {CONSENSUS_FORMS}"
    )


RECONNECT_ENV = "UPSERT_CONSENSUS_RECONNECT_S"


def reconnect_seconds() -> float:
    """``UPSERT_CONSENSUS_RECONNECT_S`` as seconds (the default when unset)."""
    raw = os.environ.get(RECONNECT_ENV, "").strip()
    if not raw:
        return DEFAULT_RECONNECT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ConfigError(f"{RECONNECT_ENV} must be a number of seconds >= 0, got {raw!r}")
    return value


def open_blob(url: str) -> Blob:
    """The :class:`Blob` that ``url`` names (see the module docstring)."""
    scheme = _scheme(url)
    if scheme == "mem":
        name = _mem_name(url)
        if not name:
            return MemoryBlob()
        with _registry_lock:
            return _memory_blobs.setdefault(name, MemoryBlob())
    if scheme == "file":
        rest = unquote(url.split("://", 1)[1])
        if "?" in rest or "#" in rest:
            raise ConfigError(
                f"file blob URL {redact_url(repr(url))} must not have a query or fragment"
            )
        if not rest:
            raise ConfigError(
                f"file blob URL {redact_url(repr(url))} has no path; use {BLOB_FORMS}"
            )
        # file:///abs -> "/abs" (absolute); file://rel/dir -> "rel/dir" (relative to cwd).
        return LocalBlob(rest)
    if scheme == "s3":
        parts = urlsplit(url)
        if "@" in parts.netloc:  # credentials come from boto3's chain, never the URL
            raise ConfigError(
                f"s3 blob URL {redact_url(repr(url))} must not carry credentials;"
                " use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile"
            )
        if not parts.netloc:
            raise ConfigError(
                f"s3 blob URL {redact_url(repr(url))} has no bucket; use s3://bucket/prefix"
            )
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint_url", "region"}
        if unknown:
            raise ConfigError(
                f"unknown s3 URL parameters {sorted(unknown)} in {redact_url(repr(url))}"
            )
        endpoint = (
            query.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or None
        )
        # heavy: boto3 (~0.15 s to import): only a process that uses S3 pays for it.
        from upsert_core.persist.location.blob_s3 import S3Blob

        return S3Blob(
            parts.netloc,
            unquote(parts.path).strip("/"),
            endpoint,
            region_name=query.get("region"),
        )
    raise ConfigError(f"unsupported blob URL {redact_url(repr(url))}; use one of: {BLOB_FORMS}")


def blob_url(blob: Blob) -> str | None:
    """A URL :func:`open_blob` opens to reach ``blob`` again from another process (a
    local directory or S3), or None for a store that has none (memory, test wrappers)."""
    if isinstance(blob, LocalBlob):
        return f"file://{blob.root}"
    # An S3Blob exists only once its module is imported: a local blob's run does not
    # import it, nor boto3 with it (0.3-0.5 s of a 1,000-row file's CLI ingest).
    s3 = sys.modules.get("upsert_core.persist.location.blob_s3")
    if s3 is not None and isinstance(blob, s3.S3Blob):
        endpoint = blob._client.meta.endpoint_url  # noqa: SLF001 - the one way to learn it
        return f"s3://{blob.bucket}/{blob.prefix.strip('/')}?endpoint_url={endpoint}"
    return None
