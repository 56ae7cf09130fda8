"""Bulk decoding of encoded rows into typed Arrow columns: the inverse of ``encode_columns``.

``decode_columns(rows, types)`` turns N encodings made by ``codec.encode_datums`` (one
per row, as a binary Arrow array) into one Arrow array per column, with numpy over the
rows' shared data buffer: one pass per column, never a Python loop per row.

Invariants:

- Same values as the per-row decoder: row ``i``, column ``c`` is
  ``decode_datums(rows[i])[c]`` as an Arrow value of ``types[c]``; a row with fewer
  datums than there are columns reads as null in the missing trailing columns (how
  ``landing.rows.decode_row`` reads a row written before a column was added).
- Never garbage: every row is checked as strictly as ``decode_datums`` checks it
  (version byte, known tag, no truncation, canonical floats, timestamps and dates in
  Python's range, valid UTF-8) and must hold no more datums than there are columns.
  A row that fails raises :class:`~upsert_core.errors.CodecError`; its message is the
  per-row decoder's for that row (the fast path only finds *which* row; the row is
  then decoded alone to say *why*).
- Typed: a column only accepts null and the datum kind of its type (a bool column
  True/False, an int64 column ints, ...). A well-formed datum of another kind -- which
  the ingest path never writes, since it converts every value to its column's type
  before encoding -- is also a CodecError naming the row and column.
- Supported column types: int64, float64, bool, string, binary (and their large
  forms), timestamp("us", any tz), date32, null. Anything else is a ``TypeError``.
- The result never aliases memory the caller could mutate through ``rows``: fixed-width
  values are copied by numpy, strings and bytes by Arrow's ``take``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import NoReturn, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from upsert_core.codec import (
    _CANONICAL_NAN_BITS,
    _MAX_DATE_DAYS,
    _MAX_MICROS,
    _MIN_DATE_DAYS,
    _MIN_MICROS,
    CODEC_VERSION,
    TAG_BYTES,
    TAG_DATE,
    TAG_DATETIME,
    TAG_FALSE,
    TAG_FLOAT,
    TAG_INT,
    TAG_NULL,
    TAG_STR,
    TAG_TRUE,
    decode_datums,
)
from upsert_core.errors import CodecError

I64Array: TypeAlias = npt.NDArray[np.int64]
U8Array: TypeAlias = npt.NDArray[np.uint8]
BoolArray: TypeAlias = npt.NDArray[np.bool_]

_NEG_ZERO_BITS = 0x8000000000000000

# The datum tag each column kind accepts (besides TAG_NULL), and its payload width
# (None: a uint32 length and that many bytes).
_FIXED_WIDTH = {TAG_INT: 8, TAG_FLOAT: 8, TAG_DATETIME: 8, TAG_DATE: 4}
_TAG_NAMES = {
    TAG_NULL: "null",
    TAG_FALSE: "bool",
    TAG_TRUE: "bool",
    TAG_INT: "int",
    TAG_FLOAT: "float",
    TAG_STR: "str",
    TAG_BYTES: "bytes",
    TAG_DATETIME: "datetime",
    TAG_DATE: "date",
}


def _expected_tag(t: pa.DataType) -> int | None:
    """The tag of a column's non-null datums (TAG_TRUE stands for both booleans)."""
    if pa.types.is_null(t):
        return None
    if pa.types.is_int64(t):
        return TAG_INT
    if pa.types.is_float64(t):
        return TAG_FLOAT
    if pa.types.is_boolean(t):
        return TAG_TRUE
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return TAG_STR
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return TAG_BYTES
    if pa.types.is_timestamp(t) and t.unit == "us":
        return TAG_DATETIME
    if pa.types.is_date32(t):
        return TAG_DATE
    raise TypeError(f"decode_columns does not support column type {t}")


def decode_columns(
    rows: pa.Array | pa.ChunkedArray,
    types: Sequence[pa.DataType],
    names: Sequence[str] | None = None,
) -> pa.Table:
    """Decode every encoded row of ``rows`` into one typed column per entry of ``types``.

    ``names`` name the table's columns (default ``c0, c1, ...``). Raises CodecError for
    the first row (lowest index) that is not a valid encoding, holds more datums than
    ``types`` has columns, or holds a datum of the wrong kind for its column; TypeError
    for an unsupported column type or a ``rows`` array that is not binary.
    """
    if names is None:
        names = [f"c{i}" for i in range(len(types))]
    if len(names) != len(types):
        raise ValueError(f"{len(names)} names for {len(types)} column types")
    types = list(types)
    tags = [_expected_tag(t) for t in types]
    schema = pa.schema([pa.field(name, t) for name, t in zip(names, types, strict=True)])
    chunks = rows.chunks if isinstance(rows, pa.ChunkedArray) else [rows]
    batches = []
    row_base = 0
    for chunk in chunks:
        if not (pa.types.is_binary(chunk.type) or pa.types.is_large_binary(chunk.type)):
            raise TypeError(f"encoded rows must be a binary array, not {chunk.type}")
        if not len(chunk):
            continue
        bad, arrays = _scan(chunk, types, tags)
        if arrays is None:
            _raise_row_error(chunk, types, tags, _first_failure(chunk, types, tags, bad), row_base)
        else:
            batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
        row_base += len(chunk)
    return pa.Table.from_batches(batches, schema=schema)


