"""What the per-file and per-bucket steps hand back: metadata only, never row data.

Both engines return the same :class:`BucketResult` and :class:`FileRead` values; the
Spark engine ships them from tasks to the driver as JSON (``to_json``/``from_json``), so
every field is plain data: part metadata (blob keys, counts, sizes; an inline part's
bytes, which are at most the inline threshold), checkpoint keys, counts and messages.

Invariants:

- ``new_blobs`` lists every blob a step wrote, so a driver whose append did not commit
  (or whose file failed) can delete exactly those and nothing else.
- A step that failed reports ``failure`` (a one-line message) and still lists what it
  wrote before failing; it never leaves the driver guessing.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from upsert_core.errors import CorruptData
from upsert_core.persist.state.state import BlobPart, ErrorBatch, InlinePart, Part


def part_to_json(part: Part) -> dict[str, Any]:
    if isinstance(part, BlobPart):
        return {"key": part.key, "size": part.encoded_size_bytes, "n": part.num_updates}
    return {"inline": base64.b64encode(part.data).decode("ascii"), "n": part.num_updates}


def part_from_json(obj: dict[str, Any]) -> Part:
    try:
        if "key" in obj:
            return BlobPart(str(obj["key"]), int(obj["size"]), int(obj["n"]))
        return InlinePart(base64.b64decode(obj["inline"]), int(obj["n"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptData(f"malformed part metadata from a task: {obj!r}") from exc


@dataclass
class BucketResult:
    """One bucket's output for one file: parts, its new checkpoint, counts."""

    bucket: int
    parts: list[Part] = field(default_factory=list)
    checkpoint: str | None = None  # config value for blobref.checkpoint.<bucket>; "" = empty
    base: str | None = None  # config value for checkpoint.base.<bucket> (tasks.Base)
    tombstones: str | None = None  # blobref.tombstones.<bucket>; None = unchanged
    late: str | None = None  # blob key of the bucket's late part (ingest.late); None: none
    late_rows: int = 0  # late rows of the bucket in the file (global scope)
    live_after: int | None = None  # live rows of a rebuilt bucket after the file
    state_keys: int = 0  # keys the bucket's state holds after the file (tombstones too)
    loaded: str = ""  # where the state came from: cache|checkpoint|new|rehydrated[+replay]
    inserts: int = 0
    retractions: int = 0
    bytes_written: int = 0
    rehydrated: str | None = None  # why the state was rebuilt, if it was
    warnings: list[str] = field(default_factory=list)
    new_blobs: list[str] = field(default_factory=list)
    failure: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "bucket": self.bucket,
                "parts": [part_to_json(p) for p in self.parts],
                "checkpoint": self.checkpoint,
                "base": self.base,
                "tombstones": self.tombstones,
                "late": self.late,
                "late_rows": self.late_rows,
                "live_after": self.live_after,
                "state_keys": self.state_keys,
                "loaded": self.loaded,
                "inserts": self.inserts,
                "retractions": self.retractions,
                "bytes_written": self.bytes_written,
                "rehydrated": self.rehydrated,
                "warnings": self.warnings,
                "new_blobs": self.new_blobs,
                "failure": self.failure,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> BucketResult:
        obj = json.loads(text)
        return cls(
            bucket=int(obj["bucket"]),
            parts=[part_from_json(p) for p in obj["parts"]],
            checkpoint=obj["checkpoint"],
            base=obj.get("base"),
            tombstones=obj.get("tombstones"),
            late=obj.get("late"),
            late_rows=int(obj.get("late_rows", 0)),
            live_after=obj.get("live_after"),
            state_keys=int(obj.get("state_keys", 0)),
            loaded=str(obj.get("loaded", "")),
            inserts=int(obj["inserts"]),
            retractions=int(obj["retractions"]),
            bytes_written=int(obj["bytes_written"]),
            rehydrated=obj["rehydrated"],
            warnings=list(obj["warnings"]),
            new_blobs=list(obj["new_blobs"]),
            failure=obj["failure"],
        )


@dataclass
class FileRead:
    """What reading and validating one file produced, besides its rows."""

    schema_json: str | None = None  # the evolved source schema
    rows_read: int = 0
    good_rows: int = 0
    error_batch: ErrorBatch | None = None
    bytes_written: int = 0
    new_blobs: list[str] = field(default_factory=list)
    file_error: str | None = None  # a file-level problem: "<file>: <problem>"
    changed: str | None = None  # the file changed while being read: "<file>: <how>"
    skipped: int = 0  # Debezium events that change nothing (op t/m; landing.debezium)
    landing_bytes: int = 0  # bytes of the landing file the engine's reads took
    digest: str | None = None  # the content digest of the bytes read (landing.digest)
    read_tasks: int = 0  # tasks that read the file (0: not run as tasks)
    drain_tasks: int = 0  # distinct tasks that drained its buckets (0: not run as tasks)
    task_peak_memory: int = 0  # bytes: the largest peak RSS of a task's worker (0: no tasks)
    read_memory_added: int = 0  # bytes: the most a worker grew while a task read the file
    drain_memory_added: int = 0  # bytes: ... from a task's start to the end of a bucket's drain

    def to_json(self) -> str:
        eb = self.error_batch
        return json.dumps(
            {
                "schema": self.schema_json,
                "rows_read": self.rows_read,
                "good_rows": self.good_rows,
                "errors": None
                if eb is None
                else {"ts": eb.ts, "n": eb.num_errors, "part": part_to_json(eb.part)},
                "bytes_written": self.bytes_written,
                "new_blobs": self.new_blobs,
                "file_error": self.file_error,
                "changed": self.changed,
                "skipped": self.skipped,
                "landing_bytes": self.landing_bytes,
                "digest": self.digest,
                "read_tasks": self.read_tasks,
                "drain_tasks": self.drain_tasks,
                "task_peak_memory": self.task_peak_memory,
                "read_memory_added": self.read_memory_added,
                "drain_memory_added": self.drain_memory_added,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> FileRead:
        obj = json.loads(text)
        errors = obj["errors"]
        return cls(
            schema_json=obj["schema"],
            rows_read=int(obj["rows_read"]),
            good_rows=int(obj["good_rows"]),
            error_batch=None
            if errors is None
            else ErrorBatch(int(errors["ts"]), part_from_json(errors["part"]), int(errors["n"])),
            bytes_written=int(obj["bytes_written"]),
            new_blobs=list(obj["new_blobs"]),
            file_error=obj["file_error"],
            changed=obj.get("changed"),
            skipped=int(obj.get("skipped", 0)),
            landing_bytes=int(obj.get("landing_bytes", 0)),
            digest=obj.get("digest"),
            read_tasks=int(obj.get("read_tasks", 0)),
            drain_tasks=int(obj.get("drain_tasks", 0)),
            task_peak_memory=int(obj.get("task_peak_memory", 0)),
            read_memory_added=int(obj.get("read_memory_added", 0)),
            drain_memory_added=int(obj.get("drain_memory_added", 0)),
        )


@dataclass
class FileOutcome:
    """Everything an engine produced for one file, ready for the driver to commit."""

    read: FileRead
    buckets: list[BucketResult] = field(default_factory=list)

    @property
    def new_blobs(self) -> list[str]:
        return [*self.read.new_blobs, *(k for b in self.buckets for k in b.new_blobs)]

    @property
    def failure(self) -> str | None:
        return next((b.failure for b in self.buckets if b.failure), None)
