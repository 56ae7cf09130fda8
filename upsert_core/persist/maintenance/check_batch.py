"""Batch-scoped checks: the storage and consolidation invariants of the changes one
ingest run committed, ``lower <= ts < upper``, read without the shard's history.

:func:`check_shard` (``persist/maintenance/check.py``) reads every readable time and lists every
blob, so its cost grows with the shard's age. The checks here read only what the run
added, so their cost follows the batch:

Storage (kind :data:`~upsert_core.persist.maintenance.check.STORAGE`), :func:`read_new_updates`:

- every part of the batches in ``[lower, upper)`` (blob or inline) exists, decodes as
  Parquet with the update schema and as many rows as the state says, holds only
  16-byte keys, nonzero diffs and times inside its batch's ``[lower, upper)``, and is
  sorted by ``(key, row, ts)`` (what the streaming merge relies on);
- every error part committed at a time in ``[lower, upper)`` exists and decodes with
  the error schema and the recorded number of rows.

Consolidation (kind :data:`~upsert_core.persist.maintenance.check.CONSOLIDATION`),
:func:`check_batch_consolidated`: after summing the diffs of equal
``(key, row, ts)`` the diffs are +1 or -1, and per ``(key, ts)`` there is at most one
retraction and at most one insertion. Whether each retraction retracts the row that
was live, and no insertion lands on a live row, needs the keys' previous rows: that is
the upsert state's business (``ingest.verify.check_new_batch``, which reads them from
the touched buckets' checkpoints, never from a snapshot).

History walk, :func:`configs_at_uppers`: the shard's ``config`` (which references the
upsert state checkpoints) as it was at given uppers, found by undoing the state diffs
from the current version backwards until the diff that moved the upper off the oldest
asked-for upper. It reads only the diffs written since then (the run's own commits,
plus whatever else committed meanwhile: heartbeats, GC), in pages that double.

Cost model: one decode of each new part (O(rows the run wrote)), one decode of each of
the run's error parts, a sort of the new updates, and O(diffs since ``lower``) state
diffs. Nothing before ``lower`` is read, no blob listing is made. A batch that
compaction has already merged with older history (a GC racing the check) is read
whole and its times filtered; the module reports it in ``notes``.

Pure persist: no upsert state, no Dagster.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import CorruptData, ShardError
from upsert_core.persist.keys import consensus_key
from upsert_core.persist.maintenance.check import CONSOLIDATION, MAX_PROBLEMS, STORAGE, CheckReport
from upsert_core.persist.state.codec_state import decode_diff
from upsert_core.persist.state.state import HollowBatch, InlinePart, Part, ShardState
from upsert_core.persist.state.state_diff import Delete, Insert, Update
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA, consolidate, key_words
from upsert_core.persist.write.parts import KEY_BYTES, OpenPart, read_error_part

if TYPE_CHECKING:
    from upsert_core.persist.location import Blob
    from upsert_core.persist.shard import Shard

FIRST_PAGE = 32
"""State diffs read in the first page of the backward walk (pages then double)."""


def _where(part: Part) -> str:
    return "an inline part" if isinstance(part, InlinePart) else f"part {part.key}"


def _unsorted_at(table: pa.Table) -> int | None:
    """The first index whose row sorts before the previous one by ``(key, row, ts)``."""
    n = table.num_rows
    if n < 2:
        return None
    key, row, ts = (table.column(c).combine_chunks() for c in ("key", "row", "ts"))

    def pair(fn: str, col: pa.Array) -> np.ndarray:
        out = pc.call_function(fn, [col.slice(1), col.slice(0, n - 1)])
        return np.asarray(out.to_numpy(zero_copy_only=False), bool)

    key_eq = pair("equal", key)
    row_eq = key_eq & pair("equal", row)
    bad = pair("less", key) | (key_eq & pair("less", row)) | (row_eq & pair("less", ts))
    hits = np.flatnonzero(bad)
    return None if not len(hits) else int(hits[0]) + 1


def _check_part(
    report: CheckReport, blob: Blob, shard: str, batch: HollowBatch, part: Part, lower: int,
    upper: int,
) -> pa.Table | None:
    """The part's updates with ``lower <= ts < upper``, or None (problems reported)."""
    where = f"shard {shard!r}: batch [{batch.lower}, {batch.upper}) {_where(part)}"
    try:
        opened = OpenPart(blob, part, shard=shard)
        try:
            tables = [opened.read_row_group(i) for i in range(opened.num_row_groups)]
        finally:
            opened.close()
    except CorruptData as exc:
        report.add(STORAGE, f"{where}: {exc}")
        return None
    table = pa.concat_tables(tables) if tables else UPDATE_SCHEMA.empty_table()
    bad: list[str] = []
    if table.num_rows:
        lengths = pc.min_max(pc.binary_length(table.column("key"))).as_py()
        if lengths["min"] != KEY_BYTES or lengths["max"] != KEY_BYTES:
            bad.append(f"keys of {lengths['min']}..{lengths['max']} bytes (not {KEY_BYTES})")
        times = pc.min_max(table.column("ts")).as_py()
        # Compaction may have advanced times up to the batch's since, never below lower.
        if times["min"] < batch.lower or times["max"] > max(batch.upper - 1, batch.since):
            bad.append(f"updates at ts {times['min']}..{times['max']}")
        if pc.any(pc.equal(table.column("diff"), 0)).as_py():
            bad.append("a zero diff")
        unsorted = _unsorted_at(table)
        if unsorted is not None:
            bad.append(f"rows out of (key, row, ts) order at row {unsorted}")
    for problem in bad:
        report.add(STORAGE, f"{where} holds {problem}")
    if bad:
        return None
    if batch.lower < lower or batch.upper > upper:
        ts = table.column("ts")
        table = table.filter(pc.and_(pc.greater_equal(ts, lower), pc.less(ts, upper)))
    return table


