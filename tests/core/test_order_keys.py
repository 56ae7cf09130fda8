"""Order keys (``upsert_core.order_keys``): the bytes of a several-column order compare
exactly as the tuples do, survive numpy and Arrow unchanged, and never mix with int64
orders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.errors import CodecError, InvalidUpsertState
from upsert_core.order_keys import (
    INTEGER,
    STRING,
    concat_orders,
    decode,
    empty_orders,
    from_arrow,
    order_keys,
    to_arrow,
)

# Strings that stress the escaping: empty, NUL bytes inside and at the end, prefixes of
# each other, bytes 0xFF-like code points, non-ASCII (UTF-8 order = code point order).
TEXT = st.text(alphabet=st.sampled_from(["\x00", "\x01", "a", "b", "\xff", "é", "\U0001f600"]),
               max_size=4)
INT = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 3))
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TIME = st.integers(-(10**15), 10**15).map(lambda us: EPOCH + timedelta(microseconds=us))

KINDS = {"int": (INT, pa.int64()), "str": (TEXT, pa.string()),
         "ts": (TIME, pa.timestamp("us", tz="UTC"))}


@st.composite
def tuples(draw: st.DrawFn) -> tuple[list[str], list[tuple[object, ...]]]:
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=2, max_size=3))
    row = st.tuples(*(KINDS[k][0] for k in kinds))
    return kinds, draw(st.lists(row, min_size=1, max_size=12))


def _keys(kinds: list[str], rows: list[tuple[object, ...]]) -> np.ndarray:
    columns = [pa.array([r[i] for r in rows], KINDS[k][1]) for i, k in enumerate(kinds)]
    return order_keys(columns)


def _cmp(a: object, b: object) -> int:
    return (a > b) - (a < b)  # type: ignore[operator]


@settings(max_examples=300, deadline=None)
@given(data=tuples())
def test_order_keys_compare_exactly_as_the_tuples(
    data: tuple[list[str], list[tuple[object, ...]]],
) -> None:
    kinds, rows = data
    keys = _keys(kinds, rows)
    for i, x in enumerate(rows):
        for j, y in enumerate(rows):
            assert _cmp(keys[i], keys[j]) == _cmp(x, y), (x, y, keys[i], keys[j])
            # numpy's vectorised comparison (what the drain uses) agrees too
            assert bool(keys[i : i + 1] >= keys[j : j + 1]) == (x >= y)  # type: ignore[operator]
    # lexsort on the keys sorts the tuples
    assert [rows[i] for i in np.lexsort((keys,))] == sorted(rows)  # type: ignore[type-var]


@settings(max_examples=200, deadline=None)
@given(data=tuples())
def test_order_keys_survive_arrow_and_back_byte_for_byte(
    data: tuple[list[str], list[tuple[object, ...]]],
) -> None:
    kinds, rows = data
    keys = _keys(kinds, rows)
    arrow = to_arrow(keys)
    assert arrow.type == pa.binary()
    assert all(not b.endswith(b"\x00") for b in arrow.to_pylist())
    back = from_arrow(arrow)
    assert back.dtype.kind == "S" and back.tolist() == keys.tolist()
    assert from_arrow(pa.chunked_array([arrow[:1], arrow[1:]])).tolist() == keys.tolist()
    assert from_arrow(arrow.slice(1)).tolist() == keys.tolist()[1:]  # an offset view
    assert to_arrow(keys[1:]).to_pylist() == arrow.to_pylist()[1:]


def test_known_encoding_is_stable() -> None:
    # The stored format (ORDER_KEY_FORMAT 1): a change here breaks stored checkpoints.
    keys = order_keys([pa.array(["a\x00"], pa.string()), pa.array([-1], pa.int64())])
    assert keys.tolist() == [b"a\x00\xff\x00\x01" + b"\x7f" + b"\xff" * 7 + b"\x01"]


def test_nulls_and_unsupported_types_are_refused() -> None:
    with pytest.raises(CodecError, match="null"):
        order_keys([pa.array([1, None], pa.int64()), pa.array(["a", "b"])])
    with pytest.raises(InvalidUpsertState, match="double"):
        order_keys([pa.array([1.5]), pa.array(["a"])])
    with pytest.raises(InvalidUpsertState, match="bool"):
        order_keys([pa.array([True]), pa.array(["a"])])


def test_int64_orders_and_order_keys_never_mix() -> None:
    ints = np.array([1, 2], np.int64)
    keys = order_keys([pa.array([1, 2]), pa.array(["a", "b"])])
    with pytest.raises(InvalidUpsertState, match="mixed"):
        concat_orders([ints, keys])
    # An empty array of the other kind (an empty state made before the kind was known)
    # gives way; numpy alone would turn the integers into text.
    assert concat_orders([empty_orders(False), keys]).tolist() == keys.tolist()
    assert concat_orders([empty_orders(True), ints]).dtype == np.int64
    assert from_arrow(to_arrow(ints)).tolist() == [1, 2]


@settings(max_examples=200, deadline=None)
@given(data=tuples())
def test_decode_gives_back_the_tuples(data: tuple[list[str], list[tuple[object, ...]]]) -> None:
    kinds, rows = data
    decode_kinds = [STRING if k == "str" else INTEGER for k in kinds]
    for key, row in zip(to_arrow(_keys(kinds, rows)).to_pylist(), rows, strict=True):
        want = tuple((v - EPOCH) // timedelta(microseconds=1) if k == "ts" else v
                     for k, v in zip(kinds, row, strict=True))
        assert decode(key, decode_kinds) == want


@pytest.mark.parametrize(("key", "kinds", "why"), [
    (b"\x80\x00\x00", [INTEGER], "inside an integer"),
    (b"abc", [STRING], "no terminator"),
    (b"a\x00\x07b\x00\x01\x01", [STRING], "bad escape"),
    (b"a\x00\x01\x01\x01", [STRING], "does not end"),
    (b"a\x00\x01", [STRING], "does not end"),
    (b"\xff\x00\x01\x01", [STRING], "not UTF-8"),
    (b"\x01", ["float"], "no component of kind"),
])
def test_decode_refuses_bytes_that_are_not_an_order_key(
    key: bytes, kinds: list[str], why: str
) -> None:
    with pytest.raises(CodecError, match=why):
        decode(key, kinds)
