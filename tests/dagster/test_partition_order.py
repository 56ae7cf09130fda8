"""The order a run's landing partitions are reported in (``assets.partition_order``):
(ts, name), keys without a ts last by name; a ts order is used by one output only, and
only when it covers every key of that output."""

from __future__ import annotations

from dagster import DagsterInstance, DynamicPartitionsDefinition, PartitionKeyRange
from dagster._core.execution.context import output
from hypothesis import given
from hypothesis import strategies as st

from assets.partition_order import landing_partitions, ordered, report_in_ts_order


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 5)),
       st.sets(st.text(min_size=1, max_size=4)))
def test_ts_then_name_and_unknown_keys_last(ts: dict[str, int], others: set[str]) -> None:
    keys = set(ts) | others
    order = list(ordered(keys, ts).get_partition_keys())
    assert sorted(order) == sorted(keys)  # the same keys, each once
    known = [k for k in order if k in ts]
    assert known == sorted(known, key=lambda k: (ts[k], k))
    assert order[len(known):] == sorted(keys - set(ts))


def test_an_order_serves_one_output_that_it_covers() -> None:
    partitions = landing_partitions("order-test")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("order-test", ["c", "a", "b"])  # arrival order
    instance.add_dynamic_partitions("not-landing", ["c", "a", "b"])

    whole = PartitionKeyRange("c", "b")
    build = output._key_range_to_subset
    report_in_ts_order("order-test", {"a": 2, "b": 0, "c": 1})
    assert list(build(whole, partitions, instance).get_partition_keys()) == ["b", "c", "a"]
    assert list(build(whole, partitions, instance).get_partition_keys()) == ["a", "b", "c"]
    report_in_ts_order("order-test", {"a": 2})  # does not cover the output: name order
    assert list(build(whole, partitions, instance).get_partition_keys()) == ["a", "b", "c"]
    # Another dynamic partitions definition keeps Dagster's own subset.
    other = build(whole, DynamicPartitionsDefinition(name="not-landing"), instance)
    assert type(other).__name__ == "DefaultPartitionsSubset"
