"""Test support for code built on the persist layer, shipped with the package (as
``zarr.testing`` is): a Blob wrapper to inject faults into, and the question every
durability test asks, "did anything leak?".

- :class:`DelegatingBlob` forwards the four :class:`~upsert_core.persist.location.Blob`
  calls to the blob it wraps. A fault-injecting or recording blob subclasses it and
  overrides only the calls it changes. It offers no ranged reads (``open_reader``), so
  every read of a part goes through ``get`` and so through the subclass's hooks; a
  subclass that wants ranged reads defines ``open_reader`` itself.
- :func:`unreferenced_blobs`: the data blobs (batch parts, error parts, late parts,
  state checkpoints) under a shard's prefix that no live state version references. The
  listing is taken BEFORE the states are read, so a blob written and committed
  concurrently is never reported (it is either not listed yet or already referenced);
  on a quiescent shard the answer is exact. Rollups are state, not data, and are not
  counted (GC keeps the ones live states need).
- :func:`typed_parts`: for every non-empty part of the current state, in state order,
  whether it is typed (value columns and a bucket label, ``parts``): what a test of the
  typed snapshot layout asserts; :func:`part_formats`: each such part's format (1, 2
  or 3, ``parts``), what a test of the format upgrade asserts.

Nothing here is used by the platform's own code paths.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from upsert_core.persist.keys import shard_prefix
from upsert_core.persist.location import Blob, BlobMetadata
from upsert_core.persist.write.parts import OpenPart, PartLayout

if TYPE_CHECKING:
    from upsert_core.persist.shard import Shard

DATA_KINDS = ("part", "errors", "checkpoint", "late")
"""The blob kinds (``<shard>/<kind>/...``) that hold data a state references."""


class DelegatingBlob:
    """A Blob that forwards every call to ``inner`` (see the module docstring)."""

    def __init__(self, inner: Blob) -> None:
        self.inner = inner

    def get(self, key: str) -> bytes | None:
        return self.inner.get(key)

    def set(self, key: str, value: bytes | memoryview) -> None:
        self.inner.set(key, value)

    def delete(self, key: str) -> int | None:
        return self.inner.delete(key)

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        return self.inner.list_keys(prefix)


def unreferenced_blobs(shard: Shard, kinds: Iterable[str] = DATA_KINDS) -> set[str]:
    """Blobs of ``kinds`` under the shard's prefix that no live state references."""
    wanted = tuple(kinds)
    prefix = shard_prefix(shard.shard_id)
    listed = {
        m.key for m in shard.blob.list_keys(prefix)
        if m.key[len(prefix):].split("/", 1)[0] in wanted
    }
    referenced: set[str] = set()
    for state in shard.versions.fetch_all_live_states():
        referenced.update(state.referenced_blob_keys())
    return listed - referenced


def _layouts(shard: Shard) -> list[PartLayout]:
    """The layout of every non-empty part of ``shard``'s current state, in state order."""
    layouts = []
    for batch in shard.state().batches:
        for part in batch.parts:
            if not part.num_updates:
                continue
            opened = OpenPart(shard.blob, part, shard=shard.shard_id)
            try:
                layouts.append(opened.layout)
            finally:
                opened.close()
    return layouts


def part_formats(shard: Shard) -> list[int]:
    """For every non-empty part of ``shard``'s current state, in state order, its format:
    1 (encoded rows), 2 (values beside the encoded rows) or 3 (values only)."""
    return [3 if lay.derived_rows else 2 if lay.values else 1 for lay in _layouts(shard)]


def typed_parts(shard: Shard) -> list[bool]:
    """For every non-empty part of ``shard``'s current state: whether it is typed."""
    return [bool(lay.values) and lay.bucket is not None for lay in _layouts(shard)]
