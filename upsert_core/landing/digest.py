"""Content digests of landing files, as the ingest's ledger records them.

Two kinds, named in the digest's text ``<kind>:<32 lowercase hex digits>``:

- ``xxh3_128`` (every record written before block digests): the xxh3-128 of the whole
  file. Only a sequential read of the whole file computes it.
- ``xxh3_128_blocks/<B>`` (every record written now): the file cut into blocks of ``B``
  bytes (the last one shorter; a 0-byte file has none), the xxh3-128 of each block, and
  the xxh3-128 of those 16-byte digests concatenated in file order. Readers of disjoint
  runs of whole blocks compute their blocks' digests apart (:func:`block_run`) and
  :func:`combine` makes the file's digest of them, so the read tasks of a file read in
  parallel digest the bytes they read anyway and nobody reads the file again for it.

Invariants:

- ``B`` depends on the file's size only (:func:`blocks_kind`): a power of two of at
  least :data:`MIN_BLOCK_BYTES`, doubled until the file has at most :data:`MAX_BLOCKS`
  blocks, so the digests a file's readers hand on stay small (16 bytes per block).
  Every engine records the same digest for the same bytes; a record carries its ``B``,
  so comparing a file with a record always computes the record's kind.
- :class:`Digester` (bytes fed in file order, in pieces of any size), :func:`digest_of`
  (all bytes at once) and :func:`combine` over runs that tile the file give the same
  digest for the same bytes.
- :func:`combine` answers None unless the runs tile the file exactly (each block once,
  ``size`` bytes in all): a digest is never assembled from a wrong set of blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

from upsert_core.errors import IngestError

WHOLE = "xxh3_128"
BLOCKS = "xxh3_128_blocks"
MIN_BLOCK_BYTES = 1 << 12
"""The smallest block: a reader that owns whole blocks reads less than a block more
than it needs at each end of its range (a Parquet row group's start is not aligned),
so blocks are small against a read task's range (32 MiB by default)."""
MAX_BLOCKS = 1 << 18
"""Blocks double in size past this many per file (up to 1 GiB in 4 KiB blocks): 16
bytes of digest per block reach the step that combines them (4 MiB at most)."""
_DIGEST = 16
_HEX = "0123456789abcdef"


@dataclass(frozen=True)
class DigestKind:
    """How a digest was computed: :data:`WHOLE`, or :data:`BLOCKS` of ``block`` bytes."""

    name: str
    block: int = 0

    @property
    def text(self) -> str:
        return f"{BLOCKS}/{self.block}" if self.name == BLOCKS else self.name

    @classmethod
    def parse(cls, text: str) -> DigestKind:
        """The kind ``text`` names (:attr:`text`); :class:`IngestError` if none."""
        if text == WHOLE:
            return cls(WHOLE)
        name, _, block = text.partition("/")
        if name == BLOCKS and block.isascii() and block.isdigit() and int(block) > 0:
            return cls(BLOCKS, int(block))
        raise IngestError(f"unknown content digest kind {text!r}")


WHOLE_FILE = DigestKind(WHOLE)


def block_bytes_for(size: int) -> int:
    """The block size of a file of ``size`` bytes (module docstring)."""
    block = MIN_BLOCK_BYTES
    while size > block * MAX_BLOCKS:
        block *= 2
    return block


def blocks_kind(size: int) -> DigestKind:
    """The kind every engine records for a file of ``size`` bytes."""
    return DigestKind(BLOCKS, block_bytes_for(max(0, size)))


def digest_text(kind: DigestKind, hexdigest: str) -> str:
    return f"{kind.text}:{hexdigest}"


def kind_of(text: str) -> DigestKind:
    """The kind of digest ``text`` (``<kind>:<hex>``); :class:`IngestError` if unknown."""
    kind, sep, hexdigest = text.rpartition(":")
    # Only lowercase hex digits: what xxhash's hexdigest gives, so a digest that could
    # never equal a computed one is refused here rather than compared (a false alarm).
    if not sep or len(hexdigest) != 2 * _DIGEST or hexdigest.strip(_HEX):
        raise IngestError(f"malformed content digest {text!r}")
    return DigestKind.parse(kind)


class Digester:
    """A digest of ``kind`` over bytes fed in file order (:meth:`update`)."""

    def __init__(self, kind: DigestKind) -> None:
        self.kind = kind
        self.size = 0
        self._whole = xxhash.xxh3_128() if kind.name == WHOLE else None
        self._digests = bytearray()
        self._partial = bytearray()  # the start of the current block

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self.size += len(data)
        if self._whole is not None:
            self._whole.update(data)
            return
        view = memoryview(data)
        block = self.kind.block
        if self._partial:
            take = min(len(view), block - len(self._partial))
            self._partial += view[:take]
            view = view[take:]
            if len(self._partial) < block:
                return
            self._digests += xxhash.xxh3_128_digest(bytes(self._partial))
            self._partial = bytearray()
        whole = len(view) - len(view) % block
        for at in range(0, whole, block):
            self._digests += xxhash.xxh3_128_digest(view[at:at + block])
        self._partial += view[whole:]

    def text(self) -> str:
        """The digest of everything fed so far (feeding may go on)."""
        if self._whole is not None:
            return digest_text(self.kind, self._whole.hexdigest())
        last = xxhash.xxh3_128_digest(bytes(self._partial)) if self._partial else b""
        return digest_text(self.kind, xxhash.xxh3_128_hexdigest(bytes(self._digests) + last))


def digest_of(data: bytes | memoryview, kind: DigestKind) -> str:
    """The digest of ``kind`` of ``data``, a whole file."""
    digester = Digester(kind)
    digester.update(data)
    return digester.text()


@dataclass(frozen=True)
class BlockRun:
    """The digests of consecutive blocks ``first``, ``first + 1``, ... of one file (16
    bytes each, in order) and how many of the file's bytes they cover."""

    first: int
    digests: bytes
    covered: int

    @property
    def count(self) -> int:
        return len(self.digests) // _DIGEST

    def to_hex(self) -> str:
        return self.digests.hex()


def block_run(data: bytes | memoryview, start: int, block: int) -> BlockRun:
    """The run of the blocks ``data`` holds, ``data`` being the file's bytes from
    ``start`` (a multiple of ``block``, unless ``data`` is empty) to a block boundary
    or the file's end."""
    view = memoryview(data)
    if start % block and len(view):
        raise ValueError(f"a block run starts at a block boundary, not {start}")
    digests = b"".join(xxhash.xxh3_128_digest(view[at:at + block])
                       for at in range(0, len(view), block))
    return BlockRun(-(-start // block), digests, len(view))


def combine(runs: Iterable[BlockRun], size: int, kind: DigestKind) -> str | None:
    """The digest of ``kind`` (:data:`BLOCKS`) of a file of ``size`` bytes from its
    blocks' runs, in any order; None unless they tile the file (module docstring)."""
    if kind.name != BLOCKS:
        return None
    ordered = sorted((r for r in runs if r.count), key=lambda r: r.first)
    at = covered = 0
    for k, run in enumerate(ordered):
        whole = run.count * kind.block
        last = k == len(ordered) - 1
        if run.first != at or len(run.digests) % _DIGEST or not (
            run.covered == whole or (last and whole - kind.block < run.covered < whole)
        ):
            return None
        at += run.count
        covered += run.covered
    if at != -(-size // kind.block) or covered != size:
        return None
    return digest_text(kind, xxhash.xxh3_128_hexdigest(b"".join(r.digests for r in ordered)))


__all__ = [
    "BLOCKS",
    "MAX_BLOCKS",
    "MIN_BLOCK_BYTES",
    "WHOLE",
    "WHOLE_FILE",
    "BlockRun",
    "DigestKind",
    "Digester",
    "block_bytes_for",
    "block_run",
    "blocks_kind",
    "combine",
    "digest_of",
    "digest_text",
    "kind_of",
]
