"""The per-key state values of format-1 checkpoints, decoded (read-only).

Before the columnar format, a checkpoint stored each key's state value as the bytes
``StateValue.encode()`` of the per-key engine wrote (that engine now lives on as the
tests' oracle, ``tests/oracle/state/value.py``). A checkpoint only ever held
*finalized* values: a row or a tombstone, with an order in the global scope.

Layout (little-endian): version ``u8`` (1), kind ``u8``, flags ``u8``; for a finalized
value (kind 1), ``[order i64, position i64]`` when flag 2 is set, then ``[length u32,
row bytes]`` when flag 1 is set. Kind 0 (an accumulator) and kind 2 (a provisional
value) never belong in a checkpoint.

Invariants: :func:`decode_finalized` accepts exactly the bytes the per-key engine
wrote for a finalized value and nothing else (another version, kind or flag, a
length that disagrees, trailing bytes): :class:`CodecError` names what is wrong, and
nothing is guessed.
"""

from __future__ import annotations

import struct

from upsert_core.errors import CodecError

FORMAT_VERSION = 1
_FINALIZED = 1
_KINDS = {0: "an accumulator", 1: "a finalized value", 2: "a provisional value"}
_F_VALUE = 1
_F_ORDER = 2
_ORDER = struct.Struct("<qq")
_LEN = struct.Struct("<I")


def decode_finalized(data: bytes) -> tuple[bytes | None, int | None]:
    """``(row, order)`` of an encoded finalized state value: ``row`` None for a
    tombstone, ``order`` None when none was kept (the batch scope)."""
    if len(data) < 3:
        raise CodecError(f"a state value of {len(data)} bytes is shorter than its header")
    version, kind, flags = data[0], data[1], data[2]
    if version != FORMAT_VERSION:
        raise CodecError(f"unsupported state format version {version} (expected 1)")
    if kind != _FINALIZED:
        what = _KINDS.get(kind, f"unknown kind {kind}")
        raise CodecError(f"the state value is {what}, not a finalized value")
    if flags & ~(_F_VALUE | _F_ORDER):
        raise CodecError(f"unexpected flags {flags:#x} on a finalized state value")
    at = 3
    order: int | None = None
    if flags & _F_ORDER:
        if len(data) < at + _ORDER.size:
            raise CodecError("a state value is truncated in its order")
        order = _ORDER.unpack_from(data, at)[0]
        at += _ORDER.size
    row: bytes | None = None
    if flags & _F_VALUE:
        if len(data) < at + _LEN.size:
            raise CodecError("a state value is truncated in its row length")
        (length,) = _LEN.unpack_from(data, at)
        at += _LEN.size
        if len(data) < at + length:
            raise CodecError(f"a state value's row of {length} bytes is truncated")
        row = bytes(data[at:at + length])
        at += length
    if at != len(data):
        raise CodecError(f"{len(data) - at} trailing bytes after a state value")
    return row, order
