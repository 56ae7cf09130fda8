"""Does the upsert state equal the consolidated shard at its upper?

The ingest commits, with every batch, a checkpoint of each bucket's upsert state as of
the new upper (``upsert_core.ingest.checkpoint``). This module reads those checkpoints
back and compares them with the shard's own consolidated snapshot at ``upper - 1``:

- the checkpoints must be current (``checkpoint.upper`` equals the shard's upper);
- every checkpoint must load (right shard, bucket, bucket count, order scope; keys in
  their bucket; values decoded);
- a checkpoint may stand on an older *base* (``checkpoint.base.<b>``, order scope
  ``batch``): the state at the upper is then the checkpoint plus the shard's changes
  since the base, replayed exactly as the ingest does (``ingest.replay``), which also
  verifies that those changes fit the checkpoint;
- the live values of all buckets together must be exactly the snapshot's rows: the
  same keys, byte-identical rows, each with multiplicity 1. Tombstones (order scope
  ``global``) are state only; they have no row in the shard and are not compared;
- order scope ``global``: every live key's stored order must be the order value of its
  row (the row keeps the order column), decoded as one column with the shard's source
  schema exactly as rehydration reads it (``rehydrate.order_values``). A stored order
  the rows contradict would make the next ingest ignore newer data (or apply older
  data). A tombstone's order has no row to be checked against and is taken as stored,
  but the bucket's recorded tombstone set (``ingest.tombstones``) must load and hold
  exactly the state's tombstones, keys and orders, since a rebuild relies on it;
- every typed part of the shard keeps what its footer promises, since the typed
  snapshot (``persist.read.typed_read``) trusts it (``verify_typed``): its bucket label's N is
  the shard's bucket count and its keys lie in its bucket, its value columns are columns
  of the shard's schema with their types and equal the decoded rows, and a part that
  says ``consolidated`` is. Read part by part, one row group at a time.

:func:`compare_state` is the full check: used by ``upsertctl check`` and by the
scheduled, non-blocking Dagster check ``full_state_matches_shard``. It holds the state
and the snapshot in memory, like an ingest's rehydration would, so its cost follows the
table and the shard's history.

Batch-scoped checks (the blocking Dagster checks after every ingest run):
:func:`check_new_batch` checks what one run committed, ``start_upper <= ts < upper``,
and nothing else. On top of ``persist.maintenance.check_batch`` (the run's parts exist, decode and
consolidate; kinds ``storage`` and ``consolidation``), the run's typed parts keep their
footers' promises as in the full check (``verify_typed``; kind ``storage``; a part that
does not even open is left to ``check_batch``), and :func:`compare_touched_buckets`
verifies, for every *touched* bucket (one with changes in the batch, or whose
checkpoint reference, or in the batch scope its base, changed during the run):

- the batch's changes fit the bucket's state before the run (kind ``consolidation``):
  per key in time order each retraction retracts exactly the row that was live, and no
  insertion lands on a live row without its retraction (``columnar.apply_changes``).
  The state before the run comes from the checkpoint chain: the checkpoint the shard's
  config referenced at ``start_upper`` (found by undoing the run's state diffs,
  ``check_batch.configs_at_uppers``) plus, in the batch scope, the changes since its
  base (``ingest.replay``), never from a snapshot;
- the state committed at ``upper`` (its checkpoint, digest verified on load, plus the
  changes since its base) equals, key for key and row for row, that previous state
  plus the batch's changes (kind ``state``). A bucket that kept its checkpoint base
  through the run is that computation by construction, so only its chain is checked.
  In the global scope the shard holds no tombstones: the live rows are compared, and
  each live key's stored order must equal the order decoded from its row (as in the
  full check); tombstones are not compared.

Untouched buckets are not read. Cost: O(touched buckets' states (in the global scope
their live rows are decoded once, as whole columns, for the orders) + the changes since
their checkpoint bases, which the ingest bounds by ``REPLAY_FRACTION`` of a base and
``MAX_REPLAY_BATCHES`` batches + the batch's updates (read twice: once more for the typed
parts' promises) + the state diffs since
``start_upper``): it follows the batch and the bucket sizes, never the shard's age.
What cannot be verified without history (the run's first state diffs truncated by a
concurrent GC, the state before the run not current because something else appended,
a checkpoint the ingest itself found unusable and rebuilt, a rebucket since the run
started, whose buckets are not the run's) is reported in ``notes``,
not as a problem; the full check covers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from upsert_core.columnar import ColumnarState, apply_changes, join_keys
from upsert_core.columnar.derived_rows import as_row_array
from upsert_core.columnar.merge import fold
from upsert_core.errors import ConfigError, InvalidUpsertState, NotReadable, UpsertPlatformError
from upsert_core.ingest.buckets import bucket_of, bucket_of_keys, split_rows
from upsert_core.ingest.checkpoint import CheckpointUnusable, load_checkpoint, new_state
from upsert_core.ingest.rehydrate import order_values
from upsert_core.ingest.replay import replay_bucket
from upsert_core.ingest.shard_config import ShardIngestConfig, ShardOptions
from upsert_core.ingest.tasks import Base
from upsert_core.ingest.tombstones import TombstonesLost, load_tombstones, tombstones_of
from upsert_core.ingest.verify_typed import verify_typed_parts
from upsert_core.landing import SourceSchema
from upsert_core.order_keys import describe, is_order_keys
from upsert_core.order_scope import OrderScope
from upsert_core.persist.keys import checkpoint_prefix
from upsert_core.persist.maintenance.check import CONSOLIDATION, STORAGE, CheckReport
from upsert_core.persist.maintenance.check_batch import (
    check_batch_consolidated,
    configs_at_uppers,
    read_new_updates,
)
from upsert_core.persist.read.read import check_catch_up_readable
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import ShardState

MAX_LISTED = 10


def _order_mismatches(
    state: ColumnarState, schema: SourceSchema, shard: str, bucket: int
) -> tuple[int, str | None]:
    """Global scope: compare every live key's stored order with the order value of its
    row, decoded as one column the way rehydration reads it (``order_values``).

    Returns the number of live keys compared and a problem naming the bucket, the first
    ``MAX_LISTED`` differing keys in key order (stored and row orders) and their count,
    or None when all agree. Tombstones (null rows) are skipped: the shard holds no row
    to confirm their order. A row whose order cannot be decoded raises CorruptData.
    """
    state = fold(state)
    if state.orders is None:
        return 0, None
    live = np.flatnonzero(~np.asarray(state.rows.is_null().to_numpy(zero_copy_only=False),
                                      bool))
    from_rows = order_values(shard, schema, state.rows.take(pa.array(live, pa.int64())))
    stored = state.orders[live]
    if len(live) and is_order_keys(stored) != is_order_keys(from_rows):
        return len(live), (
            f"bucket {bucket}: its stored orders are "
            + ("order keys" if is_order_keys(stored) else "int64")
            + f" but the shard's order ({schema.order_text}) gives "
            + ("order keys" if is_order_keys(from_rows) else "int64")
        )
    bad = live[from_rows != stored]
    if not len(bad):
        return len(live), None
    shown = bad[:MAX_LISTED]
    keys = join_keys(state.hi[shown], state.lo[shown]).to_pylist()
    row_orders = from_rows[from_rows != stored][:MAX_LISTED]
    examples = ", ".join(
        f"{k.hex()} (stored {describe(o)}, row {describe(r)})"
        for k, o, r in zip(keys, state.orders[shown], row_orders, strict=True)
    )
    return len(live), (
        f"bucket {bucket}: {len(bad)} live key(s) whose stored order differs from the"
        f" order value of their row in the shard (the next ingest would decide them"
        f" against the wrong order): {examples}"
    )


@dataclass
class StateComparison:
    """The outcome: ``problems`` is empty iff the state equals the shard."""

    upper: int
    problems: list[str] = field(default_factory=list)
    state_keys: int = 0
    live_keys: int = 0
    shard_rows: int = 0
    checkpoint_bytes: int = 0
    buckets: int = 0
    orders_compared: int = 0
    """Live keys whose stored order was checked against their row (global scope)."""
    rebuilt_buckets: set[int] = field(default_factory=set)
    """Buckets whose checkpoint base lies before the shard's since: their changes since
    the base are no longer readable, so the next ingest rebuilds them from the shard
    itself (equal by construction); they are not compared."""
    typed_parts: int = 0
    """Typed parts whose footers' promises were verified (``verify_typed``)."""

    @property
    def ok(self) -> bool:
        return not self.problems


