"""How many bytes this process has read from each landing file (by URL).

Every read of a landing file's bytes goes through :class:`~upsert_core.landing.LandingFile`
(whole reads, ranged reads, the ledger's digest) or a reader it hands out, and each
adds what it read here, so an engine can report the landing bytes a file cost
(``FileRead.landing_bytes``) by taking :func:`bytes_read` before and after its reads.

Invariants:

- Counts only grow; a count is the number of bytes actually returned by the storage
  (a local ``read`` or an S3 response body), not the size of the file.
- Thread-safe: threads of one process may read different files at once. A count is
  per process: Spark tasks report their own deltas to the driver.
"""

from __future__ import annotations

import io
import threading
from typing import Any, BinaryIO

_lock = threading.Lock()
_counts: dict[str, int] = {}


def add(url: str, n: int) -> None:
    """Record that ``n`` bytes of the landing file at ``url`` were read."""
    if n <= 0:
        return
    with _lock:
        _counts[url] = _counts.get(url, 0) + n


def bytes_read(url: str) -> int:
    """Bytes of the landing file at ``url`` this process has read so far."""
    with _lock:
        return _counts.get(url, 0)


class CountingReader(io.RawIOBase):
    """A read-only, seekable file over ``fh`` (an open binary file) that adds every byte
    it returns to ``url``'s count; for readers such as pyarrow's that take a file."""

    def __init__(self, fh: BinaryIO, url: str) -> None:
        super().__init__()
        self._fh = fh
        self._url = url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def readinto(self, buffer: Any) -> int:
        data = self._fh.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        add(self._url, n)
        return n

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        add(self._url, len(data))
        return data

    def close(self) -> None:
        self._fh.close()
        super().close()
