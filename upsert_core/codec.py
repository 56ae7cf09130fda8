"""Canonical, versioned binary encoding of keys and rows, and their xxhash digests.

A key or a row is a sequence of datums. ``encode_datums`` turns it into bytes and
``decode_datums`` turns the bytes back; ``key_digest`` hashes an encoded key into the
16-byte upsert key and ``value_checksum`` hashes an encoded row into the 64-bit checksum
the snapshot accumulator sums.

Invariants:

- Canonical: equal datum sequences always encode to the same bytes, on every process
  and machine (no hash seeds, no platform byte order, no pickle). ``-0.0`` is stored
  as ``0.0`` and every NaN as the one quiet NaN ``0x7ff8000000000000``; a naive
  datetime is taken as UTC.
- Bijective on its image: ``decode_datums`` accepts exactly the bytes ``encode_datums``
  can produce, so ``encode_datums(decode_datums(b)) == b`` whenever decoding succeeds.
  Anything else (wrong version, unknown tag, truncation, a non-canonical float, bad
  UTF-8, a datetime out of range) raises :class:`~upsert_core.errors.CodecError`;
  no ``IndexError`` or ``struct.error`` escapes.
- Versioned: every encoding starts with the byte ``CODEC_VERSION``. A change of layout
  must bump it (the fixed vectors in ``tests/core/test_codec.py`` catch accidental
  changes).

Layout (version 1): the version byte, then per datum a one-byte tag and its payload,
all integers little-endian:

==========  ===  ==========================================================
datum       tag  payload
==========  ===  ==========================================================
None        0    (none)
False       1    (none)
True        2    (none)
int         3    int64
float       4    IEEE-754 binary64 (canonical, see above)
str         5    uint32 byte length, UTF-8 bytes
bytes       6    uint32 length, the bytes
datetime    7    int64 microseconds since 1970-01-01T00:00:00Z
date        8    int32 days since 1970-01-01
==========  ===  ==========================================================

Decoded datetimes are timezone-aware (UTC).

``encode_columns`` is the bulk form of ``encode_datums`` for Arrow columns (numpy, no
per-value Python objects); it returns byte-identical encodings or None when it cannot
(the caller then falls back to ``encode_datums``). ``key_digest_array`` is the bulk
form of ``key_digest`` (numpy, :mod:`upsert_core.key_hash`: one 16-byte fixed-size
binary Arrow array, no Python object per key); ``key_digests`` is its per-key form, for
callers that want Python bytes.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from numbers import Integral, Real
from typing import NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from upsert_core.errors import CodecError
from upsert_core.key_hash import xxh3_128_digests

CODEC_VERSION = 1

Datum: TypeAlias = None | bool | int | float | str | bytes | _dt.datetime | _dt.date
UpsertKey: TypeAlias = bytes
"""The 16-byte xxh3-128 digest of an encoded key."""

UPSERT_KEY_LEN = 16

TAG_NULL = 0
TAG_FALSE = 1
TAG_TRUE = 2
TAG_INT = 3
TAG_FLOAT = 4
TAG_STR = 5
TAG_BYTES = 6
TAG_DATETIME = 7
TAG_DATE = 8

_VERSION_BYTE = bytes([CODEC_VERSION])
_NULL = bytes([TAG_NULL])
_FALSE = bytes([TAG_FALSE])
_TRUE = bytes([TAG_TRUE])
_CANONICAL_NAN = struct.pack("<Bd", TAG_FLOAT, math.nan)
_POS_ZERO = struct.pack("<Bd", TAG_FLOAT, 0.0)
_CANONICAL_NAN_BITS = 0x7FF8000000000000

_TAGGED_I64 = struct.Struct("<Bq")
_TAGGED_F64 = struct.Struct("<Bd")
_TAGGED_U32 = struct.Struct("<BI")
_TAGGED_I32 = struct.Struct("<Bi")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_U32_MAX = (1 << 32) - 1

_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
_US_PER_DAY = 86_400_000_000
_UTC = _dt.UTC
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_UTC)
_MIN_DATE_DAYS = _dt.date.min.toordinal() - _EPOCH_ORDINAL
_MAX_DATE_DAYS = _dt.date.max.toordinal() - _EPOCH_ORDINAL
_MIN_MICROS = _MIN_DATE_DAYS * _US_PER_DAY
_MAX_MICROS = (_MAX_DATE_DAYS + 1) * _US_PER_DAY - 1


# --- encoding -----------------------------------------------------------------------


def _enc_int(v: int) -> bytes:
    if not _I64_MIN <= v <= _I64_MAX:
        raise CodecError(f"integer {v} is outside the int64 range")
    return _TAGGED_I64.pack(TAG_INT, v)


def _enc_float(v: float) -> bytes:
    if v != v:
        return _CANONICAL_NAN
    if v == 0.0:
        return _POS_ZERO
    return _TAGGED_F64.pack(TAG_FLOAT, v)


def _enc_str(v: str) -> bytes:
    try:
        raw = v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise CodecError(f"string is not encodable as UTF-8: {e}") from None
    if len(raw) > _U32_MAX:
        raise CodecError("string longer than 4 GiB")
    return _TAGGED_U32.pack(TAG_STR, len(raw)) + raw


def _enc_bytes(v: bytes) -> bytes:
    raw = bytes(v)
    if len(raw) > _U32_MAX:
        raise CodecError("bytes longer than 4 GiB")
    return _TAGGED_U32.pack(TAG_BYTES, len(raw)) + raw


def _enc_datetime(v: _dt.datetime) -> bytes:
    micros = (
        (v.toordinal() - _EPOCH_ORDINAL) * _US_PER_DAY
        + ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000
        + v.microsecond
    )
    offset = v.utcoffset()
    if offset is not None:
        micros -= (offset.days * 86_400 + offset.seconds) * 1_000_000 + offset.microseconds
        if not _MIN_MICROS <= micros <= _MAX_MICROS:
            raise CodecError(f"datetime {v!r} is outside the representable UTC range")
    return _TAGGED_I64.pack(TAG_DATETIME, micros)


def _enc_date(v: _dt.date) -> bytes:
    return _TAGGED_I32.pack(TAG_DATE, v.toordinal() - _EPOCH_ORDINAL)


def _enc_bool(v: bool) -> bytes:
    return _TRUE if v else _FALSE


def _enc_none(v: None) -> bytes:
    return _NULL


# Exact-type dispatch keeps the common path to one dict lookup; subclasses (numpy
# scalars, pandas Timestamps) go through ``_encode_slow``.
_ENCODERS: dict[type, Callable[[object], bytes]] = {
    type(None): _enc_none,  # type: ignore[dict-item]
    bool: _enc_bool,  # type: ignore[dict-item]
    int: _enc_int,  # type: ignore[dict-item]
    float: _enc_float,  # type: ignore[dict-item]
    str: _enc_str,  # type: ignore[dict-item]
    bytes: _enc_bytes,  # type: ignore[dict-item]
    _dt.datetime: _enc_datetime,  # type: ignore[dict-item]
    _dt.date: _enc_date,  # type: ignore[dict-item]
}


def _encode_slow(v: object) -> bytes:
    # Order matters: bool is an int, datetime is a date.
    if isinstance(v, bool):
        return _enc_bool(v)
    if isinstance(v, _dt.datetime):
        return _enc_datetime(v)
    if isinstance(v, _dt.date):
        return _enc_date(v)
    if isinstance(v, str):
        return _enc_str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return _enc_bytes(bytes(v))
    if type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_"):
        return _enc_bool(bool(v))  # numpy.bool_ is neither a bool nor Integral
    if isinstance(v, Integral):
        return _enc_int(int(v))
    if isinstance(v, Real):
        return _enc_float(float(v))
    raise CodecError(f"cannot encode a value of type {type(v).__name__}")


def encode_datums(values: Sequence[Datum]) -> bytes:
    """Encode a key or a row canonically; raises CodecError for unencodable values."""
    encoders = _ENCODERS
    parts = [_VERSION_BYTE]
    append = parts.append
    for v in values:
        enc = encoders.get(type(v))
        append(enc(v) if enc is not None else _encode_slow(v))
    return b"".join(parts)


# --- decoding -----------------------------------------------------------------------


def _truncated(what: str, pos: int) -> CodecError:
    return CodecError(f"truncated encoding: {what} at offset {pos} runs past the end")


def decode_datums(data: bytes) -> tuple[Datum, ...]:
    """Decode bytes made by ``encode_datums``; raises CodecError on anything else."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    n = len(data)
    if n == 0:
        raise CodecError("empty encoding (no version byte)")
    if data[0] != CODEC_VERSION:
        raise CodecError(f"unsupported codec version {data[0]} (expected {CODEC_VERSION})")
    out: list[Datum] = []
    append = out.append
    pos = 1
    while pos < n:
        tag = data[pos]
        start = pos
        pos += 1
        if tag == TAG_NULL:
            append(None)
        elif tag == TAG_FALSE:
            append(False)
        elif tag == TAG_TRUE:
            append(True)
        elif tag in (TAG_INT, TAG_DATETIME):
            if pos + 8 > n:
                raise _truncated("int64", start)
            (iv,) = _I64.unpack_from(data, pos)
            pos += 8
            if tag == TAG_INT:
                append(iv)
            else:
                append(_decode_datetime(iv, start))
        elif tag == TAG_FLOAT:
            if pos + 8 > n:
                raise _truncated("float64", start)
            (bits,) = _U64.unpack_from(data, pos)
            (fv,) = _F64.unpack_from(data, pos)
            if bits == 0x8000000000000000 or (fv != fv and bits != _CANONICAL_NAN_BITS):
                raise CodecError(f"non-canonical float at offset {start}")
            pos += 8
            append(fv)
        elif tag in (TAG_STR, TAG_BYTES):
            if pos + 4 > n:
                raise _truncated("length", start)
            (length,) = _U32.unpack_from(data, pos)
            pos += 4
            end = pos + length
            if end > n:
                raise _truncated("string or bytes", start)
            chunk = data[pos:end]
            pos = end
            if tag == TAG_BYTES:
                append(chunk)
            else:
                try:
                    append(chunk.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise CodecError(f"invalid UTF-8 at offset {start}: {e}") from None
        elif tag == TAG_DATE:
            if pos + 4 > n:
                raise _truncated("date", start)
            (days,) = _I32.unpack_from(data, pos)
            pos += 4
            if not _MIN_DATE_DAYS <= days <= _MAX_DATE_DAYS:
                raise CodecError(f"date out of range ({days} days) at offset {start}")
            append(_dt.date.fromordinal(days + _EPOCH_ORDINAL))
        else:
            raise CodecError(f"unknown datum tag {tag} at offset {start}")
    return tuple(out)


def _decode_datetime(micros: int, pos: int) -> _dt.datetime:
    if not _MIN_MICROS <= micros <= _MAX_MICROS:
        raise CodecError(f"datetime out of range ({micros} us) at offset {pos}")
    return _EPOCH + _dt.timedelta(microseconds=micros)


# --- digests ------------------------------------------------------------------------


def key_digest(encoded_key: bytes) -> UpsertKey:
    """The upsert key: xxh3-128 of the encoded key, 16 bytes, big-endian."""
    return _xxh3_128_digest(encoded_key)


def value_checksum(encoded_value: bytes) -> int:
    """The value checksum: xxh3-64 of the encoded value as an unsigned 64-bit int."""
    return _xxh3_64_intdigest(encoded_value)


_xxh3_128_digest = xxhash.xxh3_128_digest
_xxh3_64_intdigest = xxhash.xxh3_64_intdigest


# --- bulk encoding of Arrow columns -----------------------------------------------------
#
# ``encode_columns`` builds, for every row of a set of Arrow columns, exactly the bytes
# ``encode_datums`` makes from that row's Python values, without creating those values:
# per column it computes each row's piece (tag + payload) with numpy and scatters the
# pieces into one buffer. ``tests/core/test_codec_bulk.py`` proves byte identity.

_I32_MAX = (1 << 31) - 1

U8Array: TypeAlias = npt.NDArray[np.uint8]
I64Array: TypeAlias = npt.NDArray[np.int64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]


class _Piece(NamedTuple):
    """One column's contribution to every row: its length, tag and payload."""

    length: I64Array  # bytes per row (tag included), 1 for a null
    tags: U8Array
    fixed: U8Array | None = None  # (rows, width) payload bytes of fixed-width values
    var_lens: I64Array | None = None  # byte length of variable-width values (0 if null)


def encode_columns(
    columns: Sequence[pa.Array | pa.ChunkedArray], *, drop_trailing_nulls: bool = False
) -> pa.BinaryArray | None:
    """Encode rows given column-wise as Arrow arrays, as one binary Arrow array.

    Row ``i`` encodes exactly like ``encode_datums([c[i].as_py() for c in columns])``
    (timestamps as UTC instants), with trailing nulls removed first when
    ``drop_trailing_nulls`` (as ``landing.rows.encode_row`` does). Supported column
    types: null, bool, integers, floats, string, binary (and their large forms),
    timestamps of any unit that converts to microseconds exactly, date32. Returns None
    for anything else (another type, datetimes outside Python's range, a string that
    is not valid UTF-8, over 2 GiB of output): the caller then encodes row by row,
    which also reports the errors.
    """
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    if not arrays:
        return None
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise CodecError("columns of different lengths")
    k = len(arrays)
    valid = np.ones((k, n), dtype=np.bool_)
    for c, arr in enumerate(arrays):
        if arr.null_count:
            valid[c] = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=bool)
    included = np.ones((k, n), dtype=np.bool_)
    if drop_trailing_nulls:
        # Row i keeps column c iff some column at or after c is non-null in row i.
        seen = np.zeros(n, dtype=np.bool_)
        for c in range(k - 1, -1, -1):
            seen |= valid[c]
            included[c] = seen
    pieces: list[pa.Array] = [_constant_piece(n, CODEC_VERSION)]
    total = n  # the version bytes
    for c, arr in enumerate(arrays):
        piece = _column_piece(arr, valid[c])
        if piece is None:
            return None
        total += int(np.where(included[c], piece.length, 0).sum())
        for part in _piece_arrays(piece, arr, valid[c]):
            if not included[c].all():
                part = pc.if_else(pa.array(included[c]), part, pa.scalar(b"", pa.binary()))
            pieces.append(part)
    if total > _I32_MAX:
        return None
    # Arrow concatenates the pieces row by row in C++: no Python or per-byte numpy work.
    joined = pc.binary_join_element_wise(*pieces, pa.scalar(b"", pa.binary()))
    return joined if isinstance(joined, pa.BinaryArray) else None