def _load_live(
    shard: Shard, state: ShardState, stored: ShardIngestConfig, options: ShardOptions,
    result: StateComparison,
) -> dict[bytes, bytes] | None:
    result.buckets = options.buckets
    listed = shard.blob.list_keys(checkpoint_prefix(shard.shard_id))
    sizes = {m.key: m.size_in_bytes for m in listed}
    live: dict[bytes, bytes] = {}
    usable = True
    for bucket in range(options.buckets):
        ref = stored.checkpoint_refs.get(bucket, "")
        if not ref:
            if options.order_scope is OrderScope.GLOBAL:
                _add(result, _tombstone_mismatch(shard, stored, new_state(OrderScope.GLOBAL),
                                                 bucket, options.buckets))
            continue
        # A part base is a batch part, not under the checkpoint prefix: its size counts
        # too (it is the bucket's state), though it costs nothing beside the part.
        result.checkpoint_bytes += sizes[ref] if ref in sizes else sum(
            m.size_in_bytes for m in shard.blob.list_keys(ref) if m.key == ref
        )
        try:
            upsert = load_checkpoint(  # what is stored, never a local copy
                shard.blob, ref, shard.shard_id, bucket, options.buckets, options.order_scope,
                local_cache=False,
            )
        except CheckpointUnusable as exc:
            result.problems.append(f"bucket {bucket}: {exc}")
            usable = False
            continue
        try:
            caught_up = _catch_up(
                shard, state, stored, upsert, bucket, options.buckets,
                options.order_scope.value,
            )
            if caught_up is None:
                result.rebuilt_buckets.add(bucket)
                continue
            upsert = caught_up
        except UpsertPlatformError as exc:
            result.problems.append(f"bucket {bucket}: the changes since its checkpoint do not"
                                   f" apply to it: {exc}")
            usable = False
            continue
        if options.order_scope is OrderScope.GLOBAL:
            # The rows are compared with the shard below: an order checked against the
            # state's row is checked against the shard's.
            try:
                compared, problem = _order_mismatches(
                    upsert, options.schema, shard.shard_id, bucket
                )
            except UpsertPlatformError as exc:
                compared, problem = 0, f"bucket {bucket}: its orders cannot be checked: {exc}"
            result.orders_compared += compared
            if problem is not None:
                result.problems.append(problem)
            _add(result, _tombstone_mismatch(shard, stored, upsert, bucket, options.buckets))
        result.state_keys += len(upsert)
        live.update(upsert.live_rows())
    return live if usable else None


