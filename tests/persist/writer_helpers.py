"""Tests that drive ``append.compare_and_append`` on a bare Machine act as one registered
writer per Machine (the append refuses unregistered writers, see ``persist.write.writers``)."""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from upsert_core.persist.keys import new_writer_id
from upsert_core.persist.state import leases
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.write.append import AppendRequest, AppendResult
from upsert_core.persist.write.append import compare_and_append as _compare_and_append

_WRITERS: WeakKeyDictionary[Machine, str] = WeakKeyDictionary()


def registered_writer(machine: Machine) -> str:
    """The writer id registered for ``machine`` (registered on first use)."""
    writer = _WRITERS.get(machine)
    if writer is None or writer not in machine.state().writers:
        writer = new_writer_id()
        machine.apply(lambda s: leases.register_writer(s, writer, 0, 10**12))
        _WRITERS[machine] = writer
    return writer


def compare_and_append(
    machine: Machine, *args: Any, writer_id: str | None = None, **kwargs: Any
) -> AppendResult:
    """``append.compare_and_append`` of ``AppendRequest(*args, **kwargs)`` as the
    machine's registered writer."""
    writer = writer_id if writer_id is not None else registered_writer(machine)
    return _compare_and_append(machine, AppendRequest(*args, **kwargs), writer_id=writer)
