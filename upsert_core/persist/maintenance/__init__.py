"""Keeping a shard small and sound: compaction, GC, retention and checks.

- ``compact``: size-tiered compaction of adjacent batches.
- ``gc``: one GC pass: expire leases, apply retention, compact, roll up, truncate old
  diffs and delete the blobs no live state references.
- ``retention``: the retention a shard stores (``upsertctl retention``), which GC and the
  ingest's maintenance apply.
- ``check``: the storage and consolidation invariants of a whole shard.
- ``check_batch``: the same invariants for the changes one ingest run committed.
"""
