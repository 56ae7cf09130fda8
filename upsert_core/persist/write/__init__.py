"""The write path: from updates to a committed batch.

- ``consolidate``: the update schema ``(key, row, ts, diff)`` and its vectorised sorting,
  merging and consolidation (the read path and compaction use it too).
- ``buckets``: the key-to-bucket map that labels parts.
- ``parts``: the part format: batch parts and error parts as Parquet, written inline or
  to Blob, and read back (:class:`OpenPart`) by every reader of updates.
- ``writers``: writer registrations, the fence that lets GC delete blobs no one can
  commit any more, and the lease a writer heartbeats.
- ``append``: compare-and-append, the one transition that commits a written batch.
"""