ENCODE_CHUNK_ROWS = 256 * 1024
"""Rows per piece :func:`encode_columns_in_chunks` encodes on one thread."""


def encode_columns_in_chunks(
    columns: Sequence[pa.Array | pa.ChunkedArray], *, drop_trailing_nulls: bool = False,
    chunk_rows: int = ENCODE_CHUNK_ROWS, threads: int | None = None,
) -> pa.BinaryArray | None:
    """:func:`encode_columns`, the rows cut into pieces of ``chunk_rows`` encoded on a
    thread pool (Arrow and numpy release the GIL; default: one thread per CPU), then
    joined: the same bytes, row for row, and None exactly when :func:`encode_columns`
    of the whole would be None (a piece it declines, or over 2 GiB in all)."""
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    n = len(arrays[0]) if arrays else 0
    workers = max(1, min(threads or os.cpu_count() or 1, -(-n // max(1, chunk_rows))))
    if workers == 1:
        return encode_columns(arrays, drop_trailing_nulls=drop_trailing_nulls)
    starts = range(0, n, max(1, chunk_rows))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="encode") as pool:
        pieces = list(pool.map(
            lambda s: encode_columns([a.slice(s, chunk_rows) for a in arrays],
                                     drop_trailing_nulls=drop_trailing_nulls),
            starts,
        ))
    encoded = [p for p in pieces if p is not None]
    if len(encoded) < len(pieces) or sum(_data_bytes(p) for p in encoded) > _I32_MAX:
        return None
    joined = pa.concat_arrays(encoded)
    return joined if isinstance(joined, pa.BinaryArray) else None


def _data_bytes(array: pa.BinaryArray) -> int:
    """The bytes of ``array``'s values (its last offset less its first)."""
    if not len(array):
        return 0
    offsets = np.frombuffer(array.buffers()[1], dtype="<i4",
                            count=array.offset + len(array) + 1)
    return int(offsets[-1]) - int(offsets[array.offset])


def _constant_piece(n: int, byte: int) -> pa.Array:
    """``n`` one-byte values ``byte``, as a binary array."""
    data = pa.py_buffer(np.full(n, byte, dtype=np.uint8))
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(1), n, [None, data]).cast(pa.binary())


def _piece_arrays(piece: _Piece, arr: pa.Array, valid: BoolArray) -> list[pa.Array]:
    """One column's encodings as binary arrays to concatenate: the head (tag, then the
    fixed-width payload or the u32 length of a variable-width value; the tag alone for
    a null) and, for variable-width values, the value bytes (empty for a null)."""
    n = len(valid)
    if piece.fixed is not None:
        payload = piece.fixed
    elif piece.var_lens is not None:
        payload = piece.var_lens.astype("<u4").view(np.uint8).reshape(n, 4)
    else:
        payload = np.zeros((n, 0), dtype=np.uint8)
    width = 1 + payload.shape[1]
    head = np.empty((n, width), dtype=np.uint8)
    head[:, 0] = piece.tags
    head[:, 1:] = payload
    if width == 1 or valid.all():
        heads = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(width), n, [None, pa.py_buffer(head)]
        ).cast(pa.binary())
    else:
        keep = np.zeros((n, width), dtype=bool)
        keep[:, 0] = True
        keep[:, 1:] = valid[:, None]
        lengths = np.where(valid, width, 1).astype(np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        heads = pa.Array.from_buffers(
            pa.binary(), n,
            [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(head[keep])],
        )
    if piece.var_lens is None:
        return [heads]
    values = arr if pa.types.is_binary(arr.type) else arr.cast(pa.binary())
    if values.null_count:
        values = values.fill_null(pa.scalar(b"", pa.binary()))
    return [heads, values]


def _fixed(valid: BoolArray, tag: int, payload: U8Array) -> _Piece:
    width = payload.shape[1]
    return _Piece(
        length=np.where(valid, 1 + width, 1).astype(np.int64),
        tags=np.where(valid, tag, TAG_NULL).astype(np.uint8),
        fixed=payload,
    )


def _column_piece(arr: pa.Array, valid: BoolArray) -> _Piece | None:
    n = len(arr)
    t = arr.type
    if pa.types.is_null(t):
        return _Piece(np.ones(n, dtype=np.int64), np.full(n, TAG_NULL, dtype=np.uint8))
    if pa.types.is_boolean(t):
        values = np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
        tags = np.where(valid, np.where(values, TAG_TRUE, TAG_FALSE), TAG_NULL)
        return _Piece(np.ones(n, dtype=np.int64), tags.astype(np.uint8))
    if pa.types.is_integer(t):
        if pa.types.is_uint64(t) and pc.any(
            pc.greater(arr, pa.scalar(_I64_MAX, pa.uint64()))
        ).as_py():
            return None
        ints = np.ascontiguousarray(arr.cast(pa.int64()).fill_null(0).to_numpy(), dtype="<i8")
        return _fixed(valid, TAG_INT, ints.view(np.uint8).reshape(n, 8))
    if pa.types.is_floating(t):
        floats = np.array(arr.cast(pa.float64()).fill_null(0.0).to_numpy(), dtype="<f8")
        floats[floats == 0.0] = 0.0  # -0.0 -> 0.0
        bits = floats.view("<u8")
        bits[np.isnan(floats)] = _CANONICAL_NAN_BITS
        return _fixed(valid, TAG_FLOAT, bits.view(np.uint8).reshape(n, 8))
    if pa.types.is_timestamp(t):
        try:
            micros_ts = arr.cast(pa.timestamp("us", tz=t.tz), safe=True)
        except pa.ArrowInvalid:
            return None
        micros = np.ascontiguousarray(
            micros_ts.cast(pa.int64()).fill_null(0).to_numpy(), dtype="<i8"
        )
        live = micros[valid]
        if len(live) and (live.min() < _MIN_MICROS or live.max() > _MAX_MICROS):
            return None
        return _fixed(valid, TAG_DATETIME, micros.view(np.uint8).reshape(n, 8))
    if pa.types.is_date32(t):
        days = np.ascontiguousarray(arr.cast(pa.int32()).fill_null(0).to_numpy(), dtype="<i4")
        live = days[valid]
        if len(live) and (live.min() < _MIN_DATE_DAYS or live.max() > _MAX_DATE_DAYS):
            return None
        return _fixed(valid, TAG_DATE, days.view(np.uint8).reshape(n, 4))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return _column_piece(arr.cast(pa.string()), valid)
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return _column_piece(arr.cast(pa.binary()), valid)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        if pa.types.is_string(t) and not _valid_utf8(arr):
            return None  # copying the bytes would store a string no reader can decode
        offsets_buf = arr.buffers()[1]
        raw = np.frombuffer(offsets_buf, dtype="<i4", count=arr.offset + n + 1)
        starts = raw[arr.offset :].astype(np.int64)
        lens = np.where(valid, starts[1:] - starts[:-1], 0).astype(np.int64)
        tag = TAG_STR if pa.types.is_string(t) else TAG_BYTES
        return _Piece(
            length=np.where(valid, 5 + lens, 1).astype(np.int64),
            tags=np.where(valid, tag, TAG_NULL).astype(np.uint8),
            var_lens=lens,
        )
    return None


def encodes_in_bulk(columns: Sequence[pa.Array | pa.ChunkedArray]) -> bool:
    """Whether :func:`encode_columns` accepts every row of ``columns`` (of one length)
    value by value, without encoding them: True only where it is certain (the types
    ``landing.schema.ARROW_TYPES`` holds, timestamps and dates within Python's range,
    strings that are UTF-8), so a caller may put off the encoding and know it cannot
    fail. It mirrors :func:`_column_piece`'s refusals; output over 2 GiB is not
    checked (``persist.write.parts.rows_of_values`` splits such output itself)."""
    for column in columns:
        arrays = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        t = column.type
        if pa.types.is_int64(t) or pa.types.is_float64(t) or pa.types.is_boolean(t):
            continue
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_null(t):
            continue
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if all(_valid_utf8(a) for a in arrays):
                continue
            return False
        if pa.types.is_timestamp(t) and t.unit == "us":
            low, high, as_int = _MIN_MICROS, _MAX_MICROS, pa.int64()
        elif pa.types.is_date32(t):
            low, high, as_int = _MIN_DATE_DAYS, _MAX_DATE_DAYS, pa.int32()
        else:
            return False
        bounds = pc.min_max(column.cast(as_int))
        least, most = bounds["min"].as_py(), bounds["max"].as_py()
        if least is not None and (least < low or most > high):
            return False
    return True


def _valid_utf8(arr: pa.Array) -> bool:
    try:
        arr.validate(full=True)  # Arrow does not check strings it did not build itself
    except pa.ArrowInvalid:
        return False
    return True


def key_digest_array(encoded: pa.BinaryArray | pa.LargeBinaryArray) -> pa.FixedSizeBinaryArray:
    """``key_digest`` of every value of a binary Arrow array of encoded keys, as one
    ``binary(16)`` Arrow array (computed in numpy by :mod:`upsert_core.key_hash`, bit
    for bit the digests :func:`key_digests` makes one Python call per key for)."""
    return xxh3_128_digests(encoded)


def key_digests(encoded: pa.BinaryArray) -> list[UpsertKey]:
    """``key_digest`` of every value of a binary Arrow array of encoded keys, as Python
    bytes (one ``xxhash`` call per key; :func:`key_digest_array` for an Arrow array)."""
    n = len(encoded)
    if n == 0:
        return []
    raw = np.frombuffer(encoded.buffers()[1], dtype="<i4", count=encoded.offset + n + 1)
    bounds = raw[encoded.offset :]
    data = encoded.buffers()[2]
    digest = _xxh3_128_digest
    width = int(bounds[1] - bounds[0])
    if width > 0 and int(bounds[-1] - bounds[0]) == width * n and data is not None:
        # Every key encodes to the same width (one fixed-width key column, no nulls):
        # numpy cuts the buffer into bytes objects without a Python slice per key.
        start = int(bounds[0])
        chunk = np.frombuffer(data, dtype=np.uint8, count=width * n, offset=start)
        equal = bool(np.all(np.diff(bounds) == width))
        if equal:
            return list(map(digest, chunk.view(f"V{width}").tolist()))
    offsets = bounds.tolist()
    view = memoryview(data if data is not None else b"")
    return [digest(view[offsets[i] : offsets[i + 1]]) for i in range(n)]
