"""XXH3-128 (seed 0, default secret) of every value of an Arrow binary array, in numpy.

The upsert key is ``xxhash.xxh3_128_digest`` of the encoded key (``codec.key_digest``).
Calling it once per key costs a Python call and a bytes object per key.
:func:`xxh3_128_columns` computes the same 128-bit hashes of a whole Arrow array with
numpy. Keys are grouped by the code path XXH3 takes for their length: each length up to
16 bytes, 17-128 bytes by their number of mixing rounds (1-4), 129-240 bytes by their
rounds past the first four (0-3). A group is hashed a chunk of keys at a time: the bytes
its path reads (a key's first and last ``16 * rounds`` bytes, say) are copied for the
chunk with one numpy gather per block, or read in place when the keys have one width and
lie end to end (a fixed-width key column's do), and the 64x64->128-bit products are
emulated on 32-bit halves in uint64 arithmetic, which wraps mod 2**64 as XXH3's does.
Keys longer than 240 bytes (XXH3's striped loop) take the per-key call.

Implemented from the XXH3 specification (Cyan4973/xxHash ``doc/xxhash_spec.md``) and
``xxhash.h`` (``XXH3_len_*_128b``, ``XXH128_mix32B``), read for semantics.

Invariants:

- Bit for bit the reference: ``hi[i]``, ``lo[i]`` are ``high64`` and ``low64`` of
  XXH3-128 of value ``i``'s bytes, so the big-endian bytes of ``hi[i]`` then ``lo[i]``
  are ``xxhash.xxh3_128_digest(value)`` (the canonical form; ``columnar.split_keys``
  reads stored keys into the same halves). ``tests/core/test_key_hash.py`` proves it
  against ``xxhash`` for every length class and boundary, slices, chunked and large
  binary arrays.
- Validity is ignored, as in ``codec.key_digests``: a null value is hashed as the bytes
  its offsets span (none, for the nulls Arrow builds). The codec never makes a null
  encoded key.
- Every constant is an ``np.uint64`` and every operand a uint64 array: no Python int
  meets a uint64 array (numpy 1 would turn the pair into float64).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import xxhash

U64: TypeAlias = npt.NDArray[np.uint64]
I64: TypeAlias = npt.NDArray[np.int64]

CHUNK_KEYS = 1 << 15
"""Keys hashed per numpy pass: the temporaries (a few dozen uint64 arrays) stay in cache."""

MIDSIZE_MAX = 240
"""The longest key hashed here; longer keys (XXH3's striped loop) take ``xxhash``."""

_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
"""XXH3's default secret (``XXH3_kSecret``, 192 bytes)."""

_SECRET_SIZE_MIN = 136
_MIDSIZE_STARTOFFSET = 3
_MIDSIZE_LASTOFFSET = 17


def _s64(offset: int) -> np.uint64:
    """The little-endian 64-bit word of the secret at ``offset``."""
    return np.uint64(int.from_bytes(_SECRET[offset : offset + 8], "little"))


def _s32(offset: int) -> int:
    return int.from_bytes(_SECRET[offset : offset + 4], "little")


_P64_1 = np.uint64(0x9E3779B185EBCA87)
_P64_2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P64_3 = np.uint64(0x165667B19E3779F9)
_P64_4 = np.uint64(0x85EBCA77C2B2AE63)
_MX1 = np.uint64(0x165667919E3779F9)
_MX2 = np.uint64(0x9FB21C651E98DF25)
_M32 = np.uint64(0xFFFFFFFF)
_ZERO = np.uint64(0)
_SH = {k: np.uint64(k) for k in (1, 2, 3, 8, 13, 16, 19, 24, 28, 29, 32, 33, 35, 37, 54)}


# --- 64-bit building blocks (uint64 arrays, wrapping) ------------------------------------


def _mul128(a: U64, b: U64 | np.uint64) -> tuple[U64, U64]:
    """The full 128-bit product of ``a`` and ``b`` as (high64, low64), from 32-bit halves
    (in place where a temporary is done with: the arrays are chunks, kept in cache)."""
    a_lo, a_hi = a & _M32, a >> _SH[32]
    b_lo, b_hi = b & _M32, b >> _SH[32]
    ll = a_lo * b_lo
    hl = a_hi * b_lo
    lh = np.multiply(a_lo, b_hi, out=a_lo)
    hh = np.multiply(a_hi, b_hi, out=a_hi)
    cross = ll >> _SH[32]
    cross += hl & _M32
    cross += lh  # < 3 * 2**32 + (2**32 - 1)**2 < 2**64: no carry lost
    high = np.right_shift(hl, _SH[32], out=hl)
    high += cross >> _SH[32]
    high += hh
    low = np.bitwise_and(ll, _M32, out=ll)
    low |= np.left_shift(cross, _SH[32], out=cross)
    return high, low


def _fold(a: U64, b: U64) -> U64:
    """``XXH3_mul128_fold64``: the low and high halves of ``a * b`` xor-ed."""
    high, low = _mul128(a, b)
    return high ^ low


def _xorshift(v: U64, shift: int) -> U64:
    return v ^ (v >> _SH[shift])


def _avalanche(h: U64) -> U64:
    """``XXH3_avalanche``."""
    return _xorshift(_xorshift(h, 37) * _MX1, 32)


def _avalanche64(h: U64) -> U64:
    """``XXH64_avalanche``."""
    h = _xorshift(h, 33) * _P64_2
    h = _xorshift(h, 29) * _P64_3
    return _xorshift(h, 32)


# --- reading the keys' bytes --------------------------------------------------------------


_WORD: dict[int, np.dtype[np.unsignedinteger]] = {
    8: np.dtype("<u8"), 4: np.dtype("<u4"), 1: np.dtype(np.uint8)}
"""The little-endian words a key is read in (8, 4 and 1 bytes)."""


class _Block:
    """The same ``width`` bytes of each of ``count`` keys (their first bytes, or their
    last), row ``i`` at ``base + i * stride`` in ``buf``: a gathered copy, or the key
    data itself when the keys lie end to end. Words are strided views, no copy."""

    def __init__(self, buf: npt.NDArray[np.uint8], base: int, stride: int, count: int,
                 width: int) -> None:
        self.buf, self.base, self.stride, self.count, self.width = buf, base, stride, count, width

    @classmethod
    def gathered(cls, data: npt.NDArray[np.uint8], starts: I64, width: int) -> _Block:
        """The ``width`` bytes at each of ``starts``, copied row after row (one gather of
        ``width``-byte items: numpy's cost is per item, not per byte)."""
        count = len(data) - width + 1
        rows = np.ndarray((count,), dtype=f"V{width}", buffer=data, strides=(1,))
        copied = rows[starts].view(np.uint8)
        return cls(copied, 0, width, len(starts), width)

    def word(self, offset: int, size: int) -> U64:
        """The little-endian word of ``size`` bytes (8, 4 or 1) at ``offset`` in each row."""
        assert 0 <= offset <= self.width - size
        view: npt.NDArray[np.unsignedinteger] = np.ndarray(
            (self.count,), dtype=_WORD[size], buffer=self.buf,
            offset=self.base + offset, strides=(self.stride,))
        return view.astype(np.uint64)


class _Keys:
    """A chunk of keys of one group: ``head`` holds their first bytes and ``tail`` their
    last (the same block when the group's keys have one length and it holds them whole);
    ``lens`` is their length, one int when they all have it."""

    def __init__(self, head: _Block | None, tail: _Block | None, lens: I64 | int,
                 count: int) -> None:
        self.head, self.tail, self.lens, self.count = head, tail, lens, count

    def at(self, offset: int, size: int = 8) -> U64:
        """The word of ``size`` bytes at ``offset`` from each key's start."""
        assert self.head is not None
        return self.head.word(offset, size)

    def back(self, offset: int, size: int = 8) -> U64:
        """The word of ``size`` bytes starting ``offset`` bytes before each key's end."""
        assert self.tail is not None
        return self.tail.word(self.tail.width - offset, size)

    def length(self) -> U64:
        if isinstance(self.lens, int):
            return np.full(self.count, self.lens, dtype=np.uint64)
        return self.lens.astype(np.uint64)


# --- the length classes (XXH3_len_*_128b with the default secret, seed 0) -----------------
#
# Each returns (high64, low64) of the keys of a _Keys.


def _len_0(keys: _Keys) -> tuple[U64, U64]:
    low = _avalanche64(np.full(keys.count, _s64(64) ^ _s64(72), dtype=np.uint64))
    high = _avalanche64(np.full(keys.count, _s64(80) ^ _s64(88), dtype=np.uint64))
    return high, low


_FLIP_1TO3_LO = np.uint64(_s32(0) ^ _s32(4))
_FLIP_1TO3_HI = np.uint64(_s32(8) ^ _s32(12))
_BYTE = np.uint64(0xFF)


def _len_1to3(length: int) -> Callable[[_Keys], tuple[U64, U64]]:
    def hashed(keys: _Keys) -> tuple[U64, U64]:
        c1, c2, c3 = keys.at(0, 1), keys.at(length >> 1, 1), keys.at(length - 1, 1)
        combined_l = (c1 << _SH[16]) | (c2 << _SH[24]) | c3 | np.uint64(length << 8)
        # XXH_rotl32(XXH_swap32(combinedl), 13), in 32 bits
        swapped = (
            ((combined_l & _BYTE) << _SH[24])
            | (((combined_l >> _SH[8]) & _BYTE) << _SH[16])
            | (((combined_l >> _SH[16]) & _BYTE) << _SH[8])
            | (combined_l >> _SH[24])
        )
        combined_h = ((swapped << _SH[13]) | (swapped >> _SH[19])) & _M32
        return (_avalanche64(combined_h ^ _FLIP_1TO3_HI),
                _avalanche64(combined_l ^ _FLIP_1TO3_LO))

    return hashed


_FLIP_4TO8 = _s64(16) ^ _s64(24)


def _len_4to8(keys: _Keys) -> tuple[U64, U64]:
    input_64 = keys.at(0, 4) | (keys.back(4, 4) << _SH[32])
    high, low = _mul128(input_64 ^ _FLIP_4TO8, _P64_1 + (keys.length() << _SH[2]))
    high = high + (low << _SH[1])
    low = low ^ (high >> _SH[3])
    low = _xorshift(_xorshift(low, 35) * _MX2, 28)
    return _avalanche(high), low


_FLIP_9TO16_LO = _s64(32) ^ _s64(40)
_FLIP_9TO16_HI = _s64(48) ^ _s64(56)
_P32_2_LESS_1 = np.uint64(0x85EBCA77 - 1)


def _len_9to16(keys: _Keys) -> tuple[U64, U64]:
    input_lo = keys.at(0)
    input_hi = keys.back(8)
    m_high, m_low = _mul128(input_lo ^ input_hi ^ _FLIP_9TO16_LO, _P64_1)
    m_low = m_low + ((keys.length() - np.uint64(1)) << _SH[54])
    input_hi = input_hi ^ _FLIP_9TO16_HI
    # m_high += the high half of input_hi + its low half times PRIME32_2
    m_high = m_high + input_hi + (input_hi & _M32) * _P32_2_LESS_1
    m_low = m_low ^ m_high.byteswap()
    high, low = _mul128(m_low, _P64_2)
    high = high + m_high * _P64_2
    return _avalanche(high), _avalanche(low)


def _mix16(lo_word: U64, hi_word: U64, secret: int) -> U64:
    """``XXH3_mix16B`` (seed 0) of the 16 input bytes ``lo_word``, ``hi_word``."""
    return _fold(lo_word ^ _s64(secret), hi_word ^ _s64(secret + 8))


def _mix32(acc: tuple[U64, U64], in1: tuple[U64, U64], in2: tuple[U64, U64],
           secret: int) -> tuple[U64, U64]:
    """``XXH128_mix32B`` (seed 0) of the 16-byte inputs ``in1``, ``in2`` (two words
    each) into ``acc`` = (low64, high64)."""
    low = (acc[0] + _mix16(in1[0], in1[1], secret)) ^ (in2[0] + in2[1])
    high = (acc[1] + _mix16(in2[0], in2[1], secret + 16)) ^ (in1[0] + in1[1])
    return low, high


def _finish(acc: tuple[U64, U64], length: U64) -> tuple[U64, U64]:
    low = acc[0] + acc[1]
    high = acc[0] * _P64_1 + acc[1] * _P64_4 + length * _P64_2
    return _ZERO - _avalanche(high), _avalanche(low)


def _len_17to128(rounds: int) -> Callable[[_Keys], tuple[U64, U64]]:
    """Keys of 17-128 bytes with ``rounds`` = (len - 1) // 32 + 1 mixing rounds: their
    first and last 16 * rounds bytes are read."""

    def hashed(keys: _Keys) -> tuple[U64, U64]:
        length = keys.length()
        acc = (length * _P64_1, np.zeros(keys.count, np.uint64))
        for i in range(rounds - 1, -1, -1):
            # input + 16*i and input + len - 16*(i+1)
            first = (keys.at(16 * i), keys.at(16 * i + 8))
            last = (keys.back(16 * (i + 1)), keys.back(16 * (i + 1) - 8))
            acc = _mix32(acc, first, last, 32 * i)
        return _finish(acc, length)

    return hashed


def _len_129to240(tail_rounds: int) -> Callable[[_Keys], tuple[U64, U64]]:
    """Keys of 129-240 bytes with ``tail_rounds`` mixing rounds after the first four
    (0 below 160 bytes, then one more per 32 bytes): their first 128 + 32 * tail_rounds
    bytes and their last 32 are read."""

    def hashed(keys: _Keys) -> tuple[U64, U64]:
        length = keys.length()
        acc = (length * _P64_1, np.zeros(keys.count, np.uint64))

        def pair(offset: int) -> tuple[U64, U64]:
            return keys.at(offset), keys.at(offset + 8)

        for i in range(32, 160, 32):
            acc = _mix32(acc, pair(i - 32), pair(i - 16), i - 32)
        acc = (_avalanche(acc[0]), _avalanche(acc[1]))
        for i in range(160, 160 + 32 * tail_rounds, 32):
            acc = _mix32(acc, pair(i - 32), pair(i - 16), _MIDSIZE_STARTOFFSET + i - 160)
        # The last 32 bytes, with the seed's negation (still 0).
        acc = _mix32(acc, (keys.back(16), keys.back(8)), (keys.back(32), keys.back(24)),
                     _SECRET_SIZE_MIN - _MIDSIZE_LASTOFFSET - 16)
        return _finish(acc, length)

    return hashed


class _Group(NamedTuple):
    """Keys XXH3 hashes the same way: ``hashed`` reads their first ``head`` and last
    ``tail`` bytes (``tail`` 0: the head holds the whole key, of length ``exact``)."""

    hashed: Callable[[_Keys], tuple[U64, U64]]
    head: int
    tail: int
    exact: int | None = None


def _groups() -> tuple[list[_Group], npt.NDArray[np.uint8]]:
    """The groups, and the group of each length 0..MIDSIZE_MAX + 1 (the last: longer keys,
    no group)."""
    groups = [_Group(_len_0, 0, 0, 0)]
    groups += [_Group(_len_1to3(n), n, 0, n) for n in range(1, 4)]
    groups += [_Group(_len_4to8, n, 0, n) for n in range(4, 9)]
    groups += [_Group(_len_9to16, n, 0, n) for n in range(9, 17)]
    first_mid = len(groups)
    groups += [_Group(_len_17to128(r), 16 * r, 16 * r) for r in range(1, 5)]
    first_long = len(groups)
    groups += [_Group(_len_129to240(t), 128 + 32 * t, 32) for t in range(4)]
    of_length = np.empty(MIDSIZE_MAX + 2, dtype=np.uint8)
    of_length[:17] = np.arange(17)
    for n in range(17, 129):
        of_length[n] = first_mid + (n - 1) // 32
    for n in range(129, MIDSIZE_MAX + 1):
        of_length[n] = first_long + (0 if n < 160 else (n - 160) // 32 + 1)
    of_length[MIDSIZE_MAX + 1] = len(groups)
    return groups, of_length


_GROUPS, _GROUP_OF_LENGTH = _groups()
_LONG = len(_GROUPS)
"""The group number of keys longer than :data:`MIDSIZE_MAX` (hashed by ``xxhash``)."""


# --- arrays ---------------------------------------------------------------------------------


def _offsets(encoded: pa.Array) -> npt.NDArray[np.signedinteger]:
    """The value offsets of ``encoded`` (int32, or int64 for large binary), no copy."""
    n = len(encoded)
    wide = pa.types.is_large_binary(encoded.type)
    raw = np.frombuffer(encoded.buffers()[1], dtype="<i8" if wide else "<i4",
                        count=encoded.offset + n + 1)
    return raw[encoded.offset :]


def xxh3_128_columns(encoded: pa.Array | pa.ChunkedArray, *,
                     chunk_keys: int | None = None) -> tuple[U64, U64]:
    """``(high64, low64)`` of XXH3-128 of every value of a binary (or large binary)
    Arrow array: the upsert keys of encoded keys, split as ``columnar.split_keys``
    splits 16-byte keys (see the module docstring). ``chunk_keys``: keys per numpy
    pass (default :data:`CHUNK_KEYS`)."""
    encoded = _binary(encoded)
    high = np.empty(len(encoded), dtype=np.uint64)
    low = np.empty(len(encoded), dtype=np.uint64)
    _hash_into(encoded, high, low, chunk_keys or CHUNK_KEYS)
    return high, low


def xxh3_128_digests(encoded: pa.Array | pa.ChunkedArray, *,
                     chunk_keys: int | None = None) -> pa.FixedSizeBinaryArray:
    """The 16-byte canonical (big-endian) XXH3-128 digests of every value, as
    ``xxhash.xxh3_128_digest`` returns them, in one fixed-size binary array. The halves
    are written straight into the array's buffer, which Arrow's memory pool holds."""
    encoded = _binary(encoded)
    n = len(encoded)
    buffer = pa.allocate_buffer(16 * n)
    both = np.frombuffer(buffer, dtype=">u8").reshape(n, 2)
    _hash_into(encoded, both[:, 0], both[:, 1], chunk_keys or CHUNK_KEYS)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), n, [None, buffer])


