"""``StateValue``: what the upsert state holds for one key.

A state value is in exactly one of three shapes:

- **consolidating**: the snapshot accumulator. It sums the updates ``(value, diff)`` seen
  for the key without keeping them: ``diff_sum = SUM(diff)``, ``len_sum =
  SUM(len(value) * diff)``, ``checksum_sum = SUM(value_checksum(value) * diff)``, all
  *wrapping* 64-bit, and ``value_xor`` = XOR of the values whose diff is odd (even diffs
  cancel), zero-padded to the longest such value (``xor_len``). A well-formed history is
  the current value at +1 (or nothing) plus pairs ``(old, +1), (old, -1)`` in any order
  and cut into any chunks, so the pairs cancel and the accumulator ends in one of two
  states: all zero (the key is absent) or ``diff_sum == 1`` with ``value_xor``, ``len_sum``
  and ``checksum_sum`` describing the current value.
- **finalized**: a value (encoded row bytes) or a tombstone, with an order key (``None``
  after decoding a snapshot; ``None`` sorts below every order key).
- **provisional**: a finalized part (value or absent, with its order) plus a provisional
  value or tombstone written by a partial (AtTime) drain at timestamp ``ts`` with its own
  order. Feedback from the output shard later replaces it.

Invariants:

- ``ensure_decoded`` turns an accumulator into a finalized value only when ``diff_sum ==
  1``, ``0 <= len_sum <= xor_len``, ``value_xor`` has no bits beyond ``len_sum`` bytes and
  the checksum of those bytes equals ``checksum_sum``; into a finalized tombstone only
  when every sum and ``value_xor`` are zero. Anything else raises
  :class:`~upsert_core.errors.InvalidUpsertState` carrying the accumulator and leaves it
  unchanged: garbage is never decoded.
- ``merge_update`` reports "deletable" only when the accumulator is entirely zero
  (stricter than the reference, which ignores ``len_sum``), so a corrupt accumulator is
  never silently dropped.
- Finalized and provisional values are never mutated after construction (the ``into_*``
  methods return new objects). Accumulators are mutated by ``merge_update`` and
  ``ensure_decoded``; callers that got one from a backend copy it first
  (``to_consolidating``) so a failed consolidation leaves the backend untouched.
- ``memory_size()`` equals ``len(encode())`` exactly, so the in-memory and the on-disk
  backend report the same sizes for the same state.
- ``encode``/``decode`` are versioned (first byte ``STATE_FORMAT_VERSION``) and strict:
  ``decode`` raises :class:`~upsert_core.errors.CodecError` on anything ``encode`` cannot
  produce.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeAlias, overload

from upsert_core.codec import value_checksum
from upsert_core.errors import CodecError, InvalidUpsertState

OrderKey: TypeAlias = tuple[int, int]
"""(order value, position): the greater order key wins within one timestamp."""

STATE_FORMAT_VERSION = 1

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63

_CONSOLIDATING = 0
_FINALIZED = 1
_PROVISIONAL = 2

# Encoded layout (little-endian): version u8, kind u8, flags u8, then per kind:
#   consolidating: diff_sum u64, len_sum u64, checksum_sum u64, xor_len u32, value_xor
#   finalized:     [order i64 i64 if F_ORDER] [u32 len, value if F_VALUE]
#   provisional:   finalized part, ts i64, [order if P_ORDER] [u32 len, value if P_VALUE]
_F_VALUE = 1
_F_ORDER = 2
_P_VALUE = 4
_P_ORDER = 8

_HEADER = struct.Struct("<BBB")
_SUMS = struct.Struct("<QQQI")
_ORDER = struct.Struct("<qq")
_TS = struct.Struct("<q")
_LEN = struct.Struct("<I")

_HEADER_SIZE = 3
_ACC_FIXED_SIZE = _HEADER_SIZE + _SUMS.size  # 31
_ORDER_SIZE = 16
_TS_SIZE = 8
_LEN_SIZE = 4


def order_ge(a: OrderKey | None, b: OrderKey) -> bool:
    """Whether stored order ``a`` is at or above ``b`` (``None`` is below everything)."""
    return a is not None and a >= b


def _signed(v: int) -> int:
    return v - (1 << 64) if v & _SIGN64 else v


class _FinalizedValue:
    """``StateValue.finalized_value``: a constructor on the class, the bytes on an instance.

    ``StateValue.finalized_value(b"row", None)`` builds a finalized value;
    ``sv.finalized_value`` is that value's bytes (``None`` for a tombstone or when only a
    provisional part exists) and raises ``InvalidUpsertState`` on an accumulator.
    """

    @overload
    def __get__(
        self, obj: None, owner: type[StateValue]
    ) -> Callable[[bytes, OrderKey | None], StateValue]: ...

    @overload
    def __get__(self, obj: StateValue, owner: type[StateValue]) -> bytes | None: ...

    def __get__(
        self, obj: StateValue | None, owner: type[StateValue]
    ) -> Callable[[bytes, OrderKey | None], StateValue] | bytes | None:
        if obj is None:
            return owner.new_finalized_value
        obj._require_decoded("finalized_value")
        return obj._value


class StateValue:
    """The state of one key; see the module docstring for the three shapes."""

    __slots__ = (
        "_kind",
        "_value",
        "_order",
        "_pts",
        "_pvalue",
        "_porder",
        "_xor",
        "_xlen",
        "_lsum",
        "_csum",
        "_dsum",
    )

    _kind: int
    _value: bytes | None
    _order: OrderKey | None
    _pts: int
    _pvalue: bytes | None
    _porder: OrderKey | None
    _xor: int
    _xlen: int
    _lsum: int
    _csum: int
    _dsum: int

    def __init__(self) -> None:
        # Same as ``StateValue.consolidating()``: the empty accumulator.
        self._kind = _CONSOLIDATING
        self._xor = 0
        self._xlen = 0
        self._lsum = 0
        self._csum = 0
        self._dsum = 0

    # --- constructors -------------------------------------------------------------

    @classmethod
    def consolidating(cls) -> StateValue:
        """The empty accumulator (also what an absent key starts as)."""
        return cls()

    @classmethod
    def new_finalized_value(cls, value: bytes, order: OrderKey | None) -> StateValue:
        """A finalized value; ``StateValue.finalized_value(value, order)`` is the same."""
        sv = object.__new__(cls)
        sv._kind = _FINALIZED
        sv._value = value
        sv._order = order
        return sv

    @classmethod
    def finalized_tombstone(cls, order: OrderKey | None) -> StateValue:
        sv = object.__new__(cls)
        sv._kind = _FINALIZED
        sv._value = None
        sv._order = order
        return sv

    @classmethod
    def new_provisional_value(cls, value: bytes, ts: int, order: OrderKey) -> StateValue:
        return cls._provisional(None, None, value, ts, order)

    @classmethod
    def new_provisional_tombstone(cls, ts: int, order: OrderKey) -> StateValue:
        return cls._provisional(None, None, None, ts, order)

    @classmethod
    def _provisional(
        cls,
        value: bytes | None,
        order: OrderKey | None,
        pvalue: bytes | None,
        ts: int,
        porder: OrderKey | None,
    ) -> StateValue:
        sv = object.__new__(cls)
        sv._kind = _PROVISIONAL
        sv._value = value
        sv._order = order
        sv._pvalue = pvalue
        sv._pts = ts
        sv._porder = porder
        return sv

    def into_provisional_value(self, value: bytes, ts: int, order: OrderKey) -> StateValue:
        """A new state keeping this finalized part, with provisional ``value`` at ``ts``."""
        self._require_decoded("into_provisional_value")
        return StateValue._provisional(self._value, self._order, value, ts, order)

    def into_provisional_tombstone(self, ts: int, order: OrderKey) -> StateValue:
        """A new state keeping this finalized part, with a provisional delete at ``ts``."""
        self._require_decoded("into_provisional_tombstone")
        return StateValue._provisional(self._value, self._order, None, ts, order)

    def to_consolidating(self) -> StateValue:
        """A *new* accumulator equal to this state's finalized part (or a copy of it).

        The provisional part is dropped: the feedback being consolidated supersedes it.
        """
        acc = StateValue()
        if self._kind == _CONSOLIDATING:
            acc._xor = self._xor
            acc._xlen = self._xlen
            acc._lsum = self._lsum
            acc._csum = self._csum
            acc._dsum = self._dsum
        elif self._value is not None:
            acc.merge_update(self._value, 1)
        return acc

    # --- the accumulator as plain sums (bulk consolidation) --------------------------

    def accumulator_sums(self) -> tuple[int, int, int, int, int]:
        """``(diff_sum, len_sum, checksum_sum, xor_len, value_xor)`` of ``to_consolidating()``.

        The sums are unsigned 64-bit (as stored). Nothing is allocated, which is why
        bulk consolidation (:mod:`tests.oracle.state.chunk`) starts from these.
        """
        kind = self._kind
        if kind == _CONSOLIDATING:
            return (self._dsum, self._lsum, self._csum, self._xlen, self._xor)
        v = self._value
        if v is None:
            return (0, 0, 0, 0, 0)
        n = len(v)
        return (1, n, value_checksum(v), n, int.from_bytes(v, "little"))

    @classmethod
    def from_accumulator_sums(
        cls, diff_sum: int, len_sum: int, checksum_sum: int, xor_len: int, value_xor: int
    ) -> StateValue:
        """An accumulator with exactly these fields (the inverse of ``accumulator_sums``).

        Unchecked: the caller passes sums already reduced to unsigned 64 bits.
        """
        sv = object.__new__(cls)
        sv._kind = _CONSOLIDATING
        sv._dsum = diff_sum
        sv._lsum = len_sum
        sv._csum = checksum_sum
        sv._xlen = xor_len
        sv._xor = value_xor
        return sv

    # --- queries ------------------------------------------------------------------

    @property
    def is_consolidating(self) -> bool:
        return self._kind == _CONSOLIDATING

    @property
    def is_provisional(self) -> bool:
        return self._kind == _PROVISIONAL

    @property
    def is_tombstone(self) -> bool:
        """A finalized tombstone without a provisional part."""
        return self._kind == _FINALIZED and self._value is None

    # Both the constructor (on the class) and the finalized bytes (on an instance).
    finalized_value = _FinalizedValue()

    @property
    def finalized_order(self) -> OrderKey | None:
        self._require_decoded("finalized_order")
        return self._order

    def provisional_value_ref(self, ts: int) -> bytes | None:
        """The value an update at ``ts`` sees (provisional part if it is at ``ts``)."""
        kind = self._kind
        if kind == _FINALIZED:
            return self._value
        if kind == _PROVISIONAL:
            return self._pvalue if self._pts == ts else self._value
        raise self._not_decoded("provisional_value_ref")

    def provisional_order(self, ts: int) -> OrderKey | None:
        """The order an update at ``ts`` must beat (provisional part if it is at ``ts``)."""
        kind = self._kind
        if kind == _FINALIZED:
            return self._order
        if kind == _PROVISIONAL:
            return self._porder if self._pts == ts else self._order
        raise self._not_decoded("provisional_order")

    def view_at(self, ts: int) -> tuple[bytes | None, OrderKey | None]:
        """``(provisional_value_ref(ts), provisional_order(ts))`` in one call, decoding an
        accumulator in place first (``ensure_decoded``); the drain's per-key step."""
        kind = self._kind
        if kind == _FINALIZED:
            return self._value, self._order
        if kind == _CONSOLIDATING:
            self.ensure_decoded()
            return self._value, self._order
        if self._pts == ts:
            return self._pvalue, self._porder
        return self._value, self._order

    @property
    def provisional_ts(self) -> int | None:
        return self._pts if self._kind == _PROVISIONAL else None

    def _require_decoded(self, what: str) -> None:
        if self._kind == _CONSOLIDATING:
            raise self._not_decoded(what)

    def _not_decoded(self, what: str) -> InvalidUpsertState:
        return InvalidUpsertState(
            f"{what} called on a consolidating accumulator; call ensure_decoded first ({self!r})",
            state=self,
        )

    # --- the accumulator ----------------------------------------------------------

    def merge_update(self, value: bytes, diff: int) -> bool:
        """Add ``(value, diff)`` to the accumulator; True when it is back to all zero.

        A finalized or provisional state first turns (in place) into the accumulator of
        its finalized part, so feedback can be consolidated on top of decoded state.
        """
        if self._kind != _CONSOLIDATING:
            fin = self._value
            StateValue.__init__(self)
            if fin is not None:
                self.merge_update(fin, 1)
        n = len(value)
        self._dsum = (self._dsum + diff) & _MASK64
        self._lsum = (self._lsum + n * diff) & _MASK64
        self._csum = (self._csum + value_checksum(value) * diff) & _MASK64
        if diff & 1:
            # Odd diffs flip the value into the XOR; even ones cancel out.
            self._xor ^= int.from_bytes(value, "little")
            if n > self._xlen:
                self._xlen = n
        return self._dsum == 0 and self._csum == 0 and self._lsum == 0 and self._xor == 0

    def ensure_decoded(self) -> None:
        """Turn a valid end-state accumulator into a finalized value or tombstone.

        No-op on finalized/provisional states. Raises ``InvalidUpsertState`` (and leaves
        the accumulator as it was) for any other accumulator.
        """
        if self._kind != _CONSOLIDATING:
            return
        dsum = self._dsum
        if dsum == 1:
            length = self._lsum
            if length & _SIGN64:
                raise self._invalid("negative len_sum with diff_sum 1")
            if length > self._xlen:
                raise self._invalid(
                    f"len_sum ({length}) is longer than the accumulated value ({self._xlen})"
                )
            if self._xor.bit_length() > 8 * length:
                raise self._invalid(f"value_xor has non-zero bytes beyond len_sum ({length})")
            value = self._xor.to_bytes(length, "little")
            if value_checksum(value) != self._csum:
                raise self._invalid("checksum_sum does not match the accumulated value")
            self._become_finalized(value)
        elif dsum == 0:
            if self._lsum != 0:
                raise self._invalid("len_sum is non-zero with diff_sum 0")
            if self._csum != 0:
                raise self._invalid("checksum_sum is non-zero with diff_sum 0")
            if self._xor != 0:
                raise self._invalid("value_xor is not all zero with diff_sum 0")
            self._become_finalized(None)
        else:
            raise self._invalid(f"diff_sum is {_signed(dsum)}, neither 0 nor 1")

    def _become_finalized(self, value: bytes | None) -> None:
        for name in ("_xor", "_xlen", "_lsum", "_csum", "_dsum"):
            delattr(self, name)
        self._kind = _FINALIZED
        self._value = value
        self._order = None

    def _invalid(self, why: str) -> InvalidUpsertState:
        return InvalidUpsertState(f"invalid upsert state: {why}; {self!r}", state=self)

    @property
    def diff_sum(self) -> int:
        """The accumulator's diff sum as a signed 64-bit int (0 for decoded states)."""
        return _signed(self._dsum) if self._kind == _CONSOLIDATING else 0

    # --- size and encoding --------------------------------------------------------

    def memory_size(self) -> int:
        """The size this value is accounted at: exactly ``len(self.encode())``."""
        kind = self._kind
        if kind == _FINALIZED:
            v = self._value
            return (
                _HEADER_SIZE
                + (0 if self._order is None else _ORDER_SIZE)
                + (0 if v is None else _LEN_SIZE + len(v))
            )
        if kind == _CONSOLIDATING:
            return _ACC_FIXED_SIZE + self._xlen
        v = self._value
        pv = self._pvalue
        return (
            _HEADER_SIZE
            + _TS_SIZE
            + (0 if self._order is None else _ORDER_SIZE)
            + (0 if v is None else _LEN_SIZE + len(v))
            + (0 if self._porder is None else _ORDER_SIZE)
            + (0 if pv is None else _LEN_SIZE + len(pv))
        )

    def size_tag(self) -> int:
        """``memory_size() * 2 + is_tombstone`` in one call (for backends' bulk paths)."""
        if self._kind == _FINALIZED:
            # Inlined memory_size() for the common shape (one call less per put).
            v = self._value
            base = _HEADER_SIZE + (0 if self._order is None else _ORDER_SIZE)
            return base * 2 + 1 if v is None else (base + _LEN_SIZE + len(v)) * 2
        return self.memory_size() * 2

    def encode(self) -> bytes:
        """Versioned bytes for the on-disk backend and checkpoints."""
        try:
            return self._encode()
        except struct.error as e:
            raise CodecError(f"state value does not fit the state format: {e}") from None

    def _encode(self) -> bytes:
        kind = self._kind
        if kind == _CONSOLIDATING:
            return (
                _HEADER.pack(STATE_FORMAT_VERSION, kind, 0)
                + _SUMS.pack(self._dsum, self._lsum, self._csum, self._xlen)
                + self._xor.to_bytes(self._xlen, "little")
            )
        flags = 0
        parts: list[bytes] = []
        if self._order is not None:
            flags |= _F_ORDER
            parts.append(_ORDER.pack(*self._order))
        if self._value is not None:
            flags |= _F_VALUE
            parts.append(_LEN.pack(len(self._value)))
            parts.append(self._value)
        if kind == _PROVISIONAL:
            parts.append(_TS.pack(self._pts))
            if self._porder is not None:
                flags |= _P_ORDER
                parts.append(_ORDER.pack(*self._porder))
            if self._pvalue is not None:
                flags |= _P_VALUE
                parts.append(_LEN.pack(len(self._pvalue)))
                parts.append(self._pvalue)
        return _HEADER.pack(STATE_FORMAT_VERSION, kind, flags) + b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> StateValue:
        """Inverse of ``encode``; raises CodecError on anything else."""
        n = len(data)
        if n >= _HEADER_SIZE and data[0] == STATE_FORMAT_VERSION and data[1] == _FINALIZED:
            # Fast path for the common shape: a finalized value, with or without order.
            flags = data[2]
            if flags == _F_VALUE and n >= 7 and _LEN.unpack_from(data, 3)[0] == n - 7:
                return cls.new_finalized_value(bytes(data[7:]), None)
            if flags == _F_VALUE | _F_ORDER and n >= 23 and _LEN.unpack_from(data, 19)[0] == n - 23:
                a, b = _ORDER.unpack_from(data, 3)
                return cls.new_finalized_value(bytes(data[23:]), (a, b))
        try:
            return _Reader(bytes(data)).state_value()
        except struct.error as e:
            raise CodecError(f"truncated state value: {e}") from None

    # --- comparisons and display --------------------------------------------------

    def _fields(self) -> tuple[object, ...]:
        kind = self._kind
        if kind == _CONSOLIDATING:
            return (kind, self._dsum, self._lsum, self._csum, self._xlen, self._xor)
        if kind == _FINALIZED:
            return (kind, self._value, self._order)
        return (kind, self._value, self._order, self._pts, self._pvalue, self._porder)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StateValue):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind = self._kind
        if kind == _CONSOLIDATING:
            return (
                f"StateValue.consolidating(diff_sum={_signed(self._dsum)}, "
                f"len_sum={_signed(self._lsum)}, checksum_sum={_signed(self._csum)}, "
                f"xor_len={self._xlen}, value_xor_nonzero={self._xor != 0})"
            )
        if kind == _FINALIZED:
            if self._value is None:
                return f"StateValue.finalized_tombstone(order={self._order!r})"
            return f"StateValue.finalized_value({self._value!r}, order={self._order!r})"
        return (
            f"StateValue.provisional(finalized={self._value!r}, order={self._order!r}, "
            f"ts={self._pts}, value={self._pvalue!r}, provisional_order={self._porder!r})"
        )