def read_new_updates(
    shard: Shard, state: ShardState, lower: int, upper: int, report: CheckReport
) -> pa.Table:
    """Every update the batches in ``[lower, upper)`` hold (each part checked, see the
    module docstring), concatenated in no particular order; the run's error parts are
    checked too. Problems go to ``report``; a broken part contributes nothing."""
    tables: list[pa.Table] = []
    parts = 0
    for batch in state.batches:
        if batch.upper <= lower or batch.lower >= upper:
            continue
        if batch.lower < lower or batch.upper > upper:
            report.notes.append(
                f"batch [{batch.lower}, {batch.upper}) was compacted with times outside"
                f" [{lower}, {upper}); it was read whole"
            )
        for part in batch.parts:
            parts += 1
            table = _check_part(
                report, shard.blob, shard.shard_id, batch, part, lower, upper
            )
            if table is not None and table.num_rows:
                tables.append(table.select(UPDATE_SCHEMA.names))
    error_parts = 0
    for err in state.errors:
        if not lower <= err.ts < upper:
            continue
        error_parts += 1
        try:
            rows = read_error_part(shard.blob, err.part, shard=shard.shard_id).num_rows
        except CorruptData as exc:
            report.add(STORAGE, f"error part at ts {err.ts}: {exc}")
            continue
        if rows != err.num_errors:
            report.add(STORAGE, f"error part at ts {err.ts} holds {rows} rows but the"
                                f" state says {err.num_errors}")
    report.counts["new_parts"] = parts
    report.counts["new_error_parts"] = error_parts
    updates = pa.concat_tables(tables) if tables else UPDATE_SCHEMA.empty_table()
    report.counts["new_updates"] = updates.num_rows
    return updates


