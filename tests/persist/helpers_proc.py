"""Helpers for the shard tests, and subprocess entry points for the process tests.

Run as ``python -m tests.persist.helpers_proc COMMAND ARGS_JSON``; every command prints
one JSON line on stdout when it finishes (or, for the crash commands, ``READY`` lines
before the test kills it with SIGKILL).

Commands:

- ``append``: append ``count`` one-file batches named ``{writer}-{i}`` to a shard,
  racing other processes: each attempt appends at the upper it last read; a lost race
  deletes its parts (``Shard.append``) and retries at the new upper.
- ``write_then_hang``: write the parts (and an error part) of the next batch, print
  their keys and ``READY``, then sleep until killed (killed between writing parts and
  the compare-and-set).
- ``gc_then_die``: run GC with a wrapper that SIGKILLs this process at a chosen point
  (``delete:N``: before the N-th blob delete; ``truncate``: before truncating;
  ``after_truncate``: right after truncating).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from upsert_core.persist.keys import shard_prefix
from upsert_core.persist.location import (
    Blob,
    BlobMetadata,
    CasResult,
    Consensus,
    SeqNo,
    VersionedData,
)
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import DelegatingBlob

Update = tuple[bytes, bytes, int, int]


# --- helpers for tests ----------------------------------------------------------------


def key(i: int) -> bytes:
    """A 16-byte upsert key for a small integer."""
    return i.to_bytes(16, "big")


def updates_table(updates: Iterable[Update]) -> pa.Table:
    rows = list(updates)
    return pa.table(
        {
            "key": pa.array([u[0] for u in rows], pa.binary()),
            "row": pa.array([u[1] for u in rows], pa.binary()),
            "ts": pa.array([u[2] for u in rows], pa.int64()),
            "diff": pa.array([u[3] for u in rows], pa.int64()),
        }
    )


def rows_of(table: pa.Table) -> list[Update]:
    return sorted(
        zip(
            table.column("key").to_pylist(),
            table.column("row").to_pylist(),
            table.column("ts").to_pylist(),
            table.column("diff").to_pylist(),
            strict=True,
        )
    )


def upsert_updates(model: dict[bytes, bytes], ts: int, ops: Iterable[tuple[int, bytes | None]]
                   ) -> list[Update]:
    """Updates (and the new ``model``) for upserts/deletes ``(key index, row or None)``."""
    out: list[Update] = []
    for k, row in ops:
        kb = key(k)
        old = model.get(kb)
        if old == row:
            continue
        if old is not None:
            out.append((kb, old, ts, -1))
            del model[kb]
        if row is not None:
            out.append((kb, row, ts, 1))
            model[kb] = row
    return out


def blob_keys(blob: Blob, shard: str) -> set[str]:
    return {m.key for m in blob.list_keys(shard_prefix(shard))}


def data_blob_keys(blob: Blob, shard: str) -> set[str]:
    """The shard's part and error part blobs."""
    prefix = shard_prefix(shard)
    return {k for k in blob_keys(blob, shard) if k[len(prefix):].split("/")[0] in
            ("part", "errors")}


def live_referenced(shard: Shard) -> set[str]:
    """Blob keys referenced by any live state (parts, errors, blobrefs)."""
    keys: set[str] = set()
    for state in shard.versions.fetch_all_live_states():
        keys.update(state.referenced_blob_keys())
    return keys


def live_rollup_keys(shard: Shard) -> set[str]:
    earliest = shard.versions.earliest_live_seqno() or 0
    keys: set[str] = set()
    for state in shard.versions.fetch_all_live_states():
        keys.update(r.key for s, r in state.rollups.items() if s >= earliest)
    return keys


