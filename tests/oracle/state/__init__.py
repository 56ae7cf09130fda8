"""Upsert state: ``StateValue``, ``UpsertState``, statistics and the backend protocol.

The modules: ``value`` (the per-key state and its snapshot accumulator), ``stats`` (put,
get and merge statistics and the records passed to backends), ``backend`` (the
``StateBackend`` protocol), ``upsert_state`` (the wrapper that consolidates snapshot
and feedback chunks), ``chunk`` (the column-wise fold behind that consolidation) and
``gc_pause`` (no cyclic GC during bulk steps). Implementations of the protocol live in
``tests.oracle.backends``.
"""

from upsert_core.codec import UpsertKey
from tests.oracle.state.backend import StateBackend
from tests.oracle.state.stats import (
    ABSENT,
    GetStats,
    MergeStats,
    PutStats,
    PutValue,
    ValueAndSize,
    ValueMetadata,
)
from tests.oracle.state.upsert_state import UpsertState
from tests.oracle.state.value import STATE_FORMAT_VERSION, OrderKey, StateValue, order_ge

__all__ = [
    "ABSENT",
    "STATE_FORMAT_VERSION",
    "GetStats",
    "MergeStats",
    "OrderKey",
    "PutStats",
    "PutValue",
    "StateBackend",
    "StateValue",
    "UpsertKey",
    "UpsertState",
    "ValueAndSize",
    "ValueMetadata",
    "order_ge",
]
