"""Writing shard rows as JSON Lines, CSV or Parquet, to stdout or a file.

Invariants (CONTRACT.md, "Output"):

- Every output row has every column of the shard's schema, in schema order, with
  ``None`` (JSON ``null``, CSV empty) where the row has no value.
- In JSON Lines and CSV, timestamps and dates are ISO-8601 strings; binary values are
  base64; non-finite floats are the strings ``NaN``, ``Infinity``, ``-Infinity`` (JSON
  has no literal for them). Parquet keeps the native column types.
- CSV always starts with a header row, even when there are no rows.
- CSV quotes every value holding a line break (``\\n`` or a lone ``\\r``), so each row
  reads back as one row with any CSV reader.
- Writers stream: rows are written as they come, never collected first (Parquet is
  written one row group per call to :meth:`RowWriter.write`).
- Only data goes to the output; nothing here writes to stderr.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from typing import IO, Any, Protocol

from upsert_core.errors import ConfigError

FORMATS = ("jsonl", "csv", "parquet")


def json_value(value: object) -> object:
    """A JSON-representable form of one decoded datum (see the module docstring)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def csv_value(value: object) -> str:
    """The CSV text of one decoded datum: empty for null, ``true``/``false`` for bools."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return str(json_value(value))


def json_row(columns: Sequence[str], row: dict[str, object]) -> dict[str, object]:
    """``row`` with every column, in order, values made JSON-safe."""
    return {name: json_value(row.get(name)) for name in columns}


_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
"""The line breaks ``json.dumps(ensure_ascii=False)`` leaves raw (it escapes those below
U+0020), as JSON escapes."""


def dumps(obj: object) -> str:
    """Compact JSON with non-ASCII kept readable; never emits NaN literals.

    SUBTLE: one JSON value is one line by any reader's definition: U+0085, U+2028 and
    U+2029 in strings are escaped, since ``str.splitlines`` (the usual way to read JSON
    Lines in Python) and other line readers break lines there, which would cut a row in
    two. The JSON parses to the same value either way.
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(_LINE_BREAKS)


class RowWriter(Protocol):
    def write(self, rows: Sequence[dict[str, object]]) -> None: ...


class _JsonlWriter:
    def __init__(self, out: IO[str], columns: Sequence[str]) -> None:
        self._out = out
        self._columns = list(columns)

    def write(self, rows: Sequence[dict[str, object]]) -> None:
        self._out.write("".join(dumps(json_row(self._columns, r)) + "\n" for r in rows))


class _CsvWriter:
    """Minimal quoting, ``"\\n"`` line ends, and any value holding a line break quoted.

    SUBTLE: ``csv`` quotes only the characters of its ``lineterminator``. With ``"\\n"``
    a value holding a lone ``"\\r"`` would be written bare, and every CSV reader
    (pyarrow, pandas, ``csv`` itself, the landing's reader) takes a bare ``"\\r"`` for a
    line end: the row would read back split in two. Rows with a ``"\\r"`` go through a
    writer whose terminator is ``"\\r\\n"`` (so it quotes both), and get ``"\\n"``.
    """

    def __init__(self, out: IO[str], columns: Sequence[str]) -> None:
        self._out = out
        self._columns = list(columns)
        self._csv = csv.writer(out, lineterminator="\n")
        self._cr_buffer = io.StringIO()
        self._cr_csv = csv.writer(self._cr_buffer, lineterminator="\r\n")
        self._write_rows([self._columns])

    def _write_rows(self, rows: Iterable[list[str]]) -> None:
        rows = list(rows)
        if "\r" not in "".join(chain.from_iterable(rows)):  # the usual case, at C speed
            self._csv.writerows(rows)
            return
        plain: list[list[str]] = []
        for row in rows:
            if not any("\r" in value for value in row):
                plain.append(row)
                continue
            self._csv.writerows(plain)
            plain = []
            self._cr_csv.writerow(row)
            line = self._cr_buffer.getvalue()
            self._cr_buffer.seek(0)
            self._cr_buffer.truncate()
            self._out.write(line[: -len("\r\n")] + "\n")
        self._csv.writerows(plain)

    def write(self, rows: Sequence[dict[str, object]]) -> None:
        self._write_rows([csv_value(r.get(c)) for c in self._columns] for r in rows)


