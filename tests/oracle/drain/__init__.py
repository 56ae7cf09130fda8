"""Staging and draining source updates: the upsert operator (see the submodules).

- :mod:`~tests.oracle.drain.stash`: stage updates column-wise (``Stash.stage``).
- :mod:`~tests.oracle.drain.styles`: ``ToUpper`` / ``AtTime`` and ``OrderScope``.
- :mod:`~tests.oracle.drain.operator`: ``drain_staged_input`` (sort, dedup, emit).
- :mod:`~tests.oracle.drain.output`: ``DrainOutput`` (updates and decisions).
- :mod:`~tests.oracle.drain.feedback`: ``apply_feedback`` (the state learns from output).
"""

from tests.oracle.drain.feedback import GLOBAL_POSITION, apply_feedback
from tests.oracle.drain.operator import drain_staged_input, winners
from tests.oracle.drain.output import Decision, DrainOutput, OutputUpdate
from tests.oracle.drain.stash import SourceUpdate, StagedColumns, Stash
from tests.oracle.drain.styles import AtTime, DrainStyle, OrderScope, ToUpper

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
