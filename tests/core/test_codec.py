"""The datum codec: round trip, canonical form, fixed vectors, malformed input."""

from __future__ import annotations

import datetime as dt
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.codec import (
    CODEC_VERSION,
    Datum,
    decode_datums,
    encode_datums,
    key_digest,
    value_checksum,
)
from upsert_core.errors import CodecError

UTC = dt.UTC

datums: st.SearchStrategy[Datum] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.binary(max_size=64),
    st.datetimes(timezones=st.none() | st.timezones()),
    st.dates(),
)
rows = st.lists(datums, max_size=8)


def _normalised(v: Datum) -> Datum:
    """What decoding the encoding of ``v`` must give back."""
    if isinstance(v, float):
        return 0.0 if v == 0.0 else v
    if isinstance(v, dt.datetime):
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)
    return v


def _same(a: Datum, b: Datum) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return a == b and a.utcoffset() == b.utcoffset()
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


@given(rows)
def test_round_trip(values: list[Datum]) -> None:
    encoded = encode_datums(values)
    assert encoded[0] == CODEC_VERSION
    decoded = decode_datums(encoded)
    assert len(decoded) == len(values)
    for got, want in zip(decoded, values, strict=True):
        assert _same(got, _normalised(want)), (got, want)
    # Canonical: the decoded values encode to the very same bytes.
    assert encode_datums(decoded) == encoded


@given(st.binary(max_size=40))
def test_decoding_arbitrary_bytes_either_fails_cleanly_or_is_canonical(data: bytes) -> None:
    try:
        decoded = decode_datums(data)
    except CodecError:
        return
    assert encode_datums(decoded) == data


@given(rows, st.data())
def test_every_truncation_fails_cleanly_or_is_a_datum_prefix(
    values: list[Datum], data: st.DataObject
) -> None:
    encoded = encode_datums(values)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    try:
        decoded = decode_datums(encoded[:cut])
    except CodecError:
        return
    # Cutting exactly at a datum boundary leaves a valid, shorter row.
    assert encode_datums(decoded) == encoded[:cut]
    assert len(decoded) < len(values)


def test_equal_values_encode_identically() -> None:
    nan_payload = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    assert encode_datums([-0.0]) == encode_datums([0.0])
    assert encode_datums([nan_payload]) == encode_datums([math.nan])
    assert encode_datums([-math.nan]) == encode_datums([math.nan])
    instant = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert encode_datums([instant]) == encode_datums([instant.astimezone(plus_two)])
    assert encode_datums([instant]) == encode_datums([instant.replace(tzinfo=None)])
    assert encode_datums([np.int64(7), np.float64(1.5), np.bool_(True)]) == encode_datums(
        [7, 1.5, True]
    )
    assert encode_datums([bytearray(b"ab")]) == encode_datums([b"ab"])
    # Types never collide: 1, True, 1.0 and "1" are different datums.
    assert len({encode_datums([v]) for v in (1, True, 1.0, "1", b"1")}) == 5


# Fixed vectors: if one of these changes, the encoding changed, and every stored key,
# digest and state would be misread. Bump CODEC_VERSION instead of editing them.
FIXED_VECTORS: list[tuple[tuple[Datum, ...], str]] = [
    ((), "01"),
    ((None, False, True), "01000102"),
    ((1, -1), "0103010000000000000003ffffffffffffffff"),
    ((2**63 - 1, -(2**63)), "0103ffffffffffffff7f030000000000000080"),
    (
        (1.5, -0.0, math.nan, -math.inf),
        "0104000000000000f83f040000000000000000"
        "04000000000000f87f04000000000000f0ff",
    ),
    (("héllo", ""), "01050600000068c3a96c6c6f0500000000"),
    ((b"\x00\xff",), "01060200000000ff"),
    ((dt.datetime(2024, 1, 2, 3, 4, 5, 6),), "010746d34dc0ed0d0600"),
    ((dt.date(2024, 2, 29), dt.date(1969, 12, 31)), "0108464d000008ffffffff"),
    (("order-42", 42, None), "0105080000006f726465722d3432032a0000000000000000"),
]


@pytest.mark.parametrize(("values", "hex_bytes"), FIXED_VECTORS)
def test_fixed_vectors(values: tuple[Datum, ...], hex_bytes: str) -> None:
    assert encode_datums(values).hex() == hex_bytes
    decoded = decode_datums(bytes.fromhex(hex_bytes))
    assert all(_same(a, _normalised(b)) for a, b in zip(decoded, values, strict=True))


def test_fixed_digests() -> None:
    key = encode_datums(["customer", 42])
    assert key.hex() == "010508000000637573746f6d6572032a00000000000000"
    assert key_digest(key).hex() == "7e23c3027455e10f48ca0a003ef665dc"
    assert value_checksum(key) == 12556726822453404579
    assert key_digest(key) == xxhash.xxh3_128(key).digest()
    assert value_checksum(key) == xxhash.xxh3_64(key).intdigest()
    assert len(key_digest(b"")) == 16
    assert 0 <= value_checksum(b"") < 2**64


def test_encoding_is_the_same_in_another_process() -> None:
    script = (
        "import datetime as dt\n"
        "from upsert_core.codec import encode_datums, key_digest\n"
        "v = encode_datums(['k', 3, 2.5, None, b'x', dt.date(2020, 1, 1)])\n"
        "print(v.hex(), key_digest(v).hex())\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env
    ).stdout.split()
    here = encode_datums(["k", 3, 2.5, None, b"x", dt.date(2020, 1, 1)])
    assert out == [here.hex(), key_digest(here).hex()]


@pytest.mark.parametrize(
    ("hex_bytes", "why"),
    [
        ("", "empty"),
        ("02", "unsupported codec version"),
        ("0109", "unknown datum tag"),
        ("0103010000", "truncated"),
        ("0104000000", "truncated"),
        ("0105050000006869", "truncated"),
        ("010506", "truncated"),
        ("0106ffffffff", "truncated"),
        ("0108010000", "truncated"),
        ("0104" + "0000000000000080", "non-canonical float"),
        ("0104" + "010000000000f87f", "non-canonical float"),
        ("010502000000c328", "invalid UTF-8"),
        ("0108ffffff7f", "date out of range"),
        ("0107ffffffffffffff7f", "datetime out of range"),
    ],
)
def test_malformed_bytes_raise_codec_error(hex_bytes: str, why: str) -> None:
    with pytest.raises(CodecError, match=why):
        decode_datums(bytes.fromhex(hex_bytes))


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(CodecError):
        decode_datums("01")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [
        2**63,
        -(2**63) - 1,
        np.uint64(2**64 - 1),
        "\ud800",
        object(),
        [1, 2],
        dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),
    ],
)
def test_unencodable_values_raise_codec_error(value: object) -> None:
    with pytest.raises(CodecError):
        encode_datums([value])  # type: ignore[list-item]