DICTIONARY_MAX_DISTINCT = 0.25
"""A Parquet column is dictionary-encoded when the distinct values of the first rows
(:data:`DICTIONARY_SAMPLE_ROWS`) are at most this share of them: pyarrow's default (try
a dictionary on every column, fall back when it fills) tripled the time of writing a
1M-row snapshot of mostly distinct values, and made the file bigger."""

DICTIONARY_SAMPLE_ROWS = 16 * 1024
"""Rows the choice looks at. Counting the distinct values of a whole first batch (256k
rows of long strings) was half of a 1M-row export's time here; an encoding choice needs
an estimate, and the rows of a snapshot come in no order that a prefix would bias."""


def dictionary_columns(table: Any) -> list[str]:
    """The columns of ``table`` worth dictionary-encoding (few distinct values among its
    first :data:`DICTIONARY_SAMPLE_ROWS` rows). Only the encoding depends on it."""
    import pyarrow.compute as pc

    sample = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    limit = DICTIONARY_MAX_DISTINCT * sample.num_rows
    return [name for name in sample.column_names
            if pc.count_distinct(sample.column(name), mode="all").as_py() <= limit]


class _ParquetWriter:
    """Parquet, one row group per write; the file is opened at the first write (the
    first rows choose which columns get a dictionary)."""

    def __init__(self, sink: Any, columns: Sequence[tuple[str, object]]) -> None:
        import pyarrow as pa

        self._pa = pa
        self._sink = sink
        self._schema = pa.schema([pa.field(name, typ) for name, typ in columns])
        self._writer: Any = None

    def _open(self, first: Any) -> Any:
        import pyarrow.parquet as pq

        if self._writer is None:
            self._writer = pq.ParquetWriter(
                self._sink, self._schema, use_dictionary=dictionary_columns(first))
        return self._writer

    def write(self, rows: Sequence[dict[str, object]]) -> None:
        if not rows:
            return
        pa = self._pa
        arrays = [
            pa.array([r.get(f.name) for r in rows], type=f.type) for f in self._schema
        ]
        self.write_table(pa.Table.from_arrays(arrays, schema=self._schema))

    def write_table(self, table: Any) -> None:
        """Write an Arrow table already in this writer's schema (no per-row work)."""
        if table.num_rows:
            self._open(table).write_table(table)

    def close(self) -> None:
        if self._writer is None:  # a valid file with the schema and no rows
            self._open(self._schema.empty_table()).write_table(self._schema.empty_table())
        self._writer.close()


@contextmanager
def _text_out(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8", newline="") as f:
        yield f


@contextmanager
def row_writer(
    fmt: str, columns: Sequence[tuple[str, object]], out: str | None
) -> Iterator[RowWriter]:
    """A writer of rows in ``fmt`` to file ``out`` (stdout when None).

    ``columns`` are ``(name, arrow type)`` pairs in schema order.
    """
    names = [name for name, _ in columns]
    if fmt == "jsonl":
        with _text_out(out) as f:
            yield _JsonlWriter(f, names)
    elif fmt == "csv":
        with _text_out(out) as f:
            yield _CsvWriter(f, names)
    elif fmt == "parquet":
        sys.stdout.flush()
        writer = _ParquetWriter(sys.stdout.buffer if out is None else out, columns)
        yield writer
        writer.close()
    else:
        raise ConfigError(f"unknown output format {fmt!r}; use one of: {', '.join(FORMATS)}")


def write_jsonl(objects: Iterable[object], out: str | None) -> int:
    """Write each object as one JSON line; returns how many were written."""
    n = 0
    with _text_out(out) as f:
        for obj in objects:
            f.write(dumps(obj) + "\n")
            n += 1
    return n
