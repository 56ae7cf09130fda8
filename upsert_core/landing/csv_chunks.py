"""Reading a large CSV landing file in chunks, so memory follows a chunk, not the file.

Why Arrow's streaming reader, and not blocks cut at line ends as for JSON Lines
(``landing.text_chunks``): a quoted CSV value may hold a newline, so a line end is known
to end a row only by parsing from the file's start. Cutting only text without a quote
character would refuse most real files (Arrow's writer, Spark and many exporters quote
every string). :func:`~upsert_core.landing.readers.read_csv` does not hold a whole
file's rows in one parse either: Arrow's serial CSV reader (``use_threads=False``) cuts
the bytes into blocks of ``CSV_BLOCK_BYTES`` (1 MiB) and its chunker, with
``newlines_in_values``, lexes the quotes to end each block after the last complete row.
``pyarrow.csv.open_csv`` is that same chunker and parser, handing over each block's rows
instead of concatenating them; :func:`csv_chunks` runs it with exactly ``read_csv``'s
options (``readers.csv_options``: every column text, so nothing is inferred from the
first block; the same invalid-row handler; the same 1 MiB block, so a row longer than a
block is the same file error) on exactly the bytes ``read_csv`` parses (after one BOM;
through the same ``readers.ArrowTextSource``, so Arrow's blocks start at the same bytes),
and groups the blocks' rows into chunks of about ``UPSERT_STREAM_BLOCK_BYTES`` of rows
(Arrow's bytes: about the text they came from).

What ``read_csv`` decides from the whole text is decided here from a prefix, only where
the prefix settles it:

- the header (Python's ``csv`` reader, the first non-empty row): taken from the complete
  lines of the prefix, and only if reading it did not reach the prefix's last line (a
  quoted newline could carry it on); otherwise the prefix grows;
- "a file of whitespace only is empty": the prefix grows until it holds another byte;
- a prefix that is the whole file is read by ``read_csv`` itself.

Invariants:

- The chunks together are exactly ``read_csv``'s rows, values, column names, row
  numbers (data rows from 1, blank lines not counted, as Arrow counts them) and error
  rows with their reasons, in order; every chunk has every column of the header (also
  one without rows). A file ``read_csv`` refuses raises ``IngestError`` here too, maybe
  after earlier chunks were yielded (the caller discards what it made of them and reads
  the file whole for the exact message: ``validate.validate_text_chunks``).
- Every read is of the version listed (``LandingFile.read_range``): a change, also a
  file shorter than listed, raises :class:`~upsert_core.errors.LandingFileChanged`.
  Each byte is read once (``landing.read_counter``): the prefix is the stream's start.
  The reads are in file order, so they are digested as they are read: once the last
  byte is read, the file's content digest is remembered (``LandingFile.known_digest``)
  and the ledger does not read the file again.
- Memory: one ranged read (``UPSERT_STREAM_BLOCK_BYTES``) plus the chunk being built
  (about as many bytes of rows), and Arrow's 1 MiB block; not the file.
- A malformed row whose text is not UTF-8 makes Arrow report an "unraisable" decoding
  error before the read fails; as in ``read_csv`` the traceback is dropped
  (``readers.unraisable_ignored``), here from the first byte seen that is not UTF-8.

Column types are not decided here: every column is text, typed by validation;
``landing.stream_types`` checks that chunk by chunk typed every column as the whole file
would.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import ExitStack

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from upsert_core.errors import IngestError, LandingFileChanged
from upsert_core.landing.batch import Column, RawBatch, RowError, SourceKind
from upsert_core.landing.digest import Digester
from upsert_core.landing.listing import LandingFile, remember_digest
from upsert_core.landing.readers import (
    ArrowTextSource,
    check_csv_names,
    csv_header,
    csv_options,
    read_csv,
    unraisable_ignored,
)
from upsert_core.landing.text_chunks import block_bytes

_BOM = b"\xef\xbb\xbf"


def csv_chunks(
    file: LandingFile, size: int | None = None, *, arrow_block: int | None = None
) -> Iterator[RawBatch]:
    """The rows of CSV ``file`` as chunks of about ``size`` bytes of rows, read ``size``
    bytes at a time (module docstring). ``arrow_block``: Arrow's CSV block (tests only,
    with ``read_csv``'s ``block_size`` the same; default ``readers.CSV_BLOCK_BYTES``)."""
    size = size or block_bytes()
    name = file.name
    reads = _InOrder(file)
    head, whole = _head(reads, size)
    if whole:
        yield read_csv(name, head, block_size=arrow_block)
        return
    start = len(_BOM) if head.startswith(_BOM) else 0
    header = _prefix_header(name, head[start:])
    assert header is not None  # _head read on until it was settled
    bad: list[tuple[int, str]] = []
    with ExitStack() as quiet:
        at = len(head)

        def more() -> bytes:  # the next ranged read
            nonlocal at
            piece = reads.read(at, size) if at < file.size else b""
            at += len(piece)
            return piece

        source = ArrowTextSource(head, start, more,
                                 on_not_utf8=lambda: quiet.enter_context(unraisable_ignored()))
        try:
            reader = pacsv.open_csv(pa.PythonFile(source, mode="r"),
                                    **csv_options(header, bad, arrow_block))
        except LandingFileChanged:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
            raise IngestError(f"{name}: unreadable CSV file: {exc}") from exc
        check_csv_names(name, reader.schema, header)
        rows = _Numbering(name, header, bad)
        batches: list[pa.RecordBatch] = []
        held = 0  # bytes of the rows in ``batches``
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except LandingFileChanged:
                raise
            except Exception as exc:  # noqa: BLE001 - as above, for a later block
                raise IngestError(f"{name}: unreadable CSV file: {exc}") from exc
            batches.append(batch)
            held += batch.nbytes
            if held >= size:
                yield rows.chunk(batches, final=False)
                batches, held = [], 0
        if batches or rows.pending or not rows.yielded:
            yield rows.chunk(batches, final=True)


