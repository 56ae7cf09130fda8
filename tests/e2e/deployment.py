"""The configurations the end-to-end suite runs on, behind one interface.

- ``embedded``: the defaults of CONTRACT.md: SQLite consensus and a local blob store
  under ``UPSERT_HOME``, a local landing directory, the in-process engine (fast; the
  Spark engine on the embedded defaults is covered by ``test_spark.py``).
- ``cluster``: what ``deploy/cluster.sh`` starts: a Spark standalone master and two workers,
  PostgreSQL consensus, a moto S3 server as blob store AND landing area, and the Spark
  engine (the CLI's default), so every ingest is a Spark application on the master.

Invariants:

- Tests are written once against :class:`~tests.e2e.helpers.Cli`; only the deployment
  decides the stores, the LANDING argument and the engine.
- Every test gets stores no other test sees: on the cluster, a PostgreSQL schema of its
  own in the cluster's database (``search_path`` in the URL) and S3 prefixes of its own
  for blobs and landing files.
- On the cluster, a test still writes its batch files into a local directory; before
  each ingest :class:`S3LandingMirror` makes the S3 landing prefix hold exactly those
  files (new and changed ones uploaded, removed ones deleted), so the ingest reads S3
  as it would in production. A touched file is uploaded again (S3 sees a new object),
  which is what "touching a file changes nothing" must survive. A local directory that
  does not exist maps to a bucket that does not exist: S3 has no empty directories, and
  a missing bucket is its missing landing location.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import boto3
import psycopg

from tests.clusterctl import ClusterHandle
from tests.e2e.helpers import Cli

MISSING_BUCKET = "upsert-e2e-no-such-bucket"
# Every cluster ingest is a new Spark application: a driver JVM and an executor JVM that
# live for seconds. C1-only JIT and the serial GC start them faster (measured: ~12 s ->
# ~9 s per one-file ingest on this 2-core machine); nothing under test depends on them.
SHORT_LIVED_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
SPARK_SUBMIT_ARGS = (
    f"--driver-java-options '{SHORT_LIVED_JVM}' "
    f"--conf 'spark.executor.extraJavaOptions={SHORT_LIVED_JVM}' pyspark-shell"
)


class Deployment(Protocol):
    name: str

    def make_cli(self, tmp_path: Path) -> Cli:
        """A CLI on fresh stores of this deployment."""
        ...

    def fresh_stores(self, tmp_path: Path) -> tuple[str, str]:
        """(consensus URL, blob URL) of more fresh, empty stores of this deployment."""
        ...

    def dagster_home(self, tmp_path: Path) -> Path:
        """The ``DAGSTER_HOME`` of this deployment's Dagster instance."""
        ...


class Embedded:
    name = "embedded"

    def make_cli(self, tmp_path: Path) -> Cli:
        return Cli(tmp_path / "home")

    def fresh_stores(self, tmp_path: Path) -> tuple[str, str]:
        root = tmp_path / f"stores-{uuid.uuid4().hex[:8]}"
        root.mkdir()
        return f"sqlite:///{root / 'consensus.db'}", f"file://{root / 'blob'}"

    def dagster_home(self, tmp_path: Path) -> Path:
        """A fresh instance with Dagster's defaults (SQLite run and event storage)."""
        home = tmp_path / "dagster-home"
        home.mkdir(exist_ok=True)
        return home


class S3LandingMirror:
    """Keeps ``s3://bucket/prefix/<n>/`` equal to local landing directory number n."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.roots: dict[Path, tuple[str, dict[str, tuple[int, str]]]] = {}

    def __call__(self, local: Path | str) -> str:
        root = Path(local).resolve()
        if not root.is_dir():
            return f"s3://{MISSING_BUCKET}/{self.prefix}"
        prefix, synced = self.roots.setdefault(root, (f"{self.prefix}/{len(self.roots)}", {}))
        present: dict[str, tuple[int, str]] = {}
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            name = path.relative_to(root).as_posix()
            body = path.read_bytes()
            present[name] = (path.stat().st_mtime_ns, hashlib.sha256(body).hexdigest())
            if synced.get(name) != present[name]:
                self.client.put_object(Bucket=self.bucket, Key=f"{prefix}/{name}", Body=body)
        for name in set(synced) - set(present):
            self.client.delete_object(Bucket=self.bucket, Key=f"{prefix}/{name}")
        synced.clear()
        synced.update(present)
        return f"s3://{self.bucket}/{prefix}"


class Cluster:
    """Tests on a cluster started by ``deploy/cluster.sh`` (shared by the tests)."""

    name = "cluster"

    def __init__(self, handle: ClusterHandle) -> None:
        self.handle = handle
        exports = handle.exports
        self.s3 = boto3.client(
            "s3", endpoint_url=exports["AWS_ENDPOINT_URL"],
            aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
            region_name=exports["AWS_DEFAULT_REGION"],
        )

    def fresh_stores(self, tmp_path: Path) -> tuple[str, str]:
        tag = uuid.uuid4().hex[:12]
        schema = f"e2e_{tag}"
        with psycopg.connect(self.handle.pg_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        consensus = self.handle.exports["UPSERT_CONSENSUS_URL"]
        consensus += f"?options={quote(f'-csearch_path={schema}')}"
        return consensus, f"s3://{self.handle.bucket}/shards-{tag}"

    def dagster_home(self, tmp_path: Path) -> Path:
        """The cluster's instance: runs and events in its PostgreSQL database."""
        return Path(self.handle.exports["DAGSTER_HOME"])

    def make_cli(self, tmp_path: Path) -> Cli:
        consensus, blob = self.fresh_stores(tmp_path)
        mirror = S3LandingMirror(self.s3, self.handle.bucket, f"landing-{uuid.uuid4().hex[:12]}")
        env = {**self.handle.exports, "UPSERT_CONSENSUS_URL": consensus,
               "UPSERT_BLOB_URL": blob, "PYSPARK_SUBMIT_ARGS": SPARK_SUBMIT_ARGS}
        return Cli(tmp_path / "home", env=env, engine="spark", landing_url=mirror,
                   stores=(consensus, blob))
