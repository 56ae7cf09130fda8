"""A run's per-partition materialization events of the landing partitions are stored in
file-name order, which is the order the run applied the files in (ts order).

Dagster emits one materialization per partition of a run from the asset's output, in
the order the run's partition subset iterates; for dynamic partitions that subset is a
Python ``set`` of the keys, so a 3-file backfill stored its events ts1, ts2, ts0 and the
UI's "Latest materialization" named an earlier file than the run's last (issue 23).
Dagster has no setting for that order, so this module wraps the one function that
builds an output's partition subset (``dagster._core.execution.context.output.
_key_range_to_subset``, dagster 1.13) and, for partitions definitions registered here
(:func:`landing_partitions`), hands the output a subset whose keys iterate sorted.

Invariants:

- Only the order changes: the ordered subset holds exactly the keys Dagster computed,
  compares equal to Dagster's own, and only the output context of a step sees it (it is
  never serialized; every set operation on it yields Dagster's plain subset).
- Only the partitions definitions made by :func:`landing_partitions` are affected; any
  other asset in the process keeps Dagster's behaviour.
- Within one run files are applied in name order (``assets.ingest_step``), so name order
  is ts order for every file the run applied. A partition of the run's range applied
  by an earlier run (a late file's neighbours) is ordered by name too.
- Should a Dagster release move that function, :func:`install` raises at import (the
  version range in ``pyproject.toml`` pins 1.13) and
  ``tests/dagster/test_backfill.py::test_a_backfills_events_are_stored_in_ts_order``
  fails if the order is lost another way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dagster import DynamicPartitionsDefinition
from dagster._core.definitions.partitions.subset.default import DefaultPartitionsSubset
from dagster._core.execution.context import output as _output

_LANDING: set[str] = set()
_INSTALLED: list[Callable[..., Any]] = []


class NameOrderedSubset(DefaultPartitionsSubset):
    """Dagster's default subset whose keys iterate in name order."""

    def get_partition_keys(self) -> Iterable[str]:
        return sorted(self.subset)

    def to_serializable_subset(self) -> DefaultPartitionsSubset:
        return DefaultPartitionsSubset(set(self.subset))


def landing_partitions(name: str) -> DynamicPartitionsDefinition:
    """The dynamic partitions ``name`` (one per landing file), whose runs report their
    partitions in name order."""
    install()
    _LANDING.add(name)
    return DynamicPartitionsDefinition(name=name)


def _ordered(original: Callable[..., Any]) -> Callable[..., Any]:
    def key_range_to_subset(key_range: Any, partitions_def: Any, instance: Any) -> Any:
        subset = original(key_range, partitions_def, instance)
        if (isinstance(partitions_def, DynamicPartitionsDefinition)
                and partitions_def.name in _LANDING
                and type(subset) is DefaultPartitionsSubset):
            return NameOrderedSubset(set(subset.subset))
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