def check_batch_consolidated(updates: pa.Table, report: CheckReport) -> pa.Table:
    """The consolidated form of ``updates`` (sorted by ``(key, row, ts)``), after
    reporting every ``(key, row, ts)`` whose diffs do not sum to +-1 (or 0) and every
    ``(key, ts)`` with more than one retraction or insertion."""
    table = consolidate(updates)
    n = table.num_rows
    if n == 0:
        return table
    diff = table.column("diff").to_numpy()
    keys = table.column("key")
    ts = table.column("ts").to_numpy()
    for i in np.flatnonzero(np.abs(diff) != 1)[:MAX_PROBLEMS]:
        report.add(CONSOLIDATION, f"key {keys[int(i)].as_py().hex()}: a row has diff"
                                  f" {int(diff[i])} at ts {int(ts[i])} (must be +1 or -1)")
    words = key_words(keys)
    if words is None:  # keys of other lengths were reported by the storage pass
        return table
    hi, lo = words
    # Group by (key, ts): the table is sorted by (key, row, ts), so sort again by ts
    # within key (stable) and count the signs per group.
    order = np.lexsort((ts, lo, hi))
    h, low, t, d = hi[order], lo[order], ts[order], diff[order]
    start = np.ones(n, bool)
    start[1:] = (h[1:] != h[:-1]) | (low[1:] != low[:-1]) | (t[1:] != t[:-1])
    group = np.cumsum(start) - 1
    groups = int(group[-1]) + 1
    inserts = np.bincount(group, weights=(d > 0), minlength=groups)
    retracts = np.bincount(group, weights=(d < 0), minlength=groups)
    first = np.flatnonzero(start)
    for g in np.flatnonzero((inserts > 1) | (retracts > 1))[:MAX_PROBLEMS]:
        i = int(order[first[g]])
        report.add(
            CONSOLIDATION,
            f"key {keys[i].as_py().hex()}: {int(inserts[g])} insertion(s) and"
            f" {int(retracts[g])} retraction(s) at ts {int(ts[i])} (at most one each)",
        )
    return table


def configs_at_uppers(
    shard: Shard, state: ShardState, uppers: Collection[int]
) -> dict[int, Mapping[str, str]]:
    """The shard's config at each of ``uppers`` (as of the newest version with that
    upper, not after ``state``), found by undoing state diffs backwards from ``state``
    (see the module docstring). Uppers the live diffs no longer reach (truncated by GC)
    or that the shard never had are missing from the result."""
    wanted = {u for u in uppers if u <= state.upper}
    found: dict[int, Mapping[str, str]] = {}
    config = dict(state.config)
    current_upper = state.upper
    if current_upper in wanted:
        found[current_upper] = dict(config)
    if not wanted - found.keys():
        return found
    lowest = min(wanted)
    key = consensus_key(shard.shard_id)
    newest = state.seqno
    page = FIRST_PAGE
    while newest >= 1:
        start = max(1, newest - page + 1)
        entries = [e for e in shard.consensus.scan(key, start, newest - start + 1)
                   if e.seqno <= newest]
        if not entries or entries[-1].seqno != newest:
            return found  # truncated by GC: the older versions are gone
        for entry in reversed(entries):
            diff = decode_diff(entry.data)
            if diff.seqno_to != entry.seqno:
                raise ShardError(f"consensus entry {entry.seqno} of shard {shard.shard_id!r}"
                                 f" holds the diff {diff.seqno_from}->{diff.seqno_to}")
            for change in diff.changes:
                op = change.change
                if change.field == "upper" and isinstance(op, Update):
                    current_upper = int(op.before)
                elif change.field == "config":
                    name = str(change.key)
                    if isinstance(op, Insert):
                        config.pop(name, None)
                    elif isinstance(op, (Update, Delete)):
                        config[name] = op.before
            if current_upper in wanted and current_upper not in found:
                found[current_upper] = dict(config)
            if current_upper < lowest or not wanted - found.keys():
                return found
        if entries[0].seqno != start:
            return found  # truncated by GC below this page: the older versions are gone
        newest = start - 1
        page *= 2
    return found
