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
  ``global``) are state only; they have no row in the shard and are not compared.

Used by ``upsertctl check`` and by the Dagster asset check ``state_matches_shard``.
It holds the state and the snapshot in memory, like an ingest's rehydration would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from upsert_core.columnar import ColumnarState
from upsert_core.errors import NotReadable, UpsertPlatformError
from upsert_core.ingest import IngestRequest, checkpoints_current, resolve_options
from upsert_core.ingest.buckets import bucket_of
from upsert_core.ingest.checkpoint import (
    CONFIG_CHECKPOINT_UPPER,
    CheckpointUnusable,
    checkpoint_base_name,
    checkpoint_ref_name,
    load_checkpoint,
)
from upsert_core.ingest.options import CONFIG_SCHEMA
from upsert_core.ingest.replay import replay_bucket
from upsert_core.ingest.tasks import Base
from upsert_core.persist.keys import checkpoint_prefix
from upsert_core.persist.read import check_catch_up_readable
from upsert_core.persist.shard import Shard
from upsert_core.persist.state import ShardState

MAX_LISTED = 10


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
    rebuilt_buckets: set[int] = field(default_factory=set)
    """Buckets whose checkpoint base lies before the shard's since: their changes since
    the base are no longer readable, so the next ingest rebuilds them from the shard
    itself (equal by construction); they are not compared."""

    @property
    def ok(self) -> bool:
        return not self.problems


def _load_live(
    shard: Shard, state: ShardState, result: StateComparison
) -> dict[bytes, bytes] | None:
    options = resolve_options(state.config, IngestRequest())
    result.buckets = options.buckets
    listed = shard.blob.list_keys(checkpoint_prefix(shard.shard_id))
    sizes = {m.key: m.size_in_bytes for m in listed}
    live: dict[bytes, bytes] = {}
    usable = True
    for bucket in range(options.buckets):
        ref = state.config.get(checkpoint_ref_name(bucket), "")
        if not ref:
            continue
        result.checkpoint_bytes += sizes.get(ref, 0)
        try:
            upsert = load_checkpoint(
                shard.blob, ref, shard.shard_id, bucket, options.buckets, options.order_scope
            )
        except CheckpointUnusable as exc:
            result.problems.append(f"bucket {bucket}: {exc}")
            usable = False
            continue
        try:
            caught_up = _catch_up(
                shard, state, upsert, bucket, options.buckets, options.order_scope.value
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
        result.state_keys += len(upsert)
        live.update(upsert.live_rows())
    return live if usable else None


def _catch_up(
    shard: Shard, state: ShardState, upsert: ColumnarState, bucket: int, buckets: int,
    scope: str,
) -> ColumnarState | None:
    """``upsert`` with the shard's changes since the bucket's checkpoint base replayed.

    Returns None when those changes are no longer exact (the base is not newer than
    the shard's since after ``gc --retain``, see ``read.changes_after``): the ingest then
    rebuilds the bucket.
    """
    if scope != "batch":
        return upsert
    base = Base.decode(state.config.get(checkpoint_base_name(bucket)), state.upper)
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
    if CONFIG_SCHEMA not in state.config:
        result.problems.append(
            f"shard {shard.shard_id!r} has data up to {state.upper} but no ingest options:"
            " it was not written by the ingest"
        )
        return result
    if not checkpoints_current(state):
        result.problems.append(
            f"the upsert state checkpoints describe upper"
            f" {state.config.get(CONFIG_CHECKPOINT_UPPER)!s}, but the shard's upper is"
            f" {state.upper}: something other than the ingest appended to the shard"
        )
        return result
    try:
        live = _load_live(shard, state, result)
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