# --- the vectorised path ----------------------------------------------------------------


def _scan(
    rows: pa.Array, types: list[pa.DataType], tags: list[int | None]
) -> tuple[BoolArray, list[pa.Array] | None]:
    """Check every row of a non-empty ``rows``; the columns too if every row passes.

    Returns ``(bad, arrays)``: ``bad`` marks exactly the rows that fail a structural
    check (anything but UTF-8: each row is checked on its own bytes, whatever other
    rows hold); ``arrays`` is None if some row fails, UTF-8 included (a bad string
    leaves ``bad`` clear: the caller locates it).
    """
    n = len(rows)
    large = pa.types.is_large_binary(rows.type)
    off_buf, data_buf = rows.buffers()[1], rows.buffers()[2]
    raw_offsets = np.frombuffer(off_buf, dtype="<i8" if large else "<i4", count=rows.offset + n + 1)
    offsets = raw_offsets[rows.offset :].astype(np.int64)
    data: U8Array = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    start, end = offsets[:-1], offsets[1:]
    size = len(data)
    bad = end <= start  # no version byte
    if rows.null_count:
        bad |= np.asarray(rows.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    if n and not size:
        return bad, None
    bad |= data[np.minimum(start, size - 1)] != CODEC_VERSION
    clean = not bad.any()  # build columns while every row so far is fine
    pos = start + 1
    arrays: list[pa.Array] = []
    for t, want in zip(types, tags, strict=True):
        has = pos < end
        tag = np.where(has, data[np.minimum(pos, size - 1)], TAG_NULL).astype(np.uint8)
        live = tag != TAG_NULL
        if want is None:
            bad |= live
        elif want == TAG_TRUE:
            bad |= live & (tag != TAG_TRUE) & (tag != TAG_FALSE)
        else:
            bad |= live & (tag != want)
        width = _FIXED_WIDTH.get(want) if want is not None else 0
        if want is None or want == TAG_TRUE:
            step = has.astype(np.int64)
            column = _flag_column(t, want, tag, live, n)
        elif width is not None:
            step = np.where(live, 1 + width, has.astype(np.int64))
            bad |= pos + step > end
            values = _fixed_values(data, pos + 1, live, width)
            bad |= live & _out_of_domain(want, values)
            column = pa.Array.from_buffers(t, n, [_validity(live), pa.py_buffer(values)])
        else:
            lens = np.where(live, _gather(data, pos + 1, "<u4"), 0).astype(np.int64)
            step = np.where(live, 5 + lens, has.astype(np.int64))
            bad |= pos + step > end
            clean = clean and not bad.any()
            # Only clean rows make the offsets Arrow is handed; never index past them.
            column = _var_column(t, rows, pos, lens, live, n) if clean else None
        clean = clean and column is not None and not bad.any()
        if clean:
            arrays.append(column)
        pos = pos + step
    bad |= pos != end  # more datums than columns (or a malformed extra one)
    return bad, arrays if clean and not bad.any() else None


def _first_failure(
    rows: pa.Array, types: list[pa.DataType], tags: list[int | None], bad: BoolArray
) -> int:
    """The lowest index of a failing row, given the structural ``bad`` mask."""
    first = int(np.flatnonzero(bad)[0]) if bad.any() else len(rows)
    # Rows before ``first`` pass every structural check; one may still hold bad UTF-8.
    # Bisect for the shortest failing prefix: rows[:lo] decodes, rows[:hi] does not.
    lo, hi = 0, first
    if hi == 0 or _scan(rows.slice(0, hi), types, tags)[1] is not None:
        return first
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _scan(rows.slice(0, mid), types, tags)[1] is None:
            hi = mid
        else:
            lo = mid
    return hi - 1


def _gather(data: U8Array, at: I64Array, dtype: str) -> npt.NDArray[np.generic]:
    """The little-endian ``dtype`` value starting at each ``at`` (clipped into range)."""
    width = np.dtype(dtype).itemsize
    if len(data) < width:
        return np.zeros(len(at), dtype=dtype)
    # An unaligned view whose element k is the value at byte k: one gather per column.
    windows = np.ndarray(shape=(len(data) - width + 1,), dtype=dtype, buffer=data, strides=(1,))
    return windows[np.minimum(at, len(data) - width)]


def _validity(live: BoolArray) -> pa.Buffer | None:
    if live.all():
        return None
    return pa.py_buffer(np.packbits(live, bitorder="little"))


def _flag_column(
    t: pa.DataType, want: int | None, tag: U8Array, live: BoolArray, n: int
) -> pa.Array:
    if want is None:
        return pa.nulls(n, type=t)
    values = pa.py_buffer(np.packbits(tag == TAG_TRUE, bitorder="little"))
    return pa.Array.from_buffers(t, n, [_validity(live), values])


def _fixed_values(data: U8Array, at: I64Array, live: BoolArray, width: int) -> I64Array:
    """The payloads at ``at`` (0 where not live), as int32 or int64 bit patterns."""
    dtype = "<i4" if width == 4 else "<i8"
    return np.where(live, _gather(data, at, dtype), 0).astype(dtype, copy=False)


def _out_of_domain(want: int, values: I64Array) -> BoolArray:
    """Values ``decode_datums`` rejects: non-canonical floats, out-of-range instants."""
    if want == TAG_FLOAT:
        bits = values.view("<u8")
        return (bits == _NEG_ZERO_BITS) | (
            np.isnan(values.view("<f8")) & (bits != _CANONICAL_NAN_BITS)
        )
    if want == TAG_DATETIME:
        return (values < _MIN_MICROS) | (values > _MAX_MICROS)
    if want == TAG_DATE:
        return (values < _MIN_DATE_DAYS) | (values > _MAX_DATE_DAYS)
    return np.zeros(len(values), dtype=np.bool_)


def _var_column(
    t: pa.DataType, rows: pa.Array, pos: I64Array, lens: I64Array, live: BoolArray, n: int
) -> pa.Array | None:
    """The string or bytes column; None if a string is not valid UTF-8."""
    # Payload i is data[s_i : s_i + lens_i]. The bounds s_0, e_0, s_1, e_1, ... never
    # decrease (rows are in order and checked to end within themselves), so as offsets
    # they describe a binary array whose even elements are the payloads; Arrow's take
    # copies those out (C++, one memcpy each). Null rows contribute an empty payload.
    payload = np.where(live, pos + 5, pos)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = payload
    bounds[1::2] = payload + lens
    large = pa.types.is_large_binary(rows.type)
    interleaved = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        2 * n - 1,
        [None, pa.py_buffer(bounds if large else bounds.astype(np.int32)), rows.buffers()[2]],
    )
    taken = interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    bufs = taken.buffers()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        target = pa.large_string() if large else pa.string()
    else:
        target = pa.large_binary() if large else pa.binary()
    out = pa.Array.from_buffers(target, n, [_validity(live), bufs[1], bufs[2]])
    if target in (pa.string(), pa.large_string()):
        try:
            out.validate(full=True)  # UTF-8
        except pa.ArrowInvalid:
            return None
    return out if out.type == t else out.cast(t)