def _add(result: StateComparison, problem: str | None) -> None:
    if problem is not None:
        result.problems.append(problem)


def _tombstone_mismatch(
    shard: Shard, stored: ShardIngestConfig, upsert: ColumnarState, bucket: int, buckets: int
) -> str | None:
    """Global scope: whether the bucket's recorded tombstone set is readable and holds
    exactly the state's tombstones, key for key and order for order (a rebuild relies on
    it). A bucket last written before sets were recorded has none to compare."""
    ref = stored.tombstone_refs.get(bucket)
    if ref is None:
        return None
    try:
        recorded = load_tombstones(shard.blob, ref, shard.shard_id, bucket, buckets)
    except TombstonesLost as exc:
        return f"bucket {bucket}: {exc}"
    held = tombstones_of(upsert)
    same = (
        len(held) == len(recorded)
        and np.array_equal(held.hi, recorded.hi)
        and np.array_equal(held.lo, recorded.lo)
        and np.array_equal(np.asarray(held.orders), np.asarray(recorded.orders))
    )
    if same:
        return None
    return (f"bucket {bucket}: its tombstone set ({ref or 'none'}) holds {len(recorded)} "
            f"tombstone(s), its upsert state {len(held)}, or their keys or orders differ")


def _catch_up(
    shard: Shard, state: ShardState, stored: ShardIngestConfig, upsert: ColumnarState,
    bucket: int, buckets: int, scope: str,
) -> ColumnarState | None:
    """``upsert`` with the shard's changes since the bucket's checkpoint base replayed.

    Returns None when those changes are no longer exact (the base is not newer than
    the shard's since after ``gc --retain``, see ``read.changes_after``): the ingest then
    rebuilds the bucket.
    """
    if scope != "batch":
        return upsert
    base = Base.decode(stored.checkpoint_bases.get(bucket), state.upper)
    if base.as_of >= state.upper:
        return upsert
    try:
        check_catch_up_readable(state, base.as_of, state.upper)
    except NotReadable:
        return None
    caught_up, _ = replay_bucket(
        shard.blob, state, upsert, bucket, buckets, base.as_of, state.upper
    )
    return caught_up


