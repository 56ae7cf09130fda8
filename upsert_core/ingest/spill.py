"""A streamed file's validated rows, by bucket, in temporary files until they are drained.

A file read in chunks (``landing.chunks``) is validated and bucketed chunk by chunk. The
rows are held in memory while they fit ``memory_limit`` bytes; from the chunk that
would exceed it on, each chunk's rows of a bucket are written as one Arrow IPC stream
file (opened, written and closed at once, so a shard of thousands of buckets never
holds a descriptor per bucket), in a private temporary directory (``UPSERT_SPILL_DIR``,
else the system's temporary directory, made on first use and named after this
process). Once the whole file is read, each bucket's rows are read back when its drain
starts, so the ingest holds at most ``memory_limit`` plus one chunk while reading and
the buckets being drained while draining, never the whole file.

Invariants:

- A bucket's rows come back in the order they were added (file order), with the
  columns they were added with (``ROWS_SCHEMA`` plus any value columns); when chunks
  came with different extra columns, with the base schema's columns only, so the drain
  sees what the whole-file read gives it.
- :meth:`BucketSpill.add` is called from one thread; once it is done, :meth:`table`
  may be called from several threads (each reads its own files).
- :meth:`close` removes every file, whatever happened (also via ``with``). A process
  killed before it could (the kernel's answer to running out of memory) leaves its
  directory behind: the next spill in the same parent directory removes every
  ``upsert-spill-<host id>.<pid>-*`` directory of this host whose process is no longer
  running.
- A spill that cannot be written (a full disk) raises :class:`IngestError` naming the
  directory and ``UPSERT_SPILL_DIR``; the file then fails as a whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from types import TracebackType

import numpy as np
import pyarrow as pa

from upsert_core.errors import IngestError
from upsert_core.ingest.buckets import split_rows
from upsert_core.persist.keys import host_id, pid_running

SPILL_DIR_ENV = "UPSERT_SPILL_DIR"
_PREFIX = "upsert-spill-"


class BucketSpill:
    """See the module docstring."""

    def __init__(
        self, schema: pa.Schema, directory: str | None = None, memory_limit: int = 0
    ) -> None:
        self.schema = schema
        self.memory_limit = memory_limit
        self._where = directory
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._held: dict[int, list[pa.Table]] = {}
        self._held_bytes = 0
        self._spilling = False
        self._files: dict[int, list[str]] = {}
        self._written = 0
        self._chunk_schema: pa.Schema | None = None
        self._mixed = False
        self.bytes: dict[int, int] = {}
        self.rows: dict[int, int] = {}

    def add(self, rows: pa.Table) -> None:
        """Append ``rows`` (the base schema's columns first, with their ``bucket``, then
        any extra columns) to their buckets."""
        if rows.num_rows == 0:
            return
        if self._chunk_schema is None:
            self._chunk_schema = rows.schema
        elif rows.schema != self._chunk_schema:
            self._mixed = True  # chunks with other extra columns: base columns only
        buckets = np.asarray(rows.column("bucket").to_numpy(), dtype=np.int64)
        groups = split_rows(rows, buckets)
        per_row = rows.nbytes / rows.num_rows
        for bucket, group in groups.items():
            self.bytes[bucket] = self.bytes.get(bucket, 0) + int(per_row * group.num_rows)
            self.rows[bucket] = self.rows.get(bucket, 0) + group.num_rows
        if not self._spilling and self._held_bytes + rows.nbytes <= self.memory_limit:
            for bucket, group in groups.items():
                self._held.setdefault(bucket, []).append(group)
            self._held_bytes += rows.nbytes
            return
        self._spilling = True
        held, self._held, self._held_bytes = self._held, {}, 0
        for bucket, tables in held.items():
            self._write(bucket, pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        for bucket, group in groups.items():
            self._write(bucket, group)

    def _write(self, bucket: int, group: pa.Table) -> None:
        directory = self._directory()
        path = os.path.join(directory, f"{bucket:05d}-{self._written:08d}.arrows")
        self._written += 1
        try:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, group.schema) as out:
                out.write_table(group)
        except (OSError, pa.ArrowException) as exc:
            raise IngestError(
                f"cannot spill validated rows to {directory}: {exc}; set "
                f"{SPILL_DIR_ENV} to a directory with room for the file's rows"
            ) from exc
        self._files.setdefault(bucket, []).append(path)

    def _directory(self) -> str:
        """The private spill directory, made on first use (after sweeping the ones
        killed processes left behind)."""
        if self._dir is None:
            where = self._where or os.environ.get(SPILL_DIR_ENV) or tempfile.gettempdir()
            try:
                _sweep_orphans(where)
                self._dir = tempfile.TemporaryDirectory(
                    prefix=f"{_PREFIX}{host_id()}.{os.getpid()}-", dir=where
                )
            except OSError as exc:
                raise IngestError(
                    f"cannot make a directory to spill validated rows to in {where}: "
                    f"{exc}; set {SPILL_DIR_ENV} to a writable directory with room for "
                    "the file's rows"
                ) from exc
        return self._dir.name

    def buckets(self) -> list[int]:
        """The buckets that have rows, in order."""
        return sorted(self.rows)

    def table(self, bucket: int, *, combine: bool = True) -> pa.Table:
        """Bucket ``bucket``'s rows, in file order (empty if it has none): one chunk per
        column, or with ``combine`` False as the chunks they were added in (a first
        drain takes them into key order at once: combining them first copied every
        value once more)."""
        if bucket not in self.rows:
            return self.schema.empty_table()
        pieces = list(self._held.get(bucket, ()))
        for path in self._files.get(bucket, ()):
            with pa.OSFile(path, "rb") as source:
                pieces.append(pa.ipc.open_stream(source).read_all())
        if self._mixed:
            pieces = [piece.select(self.schema.names) for piece in pieces]
        whole = pa.concat_tables(pieces)
        return whole.combine_chunks() if combine else whole

    def close(self) -> None:
        """Remove every file."""
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


def _sweep_orphans(parent: str) -> None:
    """Remove ``upsert-spill-<host id>.<pid>-*`` directories in ``parent`` made on this
    host (``keys.host_id``: where pids mean something) whose process is gone."""
    mine = f"{_PREFIX}{host_id()}."
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if not (entry.name.startswith(mine) and entry.is_dir(follow_symlinks=False)):
                continue
            pid_text = entry.name[len(mine):].split("-", 1)[0]
            if not pid_text.isdigit() or pid_running(int(pid_text)):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)


__all__ = ["SPILL_DIR_ENV", "BucketSpill"]
