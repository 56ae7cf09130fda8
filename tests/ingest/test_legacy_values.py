"""Format-1 checkpoint values (``ingest.legacy_values``) decode exactly as the per-key
engine that wrote them (``tests/oracle``) reads them back: every finalized value, and
nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle.state import StateValue
from upsert_core.errors import CodecError
from upsert_core.ingest.legacy_values import decode_finalized

ROWS = st.one_of(st.none(), st.binary(max_size=40))
ORDERS = st.one_of(st.none(), st.tuples(st.integers(-(2**63), 2**63 - 1),
                                        st.integers(-(2**63), 2**63 - 1)))


def _finalized(row: bytes | None, order: tuple[int, int] | None) -> StateValue:
    if row is None:
        return StateValue.finalized_tombstone(order)
    return StateValue.new_finalized_value(row, order)


@given(ROWS, ORDERS)
def test_every_finalized_value_decodes_as_written(
    row: bytes | None, order: tuple[int, int] | None
) -> None:
    decoded = decode_finalized(_finalized(row, order).encode())
    assert decoded == (row, None if order is None else order[0])


@given(st.binary(max_size=12), st.integers(0, 2**31), st.integers(-5, 5), ORDERS)
def test_accumulators_and_provisional_values_are_refused(
    row: bytes, ts: int, diff: int, order: tuple[int, int] | None
) -> None:
    acc = StateValue.consolidating()
    acc.merge_update(row, diff)
    with pytest.raises(CodecError, match="accumulator"):
        decode_finalized(acc.encode())
    provisional = _finalized(row, order).into_provisional_value(row, ts, (1, 2))
    with pytest.raises(CodecError, match="provisional"):
        decode_finalized(provisional.encode())


@settings(max_examples=400)
@given(ROWS, ORDERS, st.data())
def test_damaged_bytes_are_refused_or_read_as_the_oracle_reads_them(
    row: bytes | None, order: tuple[int, int] | None, data: st.DataObject
) -> None:
    encoded = bytearray(_finalized(row, order).encode())
    how = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if how == "flip":
        at = data.draw(st.integers(0, len(encoded) - 1))
        encoded[at] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del encoded[data.draw(st.integers(0, len(encoded) - 1)):]
    else:
        encoded += data.draw(st.binary(min_size=1, max_size=4))
    try:
        oracle = StateValue.decode(bytes(encoded))
    except CodecError:
        oracle = None
    if oracle is None or oracle.is_consolidating or oracle.is_provisional:
        with pytest.raises(CodecError):
            decode_finalized(bytes(encoded))
    else:
        order_key = oracle.finalized_order
        assert decode_finalized(bytes(encoded)) == (
            oracle.finalized_value, None if order_key is None else order_key[0]
        )
