"""Reading a large Parquet landing file in chunks, so memory follows a chunk, not the file.

:func:`read_batch` holds a whole file (its bytes plus its decoded columns): a 30M-row
Parquet file needs more memory than a 24 GB machine has. :func:`parquet_chunks` reads
the same rows as :class:`RawBatch`\\ es of at most ``chunk_rows`` rows each, in file
order, straight from the file (a local file is read through Arrow's file reader; an S3
object is fetched once, as listed, and decoded chunk by chunk). The ingest validates
each chunk against the schema the previous one left, exactly as it validates files
(``validate.validate_batch``), and spills the validated rows by bucket
(``ingest.spill``).

Invariants:

- The chunks together are exactly the rows :func:`read_batch` returns, in order, with
  the same row numbers (positions count from 1 over the whole file) and the same
  column names and types (every chunk has every column the file declares), and the
  file's key-value metadata.
- A file that cannot be read as Parquet, or has duplicate column names, raises one
  ``IngestError("<file>: <problem>")`` like :func:`read_batch` (possibly after earlier
  chunks were yielded: the caller discards what it made of them).
- A local file that changed while it was read raises :class:`LandingFileChanged` after
  its last chunk (its version and size are checked once the reading is done), or
  instead of a read error (a file still being written reads as damaged Parquet), so
  the caller never commits rows of a file that was being rewritten and leaves it
  pending. A file deleted or moved meanwhile is changed too.
- :func:`streams` decides by suffix, envelope and listed size only (no read): Parquet
  files, plain JSON Lines files (``landing.text_chunks``) and plain CSV files
  (``landing.csv_chunks``), of at least ``UPSERT_STREAM_BYTES`` (default 256 MiB; 0
  streams every such file). Debezium JSON Lines files are read whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core.errors import ConfigError, IngestError, LandingFileChanged
from upsert_core.landing.batch import Column, RawBatch, SourceKind
from upsert_core.landing.listing import LandingFile
from upsert_core.landing.read_counter import CountingReader

STREAM_BYTES_ENV = "UPSERT_STREAM_BYTES"
DEFAULT_STREAM_BYTES = 256 << 20
CHUNK_ROWS_ENV = "UPSERT_STREAM_CHUNK_ROWS"
DEFAULT_CHUNK_ROWS = 1 << 20


def _env_int(name: str, default: int, minimum: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or int(text) < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return int(text)


def stream_threshold() -> int:
    """``UPSERT_STREAM_BYTES``: the listed size from which a Parquet file is streamed."""
    return _env_int(STREAM_BYTES_ENV, DEFAULT_STREAM_BYTES, 0)


def chunk_rows() -> int:
    """``UPSERT_STREAM_CHUNK_ROWS``: rows per chunk of a streamed file."""
    return _env_int(CHUNK_ROWS_ENV, DEFAULT_CHUNK_ROWS, 1)


def streams(file: LandingFile, envelope: str = "plain") -> bool:
    """Whether ``file`` is read in chunks (module docstring): Parquet, and JSON Lines and
    CSV of the plain envelope (``landing.text_chunks``, ``landing.csv_chunks``)."""
    if file.suffix in (".jsonl", ".csv") and envelope == "plain":
        return file.size >= stream_threshold()
    return file.suffix == ".parquet" and file.size >= stream_threshold()


def parquet_chunks(file: LandingFile, rows_per_chunk: int | None = None) -> Iterator[RawBatch]:
    """The rows of Parquet ``file`` as chunks (module docstring)."""
    rows_per_chunk = rows_per_chunk or chunk_rows()
    path = file.local_path()
    source: pa.NativeFile
    if path is None:
        source = pa.BufferReader(file.read_bytes())
    else:
        try:  # counted: the ingest reports the landing bytes it read
            source = pa.PythonFile(CountingReader(open(path, "rb"), file.url), mode="r")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise IngestError(f"{file.name}: cannot read file: {exc}") from exc
    with source:
        try:
            yield from _chunks(file.name, source, rows_per_chunk)
        except IngestError:
            # A file still being written reads as damaged: say it changed, if it did.
            if path is not None:
                _check_unchanged(file, path)
            raise
        if path is not None:
            _check_unchanged(file, path)


def _check_unchanged(file: LandingFile, path: os.PathLike[str] | str) -> None:
    """:class:`LandingFileChanged` if the local file is not the version listed (also
    when it was deleted or moved since)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise LandingFileChanged(
            f"{file.name}: changed while being ingested (deleted or moved: {exc}); "
            "still being written?"
        ) from exc
    file.check_local_version(st)


def _chunks(name: str, source: pa.NativeFile, rows_per_chunk: int) -> Iterator[RawBatch]:
    try:
        parquet = pq.ParquetFile(source)
        names = parquet.schema_arrow.names
        metadata = dict(parquet.schema_arrow.metadata or {})
        batches = parquet.iter_batches(batch_size=rows_per_chunk, use_threads=True)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise IngestError(f"{name}: unreadable or truncated Parquet file: {exc}") from exc
    seen: set[str] = set()
    for col in names:
        if col in seen:
            raise IngestError(f"{name}: duplicate column {col!r}")
        seen.add(col)
    start = 0
    while True:
        try:
            batch = next(batches, None)
        except Exception as exc:  # noqa: BLE001 - as above, for a damaged row group
            raise IngestError(f"{name}: unreadable or truncated Parquet file: {exc}") from exc
        if batch is None:
            if start == 0:  # no rows: its columns still count (they may add to the schema)
                empty = parquet.schema_arrow.empty_table()
                yield RawBatch(name, SourceKind.TYPED,
                               {col: empty.column(i).combine_chunks()
                                for i, col in enumerate(names)},
                               np.zeros(0, np.int64), metadata=metadata)
            return
        n = batch.num_rows
        if n == 0:
            continue
        columns: dict[str, Column] = {col: batch.column(i) for i, col in enumerate(names)}
        positions = np.arange(start + 1, start + n + 1, dtype=np.int64)
        start += n
        yield RawBatch(name, SourceKind.TYPED, columns, positions, metadata=metadata)


__all__ = ["chunk_rows", "parquet_chunks", "stream_threshold", "streams"]
