"""An in-process :class:`~upsert_core.persist.location.Blob` for unit tests.

Invariants kept: every operation happens under one lock, so ``set`` is atomic and all
operations are linearizable; ``delete`` of a missing key returns ``None``; values are
stored as immutable ``bytes`` copies, so callers cannot mutate what was stored.
``open_reader`` (ranged reads) returns an in-memory reader over the bytes stored at
that moment: like a local file kept open, it outlives a later delete or overwrite.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

from upsert_core.errors import InvalidUsage
from upsert_core.persist.location import BlobMetadata, BlobReader


def check_blob_key(key: str) -> None:
    """Raise :class:`InvalidUsage` unless ``key`` is a non-empty string."""
    if not isinstance(key, str) or not key:
        raise InvalidUsage(f"blob key must be a non-empty string, got {key!r}")


def blob_view(value: bytes | memoryview) -> memoryview:
    """``value`` as a flat byte view, without copying; raise :class:`InvalidUsage` for
    anything that is not bytes-like (a str, a list, a strided or typed array)."""
    if isinstance(value, str):
        raise InvalidUsage("blob value must be bytes, got str")
    try:
        view = memoryview(value)
    except TypeError:
        raise InvalidUsage(f"blob value must be bytes, got {type(value).__name__}") from None
    if not view.c_contiguous:
        raise InvalidUsage("blob value must be contiguous bytes")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def check_blob_value(value: bytes | memoryview) -> bytes:
    """Return ``value`` as ``bytes`` (copied unless it is bytes already); raise
    :class:`InvalidUsage` for non-bytes-like."""
    if isinstance(value, bytes):
        return value
    return bytes(blob_view(value))


class MemoryBlob:
    """A thread-safe, non-durable blob store kept in a dict."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        check_blob_key(key)
        with self._lock:
            return self._data.get(key)

    def open_reader(self, key: str) -> BlobReader | None:
        check_blob_key(key)
        with self._lock:
            data = self._data.get(key)
        return None if data is None else io.BytesIO(data)

    def set(self, key: str, value: bytes | memoryview) -> None:
        check_blob_key(key)
        value = check_blob_value(value)
        with self._lock:
            self._data[key] = value

    def delete(self, key: str) -> int | None:
        check_blob_key(key)
        with self._lock:
            old = self._data.pop(key, None)
        return None if old is None else len(old)

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        with self._lock:
            found = [BlobMetadata(k, len(v)) for k, v in self._data.items() if k.startswith(prefix)]
        found.sort(key=lambda m: m.key)
        return iter(found)