def _head(reads: _InOrder, size: int) -> tuple[bytes, bool]:
    """The file's first bytes, ``size`` at a time, until they settle the header (module
    docstring), and whether they are the whole file."""
    file = reads.file
    data = b""
    while True:
        piece = reads.read(len(data), size)
        data += piece
        if len(data) >= file.size:
            return data, True
        start = len(_BOM) if data.startswith(_BOM) else 0
        if len(data) > start and _prefix_header(file.name, data[start:]) is not None:
            return data, False


class _InOrder:
    """The ranged reads of one file, each starting where the one before ended, digested
    as they are read (module docstring)."""

    def __init__(self, file: LandingFile) -> None:
        self.file = file
        self._digester = Digester(file.digest_kind())

    def read(self, at: int, size: int) -> bytes:
        """Bytes ``[at, at + size)`` of the listed version (as :func:`_read`)."""
        piece = _read(self.file, at, size)
        if at == self._digester.size:  # always, reading in order: else not digested
            self._digester.update(piece)
            if piece and self._digester.size == self.file.size:
                remember_digest(self.file, self._digester.size, self._digester.text())
        return piece


def _read(file: LandingFile, at: int, size: int) -> bytes:
    """Bytes ``[at, at + size)`` of the listed version (fewer at its end)."""
    end = min(file.size, at + size)
    piece = file.read_range(at, end)
    if len(piece) < end - at:
        raise LandingFileChanged(
            f"{file.name}: changed while being ingested (shorter than the {file.size} bytes"
            " listed); still being written?"
        )
    return piece


def _prefix_header(name: str, data: bytes) -> list[str] | None:
    """The header ``read_csv`` takes from a file starting with ``data`` (after its BOM),
    or None when ``data`` does not settle it (module docstring). Raises ``IngestError``
    where ``read_csv`` would, for a header within the prefix. Looks at a window of the
    prefix first, doubling (a header is short; decoding a whole block is not)."""
    window = _HEADER_WINDOW
    while True:
        header = _window_header(name, data[:window])
        if header is not None or window >= len(data):
            return header
        window *= 2


_HEADER_WINDOW = 1 << 16


def _window_header(name: str, data: bytes) -> list[str] | None:
    """:func:`_prefix_header` of exactly ``data``."""
    if not data.strip():
        return None  # whitespace so far: the file may yet be "empty"
    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    if cut == 0:
        return None
    lines = _Lines(data[:cut].decode("utf-8", "surrogateescape"))
    try:
        header = csv_header(name, lines)
    except IngestError:
        if lines.at_last:
            return None  # the header (or what fails) may go on past the prefix
        raise
    return None if lines.at_last else header


class _Lines:
    """The lines of ``text`` as ``csv.reader`` reads a file's (``newline=""``), knowing
    whether the last one was handed out: a row read before it ended within ``text``."""

    def __init__(self, text: str) -> None:
        self._lines = iter(io.StringIO(text, newline=""))
        self._next = next(self._lines, None)
        self.at_last = self._next is None

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        line = self._next
        if line is None:
            raise StopIteration
        self._next = next(self._lines, None)
        self.at_last = self._next is None
        return line


class _Numbering:
    """Gives each chunk its rows' file row numbers and the error rows among them.

    Arrow numbers the records it reports to the invalid-row handler (``bad``, data rows
    from 1, in file order, appended while it parses a block); the good rows are the
    other numbers, in order. A chunk's good rows are the next ones not in ``bad``; the
    error rows before its last good row are its own, those after wait for the next
    chunk (the last takes all)."""

    def __init__(self, name: str, header: list[str], bad: list[tuple[int, str]]) -> None:
        self.name = name
        self.header = header
        self.bad = bad
        self.taken = 0  # error rows of ``bad`` given to chunks
        self.last = 0  # the last good row's number
        self.yielded = False

    @property
    def pending(self) -> bool:
        return self.taken < len(self.bad)

    def chunk(self, batches: list[pa.RecordBatch], *, final: bool) -> RawBatch:
        n = sum(b.num_rows for b in batches)
        waiting = self.bad[self.taken :]
        skipped = np.array([row for row, _ in waiting], dtype=np.int64)
        numbers = np.arange(self.last + 1, self.last + 1 + n + len(skipped), dtype=np.int64)
        positions = numbers[~np.isin(numbers, skipped)][:n]
        if n:
            self.last = int(positions[-1])
        mine = len(waiting) if final else int(np.searchsorted(skipped, self.last))
        errors = [RowError(self.name, row, reason) for row, reason in waiting[:mine]]
        self.taken += mine
        self.yielded = True
        columns: dict[str, Column] = {}
        for i, col in enumerate(self.header):
            parts = [b.column(i) for b in batches]
            columns[col] = (parts[0] if len(parts) == 1 else
                            pa.concat_arrays(parts) if parts else pa.array([], pa.string()))
        return RawBatch(self.name, SourceKind.TEXT, columns, positions, errors)


__all__ = ["csv_chunks"]