def _binary(encoded: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(encoded, pa.ChunkedArray):
        encoded = (encoded.combine_chunks() if encoded.num_chunks != 1
                   else encoded.chunk(0))
    if not (pa.types.is_binary(encoded.type) or pa.types.is_large_binary(encoded.type)):
        raise TypeError(f"expected a binary Arrow array, got {encoded.type}")
    return encoded


def _hash_into(encoded: pa.Array, high: npt.NDArray[np.generic], low: npt.NDArray[np.generic],
               step: int) -> None:
    """Write the halves of every value's hash into ``high`` and ``low`` (any uint64
    views, big-endian and strided included)."""
    n = len(encoded)
    if n == 0:
        return
    offsets = _offsets(encoded)
    buffer = encoded.buffers()[2]
    data = (np.frombuffer(buffer, dtype=np.uint8) if buffer is not None and buffer.size
            else np.zeros(0, np.uint8))
    # Chunk by chunk of the array, each chunk group by group: the chunk's keys are read
    # from memory once (the gathers of its groups after the first hit the cache), and
    # no temporary is larger than a chunk.
    for a in range(0, n, step):
        b = min(a + step, n)
        bounds = offsets[a : b + 1].astype(np.int64)
        starts, lens = bounds[:-1], np.diff(bounds)
        shortest, longest = (int(_GROUP_OF_LENGTH[min(int(x), MIDSIZE_MAX + 1)])
                             for x in (lens.min(), lens.max()))
        members: dict[int, npt.NDArray[np.intp] | None]
        if shortest == longest:  # one group: groups only grow with the length
            members = {shortest: None}
        else:
            groups = _GROUP_OF_LENGTH[np.minimum(lens, MIDSIZE_MAX + 1).astype(np.intp)]
            members = {g: np.flatnonzero(groups == g)
                       for g in np.flatnonzero(np.bincount(groups)).tolist()}
        c_high, c_low = high[a:b], low[a:b]
        for g, index in members.items():
            if g == _LONG:
                _hash_long(data, starts, lens, index, c_high, c_low)
            elif index is None:
                c_high[:], c_low[:] = _GROUPS[g].hashed(_chunk(_GROUPS[g], data, starts, lens))
            else:
                c_high[index], c_low[index] = _GROUPS[g].hashed(
                    _chunk(_GROUPS[g], data, starts[index], lens[index]))


def _chunk(group: _Group, data: npt.NDArray[np.uint8], starts: I64, lens: I64) -> _Keys:
    """The keys at ``starts`` of ``lens`` bytes (one group) as blocks of their bytes."""
    count = len(starts)
    width = int(lens[0])
    same = group.exact is not None or bool(np.all(lens == width))
    lens_or_one: I64 | int = width if same else lens
    if same and int(starts[-1]) - int(starts[0]) == width * (count - 1) and (
            count == 1 or bool(np.all(np.diff(starts) == width))):
        # One width, end to end (a fixed-width key column): read the data in place.
        first = int(starts[0])
        head = _Block(data, first, width, count, group.head) if group.head else None
        tail = (_Block(data, first + width - group.tail, width, count, group.tail)
                if group.tail else head)
        return _Keys(head, tail, lens_or_one, count)
    head = _Block.gathered(data, starts, group.head) if group.head else None
    tail = _Block.gathered(data, starts + lens - group.tail, group.tail) if group.tail else head
    return _Keys(head, tail, lens_or_one, count)


def _hash_long(data: npt.NDArray[np.uint8], starts: I64, lens: I64,
               index: npt.NDArray[np.intp] | None, high: npt.NDArray[np.generic],
               low: npt.NDArray[np.generic]) -> None:
    """Keys over :data:`MIDSIZE_MAX` bytes (those at ``index``; all if None), one
    ``xxhash`` call each."""
    for i in (range(len(starts)) if index is None else index.tolist()):
        start = int(starts[i])
        digest = xxhash.xxh3_128_digest(data[start : start + int(lens[i])].tobytes())
        high[i] = int.from_bytes(digest[:8], "big")
        low[i] = int.from_bytes(digest[8:], "big")
