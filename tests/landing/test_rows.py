"""Row encoding: trailing nulls trimmed, decoding pads, keys are 16-byte digests."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.codec import Datum, encode_datums, key_digest
from upsert_core.errors import CodecError
from upsert_core.landing import LogicalType, SourceSchema, decode_row, encode_key, encode_row

DATUMS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.dates(),
    st.datetimes(timezones=st.just(dt.UTC)),
)


@given(st.lists(DATUMS, max_size=6), st.integers(0, 4))
def test_trailing_nulls_never_change_a_row_encoding(values: list[Datum], nulls: int) -> None:
    assert encode_row(values + [None] * nulls) == encode_row(values)


@given(st.lists(DATUMS, max_size=6), st.integers(0, 3))
def test_decode_row_pads_missing_columns(values: list[Datum], extra: int) -> None:
    names = [f"c{i}" for i in range(len(values) + extra)]
    schema = SourceSchema(key=("k",), columns=tuple((n, LogicalType.STRING) for n in names))
    decoded = decode_row(schema, encode_row(values))
    assert list(decoded) == names
    assert list(decoded.values()) == values + [None] * extra


def test_decode_row_rejects_more_values_than_columns() -> None:
    schema = SourceSchema(columns=(("key", LogicalType.INT64),))
    with pytest.raises(CodecError, match="2 values but the schema has only 1"):
        decode_row(schema, encode_row([1, 2]))


def test_encode_key_is_the_digest_of_the_encoded_key_values() -> None:
    assert encode_key([1, "a"]) == key_digest(encode_datums([1, "a"]))
    assert len(encode_key([None])) == 16
    assert encode_key([1, "a"]) != encode_key(["a", 1])
