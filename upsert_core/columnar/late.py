"""Late rows of a global-scope drain: the rows whose order is not past their key's.

CONTRACT.md ("Change data capture", late rows): in the ``global`` order scope a row
whose order value is not greater than the order the state stores for its key BEFORE the
batch (tombstones included) is *late*. It changes nothing (the drain's skip rule already
ignores it: a key's winner is late exactly when every row of the key is) and is kept in
the shard's late collection (``ingest.late``). Only that comparison defines late: a row
that loses to another row of its own batch but is past the stored order is not late.

Invariants:

- :func:`late_rows` looks nothing up in the state again: each row takes its key's
  stored order from the winners' lookup (every row's key has exactly one winner), so
  the cost is one ``locate`` of the batch's rows among its winners.
- A key the state does not hold (never seen) has no stored order: its rows are never
  late. A batch-scope state stores no orders: it has no late rows.
- The indices come back in ascending order (the rows' order in the drained table,
  which is file order for one file's rows).
"""

from __future__ import annotations

import numpy as np

from upsert_core.columnar.state import Index, locate
from upsert_core.errors import InvalidUpsertState
from upsert_core.order_keys import OrderArray


def late_rows(
    hi: np.ndarray,
    lo: np.ndarray,
    orders: OrderArray,
    w_hi: np.ndarray,
    w_lo: np.ndarray,
    w_found: np.ndarray,
    w_stored: OrderArray,
) -> tuple[Index, OrderArray]:
    """The indices of the late rows among the drained rows ``(hi, lo, orders)`` and their
    keys' stored orders.

    ``w_hi, w_lo`` are the batch's winners' keys (sorted, unique: every row's key is
    among them), ``w_found`` whether the state holds each winner's key and ``w_stored``
    its stored order there (the lookup the drain made for its skip rule)."""
    at, present = locate(w_hi, w_lo, hi, lo)
    if not present.all():  # every row's key has a winner, by construction
        raise InvalidUpsertState("a drained row's key is missing from its batch's winners")
    stored = w_stored[at]
    late = np.flatnonzero(w_found[at] & (stored >= orders))
    return late.astype(np.intp), stored[late]
