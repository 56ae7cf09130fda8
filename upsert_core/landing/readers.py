"""Readers: one batch file's bytes -> a :class:`RawBatch`, per format.

Invariants:

- A file that cannot be read as its format (truncated or corrupt Parquet, a CSV with
  a broken header or encoding, duplicate column names) raises one
  ``IngestError("<file>: <problem>")``; nothing of it is returned.
- Row-level damage is not a file error: a JSON line that does not parse (or is not an
  object) and a CSV row with the wrong number of fields become :class:`RowError`\\ s
  with their row number, and the other rows are kept. Strict JSON: ``NaN``,
  ``Infinity`` and ``-Infinity`` do not parse, an object with a repeated key does not
  parse (no silent "last one wins"), nor does one with a key that is not UTF-8. A
  JSON line is UTF-8 (RFC 8259): one whose bytes are not (UTF-16, CESU-8 surrogates,
  a stray byte) is a malformed line, never guessed at.
- Only names must be UTF-8 to read a file (a CSV header; Parquet column names): CSV
  values are read unchecked, and strings that are not valid UTF-8 are row errors
  found by validation (``convert.split_invalid_utf8``).
- Row numbers count from 1 in file order: data rows for Parquet and CSV (the header
  is not a row), lines for JSON Lines (a blank line is skipped but still counted, so
  a reported row is the line an editor shows).
- A 0-byte file, or one with no rows, is an empty batch (for JSON Lines and CSV it then
  has no columns at all).
- Memory is bounded by one file: the file's bytes plus its columns.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from upsert_core.errors import IngestError
from upsert_core.landing.batch import Column, RawBatch, RowError, SourceKind, is_utf8
from upsert_core.landing.listing import LandingFile

_BOM = b"\xef\xbb\xbf"


def read_batch(file: LandingFile, *, track_missing: bool = False) -> RawBatch:
    """Read one landing file by its suffix; ``track_missing`` (``--missing keep``):
    record which JSON objects leave a field out (``RawBatch.missing``)."""
    reader = _READERS.get(file.suffix)
    if reader is None:
        raise IngestError(f"{file.name}: not a batch file (.parquet, .jsonl or .csv)")
    if track_missing and reader is read_jsonl:
        return read_jsonl(file.name, file.read_bytes(), track_missing=True)
    return reader(file.name, file.read_bytes())


def read_parquet(name: str, data: bytes) -> RawBatch:
    try:
        table = pq.ParquetFile(pa.BufferReader(data)).read()  # read_table imports datasets: 0.2 s
        # Column names are decoded lazily: a damaged footer can hold invalid UTF-8.
        column_names = table.column_names
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise IngestError(f"{name}: unreadable or truncated Parquet file: {exc}") from exc
    _check_unique(name, column_names)
    columns: dict[str, Column] = {
        col: table.column(col).combine_chunks() for col in column_names
    }
    positions = np.arange(1, table.num_rows + 1, dtype=np.int64)
    metadata = dict(table.schema.metadata or {})
    return RawBatch(name, SourceKind.TYPED, columns, positions, metadata=metadata)


def read_jsonl(
    name: str, data: bytes, *, track_missing: bool = False, line_offset: int = 0
) -> RawBatch:
    """JSON Lines, parsed line by line so one bad line costs one row, not the file;
    ``track_missing``: record per column the objects without that field.
    ``line_offset``: ``data`` is a block of whole lines of a file, after this many
    lines (``landing.text_chunks``): its lines are numbered from ``line_offset + 1``
    and a BOM is only the file's when ``line_offset`` is 0."""
    objects: list[dict[str, object]] = []
    positions: list[int] = []
    errors: list[RowError] = []
    for number, obj in json_lines(name, data, errors, line_offset=line_offset):
        if not isinstance(obj, dict):
            kind = type(obj).__name__
            errors.append(RowError(name, number, f"JSON line is not an object (got {kind})"))
            continue
        objects.append(obj)
        positions.append(number)
    names: dict[str, None] = {}
    for obj in objects:
        for key in obj:
            if key not in names:
                names[key] = None
    columns: dict[str, Column] = {col: [obj.get(col) for obj in objects] for col in names}
    raw = RawBatch(name, SourceKind.JSON, columns, np.array(positions, dtype=np.int64), errors)
    if track_missing:
        raw.missing = {
            col: np.fromiter((col not in obj for obj in objects), np.bool_, len(objects))
            for col in names
        }
    return raw


