"""``check``: verify a shard's storage and consolidation invariants.

Storage (meant for a quiescent shard; a concurrent writer or GC may cause a transient
report):

- the stored versions keep ``state_versions.check_invariants`` (contiguous seqnos, a
  readable rollup at ``earliest``, the current state's rollups exist, the current state
  is well formed);
- every blob that a live state references (batch parts, error parts, ``blobref.``
  entries) exists in Blob.

Consolidation, at EVERY readable time ``since <= t < upper``: each row of the snapshot
has multiplicity exactly 1 (no negative, no duplicate rows) and each key has at most
one row. Checked in one streaming pass over ``changes(since, upper)`` (which reports
updates before ``since`` at ``since``): per ``(key, row)`` the running sum of diffs over
time must stay 0 or 1, and per key the number of rows with a positive sum must stay at
most 1 after all updates at each time. Between two change times the collection does not
change, so this covers every readable time without reading a snapshot per time.

Error rows are data, not broken invariants: their count is reported, never a problem.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import ShardError
from upsert_core.persist.keys import shard_prefix
from upsert_core.persist.location import Blob
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.state.state_versions import StateVersions, check_invariants
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA

STORAGE = "storage"
CONSOLIDATION = "consolidation"

MAX_PROBLEMS = 50
"""Problems reported per kind before the rest are only counted."""


class CheckedShard(Protocol):
    """What the check reads of a shard: a :class:`~upsert_core.persist.shard.Shard`
    handle, seen only through these calls (so ``shard`` imports this module, not the
    other way round)."""

    versions: StateVersions

    @property
    def shard_id(self) -> str: ...

    @property
    def blob(self) -> Blob: ...

    def state(self) -> ShardState: ...

    def changes(self, lower: int, upper: int | None = None) -> Iterator[pa.RecordBatch]: ...


@dataclass
class CheckReport:
    """Problems found (empty: every invariant holds) and counts of what was checked."""

    shard_id: str
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    problems_by_kind: dict[str, list[str]] = field(default_factory=dict)
    """The same problems grouped by kind: :data:`STORAGE` or :data:`CONSOLIDATION`
    (callers may add their own kinds, e.g. the upsert state comparison)."""
    notes: list[str] = field(default_factory=list)
    """What a check could not verify and why (not problems; e.g. history GC removed)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, kind: str, message: str) -> None:
        """Record one problem of ``kind``."""
        self.problems.append(message)
        self.problems_by_kind.setdefault(kind, []).append(message)

    def of_kind(self, kind: str) -> list[str]:
        return self.problems_by_kind.get(kind, [])

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"shard": self.shard_id, "ok": self.ok,
                                  "problems": self.problems,
                                  "problems_by_kind": self.problems_by_kind, **self.counts}
        if self.notes:
            out["notes"] = self.notes
        return out


