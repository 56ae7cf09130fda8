"""Staging and draining source updates: the upsert operator (see the submodules).

- :mod:`~upsert_core.drain.stash`: stage updates column-wise (``Stash.stage``).
- :mod:`~upsert_core.drain.styles`: ``ToUpper`` / ``AtTime`` and ``OrderScope``.
- :mod:`~upsert_core.drain.operator`: ``drain_staged_input`` (sort, dedup, emit).
- :mod:`~upsert_core.drain.output`: ``DrainOutput`` (updates and decisions).
- :mod:`~upsert_core.drain.feedback`: ``apply_feedback`` (the state learns from output).
"""

from upsert_core.drain.feedback import GLOBAL_POSITION, apply_feedback
from upsert_core.drain.operator import drain_staged_input, winners
from upsert_core.drain.output import Decision, DrainOutput, OutputUpdate
from upsert_core.drain.stash import SourceUpdate, StagedColumns, Stash
from upsert_core.drain.styles import AtTime, DrainStyle, OrderScope, ToUpper

__all__ = [
    "GLOBAL_POSITION",
    "AtTime",
    "Decision",
    "DrainOutput",
    "DrainStyle",
    "OrderScope",
    "OutputUpdate",
    "SourceUpdate",
    "StagedColumns",
    "Stash",
    "ToUpper",
    "apply_feedback",
    "drain_staged_input",
    "winners",
]