def compare_state(shard: Shard) -> StateComparison:
    """Compare the committed upsert state with the consolidated shard (module docstring)."""
    state = shard.state()
    result = StateComparison(upper=state.upper)
    if state.upper == 0:
        return result
    try:
        stored = ShardIngestConfig.read(state.config)
    except ConfigError as exc:
        result.problems.append(f"cannot compare the state with the shard: {exc}")
        return result
    if stored.options is None:
        result.problems.append(
            f"shard {shard.shard_id!r} has data up to {state.upper} but no ingest options:"
            " it was not written by the ingest"
        )
        return result
    typed = verify_typed_parts(shard.blob, shard.shard_id, state.batches, stored.options)
    result.typed_parts = typed.typed_parts
    result.problems.extend(typed.problems)
    if not stored.checkpoints_current(state.upper):
        result.problems.append(
            f"the upsert state checkpoints describe upper"
            f" {stored.checkpoint_upper!s}, but the shard's upper is"
            f" {state.upper}: something other than the ingest appended to the shard"
        )
        # The next ingest rebuilds every bucket from the rows plus its tombstone set:
        # each set must at least be readable (there is no current state to compare).
        for bucket, ref in sorted(stored.tombstone_refs.items()):
            try:
                load_tombstones(shard.blob, ref, shard.shard_id, bucket,
                                stored.options.buckets)
            except TombstonesLost as exc:
                result.problems.append(f"bucket {bucket}: {exc}")
        return result
    try:
        live = _load_live(shard, state, stored, stored.options, result)
        if live is None:
            return result
        result.live_keys = len(live)
        rebuilt = result.rebuilt_buckets
        seen: set[bytes] = set()
        mismatched: list[str] = []
        for batch in shard.snapshot(state.upper - 1, positive_only=False):
            keys = batch.column("key").to_pylist()
            rows = batch.column("row").to_pylist()
            diffs = batch.column("diff").to_pylist()
            for key, row, diff in zip(keys, rows, diffs, strict=True):
                if rebuilt and bucket_of(key, result.buckets) in rebuilt:
                    continue
                result.shard_rows += 1
                if diff != 1 or key in seen or live.get(key) != row:
                    mismatched.append(key.hex())
                seen.add(key)
        missing = [k.hex() for k in live.keys() - seen]
    except UpsertPlatformError as exc:
        result.problems.append(f"cannot compare the state with the shard: {exc}")
        return result
    if mismatched:
        result.problems.append(
            f"{len(mismatched)} shard row(s) differ from the upsert state (duplicate key,"
            f" multiplicity other than 1, or another value), keys: "
            + ", ".join(mismatched[:MAX_LISTED])
        )
    if missing:
        result.problems.append(
            f"{len(missing)} key(s) live in the upsert state have no row in the shard: "
            + ", ".join(sorted(missing)[:MAX_LISTED])
        )
    return result


