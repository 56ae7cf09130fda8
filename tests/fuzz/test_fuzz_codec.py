"""Fuzz the row codec with random and damaged bytes and hostile Arrow columns.

- ``decode_datums`` on any bytes (pure noise, and valid encodings truncated, flipped or
  extended) either decodes, and then re-encoding gives back exactly the input (the codec
  is bijective on its image), or raises :class:`CodecError`; nothing else escapes.
- ``encode_datums`` on any Python values (huge ints, NaN, lone surrogates, unsupported
  types) returns bytes that decode back, or raises :class:`CodecError`.
- ``encode_columns`` on Arrow columns drawn from the *raw* value domains (every int64
  timestamp, uint64 above int64, nanosecond timestamps with sub-microsecond parts,
  dates far out of Python's range) returns None (decline, the caller falls back) or
  exactly what ``encode_datums`` makes of the rows; it never raises.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.codec import decode_datums, encode_columns, encode_datums
from upsert_core.errors import CodecError

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=500, deadline=None)

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(), max_size=10),  # incl. lone surrogates
    st.binary(max_size=10),
    st.dates(),
    st.datetimes(timezones=st.sampled_from([None])),
    st.decimals(allow_nan=False, places=2, max_value=10**6, min_value=-(10**6)),
    st.lists(st.integers(), max_size=2),
    st.complex_numbers(max_magnitude=10),
)


@st.composite
def damaged_encodings(draw: st.DrawFn) -> bytes:
    values = draw(st.lists(ANY_VALUE, max_size=5))
    try:
        data = encode_datums(values)
    except CodecError:
        data = b"\x01"
    how = draw(st.sampled_from(["truncate", "flip", "extend", "tag"]))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data)))]
    if how == "flip":
        out = bytearray(data)
        i = draw(st.integers(0, len(out) - 1))
        out[i] ^= draw(st.integers(1, 255))
        return bytes(out)
    if how == "extend":
        return data + draw(st.binary(min_size=1, max_size=12))
    return data + bytes([draw(st.integers(0, 255))]) + draw(st.binary(max_size=9))


def _decode_or_codec_error(data: bytes) -> None:
    try:
        values = decode_datums(data)
    except CodecError:
        return
    assert encode_datums(values) == data, "decoding accepted a non-canonical encoding"


@FUZZ
@given(data=st.one_of(st.binary(max_size=64), st.binary(max_size=8).map(lambda b: b"\x01" + b)))
def test_decode_random_bytes(data: bytes, fuzz_counter: Counter[str]) -> None:
    fuzz_counter["codec-decode-random"] += 1
    _decode_or_codec_error(data)


@FUZZ
@given(data=damaged_encodings())
def test_decode_damaged_encodings(data: bytes, fuzz_counter: Counter[str]) -> None:
    fuzz_counter["codec-decode-damaged"] += 1
    _decode_or_codec_error(data)


@FUZZ
@given(values=st.lists(ANY_VALUE, max_size=6))
def test_encode_any_values(values: list[Any], fuzz_counter: Counter[str]) -> None:
    fuzz_counter["codec-encode"] += 1
    try:
        data = encode_datums(values)
    except CodecError:
        return
    assert len(decode_datums(data)) == len(values)


RAW_COLUMNS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "ts_s": (pa.timestamp("s"), st.integers(-(2**63), 2**63 - 1)),
    "ts_ms": (pa.timestamp("ms", tz="UTC"), st.integers(-(2**63), 2**63 - 1)),
    "ts_us": (pa.timestamp("us"), st.integers(-(2**63), 2**63 - 1)),
    "ts_ns": (pa.timestamp("ns", tz="Europe/Paris"), st.integers(-(2**63), 2**63 - 1)),
    "date32": (pa.date32(), st.integers(-(2**31), 2**31 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float32": (pa.float32(), st.floats(width=32)),
    "string": (pa.string(), st.text(alphabet=st.characters(codec="utf-8"), max_size=6)),
    "binary": (pa.large_binary(), st.binary(max_size=6)),
    "list": (pa.list_(pa.int8()), st.lists(st.integers(-128, 127), max_size=2)),
    "decimal": (pa.decimal128(5, 2), st.decimals(places=2, min_value=-999, max_value=999)),
}


@st.composite
def raw_tables(draw: st.DrawFn) -> list[pa.Array]:
    n = draw(st.integers(0, 12))
    columns = []
    for kind in draw(st.lists(st.sampled_from(sorted(RAW_COLUMNS)), min_size=1, max_size=4)):
        typ, values = RAW_COLUMNS[kind]
        items = draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n))
        storage = typ.storage_type if hasattr(typ, "storage_type") else None
        if pa.types.is_timestamp(typ) or pa.types.is_date32(typ):
            # Build from raw integers: every representable value, not only Python's range.
            ints = pa.array(items, type=pa.int64() if typ.bit_width == 64 else pa.int32())
            columns.append(ints.view(typ))
        else:
            columns.append(pa.array(items, type=storage or typ))
    return columns


@FUZZ
@given(columns=raw_tables(), drop=st.booleans())
def test_encode_columns_declines_or_matches(
    columns: list[pa.Array], drop: bool, fuzz_counter: Counter[str]
) -> None:
    fuzz_counter["codec-encode-columns"] += 1
    out = encode_columns(columns, drop_trailing_nulls=drop)
    if out is None:
        return
    for i in range(len(columns[0])):
        # If encode_columns encoded the row, Python can represent every value in it.
        row = [col[i].as_py() for col in columns]
        while drop and row and row[-1] is None:
            row.pop()
        assert out[i].as_py() == encode_datums(row), f"row {i} differs"