def json_lines(
    name: str, data: bytes, errors: list[RowError], *, reuse_wrapper_schema: bool = False,
    line_offset: int = 0,
) -> Iterator[tuple[int, object]]:
    """``(line number, parsed value)`` of every non-blank line that parses as strict JSON
    (module docstring); a line that does not is appended to ``errors`` instead.
    ``reuse_wrapper_schema``: parse Kafka Connect's repeated ``schema`` once
    (:class:`_WrapperSchemaReuse`; the same values and errors, the schema value shared
    between lines, so it must only be read). ``line_offset``: as :func:`read_jsonl`."""
    if line_offset == 0 and data.startswith(_BOM):
        data = data[len(_BOM) :]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line does not start another
    parse = _WrapperSchemaReuse().parse if reuse_wrapper_schema else _parse_line
    for number, line in enumerate(lines, start=line_offset + 1):
        if not line.strip():
            continue
        try:
            obj = parse(line)
        except UnicodeDecodeError as exc:
            reason = f"malformed JSON line: not valid UTF-8 ({exc.reason} at byte {exc.start + 1})"
            errors.append(RowError(name, number, reason))
            continue
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, ours
            errors.append(RowError(name, number, f"malformed JSON line: {_short(str(exc))}"))
            continue
        if b"\\u" in line and not _keys_utf8(obj):
            # An escaped lone surrogate ("\ud800") decodes, but is no UTF-8 column name.
            errors.append(RowError(name, number, "malformed JSON line: a key is not UTF-8"))
            continue
        yield number, obj


def _parse_line(line: bytes) -> object:
    """One line's value, strictly (module docstring); raises ``UnicodeDecodeError``,
    ``ValueError`` (``JSONDecodeError``, a repeated key, ``NaN``) or ``RecursionError``."""
    # SUBTLE: decoded here, strictly, not by json.loads: given bytes, it guesses
    # UTF-16/32 from NUL bytes and decodes UTF-8 with "surrogatepass", so a
    # UTF-16 line or CESU-8 surrogate bytes (not UTF-8) would read as valid.
    text = line.decode("utf-8")
    if text.startswith("\ufeff"):  # json.loads(bytes) skipped a BOM on any line
        text = text[1:]
    return _DECODER.decode(text)