# --- the per-row path, only to report an error ---------------------------------------------


def _raise_row_error(
    rows: pa.Array, types: list[pa.DataType], tags: list[int | None], i: int, row_base: int
) -> NoReturn:
    """Raise the CodecError of row ``i``, decoded alone by the per-row decoder."""
    k = len(types)
    try:
        values = decode_datums(rows[i].as_py())
        if len(values) > k:
            raise CodecError(f"row has {len(values)} values but the schema has only {k} columns")
    except CodecError as e:
        raise CodecError(f"row {row_base + i}: {e}") from None
    for c, (value, want) in enumerate(zip(values, tags, strict=False)):
        if value is None:
            continue
        got = _tag_of(value)
        if not (got == want or (want == TAG_TRUE and got == TAG_FALSE)):
            raise CodecError(
                f"row {row_base + i}: column {c} holds a {_TAG_NAMES[got]} datum"
                f" but has type {types[c]}"
            )
    # The vectorised checks and the per-row decoder disagree: a bug, never garbage.
    raise CodecError(f"row {row_base + i}: failed the bulk decoder's checks")


def _tag_of(value: object) -> int:
    """The tag ``encode_datums`` gives a decoded datum."""
    if isinstance(value, bool):
        return TAG_TRUE if value else TAG_FALSE
    if isinstance(value, int):
        return TAG_INT
    if isinstance(value, float):
        return TAG_FLOAT
    if isinstance(value, str):
        return TAG_STR
    if isinstance(value, bytes):
        return TAG_BYTES
    if isinstance(value, dt.datetime):
        return TAG_DATETIME
    return TAG_DATE
