"""Order keys: one comparable value per row for an order of several columns.

``--order a,b`` (CONTRACT.md, "Change data capture") compares rows on ``a``, then on
``b``, and so on. The upsert engine compares ONE value per row (the in-batch winner, the
global scope's skip rule, tombstones, checkpoints), and for a single integer or
timestamp order column that value is the int64 itself, unchanged. For several columns
each row's tuple is encoded into an *order key*: bytes whose byte order is the tuple's
order (memcomparable, as MySQL's and CockroachDB's index keys are), held in numpy as a
fixed-width bytes array (``dtype`` kind ``S``) and in Arrow as ``binary``.

Encoding (format :data:`ORDER_KEY_FORMAT`), the tuple's components in column order,
then one final ``0x01`` byte:

- int64 and timestamp (microseconds since the epoch) components: 8 bytes, big-endian,
  with the sign bit flipped (so negative numbers sort first);
- string components: the UTF-8 bytes, each ``0x00`` written ``0x00 0xFF``, then the
  terminator ``0x00 0x01`` (so a prefix sorts before its extensions, and a byte
  comparison of UTF-8 is a comparison of code points).

Invariants:

- For tuples of the same column types, ``key(x) < key(y)`` exactly when ``x < y``
  compared column by column (strings as text by code point), and equal keys mean equal
  tuples. Every component is self-delimiting, so two different keys differ at a byte
  before either ends.
- A key never ends in a ``0x00`` byte (the final ``0x01``): numpy's fixed-width bytes
  pad with zeros and drop trailing zeros when they give a value back, so without it a
  key could lose bytes on its way to Arrow and back. With it, numpy's comparison of
  padded keys is the byte comparison of the keys.
- No null is ever encoded: a null in any order column is a null order, an error row
  (``landing.validate``), before anything is encoded; :func:`order_keys` refuses one.
- A single order column is never encoded: its orders stay int64 arrays everywhere, so
  shards with one order column keep every stored byte as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import CodecError, InvalidUpsertState

ORDER_KEY_FORMAT = 1
"""The encoding above; stored beside every order key held outside memory."""

OrderArray = npt.NDArray[Any]
"""One order per row: int64 (one order column) or order keys (several; numpy bytes).
Typed loosely on purpose: which of the two a state holds is checked at run time
(:func:`concat_orders`, the drain), where numpy's promotion could otherwise mix them."""

_SIGN = np.uint64(1 << 63)
# Byte strings, made Arrow scalars where used: an Arrow conversion at import would run
# pyarrow's pandas probe in every process that imports this module (upsertctl inspect).
_TERMINATOR = b"\x00\x01"
_END = b"\x01"


def order_keys(columns: Sequence[pa.Array]) -> npt.NDArray[np.bytes_]:
    """The order keys of rows whose order columns are ``columns`` (aligned, no nulls;
    each int64, timestamp or string), as a numpy bytes array."""
    if not columns:
        raise InvalidUpsertState("an order key needs at least one column")
    n = len(columns[0])
    parts: list[pa.Array | pa.Scalar] = []
    for col in columns:
        if len(col) != n:
            raise InvalidUpsertState("order columns have different lengths")
        if col.null_count:
            raise CodecError("a null order value cannot be encoded in an order key")
        parts.extend(_component(col))
    parts.append(pa.scalar(_END, pa.binary()))
    joined = pc.binary_join_element_wise(*parts, b"")
    return _fixed(joined)


def _component(col: pa.Array) -> list[pa.Array | pa.Scalar]:
    t = col.type
    if pa.types.is_timestamp(t):  # microseconds since the epoch, as one column's orders
        col = pc.cast(col, pa.timestamp("us", t.tz)).cast(pa.int64())
        t = col.type
    if pa.types.is_integer(t):
        values = np.asarray(pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False), np.int64)
        flipped = (values.view(np.uint64) ^ _SIGN).astype(">u8")
        fixed = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(8), len(values), [None, pa.py_buffer(flipped.tobytes())]
        )
        return [fixed.cast(pa.binary())]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        raw = col.cast(pa.binary() if pa.types.is_string(t) else pa.large_binary())
        escaped = pc.replace_substring(raw, b"\x00", b"\x00\xff").cast(pa.binary())
        return [escaped, pa.scalar(_TERMINATOR, pa.binary())]
    raise InvalidUpsertState(f"an order column of type {t} cannot be part of an order key")


def is_order_keys(orders: np.ndarray) -> bool:
    """Whether ``orders`` holds order keys (several columns) rather than int64 orders."""
    return orders.dtype.kind == "S"


def empty_orders(several: bool) -> OrderArray:
    """An empty order array of the kind an order of one (int64) or several columns uses."""
    return np.zeros(0, dtype="S1") if several else np.zeros(0, dtype=np.int64)


def zero_like(orders: np.ndarray) -> np.generic:
    """A filler of ``orders``' own type (never compared: it stands where a key is absent)."""
    return orders.dtype.type()


