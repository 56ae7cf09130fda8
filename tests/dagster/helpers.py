"""Helpers for the Dagster tests: a throwaway platform (landing, stores, instance)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, Definitions, ExecuteInProcessResult, materialize

from assets.factory import SourceAssets, build_source_assets
from assets.spec import SourceSpec
from orchestration.definitions import build_definitions
from resources.spark import SparkResource
from resources.stores import LocalBlobStore, SqliteConsensus
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard

Row = dict[str, Any]

# Five batches exercising the upsert rules: inserts, an in-batch duplicate, updates,
# deletes, an unchanged re-send, a late lower offset, and one bad row (null key).
BATCHES: dict[str, list[Row]] = {
    "b-01.jsonl": [
        {"key": "a", "offset": 1, "v": "a1"},
        {"key": "b", "offset": 2, "v": "b1"},
        {"key": "c", "offset": 3, "v": "c1"},
        {"key": "a", "offset": 0, "v": "a0"},
    ],
    "b-02.jsonl": [
        {"key": "b", "offset": 4, "v": "b2"},
        {"key": "c", "offset": 5, "__deleted": True},
        {"key": "d", "offset": 6, "v": "d1"},
    ],
    "b-03.jsonl": [
        {"key": "a", "offset": 7, "v": "a1", "n": 1},
        {"key": None, "offset": 8, "v": "bad"},
        {"key": "c", "offset": 9, "v": "c2"},
    ],
    "b-04.jsonl": [
        {"key": "d", "offset": 1, "v": "d-late"},
        {"key": "e", "offset": 11, "v": "e1"},
    ],
    "b-05.jsonl": [
        {"key": "b", "offset": 12, "__deleted": "TRUE"},
        {"key": "e", "offset": 13, "v": "e1"},
    ],
}


def write_jsonl(path: Path, rows: Iterable[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def fast_tmp(prefix: str) -> Path:
    """A temporary directory in memory when possible (SQLite commits are fsync-bound)."""
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def spark_resource(engine: str = "local") -> SparkResource:
    return SparkResource(engine=engine, master="local[*]")


@dataclass
class Platform:
    """A landing directory, embedded stores and a Dagster instance, all temporary."""

    root: Path
    instance: DagsterInstance

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    def spec(self, name: str = "feed", **options: Any) -> SourceSpec:
        return SourceSpec(name=name, landing=str(self.landing), shard=name, **options)

    def write_batches(self, names: Sequence[str] | None = None) -> list[str]:
        chosen = list(BATCHES) if names is None else list(names)
        for name in chosen:
            write_jsonl(self.landing / name, BATCHES[name])
        return chosen

    def resources(self, engine: str = "local", stores: str = "stores") -> dict[str, Any]:
        return {
            "consensus": SqliteConsensus(path=str(self.root / stores / "consensus.db")),
            "blob_store": LocalBlobStore(root=str(self.root / stores / "blob")),
            "spark": spark_resource(engine),
        }

    def build(self, spec: SourceSpec, engine: str = "local") -> tuple[SourceAssets, Definitions]:
        return build_source_assets(spec), build_definitions([spec], self.resources(engine))

    def shard(self, name: str = "feed", stores: str = "stores") -> Shard:
        consensus = open_consensus(f"sqlite:///{self.root / stores / 'consensus.db'}")
        blob = open_blob(f"file://{self.root / stores / 'blob'}")
        return Shard.open(consensus, blob, name, create=True)

    def add_partitions(self, spec: SourceSpec, names: Sequence[str]) -> None:
        self.instance.add_dynamic_partitions(spec.partitions_name, list(names))

    def ingest_partition(
        self, spec: SourceSpec, names: Sequence[str], partition: str
    ) -> tuple[SourceAssets, ExecuteInProcessResult]:
        """Add ``names`` as partitions and materialize the ingest assets (with their
        checks) for ``partition`` in process, on the local engine."""
        built, _ = self.build(spec)
        self.add_partitions(spec, names)
        result = materialize([*built.assets, built.checks], selection=list(built.ingest_keys),
                             partition_key=partition, instance=self.instance,
                             resources=self.resources())
        return built, result


@contextmanager
def platform() -> Iterator[Platform]:
    root = fast_tmp("upsert-dagster-")
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    try:
        with DagsterInstance.from_ref(_ref(home)) as instance:
            yield Platform(root, instance)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ref(home: Path) -> Any:
    from dagster._core.instance.ref import InstanceRef

    return InstanceRef.from_dir(str(home))


def shard_contents(shard: Shard) -> dict[str, Any]:
    """Everything a user can read of a shard, for comparing two shards."""
    state = shard.state()
    snapshots = {
        ts: sorted(
            (r["key"], r["row"]) for r in shard.snapshot_table(ts).to_pylist()
        )
        for ts in range(state.since, state.upper)
    }
    changes = sorted(
        (r["key"], r["row"], r["ts"], r["diff"])
        for b in shard.changes(state.since) for r in b.to_pylist()
    )
    return {
        "upper": state.upper,
        "ingested_files": dict(state.ingested_files),
        "snapshots": snapshots,
        "changes": changes,
        "errors": sorted((e["file"], e["row"], e["reason"]) for e in shard.errors()),
    }