def _first_in_group(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Boolean mask: position i starts a new run of equal values."""
    n = len(values)
    starts = np.ones(n, dtype=bool)
    if n > 1:
        same = pc.equal(values.slice(1), values.slice(0, n - 1))
        starts[1:] = ~np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
    return starts


def _segmented_cumsum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative sums restarting at every True of ``starts``."""
    total = np.cumsum(values)
    before = np.concatenate(([0], total[:-1]))
    offsets = np.maximum.accumulate(np.where(starts, np.arange(len(values)), 0))
    return total - before[offsets]


class _ConsolidationChecker:
    """Checks key-grouped, ``(key, row, ts)``-sorted, consolidated updates."""

    def __init__(self, report: CheckReport) -> None:
        self.report = report
        self.rows = 0
        self.live_rows_at_upper = 0
        self.multiplicity_problems = 0
        self.key_problems = 0

    def _problem(self, kind: str, message: str) -> None:
        count = getattr(self, kind) + 1
        setattr(self, kind, count)
        if count <= MAX_PROBLEMS:
            self.report.add(CONSOLIDATION, message)

    def check(self, table: pa.Table) -> None:
        """Check ``table``, which must hold every update of the keys it contains."""
        n = table.num_rows
        if n == 0:
            return
        self.rows += n
        keys = table.column("key")
        ts = table.column("ts").to_numpy()
        diff = table.column("diff").to_numpy()
        key_start = _first_in_group(keys)
        group_start = key_start | _first_in_group(table.column("row"))
        live = _segmented_cumsum(diff, group_start)
        bad = np.flatnonzero((live < 0) | (live > 1))
        for i in bad[: MAX_PROBLEMS]:
            self._problem(
                "multiplicity_problems",
                f"key {keys[int(i)].as_py().hex()}: a row has multiplicity {int(live[i])}"
                f" at ts {int(ts[i])} (must be 0 or 1)",
            )
        present = (live > 0).astype(np.int64)  # whether the row is in the snapshot
        previous = np.concatenate(([0], present[:-1]))
        previous[group_start] = 0
        delta = present - previous
        group_ends = np.concatenate((group_start[1:], [True]))
        self.live_rows_at_upper += int(present[group_ends].sum())
        key_id = np.cumsum(key_start)
        events = np.flatnonzero(delta != 0)
        if not len(events):
            return
        order = events[np.lexsort((ts[events], key_id[events]))]
        ev_key, ev_ts, ev_delta = key_id[order], ts[order], delta[order]
        new_key = np.concatenate(([True], ev_key[1:] != ev_key[:-1]))
        count = _segmented_cumsum(ev_delta, new_key)
        run_end = np.concatenate(
            ((ev_key[1:] != ev_key[:-1]) | (ev_ts[1:] != ev_ts[:-1]), [True])
        )
        over = np.flatnonzero(run_end & (count > 1))
        for j in over[:MAX_PROBLEMS]:
            first_row = int(order[j])
            self._problem(
                "key_problems",
                f"key {keys[first_row].as_py().hex()}: {int(count[j])} live rows at ts"
                f" {int(ev_ts[j])} (a key has at most one)",
            )


def _check_consolidation(shard: CheckedShard, report: CheckReport) -> None:
    state = shard.state()
    report.counts["readable_times"] = max(0, state.upper - state.since)
    if state.upper <= state.since:
        return
    checker = _ConsolidationChecker(report)
    carry = UPDATE_SCHEMA.empty_table()
    for batch in shard.changes(state.since, state.upper):
        table = pa.concat_tables([carry, pa.Table.from_batches([batch])]).combine_chunks()
        # Output is sorted by key, but one key may continue in the next batch: hold
        # back the last key's rows until its run is complete.
        last = table.column("key")[table.num_rows - 1]
        tail = int(pc.sum(pc.equal(table.column("key"), last)).as_py())
        checker.check(table.slice(0, table.num_rows - tail))
        carry = table.slice(table.num_rows - tail)
    checker.check(carry)
    report.counts["rows_checked"] = checker.rows
    report.counts["live_rows_at_upper"] = checker.live_rows_at_upper


def _check_storage(shard: CheckedShard, report: CheckReport) -> None:
    versions = shard.versions
    for problem in check_invariants(versions):
        report.add(STORAGE, problem)
    entries = versions.live_diffs()
    report.counts["live_diffs"] = len(entries)
    existing: dict[str, int] = {
        m.key: m.size_in_bytes for m in shard.blob.list_keys(shard_prefix(shard.shard_id))
    }
    report.counts["blobs"] = len(existing)
    report.counts["blob_bytes"] = sum(existing.values())
    referenced: set[str] = set()
    try:
        for state in versions.fetch_all_live_states():
            referenced.update(state.referenced_blob_keys())
    except ShardError as exc:
        report.add(STORAGE, f"shard {shard.shard_id!r}: live states unreadable: {exc}")
    missing = sorted(referenced - existing.keys())
    for key in missing[:MAX_PROBLEMS]:
        report.add(
            STORAGE,
            f"shard {shard.shard_id!r}: blob {key!r} is referenced by a live state but missing",
        )
    if len(missing) > MAX_PROBLEMS:
        report.add(STORAGE, f"... and {len(missing) - MAX_PROBLEMS} more missing blobs")
    report.counts["referenced_blobs"] = len(referenced)


def check_shard(shard: CheckedShard) -> CheckReport:
    """Every broken storage or consolidation invariant of ``shard`` (see module doc)."""
    report = CheckReport(shard_id=shard.shard_id)
    _check_storage(shard, report)
    state = shard.state()
    report.counts.update(
        seqno=state.seqno,
        since=state.since,
        upper=state.upper,
        batches=len(state.batches),
        updates=state.num_updates(),
        error_rows=state.num_errors(),
    )
    try:
        _check_consolidation(shard, report)
    except ShardError as exc:
        report.add(CONSOLIDATION, f"shard {shard.shard_id!r}: cannot read changes: {exc}")
    return report
