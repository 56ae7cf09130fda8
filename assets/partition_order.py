"""A run's per-partition materialization events of the landing partitions are stored in
ts order (the order the files went into the shard), so the last one stored, Dagster's
"Latest materialization", is the latest file.

Dagster emits one materialization per partition of a run from the asset's output, in
the order the run's partition subset iterates; for dynamic partitions that subset is a
Python ``set`` of the keys, so a 3-file backfill stored its events ts1, ts2, ts0 and the
UI's "Latest materialization" named an earlier file than the run's last (issue 23).
Dagster has no setting for that order, so this module wraps the one function that
builds an output's partition subset (``dagster._core.execution.context.output.
_key_range_to_subset``, dagster 1.13) and, for partitions definitions registered here
(:func:`landing_partitions`), hands the output a subset whose keys iterate in ts order.

The asset knows each partition's ts; just before it returns it calls
:func:`report_in_ts_order`, and the output built right after (same process, same step)
takes that order. Without one (``source_snapshot``, which has no ts) the order is by name.

Invariants:

- Only the order changes: the ordered subset holds exactly the keys Dagster computed,
  compares equal to Dagster's own, and only the output context of a step sees it (it is
  never serialized; every set operation on it yields Dagster's plain subset).
- Only the partitions definitions made by :func:`landing_partitions` are affected; any
  other asset in the process keeps Dagster's behaviour.
- Order: (ts, name); keys without a ts after those with one, by name. A ts order is used
  once, by the next output of those partitions, and only if it covers every key of that
  output (a stale one is never applied to another run's keys). Within one run files
  are applied in name order, so name order is ts order except for partitions applied
  before the run (a late file's backfill: the late file is reported last).
- Should a Dagster release move the wrapped function, :func:`install` raises at import
  (``pyproject.toml`` pins dagster 1.13), and
  ``tests/dagster/test_backfill.py::test_a_backfills_events_are_stored_in_ts_order``
  fails if the order is lost another way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dagster import DynamicPartitionsDefinition
from dagster._core.definitions.partitions.subset.default import DefaultPartitionsSubset
from dagster._core.execution.context import output as _output

_LANDING: set[str] = set()
_INSTALLED: list[Callable[..., Any]] = []
_TS: dict[str, dict[str, int]] = {}  # partitions name -> the ts of each key, for one output


class OrderedSubset(DefaultPartitionsSubset):
    """Dagster's default subset whose keys iterate in a given order (:func:`ordered`)."""

    order: tuple[str, ...]

    def get_partition_keys(self) -> Iterable[str]:
        return list(self.order)

    def to_serializable_subset(self) -> DefaultPartitionsSubset:
        return DefaultPartitionsSubset(set(self.subset))


def ordered(keys: Iterable[str], ts: Mapping[str, int]) -> OrderedSubset:
    """The subset of ``keys`` in (ts, name) order; keys without a ts last, by name."""
    names = set(keys)
    subset = OrderedSubset(names)
    subset.order = tuple(sorted(names, key=lambda k: (k not in ts, ts.get(k, 0), k)))
    return subset


def report_in_ts_order(partitions_name: str, ts: Mapping[str, int]) -> None:
    """The next output of ``partitions_name`` in this process (the calling asset's,
    built as it returns) reports its partitions in the order of ``ts``."""
    _TS[partitions_name] = dict(ts)


def landing_partitions(name: str) -> DynamicPartitionsDefinition:
    """The dynamic partitions ``name`` (one per landing file), whose runs report their
    partitions in ts order (module docstring)."""
    install()
    _LANDING.add(name)
    return DynamicPartitionsDefinition(name=name)


def _ordered(original: Callable[..., Any]) -> Callable[..., Any]:
    def key_range_to_subset(key_range: Any, partitions_def: Any, instance: Any) -> Any:
        subset = original(key_range, partitions_def, instance)
        if (isinstance(partitions_def, DynamicPartitionsDefinition)
                and partitions_def.name in _LANDING
                and type(subset) is DefaultPartitionsSubset):
            ts = _TS.pop(partitions_def.name, {})
            return ordered(subset.subset, ts if set(subset.subset) <= set(ts) else {})
        return subset

    return key_range_to_subset


def install() -> None:
    """Wrap Dagster's output subset builder once per process (module docstring)."""
    if _INSTALLED:
        return
    original = getattr(_output, "_key_range_to_subset", None)
    if original is None:
        raise ImportError(
            "dagster._core.execution.context.output._key_range_to_subset is gone: this"
            " Dagster release is not supported (assets.partition_order; pyproject.toml"
            " pins dagster 1.13)")
    _output._key_range_to_subset = _ordered(original)
    _INSTALLED.append(original)