# --- batch-scoped checks ----------------------------------------------------------------

STATE = "state"
"""Kind of problem: a touched bucket's committed state differs from the shard."""


def check_new_batch(shard: Shard, start_upper: int, upper: int | None = None) -> CheckReport:
    """The batch-scoped checks of the changes committed in ``[start_upper, upper)``
    (default: up to the shard's upper); see the module docstring. A run that committed
    nothing (``start_upper == upper``) reads nothing and passes."""
    state = shard.state()
    upper = state.upper if upper is None else upper
    report = CheckReport(shard_id=shard.shard_id)
    report.counts.update(start_upper=start_upper, upper=upper, shard_upper=state.upper)
    if not 0 <= start_upper <= upper <= state.upper:
        report.add(STORAGE, f"shard {shard.shard_id!r}: the run's range [{start_upper},"
                            f" {upper}) is not within the shard's [0, {state.upper})")
        return report
    if start_upper == upper:
        return report
    updates = read_new_updates(shard, state, start_upper, upper, report)
    changes = check_batch_consolidated(updates, report)
    _check_typed_parts(shard, state, start_upper, upper, report)
    compare_touched_buckets(shard, start_upper, upper, changes=changes, state=state,
                            report=report)
    return report


def _check_typed_parts(
    shard: Shard, state: ShardState, start_upper: int, upper: int, report: CheckReport
) -> None:
    """The typed parts of the batches in ``[start_upper, upper)`` (the ones
    ``read_new_updates`` read) keep their footers' promises (kind ``storage``)."""
    try:
        options = ShardIngestConfig.read(state.config).options
    except ConfigError as exc:
        report.add(STORAGE, f"shard {shard.shard_id!r}: its typed parts cannot be verified:"
                            f" {exc}")
        return
    batches = [b for b in state.batches if b.upper > start_upper and b.lower < upper]
    typed = verify_typed_parts(
        shard.blob, shard.shard_id, batches, options, skip_unopenable=True
    )
    report.counts["typed_parts"] = typed.typed_parts
    for problem in typed.problems:
        report.add(STORAGE, problem)


def _live_only(state: ColumnarState) -> ColumnarState:
    """The live rows of ``state`` as a batch-scope state (tombstones and orders dropped)."""
    state = fold(state)
    if state.orders is None:
        return state
    live = ~np.asarray(state.rows.is_null().to_numpy(zero_copy_only=False), bool)
    return ColumnarState.checked(
        state.hi[live], state.lo[live], state.rows.filter(pa.array(live)), None
    )


def _same(a: ColumnarState, b: ColumnarState) -> bool:
    return (
        len(a.hi) == len(b.hi)
        and bool(np.array_equal(a.hi, b.hi))
        and bool(np.array_equal(a.lo, b.lo))
        and as_row_array(a.rows).equals(as_row_array(b.rows))
    )


def _differing_keys(a: ColumnarState, b: ColumnarState) -> list[str]:
    rows_a, rows_b = a.live_rows(), b.live_rows()
    keys = {k for k in rows_a.keys() | rows_b.keys() if rows_a.get(k) != rows_b.get(k)}
    return sorted(k.hex() for k in keys)


