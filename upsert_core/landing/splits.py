"""Reading one landing file as several independent *splits*, each byte read once.

An engine that reads a large file in parallel plans its splits with :func:`plan_splits`
(by listed size only: no read) and reads split ``i`` with :func:`read_split`, anywhere
(a Spark task). Together the splits are exactly the rows :func:`~.readers.read_batch`
returns, and together they read each byte of the file about once.

- **JSON Lines**: split ``i`` has the nominal byte range ``[i*R, (i+1)*R)`` and owns the
  lines that *start* in it (a line starts at byte 0 or after a ``\\n``). It reads from
  one byte before its range (to see whether a line starts at its first byte) to the
  newline that ends its last line, which may lie past its range: a line split across a
  boundary is read whole by the split where it starts, and skipped by the next one. A
  JSON line cannot hold a raw newline (JSON escapes it), so a line is always one row.
- **Parquet**: split ``i`` owns the row groups whose first page lies in its range, and
  reads the footer and those row groups' column chunks (ranged reads).
- **CSV is not split**: a quoted value may hold a newline, so a line end is not known to
  end a row without parsing the file from its start; CSV files are read whole.

Every split also digests the blocks of the file it owns (``landing.digest``), from the
bytes it reads anyway, so the splits' block runs make the file's content digest with no
second read (``SplitRows.blocks``):

- The nominal ranges start at multiples of the file's block size whenever the file
  holds at least a block per split (:func:`plan_splits`).
- **JSON Lines**: split ``i`` owns the blocks that *start* in its nominal range. With
  aligned ranges those are exactly the bytes of its range, all of which it reads; a
  range that is not aligned (a split smaller than a block) reads the rest of its last
  block too.
- **Parquet**: the owner of a row group reads it, and its bytes rarely end at a range's
  end, so blocks follow the row groups instead: split ``i`` owns the blocks from the
  one holding the first byte of the first row group of split ``i`` or later (block 0
  for split 0) up to the one holding that of split ``i + 1`` or later (the file's end
  for the last split). It reads its blocks and its row groups in one ranged read: a
  boundary's block is read by both neighbours, less than one block per boundary more.
  Every split reads the same footer, so they agree on the boundaries.

Invariants:

- Row numbers: a Parquet split's rows carry their row numbers in the file (the footer
  gives the rows of the row groups before). A JSON Lines split numbers its lines from
  1 (``SplitRows.absolute`` is False) and reports how many lines it owns
  (``SplitRows.lines``, blank lines included): the file row number of a row is its
  number plus the lines of every split before it (:func:`line_offsets`).
- Every split of a Parquet file carries every column the file declares (typed, even
  with no rows), so validation evolves the same schema from each; a JSON Lines split
  without lines has no columns.
- The splits' block runs tile the file (each block digested once, by one split), so
  ``landing.digest.combine`` of them is the digest a sequential read gives.
- Every read is of the version listed (``LandingFile.read_range``): a change raises
  :class:`~upsert_core.errors.LandingFileChanged`; an unreadable file raises
  ``IngestError("<file>: ...")``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core.errors import IngestError
from upsert_core.landing.batch import Column, RawBatch, SourceKind
from upsert_core.landing.digest import BlockRun, block_bytes_for, block_run
from upsert_core.landing.listing import LandingFile
from upsert_core.landing.readers import read_jsonl

SPLIT_SUFFIXES = (".parquet", ".jsonl")
"""Formats that split (module docstring: not CSV)."""

TAIL_READ = 1 << 10
"""A JSON Lines split reads past its range to finish its last line in pieces of this
size, doubling up to ``TAIL_READ_MAX`` (a line usually ends within the first)."""
TAIL_READ_MAX = 1 << 20


@dataclass(frozen=True)
class Split:
    """Split ``index`` of ``count``: the nominal byte range ``[start, end)``."""

    index: int
    count: int
    start: int
    end: int


@dataclass
class SplitRows:
    """What one split read: its rows as a :class:`RawBatch` (positions absolute, or
    local when ``absolute`` is False), the lines it owns (JSON Lines) and the digests of
    the blocks it owns (module docstring)."""

    raw: RawBatch
    absolute: bool
    lines: int = 0
    blocks: BlockRun = BlockRun(0, b"", 0)


def splittable(file: LandingFile) -> bool:
    """Whether ``file``'s format splits and its size is known (module docstring)."""
    return file.suffix in SPLIT_SUFFIXES and file.size > 0 and not file.problem


