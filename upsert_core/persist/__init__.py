"""The durable shard: consensus log, blob store, state diffs, rollups, reads, GC.

``location/``: the storage contracts (``Consensus``, ``Blob``) and their
implementations, opened from URLs; they know nothing of shards. The modules here build
the shard on them (state, diffs, versions, parts, reads, append, compaction, GC, leases,
writers, check).
"""
