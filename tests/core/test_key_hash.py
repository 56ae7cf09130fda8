"""``key_hash``: the numpy XXH3-128 equals ``xxhash.xxh3_128_digest`` bit for bit, for
every length class XXH3 distinguishes and its boundaries, keys of one width laid end to
end (read in place) and of many widths (gathered), any chunking, sliced, chunked and
large binary arrays and null slots; and ``codec.key_digest_array`` equals
``key_digests`` on the codec's own encodings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.codec import (
    encode_columns,
    encode_datums,
    key_digest,
    key_digest_array,
    key_digests,
)
from upsert_core.columnar import split_keys
from upsert_core.key_hash import MIDSIZE_MAX, xxh3_128_columns, xxh3_128_digests

BOUNDARIES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 32, 33, 64, 65, 96, 97, 128, 129,
              159, 160, 191, 192, 223, 224, 239, 240, 241, 300)
"""Every length where XXH3's code path (or the number of rounds) changes, both sides."""

PINNED = {
    0: "99aa06d3014798d86001c324468d497f",
    1: "a6cd5e9392000f6ac44bdff4074eecdb",
    3: "656e81c56e41fe02c3489259e968ad9e",
    4: "ab5c3e7474d809db81a65295de8e7dde",
    8: "e4b9dd0b66ff3c50ebabbd0695002ff6",
    9: "82ddc95bc76007671c69c3f04aaed08c",
    16: "ddf6c1254d70f76794eaa17b20756f46",
    17: "263f67af63088041735fe434ded90c3c",
    128: "381610c474b8adfb2dfb73305de1f91a",
    129: "4e05eed4427255d51f8b5092c9ba3be8",
    240: "17ffe035d71c1ec8e6bf81617aad6c4a",
    241: "29bc1e9cffb6d79bc614c8c3575348c1",
}
"""Digests of ``bytes(i * 7 % 251 for i in range(length))``: stored keys are these bytes,
so a change of hash (of this code or of the xxhash library) must fail here."""

_LENGTHS = st.one_of(st.sampled_from(BOUNDARIES), st.integers(0, MIDSIZE_MAX + 20))
_VALUES = _LENGTHS.flatmap(lambda n: st.binary(min_size=n, max_size=n))


def _expected(values: Sequence[bytes]) -> list[bytes]:
    return [xxhash.xxh3_128_digest(v) for v in values]


def _check(arr: pa.Array | pa.ChunkedArray, values: Sequence[bytes], chunk: int | None = None,
           ) -> None:
    expected = _expected(values)
    digests = xxh3_128_digests(arr, chunk_keys=chunk)
    assert digests.type == pa.binary(16)
    assert digests.to_pylist() == expected
    high, low = xxh3_128_columns(arr, chunk_keys=chunk)
    assert high.dtype == np.uint64 and low.dtype == np.uint64
    assert high.tolist() == [int.from_bytes(d[:8], "big") for d in expected]
    assert low.tolist() == [int.from_bytes(d[8:], "big") for d in expected]
    # The halves are the ones the columnar state reads from stored keys.
    s_high, s_low = split_keys(digests)
    assert np.array_equal(s_high, high) and np.array_equal(s_low, low)


def test_pinned_digests() -> None:
    for length, digest in PINNED.items():
        value = bytes(i * 7 % 251 for i in range(length))
        assert xxhash.xxh3_128_digest(value).hex() == digest
        assert xxh3_128_digests(pa.array([value], pa.binary()))[0].as_py().hex() == digest


@pytest.mark.parametrize("length", BOUNDARIES)
def test_keys_of_one_width_read_in_place(length: int) -> None:
    rng = np.random.default_rng(length)
    values = [rng.integers(0, 256, length, dtype=np.uint8).tobytes() for _ in range(70)]
    arr = pa.array(values, pa.binary())
    _check(arr, values)
    _check(arr, values, chunk=16)  # several chunks, each starting mid-buffer
    _check(arr.slice(5, 50), values[5:55], chunk=7)  # a non-zero array offset


@pytest.mark.parametrize("length", [n for n in BOUNDARIES if 0 < n <= MIDSIZE_MAX])
def test_every_byte_of_a_key_counts(length: int) -> None:
    """Flipping any one bit of a key changes its digest exactly as xxhash's does (each
    input word is read from the right place, in the right order)."""
    base = bytes(i * 7 % 251 for i in range(length))
    values = [base] + [
        base[:i] + bytes([base[i] ^ (1 << bit)]) + base[i + 1 :]
        for i in range(length) for bit in (0, 7)
    ]
    _check(pa.array(values, pa.binary()), values)
    assert len(set(_expected(values))) == len(values)


