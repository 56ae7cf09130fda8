"""The durable shard: a log of state versions in Consensus, parts and rollups in Blob.

Each concern has one place:

- ``shard``: the :class:`~upsert_core.persist.shard.Shard` handle, the one API the CLI,
  the ingest and Spark use; it delegates to the subpackages below.
- ``keys``: where a shard's things live (its consensus key and every blob key) and the
  writer ids that blob keys carry.
- ``state/``: the shard's metadata and how it changes: ``state``, ``state_diff``,
  ``codec_state``, ``state_versions`` (diffs in Consensus, rollups in Blob), the
  compare-and-set ``machine``, ``leases`` and ``commit_times``.
- ``write/``: the write path: the update schema and consolidation (``consolidate``),
  ``buckets``, the part format (``parts``), writer registration and fencing
  (``writers``), and the commit (``append``).
- ``read/``: the read path: snapshot, changes and listen (``read``) and typed snapshots
  (``typed_read``).
- ``maintenance/``: ``compact``, ``gc``, ``retention``, and ``check`` / ``check_batch``,
  which verify a shard's invariants.
- ``location/``: the storage contracts (``Consensus``, ``Blob``) and their
  implementations, opened from URLs; they know nothing of shards.
- ``testing``: test support shipped with the package (a fault-injecting Blob wrapper,
  the leak finder).

The subpackages' ``__init__`` modules import nothing: import a module by its path.
"""