def plan_splits(file: LandingFile, split_bytes: int) -> list[Split]:
    """``file``'s splits of about ``split_bytes`` bytes each (one for a file that does
    not split or fits in one), starting at multiples of the file's digest block when the
    file holds at least one per split (module docstring)."""
    if split_bytes < 1:
        raise ValueError(f"split_bytes must be at least 1, got {split_bytes}")
    size = max(0, file.size)
    count = max(1, -(-size // split_bytes)) if splittable(file) else 1
    step = -(-size // count) if size else 0
    block = block_bytes_for(size)
    if count > 1 and size >= count * block:
        # Each boundary moves to the nearest block boundary: as many splits, each
        # within a block of the size it would have had.
        bounds = [0, *((i * size // count + block // 2) // block * block
                       for i in range(1, count)), size]
        return [Split(i, count, bounds[i], bounds[i + 1]) for i in range(count)]
    return [
        Split(i, count, min(size, i * step), size if i == count - 1 else min(size, (i + 1) * step))
        for i in range(count)
    ]


def read_split(file: LandingFile, split: Split, *, track_missing: bool = False) -> SplitRows:
    """The rows split ``split`` of ``file`` owns (module docstring); ``track_missing``:
    as :func:`~upsert_core.landing.readers.read_batch`."""
    if file.suffix == ".jsonl":
        data, blocks = _jsonl_bytes(file, split)
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        raw = read_jsonl(file.name, data, track_missing=track_missing)
        return SplitRows(raw, absolute=False, lines=len(lines), blocks=blocks)
    if file.suffix == ".parquet":
        raw, blocks = _parquet_rows(file, split)
        return SplitRows(raw, absolute=True, blocks=blocks)
    raise IngestError(f"{file.name}: {file.suffix or 'this'} files are not read in splits")


def line_offsets(lines: Sequence[int]) -> list[int]:
    """For each split (in order), the lines of the splits before it."""
    return [int(x) for x in np.concatenate([[0], np.cumsum(lines[:-1])])] if lines else []


# --- JSON Lines ---------------------------------------------------------------------


def _jsonl_bytes(file: LandingFile, split: Split) -> tuple[bytes, BlockRun]:
    """The bytes of the lines that start in the split's range, and the digests of the
    blocks it owns (module docstring)."""
    size = file.size
    origin = max(0, split.start - 1)
    head = file.read_range(origin, split.end)
    past = bytearray()  # every byte read past the range, in order from its end
    begin = 0
    if split.start > 0:
        # A line starts at p in [start, end) iff byte p-1 is a newline.
        begin = head.find(b"\n", 0, max(0, split.end - split.start)) + 1
    # begin 0 past the first split: no line starts here (one spans the whole range).
    data = bytearray(head[begin:]) if begin or split.start == 0 else bytearray()
    # Finish the last line: up to the first newline at or after byte end - 1.
    at, step = split.end, TAIL_READ
    while data and not data.endswith(b"\n") and at < size:
        piece = file.read_range(at, min(size, at + step))
        step = min(TAIL_READ_MAX, step * 2)
        if not piece:
            break
        past += piece
        newline = piece.find(b"\n")
        if newline >= 0:
            data += piece[: newline + 1]
            break
        data += piece
        at += len(piece)
    return bytes(data), _blocks_from_start(file, split, origin, head, past)


def _blocks_from_start(
    file: LandingFile, split: Split, origin: int, head: bytes, past: bytearray
) -> BlockRun:
    """The run of the blocks starting in the split's range, from what it read (``head``
    from ``origin``, then ``past``); a block that reaches past both is read to its end."""
    size, block = file.size, block_bytes_for(file.size)
    first = min(size, -(-split.start // block) * block)
    last = min(size, -(-split.end // block) * block)
    if first >= last:
        return BlockRun(first // block, b"", 0)
    head_end = origin + len(head)
    if last <= head_end:
        return block_run(memoryview(head)[first - origin:last - origin], first, block)
    have = head_end + len(past)
    if last > have:  # only a range smaller than a block ends inside its last block
        past += file.read_range(have, last)
    return block_run(head[first - origin:] + bytes(past[:last - head_end]), first, block)


# --- Parquet ------------------------------------------------------------------------


class _RangeFile(io.RawIOBase):
    """The listed version of ``file`` as a seekable file over ranged reads, serving
    reads that fall inside ``held`` (bytes of the file from ``held_at``) from memory."""

    def __init__(self, file: LandingFile, held_at: int = 0, held: bytes = b"") -> None:
        super().__init__()
        self._file = file
        self._pos = 0
        self._held_at = held_at
        self._held = held

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._file.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        end = self._file.size if size is None or size < 0 else min(self._file.size,
                                                                    self._pos + size)
        start, held_end = self._pos, self._held_at + len(self._held)
        if self._held_at <= start and end <= held_end:
            data = self._held[start - self._held_at:end - self._held_at]
        else:
            data = self._file.read_range(start, end)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _first_byte(row_group: Any) -> int:
    """Where a row group's first page lies in the file."""
    starts = []
    for j in range(row_group.num_columns):
        column = row_group.column(j)
        starts.append(column.data_page_offset)
        if column.has_dictionary_page and column.dictionary_page_offset:
            starts.append(column.dictionary_page_offset)
    return min(starts) if starts else 0


def _span(row_group: Any) -> tuple[int, int]:
    """Where a row group's column chunks lie in the file, as ``[start, end)``."""
    start = _first_byte(row_group)
    end = start
    for j in range(row_group.num_columns):
        column = row_group.column(j)
        first = column.data_page_offset
        if column.has_dictionary_page and column.dictionary_page_offset:
            first = min(first, column.dictionary_page_offset)
        end = max(end, first + column.total_compressed_size)
    return start, end


def _block_floor(file: LandingFile, firsts: Sequence[int], at: int) -> int:
    """Where the blocks of the split starting at ``at`` start (module docstring): the
    start of the block holding the first byte of the first row group at or after
    ``at``; the file's end when there is none."""
    block = block_bytes_for(file.size)
    later = [f for f in firsts if f >= at]
    return min(file.size, min(later) // block * block) if later else file.size


def _footer(file: LandingFile) -> tuple[pq.FileMetaData, bytes]:
    """The file's Parquet footer, read by itself (two ranged reads: its length, then
    it), so that reading the row groups then reads only their column chunks; and the
    bytes read, the file's last ones."""
    tail = file.read_range(max(0, file.size - 8), file.size)
    if len(tail) < 8 or tail[4:] != b"PAR1":
        raise IngestError(f"{file.name}: unreadable or truncated Parquet file: no footer")
    length = int.from_bytes(tail[:4], "little")
    if length + 12 > file.size:
        raise IngestError(f"{file.name}: unreadable or truncated Parquet file: bad footer length")
    footer = file.read_range(file.size - 8 - length, file.size - 8)
    return pq.read_metadata(pa.BufferReader(b"PAR1" + footer + tail)), footer + tail


def _read_held(file: LandingFile, start: int, end: int, tail: bytes) -> bytes:
    """Bytes ``[start, end)`` of the file, taking those of ``tail`` (its last bytes,
    already read) from it."""
    tail_at = file.size - len(tail)
    if end <= tail_at:
        return file.read_range(start, end)
    head = file.read_range(start, tail_at) if start < tail_at else b""
    return head + tail[max(0, start - tail_at):end - tail_at]


def _parquet_rows(file: LandingFile, split: Split) -> tuple[RawBatch, BlockRun]:
    try:
        footer, tail = _footer(file)
        groups = [footer.row_group(i) for i in range(footer.num_row_groups)]
        starts = [_first_byte(g) for g in groups]
        last = split.index == split.count - 1
        mine = [i for i, f in enumerate(starts)
                if split.start <= f < split.end or (last and f >= split.end)]
        # The blocks this split digests, and one read for them and its row groups.
        low = 0 if split.index == 0 else _block_floor(file, starts, split.start)
        high = file.size if last else _block_floor(file, starts, split.end)
        held_at, held_end = low, high
        if mine:
            spans = [_span(groups[i]) for i in mine]
            first, end = min(s for s, _ in spans), min(file.size, max(e for _, e in spans))
            if first <= high and end >= low:  # adjacent, as a writer lays them out
                held_at, held_end = min(low, first), max(high, end)
        held = _read_held(file, held_at, held_end, tail)
        blocks = block_run(memoryview(held)[low - held_at:high - held_at], low,
                           block_bytes_for(file.size))
        source = pa.PythonFile(_RangeFile(file, held_at, held), mode="r")
        parquet = pq.ParquetFile(source, metadata=footer)
        meta = parquet.metadata
        names = parquet.schema_arrow.names
        metadata = dict(parquet.schema_arrow.metadata or {})
        firsts, row, owned = [], 0, set(mine)
        for i in range(meta.num_row_groups):
            if i in owned:
                firsts.append(row)
            row += meta.row_group(i).num_rows
        table = (parquet.read_row_groups(mine, use_threads=False) if mine
                 else parquet.schema_arrow.empty_table())
    except IngestError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise IngestError(f"{file.name}: unreadable or truncated Parquet file: {exc}") from exc
    seen: set[str] = set()
    for col in names:
        if col in seen:
            raise IngestError(f"{file.name}: duplicate column {col!r}")
        seen.add(col)
    positions = np.concatenate(
        [np.arange(f + 1, f + meta.row_group(i).num_rows + 1, dtype=np.int64)
         for i, f in zip(mine, firsts, strict=True)]
    ) if mine else np.zeros(0, np.int64)
    columns: dict[str, Column] = {
        col: table.column(k).combine_chunks() for k, col in enumerate(names)
    }
    return (RawBatch(file.name, SourceKind.TYPED, columns, positions, metadata=metadata),
            blocks)


__all__ = [
    "SPLIT_SUFFIXES",
    "Split",
    "SplitRows",
    "line_offsets",
    "plan_splits",
    "read_split",
    "splittable",
]