def to_arrow(orders: np.ndarray) -> pa.Array:
    """``orders`` as Arrow: int64, or order keys as ``binary`` (exact: see the module
    docstring on trailing bytes)."""
    if is_order_keys(orders):
        return _variable(orders)
    return pa.array(np.asarray(orders, np.int64), pa.int64())


def from_arrow(column: pa.Array | pa.ChunkedArray) -> OrderArray:
    """The numpy orders of an Arrow order column: int64, or order keys from ``binary``."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if column.null_count:
        raise InvalidUpsertState("an order column holds nulls")
    t = column.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _fixed(column)
    if t == pa.int64():
        ints: npt.NDArray[np.int64] = np.asarray(
            column.to_numpy(zero_copy_only=False), np.int64)
        return ints
    raise InvalidUpsertState(f"an order column of type {t} is neither int64 nor order keys")


def _fixed(column: pa.Array) -> npt.NDArray[np.bytes_]:
    """Arrow binary values as numpy fixed-width bytes (zero-padded to the longest), with
    whole-buffer operations: no Python object per value."""
    n = len(column)
    if n == 0:
        return np.zeros(0, dtype="S1")
    column = column.cast(pa.large_binary())
    _, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64, n + 1, column.offset * 8)
    lengths = np.diff(offsets)
    width = max(1, int(lengths.max()))
    data = np.frombuffer(data_buf, np.uint8, int(offsets[-1] - offsets[0]), int(offsets[0])) \
        if data_buf is not None else np.zeros(0, np.uint8)
    matrix = np.zeros((n, width), np.uint8)
    matrix[np.arange(width) < lengths[:, None]] = data
    out: npt.NDArray[np.bytes_] = matrix.view(f"S{width}").ravel()
    return out


def _variable(keys: npt.NDArray[np.bytes_]) -> pa.Array:
    """Order keys (numpy fixed-width bytes) as Arrow ``binary``, each without the
    padding (a key never ends in a zero byte), with whole-buffer operations."""
    n = len(keys)
    if n == 0:
        return pa.array([], pa.binary())
    width = keys.dtype.itemsize
    matrix = np.ascontiguousarray(keys).view(np.uint8).reshape(n, width)
    nonzero = matrix != 0
    lengths = width - np.argmax(nonzero[:, ::-1], axis=1)
    lengths[~nonzero.any(axis=1)] = 0
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = matrix[np.arange(width) < lengths[:, None]]
    array = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data.tobytes())])
    return array.cast(pa.binary())


def concat_orders(parts: Sequence[np.ndarray]) -> OrderArray:
    """``parts`` concatenated, all of one kind. Empty parts of the other kind are
    dropped (an empty state made before the kind was known); anything else mixed raises
    :class:`InvalidUpsertState`, since numpy would silently turn integers into text."""
    kinds = {p.dtype.kind for p in parts if len(p)}
    if len(kinds) > 1:
        raise InvalidUpsertState("int64 orders and order keys cannot be mixed in one state")
    if not kinds:
        kept = [p for p in parts if p.dtype.kind == parts[-1].dtype.kind]
    else:
        kind = kinds.pop()
        kept = [p for p in parts if p.dtype.kind == kind]
    out: OrderArray = np.concatenate(kept)
    return out


INTEGER, STRING = "integer", "string"
"""The kinds of an order key's components :func:`decode` reads: an int64 (integers, and
timestamps as microseconds since the epoch) or a string."""


def decode(key: bytes, kinds: Sequence[str]) -> tuple[int | str, ...]:
    """The tuple an order key encodes, its components of ``kinds`` (:data:`INTEGER` or
    :data:`STRING`, in column order): the inverse of :func:`order_keys` for one key.

    Raises :class:`CodecError` for bytes that are not such a key (too short, a string
    without its terminator, an escape that is not ``0x00 0xFF``, bytes left over, or no
    final ``0x01``): a stored order is never guessed."""
    out: list[int | str] = []
    at = 0
    for kind in kinds:
        if kind == INTEGER:
            if at + 8 > len(key):
                raise CodecError(f"order key {describe(key)} ends inside an integer")
            unsigned = int.from_bytes(key[at:at + 8], "big") ^ (1 << 63)
            out.append(unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned)
            at += 8
        elif kind == STRING:
            text = bytearray()
            while True:
                zero = key.find(b"\x00", at)
                if zero < 0 or zero + 1 >= len(key):
                    raise CodecError(f"order key {describe(key)}: a string has no terminator")
                text += key[at:zero]
                mark = key[zero + 1]
                at = zero + 2
                if mark == 0x01:
                    break
                if mark != 0xFF:
                    raise CodecError(f"order key {describe(key)}: bad escape in a string")
                text += b"\x00"
            try:
                out.append(text.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise CodecError(f"order key {describe(key)}: a string is not UTF-8") from exc
        else:
            raise CodecError(f"an order key has no component of kind {kind!r}")
    if key[at:] != _END:
        raise CodecError(f"order key {describe(key)} does not end after its {len(kinds)} columns")
    return tuple(out)


def describe(order: object) -> str:
    """An order for a message: an int64 as is, an order key in hex."""
    if isinstance(order, bytes | np.bytes_):
        return "0x" + bytes(order).hex()
    return str(order)