class RecordingBlob(DelegatingBlob):
    """A Blob wrapper that records every deleted key (and can run hooks)."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.deleted: list[str] = []
        self.after_list: list[Any] = []  # callables run once after the next list_keys

    def delete(self, key: str) -> int | None:
        size = self.inner.delete(key)
        if size is not None:
            self.deleted.append(key)
        return size

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        listed = list(self.inner.list_keys(prefix))
        hooks, self.after_list = self.after_list, []
        for hook in hooks:
            hook()
        return iter(listed)


# --- subprocess entry points ------------------------------------------------------------


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class _DyingBlob(RecordingBlob):
    def __init__(self, inner: Blob, die_before_delete: int | None) -> None:
        super().__init__(inner)
        self.die_before_delete = die_before_delete
        self.deletes = 0

    def delete(self, key: str) -> int | None:
        self.deletes += 1
        if self.die_before_delete is not None and self.deletes >= self.die_before_delete:
            _die()
        return super().delete(key)


class _DyingConsensus:
    def __init__(self, inner: Consensus, when: str | None) -> None:
        self.inner = inner
        self.when = when

    def head(self, key: str) -> VersionedData | None:
        return self.inner.head(key)

    def compare_and_set(self, key: str, expected: SeqNo | None, new: VersionedData
                        ) -> CasResult:
        return self.inner.compare_and_set(key, expected, new)

    def scan(self, key: str, from_seqno: SeqNo, limit: int) -> list[VersionedData]:
        return self.inner.scan(key, from_seqno, limit)

    def truncate(self, key: str, seqno: SeqNo) -> int:
        if self.when == "truncate":
            _die()
        deleted = self.inner.truncate(key, seqno)
        if self.when == "after_truncate":
            _die()
        return deleted

    def list_keys(self) -> Iterator[str]:
        return self.inner.list_keys()


def _open(args: dict[str, Any]) -> Shard:
    return Shard.open(
        open_consensus(args["consensus"]), open_blob(args["blob"]), args["shard"],
        inline_threshold=0,
    )


def cmd_append(args: dict[str, Any]) -> dict[str, Any]:
    shard = _open(args)
    go = Path(args["go_file"])
    while not go.exists():
        time.sleep(0.005)
    committed: dict[str, int] = {}
    mismatches = 0
    for i in range(args["count"]):
        name = f"{args['writer']}-{i}"
        while True:
            upper = shard.upper
            rows = [(hashlib.md5(name.encode()).digest(), name.encode(), upper, 1)]
            result = shard.append(updates_table(rows), upper, ingested_files={name: upper})
            if result.committed:
                committed[name] = upper
                break
            mismatches += 1
    return {"committed": committed, "mismatches": mismatches}


def cmd_write_then_hang(args: dict[str, Any]) -> dict[str, Any]:
    shard = _open(args)
    upper = shard.upper
    batch = shard.write_batch(updates_table([(key(1), b"doomed", upper, 1)]), upper, upper + 1)
    errors = shard.write_errors(
        upper, pa.table({"file": ["doomed"], "row": [1], "reason": ["bad"]})
    )
    keys = [p.key for p in batch.parts if hasattr(p, "key")]
    keys += [errors.part.key] if hasattr(errors.part, "key") else []
    print(json.dumps({"leaked": keys}), flush=True)
    print("READY", flush=True)
    time.sleep(600)
    return {}


def cmd_gc_then_die(args: dict[str, Any]) -> dict[str, Any]:
    point: str = args["point"]
    die_delete = int(point.split(":")[1]) if point.startswith("delete:") else None
    consensus = _DyingConsensus(open_consensus(args["consensus"]), point)
    blob = _DyingBlob(open_blob(args["blob"]), die_delete)
    shard = Shard.open(consensus, blob, args["shard"], create=False)
    report = shard.gc(retain=args.get("retain"), leak_grace_ms=0)
    return {"survived": True, "report": report.as_dict()}


COMMANDS = {
    "append": cmd_append,
    "write_then_hang": cmd_write_then_hang,
    "gc_then_die": cmd_gc_then_die,
}


def main(argv: list[str]) -> int:
    command, raw = argv[1], argv[2]
    result = COMMANDS[command](json.loads(raw))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
