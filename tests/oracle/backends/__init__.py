"""Implementations of the upsert ``StateBackend`` protocol.

- ``InMemoryBackend``: a dict; fastest, for state that fits in memory.
- ``SqliteBackend``: one SQLite file; for state larger than memory and across restarts.

Both pass the same conformance suite (``tests/core/test_backends.py``) and report
identical sizes (``StateValue.memory_size()``, which equals the encoded length).
"""

from tests.oracle.backends.memory import InMemoryBackend
from tests.oracle.backends.sqlite import SqliteBackend
from tests.oracle.state.backend import StateBackend

__all__ = ["InMemoryBackend", "SqliteBackend", "StateBackend"]