@given(values=st.lists(_VALUES, max_size=60), chunk=st.integers(1, 9), cut=st.integers(0, 3))
def test_random_binary_arrays(values: list[bytes], chunk: int, cut: int) -> None:
    arr = pa.array(values, pa.binary())
    _check(arr, values, chunk=chunk)
    _check(arr.slice(cut), values[cut:], chunk=chunk)


@given(values=st.lists(_VALUES, max_size=30), chunk=st.integers(1, 5))
def test_large_binary(values: list[bytes], chunk: int) -> None:
    _check(pa.array(values, pa.large_binary()).slice(1), values[1:], chunk=chunk)


@given(parts=st.lists(st.lists(_VALUES, max_size=8), max_size=4))
def test_chunked_arrays(parts: list[list[bytes]]) -> None:
    chunked = pa.chunked_array([pa.array(p, pa.binary()) for p in parts], pa.binary())
    _check(chunked, [v for p in parts for v in p])


@given(width=st.sampled_from(BOUNDARIES), n=st.integers(1, 40), chunk=st.integers(1, 6),
       other=st.lists(_VALUES, max_size=4))
def test_one_width_among_others(width: int, n: int, chunk: int, other: list[bytes]) -> None:
    """Keys of one width, alone (read in place) or with a few others in the array
    (gathered by group), give the same digests."""
    values = [bytes([i % 256]) * width for i in range(n)]
    _check(pa.array(values, pa.binary()), values, chunk=chunk)
    mixed = values[: n // 2] + other + values[n // 2 :]
    _check(pa.array(mixed, pa.binary()), mixed, chunk=chunk)


def test_null_slots_are_hashed_as_their_bytes_like_key_digests() -> None:
    """Validity is ignored, as ``codec.key_digests`` ignores it (the codec never makes a
    null encoded key): a null Arrow built is the empty string, and a null slot that
    spans bytes is those bytes."""
    built = pa.array([b"ab", None, b"0123456789"], pa.binary())
    assert xxh3_128_digests(built).to_pylist() == key_digests(built)
    assert key_digests(built)[1] == xxhash.xxh3_128_digest(b"")
    offsets = np.array([0, 2, 12, 22], dtype=np.int32)
    spanning = pa.BinaryArray.from_buffers(
        pa.binary(), 3, [pa.py_buffer(np.packbits([1, 0, 1], bitorder="little")),
                         pa.py_buffer(offsets), pa.py_buffer(b"ab" + b"x" * 20)])
    assert spanning.null_count == 1
    assert xxh3_128_digests(spanning).to_pylist() == key_digests(spanning)
    assert key_digests(spanning)[1] == xxhash.xxh3_128_digest(b"x" * 10)


def test_empty_and_refused_input() -> None:
    assert len(xxh3_128_digests(pa.array([], pa.binary()))) == 0
    assert xxh3_128_columns(pa.chunked_array([], pa.binary()))[0].shape == (0,)
    with pytest.raises(TypeError):
        xxh3_128_columns(pa.array([1, 2]))


_KEY_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True), st.text(max_size=70), st.binary(max_size=250),
)


@given(rows=st.lists(st.lists(_KEY_VALUES, min_size=1, max_size=3), max_size=25))
def test_key_digest_array_is_key_digests_on_encoded_keys(rows: list[list[object]]) -> None:
    """The codec's bulk digest of encoded keys is the per-key digest it replaced."""
    encoded = pa.array([encode_datums(r) for r in rows], pa.binary())  # type: ignore[arg-type]
    assert key_digest_array(encoded).to_pylist() == key_digests(encoded)
    assert key_digests(encoded) == [key_digest(encode_datums(r)) for r in rows]  # type: ignore[arg-type]


@pytest.mark.parametrize("column", [
    pa.array(range(-50, 50), pa.int64()),
    pa.array([f"key-{i}" * (i % 9) for i in range(100)], pa.string()),
    pa.array([None if i % 7 == 0 else i * 1.5 for i in range(100)], pa.float64()),
])
def test_bulk_encoded_columns(column: pa.Array) -> None:
    """On the bulk encoder's output (what validation digests), sliced as it slices."""
    encoded = encode_columns([column.slice(3)])
    assert encoded is not None
    assert key_digest_array(encoded).to_pylist() == key_digests(encoded)
