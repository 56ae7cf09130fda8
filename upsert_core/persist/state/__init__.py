"""The shard's metadata and how it changes: one version, the diffs between versions,
their bytes, the durable log of versions, and the compare-and-set that extends it.

- ``state``: :class:`ShardState`, one immutable version (seqno, since, upper, batches,
  rollups, writers, leased readers, ingested files, error batches, config) and its
  invariants.
- ``state_diff``: :class:`StateDiff`, per-field inserts, updates and deletes from one
  version to the next, applied strictly.
- ``codec_state``: the versioned JSON bytes of states, rollups and diffs.
- ``state_versions``: the durable, truncatable log: diffs in Consensus, full rollups in
  Blob, and how the current state is fetched from them.
- ``machine``: :class:`Machine`, which applies a pure transition by compare-and-set and
  retries it on a fresher state after a lost race.
- ``leases``: the transitions of writer and reader leases (register, heartbeat, expire).
- ``commit_times``: the commit time of each batch kept in the config, and the ts a
  wall-clock time stands for.

Nothing here writes or reads parts: these modules import only each other,
``persist.keys`` and ``persist.location``.
"""
