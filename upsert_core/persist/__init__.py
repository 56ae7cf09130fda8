"""The durable shard: consensus log, blob store, state diffs, rollups, reads, GC."""
