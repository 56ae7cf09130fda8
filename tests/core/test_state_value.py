"""StateValue: shapes, provisional semantics, the accumulator, size and encoding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.codec import encode_datums, value_checksum
from upsert_core.errors import CodecError, InvalidUpsertState
from tests.oracle.state import STATE_FORMAT_VERSION, OrderKey, StateValue, order_ge

I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
orders: st.SearchStrategy[OrderKey] = st.tuples(I64, I64)
values = st.binary(max_size=48)


def _accumulator(updates: list[tuple[bytes, int]]) -> StateValue:
    acc = StateValue.consolidating()
    for v, d in updates:
        acc.merge_update(v, d)
    return acc


state_values: st.SearchStrategy[StateValue] = st.one_of(
    st.builds(StateValue.new_finalized_value, values, st.none() | orders),
    st.builds(StateValue.finalized_tombstone, st.none() | orders),
    st.builds(StateValue.new_provisional_value, values, I64, orders),
    st.builds(StateValue.new_provisional_tombstone, I64, orders),
    st.builds(
        lambda base, v, ts, o: base.into_provisional_value(v, ts, o),
        st.builds(StateValue.new_finalized_value, values, st.none() | orders),
        values,
        I64,
        orders,
    ),
    st.builds(
        lambda base, ts, o: base.into_provisional_tombstone(ts, o),
        st.builds(StateValue.finalized_tombstone, st.none() | orders),
        I64,
        orders,
    ),
    st.builds(
        _accumulator,
        st.lists(st.tuples(values, st.integers(min_value=-(2**70), max_value=2**70))),
    ),
)


def test_order_ge_treats_none_as_lowest() -> None:
    assert not order_ge(None, (-(2**63), -(2**63)))
    assert order_ge((1, 0), (1, 0))
    assert order_ge((2, 0), (1, 9))
    assert not order_ge((1, 0), (1, 1))


def test_finalized_value_is_constructor_on_class_and_bytes_on_instance() -> None:
    sv = StateValue.finalized_value(b"row", (3, 1))
    assert sv == StateValue.new_finalized_value(b"row", (3, 1))
    assert sv.finalized_value == b"row"
    assert sv.finalized_order == (3, 1)
    assert not sv.is_tombstone and not sv.is_consolidating
    tomb = StateValue.finalized_tombstone(None)
    assert tomb.is_tombstone and tomb.finalized_value is None and tomb.finalized_order is None


def test_provisional_part_is_seen_only_at_its_timestamp() -> None:
    base = StateValue.finalized_value(b"old", (1, 0))
    prov = base.into_provisional_value(b"new", 7, (2, 5))
    assert prov.provisional_value_ref(7) == b"new"
    assert prov.provisional_order(7) == (2, 5)
    assert prov.provisional_value_ref(8) == b"old"
    assert prov.provisional_order(8) == (1, 0)
    assert prov.finalized_value == b"old" and prov.provisional_ts == 7
    assert not prov.is_tombstone
    # The base is not modified, and replacing the provisional part keeps the finalized one.
    assert base == StateValue.finalized_value(b"old", (1, 0))
    dele = prov.into_provisional_tombstone(9, (4, 0))
    assert dele.provisional_value_ref(9) is None
    assert dele.provisional_order(9) == (4, 0)
    assert dele.provisional_value_ref(7) == b"old"
    assert not dele.is_tombstone  # a provisional delete is not a finalized tombstone


def test_new_provisional_has_no_finalized_part() -> None:
    pv = StateValue.new_provisional_value(b"v", 3, (1, 1))
    assert pv.provisional_value_ref(3) == b"v"
    assert pv.provisional_value_ref(4) is None
    assert pv.provisional_order(4) is None
    pt = StateValue.new_provisional_tombstone(3, (1, 1))
    assert pt.provisional_value_ref(3) is None and pt.provisional_order(3) == (1, 1)


def test_decoded_only_queries_on_an_accumulator_raise() -> None:
    acc = StateValue.consolidating()
    acc.merge_update(b"x", 1)
    for call in (
        lambda: acc.provisional_value_ref(1),
        lambda: acc.provisional_order(1),
        lambda: acc.finalized_value,
        lambda: acc.finalized_order,
        lambda: acc.into_provisional_value(b"y", 1, (1, 1)),
        lambda: acc.into_provisional_tombstone(1, (1, 1)),
    ):
        with pytest.raises(InvalidUpsertState):
            call()


def test_ensure_decoded_is_a_no_op_on_decoded_values() -> None:
    sv = StateValue.finalized_value(b"a", (1, 1)).into_provisional_value(b"b", 2, (2, 2))
    before = StateValue.decode(sv.encode())
    sv.ensure_decoded()
    assert sv == before


def test_merge_update_keeps_the_latest_value() -> None:
    # A shorter current value after a longer retracted one: the XOR buffer stays long
    # but the tail cancels out, and the checksum confirms the short value.
    small = encode_datums([])
    longer = encode_datums([None])
    acc = StateValue.consolidating()
    assert not acc.merge_update(small, 1)
    assert not acc.merge_update(longer, -1)
    assert not acc.merge_update(longer, 1)
    acc.ensure_decoded()
    assert acc == StateValue.finalized_value(small, None)


def test_retracting_a_different_value_than_was_inserted_is_caught() -> None:
    acc = _accumulator([(encode_datums([None]), 1), (encode_datums([]), -1)])
    with pytest.raises(InvalidUpsertState, match="len_sum is non-zero") as info:
        acc.ensure_decoded()
    assert info.value.state is acc and acc.is_consolidating


def test_len_sum_longer_than_the_accumulated_value_is_caught() -> None:
    longer, small = encode_datums([None]), encode_datums([])
    acc = _accumulator([(longer, 1), (small, -1), (longer, 1)])
    with pytest.raises(InvalidUpsertState, match="longer than the accumulated value"):
        acc.ensure_decoded()


def test_checksum_mismatch_is_caught() -> None:
    one, two = encode_datums([1]), encode_datums([2])
    acc = _accumulator([(one, 1), (two, -1), (one, 1)])
    with pytest.raises(InvalidUpsertState, match="checksum_sum does not match"):
        acc.ensure_decoded()
    assert acc.is_consolidating  # unchanged by the failed decode


def test_diff_sum_other_than_zero_or_one_is_caught() -> None:
    acc = _accumulator([(b"a", 1), (b"a", 1)])
    with pytest.raises(InvalidUpsertState, match="diff_sum is 2"):
        acc.ensure_decoded()
    neg = _accumulator([(b"a", -1)])
    with pytest.raises(InvalidUpsertState, match="diff_sum is -1"):
        neg.ensure_decoded()


def test_empty_accumulator_decodes_to_a_tombstone() -> None:
    acc = StateValue.consolidating()
    acc.ensure_decoded()
    assert acc == StateValue.finalized_tombstone(None)


def test_even_diffs_cancel_in_the_xor_and_sums_wrap() -> None:
    acc = _accumulator([(b"v", 2), (b"v", -1)])
    acc.ensure_decoded()
    assert acc.finalized_value == b"v"
    # Sums wrap at 64 bits: 2**64 + 1 copies decode like a single one.
    big = _accumulator([(b"w", 2**64 + 1)])
    assert big.diff_sum == 1
    big.ensure_decoded()
    assert big.finalized_value == b"w"


def test_merge_update_reports_deletable_only_when_entirely_zero() -> None:
    acc = StateValue.consolidating()
    assert not acc.merge_update(b"abc", 1)
    assert acc.merge_update(b"abc", -1)
    # Same XOR and diff, different length and checksum: not deletable.
    acc2 = StateValue.consolidating()
    acc2.merge_update(b"abc", 1)
    assert not acc2.merge_update(b"abc\x00", -1)


def test_merge_update_on_a_decoded_value_restarts_from_its_finalized_part() -> None:
    sv = StateValue.finalized_value(b"old", (5, 5)).into_provisional_value(b"p", 3, (6, 6))
    # The provisional part is dropped; retracting the finalized value leaves all zero.
    assert sv.merge_update(b"old", -1)
    assert sv.is_consolidating and sv.diff_sum == 0
    sv.merge_update(b"new", 1)
    sv.ensure_decoded()
    assert sv == StateValue.finalized_value(b"new", None)
    assert StateValue.finalized_tombstone((1, 1)).to_consolidating() == StateValue()


def test_to_consolidating_returns_a_copy() -> None:
    acc = _accumulator([(b"a", 1)])
    copy = acc.to_consolidating()
    copy.merge_update(b"a", -1)
    assert acc.diff_sum == 1 and copy.diff_sum == 0


@given(state_values)
def test_encode_round_trip_and_size(sv: StateValue) -> None:
    encoded = sv.encode()
    assert encoded[0] == STATE_FORMAT_VERSION
    assert sv.memory_size() == len(encoded)
    assert sv.size_tag() == 2 * len(encoded) + int(sv.is_tombstone)
    back = StateValue.decode(encoded)
    assert back == sv
    assert back.encode() == encoded


@given(state_values, st.data())
def test_decode_rejects_truncation_and_trailing_bytes(sv: StateValue, data: st.DataObject) -> None:
    encoded = sv.encode()
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(CodecError):
        StateValue.decode(encoded[:cut])
    with pytest.raises(CodecError, match="trailing"):
        StateValue.decode(encoded + b"\x00")


@pytest.mark.parametrize(
    "hex_bytes",
    ["", "02", "0103", "010001", "010110", "010220"],
)
def test_decode_rejects_malformed_headers(hex_bytes: str) -> None:
    with pytest.raises(CodecError):
        StateValue.decode(bytes.fromhex(hex_bytes))


def test_state_format_is_fixed() -> None:
    # Fixed vectors for the on-disk format: changing them needs a new format version.
    assert StateValue.finalized_tombstone(None).encode().hex() == "010100"
    assert (
        StateValue.finalized_value(b"ab", (1, -1)).encode().hex()
        == "0101030100000000000000ffffffffffffffff020000006162"
    )
    acc = _accumulator([(b"\x01", 1)])
    assert acc.encode().hex() == (
        "010000"
        + "0100000000000000"
        + "0100000000000000"
        + value_checksum(b"\x01").to_bytes(8, "little").hex()
        + "01000000"
        + "01"
    )


def test_encoding_an_order_outside_int64_raises_codec_error() -> None:
    with pytest.raises(CodecError):
        StateValue.finalized_value(b"x", (2**63, 0)).encode()
