"""``OrderScope``: how long a key's order value is remembered (CONTRACT.md
``--order-scope``).

- ``BATCH``: the state keeps no order once a batch is applied, so a later batch always
  overrides (Materialize's feedback-upsert semantics).
- ``GLOBAL``: the state keeps each key's order value, tombstones included, and a row
  whose order value is not greater than the stored one is ignored.
"""

from __future__ import annotations

import enum


class OrderScope(enum.Enum):
    """How long an order value is remembered (CONTRACT.md ``--order-scope``)."""

    BATCH = "batch"
    GLOBAL = "global"
