"""The read path: consolidated reads of a shard's parts.

- ``read``: the merged read: ``snapshot`` as of a time, ``changes`` in a range and
  ``changes_after`` (a listen), streaming parts row group by row group.
- ``typed_read``: typed snapshots of bucket-labelled parts, read bucket by bucket
  without the k-way merge; the same answer as ``read.snapshot``.
"""
