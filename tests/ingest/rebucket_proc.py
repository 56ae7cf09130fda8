"""A rebucket in a process of its own that kills itself (SIGKILL) at a chosen point, for
``test_rebucket_killed``: ``python -m tests.ingest.rebucket_proc ROOT BUCKETS POINT``.

``ROOT`` holds the shard ``s`` (``consensus.db``, ``blob/``). Points:

- ``part:K``: as the K-th relabelled part blob is about to be written;
- ``checkpoint:K``: as the K-th new checkpoint or tombstone set is about to be written
  (every part is written by then);
- ``before_commit``: everything written, the commit not sent;
- ``after_commit``: the commit landed, nothing after it ran (no clean-up, no release
  of the writer registration).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import upsert_core.ingest.rebucket as rebucket_module
from upsert_core.ingest import IngestRequest
from upsert_core.persist.keys import CHECKPOINT_DIR, PART_DIR
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import DelegatingBlob


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class DyingBlob(DelegatingBlob):
    """Dies as the ``k``-th blob under ``/<directory>/`` is about to be written."""

    def __init__(self, inner: Any, directory: str, k: int) -> None:
        super().__init__(inner)
        self.directory, self.k, self.seen = f"/{directory}/", k, 0

    def set(self, key: str, value: bytes) -> None:
        if self.directory in key:
            self.seen += 1
            if self.seen >= self.k:
                die()
        self.inner.set(key, value)


def main(argv: list[str]) -> int:
    root, buckets, point = argv[1], int(argv[2]), argv[3]
    blob: Any = open_blob(f"file://{root}/blob")
    kind, _, k = point.partition(":")
    if kind in ("part", "checkpoint"):
        blob = DyingBlob(blob, PART_DIR if kind == "part" else CHECKPOINT_DIR, int(k))
    real = rebucket_module.commit_relayout

    def commit(*args: Any, **kwargs: Any) -> Any:
        if point == "before_commit":
            die()
        result = real(*args, **kwargs)
        if point == "after_commit" and result.committed:
            die()
        return result

    rebucket_module.commit_relayout = commit  # type: ignore[assignment]
    shard = Shard.open(open_consensus(f"sqlite:///{root}/consensus.db"), blob, "s",
                       create=False)
    # Every part a blob, as the test's ingests wrote them (small parts are inlined).
    rebucket_module.rebucket(shard, buckets, request=IngestRequest(inline_threshold=0))
    print("survived", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
