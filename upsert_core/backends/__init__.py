"""Implementations of the upsert ``StateBackend`` protocol.

- ``InMemoryBackend``: a dict; fastest, for state that fits in memory.
- ``SqliteBackend``: one SQLite file; for state larger than memory and across restarts.

Both pass the same conformance suite (``tests/core/test_backends.py``) and report
identical sizes (``StateValue.memory_size()``, which equals the encoded length).
"""

from upsert_core.backends.memory import InMemoryBackend
from upsert_core.backends.sqlite import SqliteBackend
from upsert_core.state.backend import StateBackend

__all__ = ["InMemoryBackend", "SqliteBackend", "StateBackend"]