class _Buckets:
    """Loads one bucket's state as a config of the shard describes it at some upper."""

    def __init__(self, shard: Shard, state: ShardState, buckets: int, scope: OrderScope):
        self.shard, self.state, self.buckets, self.scope = shard, state, buckets, scope

    def at(self, config: ShardIngestConfig, bucket: int, upper: int) -> ColumnarState:
        """Raises CheckpointUnusable, NotReadable or InvalidUpsertState."""
        ref = config.checkpoint_refs.get(bucket, "")
        base = Base.decode(config.checkpoint_bases.get(bucket), upper)
        loaded = new_state(self.scope) if not ref else load_checkpoint(
            self.shard.blob, ref, self.shard.shard_id, bucket, self.buckets, self.scope,
            local_cache=False,  # what is stored, never a local copy
        )
        if ref and base.size >= 0:
            # The digest proves the blob is intact, not that it is the one committed: a
            # blob replaced by another valid checkpoint shows in its size.
            sizes = [m.size_in_bytes for m in self.shard.blob.list_keys(ref) if m.key == ref]
            if sizes and sizes[0] != base.size:
                raise CheckpointUnusable(
                    f"checkpoint {ref} holds {sizes[0]} bytes, but {base.size} were committed"
                )
        if self.scope is not OrderScope.BATCH:
            return loaded
        if base.as_of >= upper:
            return loaded
        check_catch_up_readable(self.state, base.as_of, upper)
        caught_up, _ = replay_bucket(
            self.shard.blob, self.state, loaded, bucket, self.buckets, base.as_of, upper
        )
        return caught_up


def _kept_base(before: ShardIngestConfig, after: ShardIngestConfig, bucket: int,
               start_upper: int, upper: int) -> bool:
    """Whether the bucket's checkpoint at ``upper`` is, by construction, its checkpoint
    at ``start_upper`` plus the shard's changes in between (same blob, same base)."""
    return (
        before.checkpoint_refs.get(bucket, "") == after.checkpoint_refs.get(bucket, "")
        and Base.decode(before.checkpoint_bases.get(bucket), start_upper).as_of
        == Base.decode(after.checkpoint_bases.get(bucket), upper).as_of
    )


