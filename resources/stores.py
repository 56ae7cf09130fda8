"""Dagster resources for where shards live: the consensus database and the blob store.

Each is an abstract ``ConfigurableResource`` with an ``open()`` that returns the
``upsert_core`` location, and implementations chosen per deployment:

- consensus: :class:`SqliteConsensus` (embedded default, ``$UPSERT_HOME/consensus.db``),
  :class:`PostgresConsensus` (password from an ``EnvVar``), :class:`UrlConsensus` (any
  URL ``upsertctl --consensus`` accepts, typically ``EnvVar("UPSERT_CONSENSUS_URL")``);
- blob: :class:`LocalBlobStore` (embedded default, ``$UPSERT_HOME/blob``),
  :class:`S3BlobStore` (credentials from boto3's chain, i.e. ``AWS_*``),
  :class:`UrlBlobStore` (``EnvVar("UPSERT_BLOB_URL")``).

``orchestration.definitions.default_resources`` picks them exactly as ``upsertctl``
resolves its stores (``UPSERT_CONSENSUS_URL`` / ``UPSERT_BLOB_URL`` > the embedded
defaults under ``UPSERT_HOME``), so the CLI and the Dagster assets open the same
shards. URLs from the environment are passed as ``EnvVar`` so a password in them is
read at run time and never shown in the UI.

Invariants: ``open()`` never caches across runs (every run opens its own handles);
opening creates the embedded directories it needs and nothing else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from urllib.parse import quote

from dagster import ConfigurableResource, EnvVar

from upsert_core.errors import IngestError, ShardNotFound
from upsert_core.ingest.first_file import first_file_problem
from upsert_core.ingest.options import IngestRequest
from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard


def _value(text: str) -> str:
    """A field's value; an ``EnvVar`` the resource was built with outside a run (the
    backfill CLI opens stores before any run) is read from the environment here."""
    return text.get_value() or "" if isinstance(text, EnvVar) else text


class ConsensusResource(ConfigurableResource, ABC):
    """Where shard metadata lives (compare-and-set log)."""

    @abstractmethod
    def url(self) -> str:
        """The consensus URL (may contain a secret; do not log it)."""

    def open(self) -> Consensus:
        return open_consensus(self.url())


class SqliteConsensus(ConsensusResource):
    """Embedded: a SQLite file."""

    path: str

    def url(self) -> str:
        Path(self.path).expanduser().absolute().parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{Path(self.path).expanduser().absolute()}"


class PostgresConsensus(ConsensusResource):
    """Production: PostgreSQL through psycopg 3; ``password`` is usually an ``EnvVar``."""

    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    database: str = "postgres"
    password: str | None = None

    def url(self) -> str:
        auth = quote(self.user, safe="")
        password = _value(self.password or "")
        if password:
            auth += ":" + quote(password, safe="")
        return f"postgresql+psycopg://{auth}@{self.host}:{self.port}/{self.database}"


class UrlConsensus(ConsensusResource):
    """Any consensus URL (``sqlite:///``, ``postgresql+psycopg://``, ``mem://``)."""

    consensus_url: str

    def url(self) -> str:
        return _value(self.consensus_url)


class BlobStoreResource(ConfigurableResource, ABC):
    """Where shard data lives (batch parts, rollups, checkpoints)."""

    @abstractmethod
    def url(self) -> str:
        """The blob URL."""

    def open(self) -> Blob:
        return open_blob(self.url())


class LocalBlobStore(BlobStoreResource):
    """Embedded: a local directory."""

    root: str

    def url(self) -> str:
        root = Path(self.root).expanduser().absolute()
        root.mkdir(parents=True, exist_ok=True)
        return f"file://{root}"


class S3BlobStore(BlobStoreResource):
    """Production: an S3 bucket and prefix (``endpoint_url`` for S3-compatible servers)."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None

    def url(self) -> str:
        base = f"s3://{self.bucket}/{self.prefix.strip('/')}".rstrip("/")
        query = [f"endpoint_url={self.endpoint_url}"] if self.endpoint_url else []
        query += [f"region={self.region}"] if self.region else []
        return base + ("?" + "&".join(query) if query else "")


class UrlBlobStore(BlobStoreResource):
    """Any blob URL (``file://``, ``s3://``, ``mem://``)."""

    blob_url: str

    def url(self) -> str:
        return _value(self.blob_url)


def open_shard(
    consensus: ConsensusResource, blob_store: BlobStoreResource, shard: str, *,
    create: bool = True,
) -> Shard:
    """A handle on ``shard`` in the configured stores."""
    return Shard.open(consensus.open(), blob_store.open(), shard, create=create)



def open_shard_to_ingest(
    consensus: ConsensusResource, blob_store: BlobStoreResource, shard: str, landing: str,
    request: IngestRequest, through: str,
) -> Shard:
    """A handle on ``shard`` for an ingest of ``landing`` through file ``through``; a
    missing shard is created only when its first file has no file-level problem (else
    :class:`IngestError` naming the file, and nothing is created), as ``upsertctl ingest``
    does (``upsert_core.ingest.first_file``)."""
    try:
        return open_shard(consensus, blob_store, shard, create=False)
    except ShardNotFound:
        problem = first_file_problem(shard, landing, request, through=through)
        if problem is not None:
            raise IngestError(problem) from None
        return open_shard(consensus, blob_store, shard, create=True)