class _Reader:
    """A strict cursor over an encoded state value."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise CodecError(
                f"truncated state value: need {n} bytes at offset {self.pos}, "
                f"have {len(self.data) - self.pos}"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        return st.unpack(self.take(st.size))

    def order(self) -> OrderKey:
        a, b = self.unpack(_ORDER)
        return (a, b)

    def blob(self) -> bytes:
        (n,) = self.unpack(_LEN)
        return self.take(n)

    def state_value(self) -> StateValue:
        version, kind, flags = self.unpack(_HEADER)
        if version != STATE_FORMAT_VERSION:
            raise CodecError(
                f"unsupported state format version {version} (expected {STATE_FORMAT_VERSION})"
            )
        if kind == _CONSOLIDATING:
            if flags != 0:
                raise CodecError(f"unexpected flags {flags:#x} on an accumulator")
            dsum, lsum, csum, xlen = self.unpack(_SUMS)
            sv = StateValue()
            sv._dsum, sv._lsum, sv._csum, sv._xlen = dsum, lsum, csum, xlen
            sv._xor = int.from_bytes(self.take(xlen), "little")
        elif kind in (_FINALIZED, _PROVISIONAL):
            allowed = _F_VALUE | _F_ORDER | (_P_VALUE | _P_ORDER if kind == _PROVISIONAL else 0)
            if flags & ~allowed:
                raise CodecError(f"unexpected flags {flags:#x} for state kind {kind}")
            order = self.order() if flags & _F_ORDER else None
            value = self.blob() if flags & _F_VALUE else None
            if kind == _FINALIZED:
                sv = (
                    StateValue.new_finalized_value(value, order)
                    if value is not None
                    else StateValue.finalized_tombstone(order)
                )
            else:
                (ts,) = self.unpack(_TS)
                porder = self.order() if flags & _P_ORDER else None
                pvalue = self.blob() if flags & _P_VALUE else None
                sv = StateValue._provisional(value, order, pvalue, ts, porder)
        else:
            raise CodecError(f"unknown state kind {kind}")
        if self.pos != len(self.data):
            raise CodecError(f"{len(self.data) - self.pos} trailing bytes after a state value")
        return sv