def compare_touched_buckets(
    shard: Shard,
    start_upper: int,
    upper: int,
    *,
    changes: pa.Table | None = None,
    state: ShardState | None = None,
    report: CheckReport | None = None,
) -> CheckReport:
    """Check every touched bucket's state against the batch ``[start_upper, upper)``
    (module docstring). ``changes``: the batch's consolidated updates (read and checked
    here when not given); problems go to ``report`` (a new one when not given)."""
    state = shard.state() if state is None else state
    report = CheckReport(shard_id=shard.shard_id) if report is None else report
    if start_upper >= upper:
        return report
    if changes is None:
        changes = check_batch_consolidated(
            read_new_updates(shard, state, start_upper, upper, report), report
        )
    options = ShardIngestConfig.read(state.config).options
    if options is None:
        report.add(STATE, f"shard {shard.shard_id!r} has data up to {state.upper} but no"
                          " ingest options: it was not written by the ingest")
        return report
    buckets, scope = options.buckets, options.order_scope
    configs = configs_at_uppers(shard, state, {start_upper, upper})
    after_config = configs.get(upper)
    before_config = {} if start_upper == 0 else configs.get(start_upper)
    if after_config is None or before_config is None:
        report.notes.append(
            f"the state diffs since upper {start_upper} are truncated (GC): the touched"
            " buckets' states were not compared"
        )
        return report
    after = ShardIngestConfig.read(after_config)
    before = ShardIngestConfig.read(before_config)
    if after.checkpoint_upper != upper:
        report.add(STATE, f"the upsert state checkpoints at upper {upper} describe upper"
                          f" {after.checkpoint_upper!s}: something other than the"
                          " ingest appended to the shard")
        return report
    counted = {c.options.buckets for c in (before, after) if c.options is not None}
    if counted - {buckets}:
        report.notes.append(
            f"the shard was rebucketed during the run ({sorted(counted | {buckets})} buckets;"
            " upsertctl rebucket): the touched buckets' states were not compared"
        )
        return report
    if start_upper > 0 and before.checkpoint_upper != start_upper:
        report.notes.append(
            f"the upsert state was not current at upper {start_upper} (something else had"
            " appended; the run rebuilt it): the touched buckets' states were not compared"
        )
        return report
    by_bucket = (
        split_rows(changes, bucket_of_keys(changes.column("key"), buckets))
        if changes.num_rows else {}
    )
    # SUBTLE: in the batch scope the base counts as much as the ref: a bucket whose base
    # moved (same blob) has another state at the upper (the changes its new base skips
    # are dropped), so it is touched even without changes in the batch. The global
    # scope replays nothing from its base.
    bases_count = scope is OrderScope.BATCH
    moved = {
        b for b in range(buckets)
        if before.checkpoint_refs.get(b, "") != after.checkpoint_refs.get(b, "")
        or (bases_count
            and before.checkpoint_bases.get(b, "") != after.checkpoint_bases.get(b, ""))
    }
    touched = sorted(set(by_bucket) | moved)
    report.counts["touched_buckets"] = len(touched)
    report.counts["buckets"] = buckets
    loader = _Buckets(shard, state, buckets, scope)
    state_keys = orders_compared = 0
    for bucket in touched:
        try:
            previous = loader.at(before, bucket, start_upper)
        except CheckpointUnusable as exc:
            if before.checkpoint_refs.get(bucket, "") == after.checkpoint_refs.get(bucket, ""):
                # Still the committed checkpoint: the state at the upper stands on it.
                report.add(STATE, f"bucket {bucket}: its checkpoint cannot be used: {exc}")
            else:
                report.notes.append(f"bucket {bucket}: its checkpoint before the run is"
                                    f" unusable (the run rebuilt it): {exc}")
            continue
        except NotReadable as exc:
            report.notes.append(f"bucket {bucket}: its state before the run cannot be"
                                f" caught up: {exc}")
            continue
        except InvalidUpsertState as exc:
            report.add(STATE, f"bucket {bucket}: its checkpoint before the run does not fit"
                              f" the shard's changes since its base: {exc}")
            continue
        bucket_changes = by_bucket.get(bucket)
        try:
            expected, _ = apply_changes(
                _live_only(previous), [] if bucket_changes is None else [bucket_changes]
            )
        except InvalidUpsertState as exc:
            report.add(CONSOLIDATION, f"bucket {bucket}: the batch does not fit the state"
                                      f" before it: {exc}")
            continue
        expected = fold(expected)
        state_keys += len(expected)
        if scope is OrderScope.BATCH and _kept_base(before, after, bucket, start_upper, upper):
            continue  # the committed state is `previous` + these changes by construction
        try:
            loaded = loader.at(after, bucket, upper)
        except (CheckpointUnusable, InvalidUpsertState, NotReadable) as exc:
            report.add(STATE, f"bucket {bucket}: its checkpoint at upper {upper} cannot be"
                              f" used: {exc}")
            continue
        if scope is OrderScope.GLOBAL:
            # Its live rows must equal `expected`'s (below), which are the shard's.
            try:
                compared, problem = _order_mismatches(
                    loaded, options.schema, shard.shard_id, bucket
                )
            except UpsertPlatformError as exc:
                compared, problem = 0, f"bucket {bucket}: its orders cannot be checked: {exc}"
            orders_compared += compared
            if problem is not None:
                report.add(STATE, problem)
        committed = _live_only(loaded)
        if not _same(committed, expected):
            keys = _differing_keys(committed, expected)
            report.add(
                STATE,
                f"bucket {bucket}: the checkpoint at upper {upper} differs from the state"
                f" before the run plus the run's changes in {len(keys)} key(s): "
                + ", ".join(keys[:MAX_LISTED]),
            )
    report.counts["state_keys_compared"] = state_keys
    if scope is OrderScope.GLOBAL:
        report.counts["orders_compared"] = orders_compared
    return report

