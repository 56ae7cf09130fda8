"""Reading a large JSON Lines landing file in blocks cut at line ends, so memory follows
a block, not the file.

:func:`line_blocks` reads the listed version of a file (local or S3) in ranged reads of
``UPSERT_STREAM_BLOCK_BYTES`` (default 64 MiB) and yields blocks of whole lines: each
ends at a newline (the last one at the file's end), and together they are the file's
bytes, each read once. :func:`jsonl_chunks` parses each block as
:func:`~upsert_core.landing.readers.read_jsonl` parses a file, numbering its lines after
the lines of the blocks before it (a JSON line cannot hold a raw newline: JSON escapes
it, so a line end always ends a row).

Invariants:

- The chunks together are exactly the rows, row numbers, error rows and reasons of
  ``read_jsonl`` on the whole file, in order (a BOM is the file's only at its start; a
  blank line is counted; a last line without newline is a line). With
  ``track_missing`` each chunk records its objects' left-out fields, as the whole read.
- A file that is 0 bytes long gives one empty chunk (no columns), as the whole read.
- Every read is of the version listed (``LandingFile.read_range``): a change, also a
  file shorter than listed, raises :class:`~upsert_core.errors.LandingFileChanged`
  (possibly after earlier chunks were yielded: the caller discards what it made of
  them). Bytes read are counted once each (``landing.read_counter``, by
  ``read_range``), and digested as they are read: once the last block is read, the
  file's content digest is remembered (``LandingFile.known_digest``), so the ledger
  does not read the file again.
- A line longer than a block is read whole (the block grows to its end).
- CSV is not cut here: a quoted value may hold a newline (the CSV reader allows it),
  so a line end is not known to end a row without parsing from the start; CSV files
  are read in chunks by Arrow's streaming reader (``landing.csv_chunks``).

Column types are not decided here: a chunk's columns are what its own lines hold.
``landing.validate.validate_text_chunks`` checks that validating chunk by chunk typed
every column as the whole file would (``landing.stream_types``).
"""

from __future__ import annotations

from collections.abc import Iterator

from upsert_core.errors import LandingFileChanged
from upsert_core.landing.batch import RawBatch
from upsert_core.landing.chunks import _env_int
from upsert_core.landing.digest import Digester
from upsert_core.landing.listing import LandingFile, remember_digest
from upsert_core.landing.readers import read_jsonl

BLOCK_BYTES_ENV = "UPSERT_STREAM_BLOCK_BYTES"
DEFAULT_BLOCK_BYTES = 64 << 20
TEXT_STREAM_SUFFIXES = (".jsonl", ".csv")
"""Text formats read in chunks: JSON Lines here, CSV by ``landing.csv_chunks``."""


def block_bytes() -> int:
    """``UPSERT_STREAM_BLOCK_BYTES``: bytes per ranged read of a streamed text file."""
    return _env_int(BLOCK_BYTES_ENV, DEFAULT_BLOCK_BYTES, 1)


def line_blocks(file: LandingFile, size: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(lines before, block)`` for the blocks of whole lines of ``file`` (module
    docstring), read ``size`` bytes at a time."""
    size = size or block_bytes()
    at, lines, carry = 0, 0, b""
    end = file.size
    digester = Digester(file.digest_kind())
    while at < end:
        piece = file.read_range(at, min(end, at + size))
        if not piece:
            raise LandingFileChanged(
                f"{file.name}: changed while being ingested (shorter than the {end} bytes"
                " listed); still being written?"
            )
        at += len(piece)
        digester.update(piece)
        if at >= end:  # every byte read, each once: the file's digest is known
            remember_digest(file, at, digester.text())
        data = carry + piece if carry else piece
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            carry = data  # no line ends here yet: the block grows to the line's end
            continue
        block, carry = (data, b"") if cut == len(data) else (data[:cut], data[cut:])
        yield lines, block
        lines += block.count(b"\n")
    if carry:
        yield lines, carry


def jsonl_chunks(
    file: LandingFile, size: int | None = None, *, track_missing: bool = False
) -> Iterator[RawBatch]:
    """The lines of JSON Lines ``file`` as chunks (module docstring)."""
    empty = True
    for before, block in line_blocks(file, size):
        empty = False
        yield read_jsonl(file.name, block, track_missing=track_missing, line_offset=before)
    if empty:
        yield read_jsonl(file.name, b"", track_missing=track_missing)


__all__ = ["TEXT_STREAM_SUFFIXES", "block_bytes", "jsonl_chunks", "line_blocks"]
