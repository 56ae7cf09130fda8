"""A streamed file's validated rows, by bucket, in temporary files until they are drained.

A file read in chunks (``landing.chunks``) is validated and bucketed chunk by chunk. The
rows are held in memory while they fit ``memory_limit`` bytes; from the chunk that
would exceed it on, every bucket's rows are appended to one Arrow IPC stream file per
bucket, in a private temporary directory (``UPSERT_SPILL_DIR``, else the system's
temporary directory, made on first use). Once the whole file is read, each bucket's
rows are read back when its drain starts, so the ingest holds at most ``memory_limit``
plus one chunk while reading and the buckets being drained while draining, never the
whole file.

Invariants:

- A bucket's rows come back in the order they were added (file order), with the
  columns they were added with (``ROWS_SCHEMA`` plus any value columns); when chunks
  came with different extra columns, with the base schema's columns only, so the drain
  sees what the whole-file read gives it.
- :meth:`BucketSpill.add` is called from one thread; :meth:`finish` closes the writers,
  after which :meth:`table` may be called from several threads (each reads its own
  file).
- :meth:`close` removes every file, whatever happened (also via ``with``).
- A spill that cannot be written (a full disk) raises :class:`IngestError` naming the
  directory and ``UPSERT_SPILL_DIR``; the file then fails as a whole.
"""

from __future__ import annotations

import os
import tempfile
import threading
from types import TracebackType

import numpy as np
import pyarrow as pa

from upsert_core.errors import IngestError
from upsert_core.ingest.buckets import split_rows

SPILL_DIR_ENV = "UPSERT_SPILL_DIR"


class BucketSpill:
    """See the module docstring."""

    def __init__(
        self, schema: pa.Schema, directory: str | None = None, memory_limit: int = 0
    ) -> None:
        self.schema = schema
        self._where = directory
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.memory_limit = memory_limit
        self._held: dict[int, list[pa.Table]] = {}
        self._held_bytes = 0
        self._writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self._sinks: dict[int, pa.NativeFile] = {}
        self._files: dict[int, list[str]] = {}
        self._chunk_schema: pa.Schema | None = None
        self._generation = 0
        self._mixed = False
        self.bytes: dict[int, int] = {}
        self.rows: dict[int, int] = {}
        self._lock = threading.Lock()

    def _path(self, bucket: int) -> str:
        return os.path.join(self._directory(), f"{bucket:05d}-{self._generation}.arrows")

    def add(self, rows: pa.Table) -> None:
        """Append ``rows`` (the base schema's columns first, with their ``bucket``, then
        any extra columns) to their buckets."""
        if rows.num_rows == 0:
            return
        if self._chunk_schema is None:
            self._chunk_schema = rows.schema
        elif rows.schema != self._chunk_schema:
            # Chunks with other extra columns (values kept for some, not all): the
            # buckets come back with the base columns only; open new files.
            self.finish()
            self._generation += 1
            self._chunk_schema, self._mixed = rows.schema, True
        buckets = np.asarray(rows.column("bucket").to_numpy(), dtype=np.int64)
        groups = split_rows(rows, buckets)
        per_row = rows.nbytes / rows.num_rows  # a group is a slice: its nbytes may not be
        for bucket, group in groups.items():
            self.bytes[bucket] = self.bytes.get(bucket, 0) + int(per_row * group.num_rows)
            self.rows[bucket] = self.rows.get(bucket, 0) + group.num_rows
        if not self._files and self._held_bytes + rows.nbytes <= self.memory_limit:
            for bucket, group in groups.items():
                self._held.setdefault(bucket, []).append(group)
            self._held_bytes += rows.nbytes
            return
        held, self._held, self._held_bytes = self._held, {}, 0
        for bucket, tables in held.items():
            for table in tables:
                self._write(bucket, table)
        for bucket, group in groups.items():
            self._write(bucket, group)

    def _write(self, bucket: int, group: pa.Table) -> None:
        if self._mixed:  # one schema per file: the base columns from the change on
            group = group.select(self.schema.names)
        directory = self._directory()
        try:
            writer = self._writers.get(bucket)
            if writer is None:
                path = self._path(bucket)
                sink = pa.OSFile(path, "wb")
                self._files.setdefault(bucket, []).append(path)
                self._sinks[bucket] = sink
                writer = pa.ipc.new_stream(sink, group.schema)
                self._writers[bucket] = writer
            writer.write_table(group)
        except (OSError, pa.ArrowException) as exc:
            raise IngestError(
                f"cannot spill validated rows to {directory}: {exc}; set "
                f"{SPILL_DIR_ENV} to a directory with room for the file's rows"
            ) from exc

    def _directory(self) -> str:
        """The private spill directory, made on first use."""
        if self._dir is None:
            where = self._where or os.environ.get(SPILL_DIR_ENV) or None
            try:
                self._dir = tempfile.TemporaryDirectory(prefix="upsert-spill-", dir=where)
            except OSError as exc:
                raise IngestError(
                    f"cannot make a directory to spill validated rows to in "
                    f"{where or tempfile.gettempdir()}: {exc}; set {SPILL_DIR_ENV} to a "
                    "writable directory with room for the file's rows"
                ) from exc
        return self._dir.name

    def finish(self) -> None:
        """Close every bucket's file (no more :meth:`add`)."""
        with self._lock:
            for bucket in list(self._writers):
                self._writers.pop(bucket).close()
                self._sinks.pop(bucket).close()

    def buckets(self) -> list[int]:
        """The buckets that have rows, in order."""
        return sorted(self.rows)

    def table(self, bucket: int) -> pa.Table:
        """Bucket ``bucket``'s rows, in file order (empty if it has none)."""
        if bucket not in self.rows:
            return self.schema.empty_table()
        pieces = list(self._held.get(bucket, ()))
        for path in self._files.get(bucket, ()):
            with pa.OSFile(path, "rb") as source:
                pieces.append(pa.ipc.open_stream(source).read_all())
        if self._mixed:
            pieces = [piece.select(self.schema.names) for piece in pieces]
        return pa.concat_tables(pieces).combine_chunks()

    def close(self) -> None:
        """Remove every file."""
        self.finish()
        self._held.clear()
        if self._dir is not None:
            self._dir.cleanup()

    def __enter__(self) -> BucketSpill:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["SPILL_DIR_ENV", "BucketSpill"]