class _WrapperSchemaReuse:
    """Parses lines like :func:`_parse_line`, but Kafka Connect's ``{"schema": S,
    "payload": ...}`` wrapper (``S`` the same ~2 KB on every line of a file) only once.

    Invariant: a line is parsed on the short path only when it starts with exactly the
    bytes ``{"schema":`` + ``S`` + ``,`` of an earlier line that parsed in full without
    error; those bytes parse to that line's (checked) schema value, whatever follows, so
    only ``{`` + the rest is parsed, with the same strict decoder, and the earlier value
    is reused. The short path's result is used only where the full parse's is the same:
    the rest parses, has at least one member and no ``schema`` (a repeated key). Every
    other line, and every line the short path fails on, is parsed in full, so values,
    errors and their messages are exactly :func:`_parse_line`'s. The schema value is
    shared by the lines that reuse it: it must be read, never changed.
    """

    _HEAD = b'{"schema":'
    _TRIES = 16  # schemas taken or found unusable before the file is parsed in full

    def __init__(self) -> None:
        self._prefix: bytes | None = None
        self._schema: object = None
        self._tries = self._TRIES

    def parse(self, line: bytes) -> object:
        prefix = self._prefix
        if prefix is not None and line.startswith(prefix):
            try:
                rest = _DECODER.decode("{" + line[len(prefix) :].decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                pass  # the full parse below gives today's error
            else:
                if isinstance(rest, dict) and rest and "schema" not in rest:
                    wrapper = {"schema": self._schema}
                    wrapper.update(rest)
                    return wrapper
        obj = _parse_line(line)
        if (self._tries and line.startswith(self._HEAD) and isinstance(obj, dict)
                and isinstance(obj["schema"], dict)):  # not a tombstone's null schema
            self._remember(line, obj)
        return obj

    def _remember(self, line: bytes, obj: dict[str, object]) -> None:
        """Take ``line``'s schema bytes as the prefix (``line`` parsed in full)."""
        self._tries -= 1
        text = line.decode("utf-8")
        start = len(self._HEAD)
        try:
            _, end = _PLAIN.raw_decode(text, start)
        except (ValueError, RecursionError):  # a value after whitespace: not raw_decode's
            end = -1
        if end < 0 or text[end : end + 1] != ",":
            return
        self._prefix = text[: end + 1].encode("utf-8")
        self._schema = obj["schema"]


def _keys_utf8(value: object) -> bool:
    """Whether every key of ``value`` (an object's own keys) is UTF-8."""
    return not isinstance(value, dict) or all(is_utf8(k) for k in value)


CSV_BLOCK_BYTES = 1 << 20
"""Arrow's CSV block: a row longer than this is a file error ("straddling object"), so a
CSV file read in chunks (``landing.csv_chunks``) parses with this same block."""


def read_csv(name: str, data: bytes, *, block_size: int | None = None) -> RawBatch:
    """CSV with a header row; every value is read as text and typed by validation.
    ``block_size``: Arrow's CSV block, :data:`CSV_BLOCK_BYTES` when not given (tests
    only: the same file parsed in smaller blocks, as ``landing.csv_chunks`` may be)."""
    start = len(_BOM) if data.startswith(_BOM) else 0
    if not data[start:].strip():
        return RawBatch(name, SourceKind.TEXT, {}, np.zeros(0, dtype=np.int64))
    try:
        text = data[start:].decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        # Undecodable bytes become lone surrogates: only the header must be UTF-8 here;
        # a value that is not is a row error (validation finds it).
        text, utf8 = data[start:].decode("utf-8", "surrogateescape"), False
    header = csv_header(name, iter(io.StringIO(text, newline="")))
    del text
    bad_rows: list[tuple[int, str]] = []
    try:
        with nullcontext() if utf8 else unraisable_ignored():
            table = pacsv.read_csv(
                pa.PythonFile(ArrowTextSource(data, start), mode="r"),
                **csv_options(header, bad_rows, block_size),
            )
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise IngestError(f"{name}: unreadable CSV file: {exc}") from exc
    total = table.num_rows + len(bad_rows)
    skipped = {row for row, _ in bad_rows}
    positions = np.array([row for row in range(1, total + 1) if row not in skipped], dtype=np.int64)
    check_csv_names(name, table.schema, header)
    columns: dict[str, Column] = {col: table.column(col).combine_chunks() for col in header}
    errors = [RowError(name, row, reason) for row, reason in bad_rows]
    return RawBatch(name, SourceKind.TEXT, columns, positions, errors)


def csv_header(name: str, lines: Iterator[str]) -> list[str]:
    """The header of a CSV file whose text (decoded, ``surrogateescape``) is ``lines``:
    its first non-empty row; raises ``IngestError`` for a header that is unreadable,
    not UTF-8 or names a column twice."""
    try:
        # SUBTLE: the header is the first non-empty line, as pyarrow (which skips empty
        # lines) reads it; taking a blank first line for it would let pyarrow use an
        # unchecked line as the column names.
        header = next(row for row in csv.reader(lines) if row)
    except (csv.Error, StopIteration) as exc:
        raise IngestError(f"{name}: unreadable CSV file: {exc or 'no header row'}") from exc
    for col in header:
        if not is_utf8(col):
            raise IngestError(f"{name}: unreadable CSV file: a column name is not valid UTF-8")
    _check_unique(name, header)
    return header


def csv_options(
    header: list[str], bad_rows: list[tuple[int, str]], block_size: int | None = None
) -> dict[str, Any]:
    """Arrow's CSV options for a file with ``header``: every column text, a row with
    the wrong number of fields appended to ``bad_rows`` (its data row number, the
    reason) and skipped, blocks of ``block_size`` (default :data:`CSV_BLOCK_BYTES`, read
    when called: tests shrink it for both reads). The whole read and the chunked one use
    exactly these."""
    if block_size is None:
        block_size = CSV_BLOCK_BYTES

    def on_invalid(row: pacsv.InvalidRow) -> str:
        if row.number is None:
            return "error"
        # ``number`` counts the header as row 1 (and blank lines not at all); data rows
        # count from 1.
        bad_rows.append(
            (
                row.number - 1,
                f"CSV row has {row.actual_columns} fields, expected {row.expected_columns}",
            )
        )
        return "skip"

    return {
        "read_options": pacsv.ReadOptions(use_threads=False, block_size=block_size),
        "parse_options": pacsv.ParseOptions(
            newlines_in_values=True, invalid_row_handler=on_invalid
        ),
        "convert_options": pacsv.ConvertOptions(
            column_types={col: pa.string() for col in header},
            strings_can_be_null=True,
            null_values=[""],
            check_utf8=False,
        ),
    }


def check_csv_names(name: str, schema: pa.Schema, header: list[str]) -> None:
    """``IngestError`` unless Arrow read the columns ``header`` names."""
    try:
        names = schema.names
    except UnicodeDecodeError:
        raise IngestError(
            f"{name}: unreadable CSV file: a column name is not valid UTF-8"
        ) from None
    if names != header:
        raise IngestError(f"{name}: unreadable CSV file: cannot tell which line is the header")


class ArrowTextSource(io.RawIOBase):
    """Bytes for Arrow's CSV reader: ``head`` from ``start``, then the pieces ``more``
    returns (``b""``: the end). A read returns all it is asked for (but at the end),
    except that it never ends between a "\\r" and a "\\n".

    SUBTLE: Arrow drops a "\\n" that starts a block read after one that ended in
    "\\r", taking the two for one line end even inside a quoted value, whose "\\r\\n"
    then silently loses its "\\n" (apache/arrow#51368, open at pyarrow 26). A block cut
    there is one byte shorter instead; a block of one byte is not (none is that small).

    ``on_not_utf8`` is called once, before the first byte that is not UTF-8 is handed
    out (``landing.csv_chunks``: Arrow's "unraisable" noise, as :func:`unraisable_ignored`).
    """

    def __init__(self, head: bytes, start: int = 0, more: Callable[[], bytes] | None = None,
                 on_not_utf8: Callable[[], object] | None = None) -> None:
        super().__init__()
        self._buf = head
        self._pos = start
        self._more = more
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._on_not_utf8 = on_not_utf8

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        """Whether an unread byte is at ``_pos`` (reading the next piece if needed)."""
        while self._pos >= len(self._buf):
            piece = self._more() if self._more is not None else b""
            if not piece:
                return False
            self._buf, self._pos = piece, 0
        return True

    def read(self, size: int | None = -1) -> bytes:
        want = None if size is None or size < 0 else size
        parts: list[bytes] = []
        got = 0
        while (want is None or got < want) and self._fill():
            end = len(self._buf) if want is None else self._pos + want - got
            part = self._buf[self._pos : end]
            self._pos += len(part)
            got += len(part)
            parts.append(part)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(data) > 1 and data.endswith(b"\r") and self._fill() and (
                self._buf[self._pos] == 0x0A):
            data = data[:-1]  # the "\r" starts the next block, with its "\n"
            if self._pos:
                self._pos -= 1
            else:  # it ended the piece before (rare): put it before this one
                self._buf = b"\r" + self._buf
        self._check_utf8(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _check_utf8(self, data: bytes) -> None:
        if self._on_not_utf8 is None:
            return
        final = not data
        if data.isascii() and not self._utf8.getstate()[0] and not final:
            return  # ASCII after whole characters: nothing to decode
        try:
            self._utf8.decode(data, final)
        except UnicodeDecodeError:
            self._on_not_utf8()
            self._on_not_utf8 = None


_unraisable_lock = threading.Lock()
_unraisable_users = 0
_unraisable_saved: Callable[[Any], object] | None = None


@contextmanager
def unraisable_ignored() -> Iterator[None]:
    """SUBTLE: pyarrow decodes a malformed CSV row's text as UTF-8 before calling the
    invalid-row handler; when that fails it reports the exception as "unraisable" (a
    traceback on stderr) and the read then fails: one file error, nothing lost. The
    traceback is noise, so it is dropped while such a file is read. The hook is the
    process's: reads in several threads share one swap (the first in installs it, the
    last out restores the original), so none restores another's no-op for good."""
    global _unraisable_users, _unraisable_saved
    with _unraisable_lock:
        if _unraisable_users == 0:
            _unraisable_saved = sys.unraisablehook
            sys.unraisablehook = _ignore_unraisable
        _unraisable_users += 1
    try:
        yield
    finally:
        with _unraisable_lock:
            _unraisable_users -= 1
            if _unraisable_users == 0 and _unraisable_saved is not None:
                sys.unraisablehook = _unraisable_saved
                _unraisable_saved = None


def _ignore_unraisable(unraisable: Any) -> None:
    return None


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object; a repeated key is an error, not silently "last one wins"."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {_short(repr(key), 60)}")
            seen.add(key)
    return obj


def _not_json(literal: str) -> object:
    """``NaN``, ``Infinity`` and ``-Infinity``: Python's json accepts them, JSON does not."""
    raise ValueError(f"{literal} is not a JSON value")


def _check_unique(name: str, columns: list[str]) -> None:
    seen: set[str] = set()
    for col in columns:
        if col in seen:
            raise IngestError(f"{name}: duplicate column {col!r}")
        seen.add(col)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_not_json)
"""The strict decoder (what ``json.loads`` with these options builds on every call)."""
_PLAIN = json.JSONDecoder()
"""Only to find where a value already parsed strictly ends."""

_READERS: dict[str, Callable[[str, bytes], RawBatch]] = {
    ".parquet": read_parquet,
    ".jsonl": read_jsonl,
    ".csv": read_csv,
}
