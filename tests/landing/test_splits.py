"""Reading a landing file as splits (``landing.splits``): together the splits are the
rows the whole-file reader returns, with the same row numbers and errors, each byte read
about once, and their block digests make the file's content digest a sequential read
gives (at any block size); a file changed since it was listed is refused."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.errors import IngestError, LandingFileChanged
from upsert_core.landing import LandingFile, digest, list_landing, read_batch, read_counter
from upsert_core.landing.batch import RawBatch
from upsert_core.landing.digest import blocks_kind, combine, digest_of
from upsert_core.landing.splits import line_offsets, plan_splits, read_split

BLOCK = st.sampled_from([1, 16, 64, 100, 256, 1 << 16])
"""Block sizes (``landing.digest.MIN_BLOCK_BYTES``): from one byte to the real one."""


@contextmanager
def _blocks_of(block: int) -> Iterator[None]:
    """Files digest in blocks of ``block`` bytes (they are all far below the real one)."""
    with mock.patch.object(digest, "MIN_BLOCK_BYTES", block):
        yield

LINE = st.one_of(
    st.fixed_dictionaries({"key": st.integers(-5, 5)}, optional={
        "v": st.one_of(st.none(), st.integers(), st.text(max_size=30)),
        "w": st.floats(allow_nan=False, allow_infinity=False),
    }).map(json.dumps),
    st.sampled_from(["", "   ", "not json", "[1, 2]", '{"key": 1, "key": 2}', "null",
                     '{"key": 3}\r', "\ufeff{\"key\": 4}"]),
    st.text(max_size=200).map(lambda t: json.dumps({"key": 1, "long": t})),
)


def _rows(batch: RawBatch, offset: int = 0) -> list[tuple[int, dict[str, object]]]:
    """(file row number, non-null values) of every row of ``batch``."""
    names = batch.names
    out = []
    for i, pos in enumerate(batch.positions.tolist()):
        values = {}
        for name in names:
            col = batch.columns[name]
            value = col[i] if isinstance(col, list) else col[i].as_py()
            if value is not None:
                values[name] = value
        out.append((pos + offset, values))
    return out


def _listed(root: Path, name: str) -> LandingFile:
    return next(f for f in list_landing(str(root)) if f.name == name)


def _read_in_splits(file: LandingFile, split_bytes: int) -> tuple[list, list, int]:
    """The rows and errors of the splits, and how many there were; checks that their
    block runs make the digest of the whole file's bytes."""
    splits = plan_splits(file, split_bytes)
    got = [read_split(file, s) for s in splits]
    offsets = line_offsets([g.lines for g in got])
    rows, errors = [], []
    for g, off in zip(got, offsets, strict=True):
        off = 0 if g.absolute else off
        rows += _rows(g.raw, off)
        errors += [(e.row + off, e.reason) for e in g.raw.errors]
    data = Path(file.url).read_bytes()
    kind = blocks_kind(file.size)
    assert combine([g.blocks for g in got], file.size, kind) == digest_of(data, kind)
    return rows, errors, len(splits)


def _aligned(file: LandingFile, split_bytes: int) -> bool:
    block = blocks_kind(file.size).block
    return all(s.start % block == 0 for s in plan_splits(file, split_bytes))


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(LINE, max_size=40), trailing=st.booleans(), bom=st.booleans(),
       split_bytes=st.integers(1, 400), block=BLOCK)
def test_jsonl_splits_are_the_whole_file(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], trailing: bool, bom: bool,
    split_bytes: int, block: int,
) -> None:
    with _blocks_of(block):
        _jsonl_splits_are_the_whole_file(tmp_path_factory, lines, trailing, bom, split_bytes)


def _jsonl_splits_are_the_whole_file(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], trailing: bool, bom: bool,
    split_bytes: int,
) -> None:
    root = tmp_path_factory.mktemp("landing")
    data = "\n".join(lines).encode() + (b"\n" if trailing and lines else b"")
    (root / "a.jsonl").write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    file = _listed(root, "a.jsonl")
    if file.size == 0:
        return  # an empty file does not split (plan_splits gives one empty range)
    whole = read_batch(file)
    before = read_counter.bytes_read(file.url)
    rows, errors, count = _read_in_splits(file, split_bytes)
    read = read_counter.bytes_read(file.url) - before
    assert rows == _rows(whole)
    assert errors == [(e.row, e.reason) for e in whole.errors]
    # Each split reads one byte before its range and finishes its last line past it;
    # ranges smaller than a block (not aligned) read the rest of their last block too.
    longest = max(len(line) for line in data.split(b"\n")) + 1
    unaligned = 0 if _aligned(file, split_bytes) else count * blocks_kind(file.size).block
    assert read <= file.size + count * (1 + 2 * max(longest, 1024)) + unaligned


def test_a_line_across_a_boundary_is_read_by_the_split_where_it_starts(tmp_path: Path) -> None:
    lines = [json.dumps({"key": i, "v": "x" * (i * 7 % 23)}) for i in range(50)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    file = _listed(tmp_path, "a.jsonl")
    splits = plan_splits(file, 100)
    starts = {0}
    at = 0
    for line in lines:
        at += len(line) + 1
        starts.add(at)
    assert any(s.start not in starts for s in splits[1:])  # a boundary inside a line
    got = [read_split(file, s) for s in splits]
    keys = [k for g in got for k in g.raw.columns.get("key", [])]
    assert keys == list(range(50))
    assert sum(g.lines for g in got) == 50


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8),
       split_bytes=st.integers(200, 20_000), block=BLOCK)
def test_parquet_splits_are_the_whole_file_and_read_only_its_row_groups(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], split_bytes: int, block: int
) -> None:
    with _blocks_of(block):
        _parquet_splits_are_the_whole_file(tmp_path_factory, sizes, split_bytes)


def _parquet_splits_are_the_whole_file(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], split_bytes: int
) -> None:
    root = tmp_path_factory.mktemp("landing")
    tables = []
    start = 0
    for n in sizes:
        tables.append(pa.table({"key": pa.array(range(start, start + n), pa.int64()),
                                "v": [f"value {i}" for i in range(start, start + n)]}))
        start += n
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, tables[0].schema) as writer:
        for table in tables:
            writer.write_table(table)  # one row group each
    (root / "a.parquet").write_bytes(sink.getvalue())
    file = _listed(root, "a.parquet")
    assert pq.ParquetFile(root / "a.parquet").metadata.num_row_groups == len(sizes)
    whole = read_batch(file)
    before = read_counter.bytes_read(file.url)
    rows, errors, count = _read_in_splits(file, split_bytes)
    read = read_counter.bytes_read(file.url) - before
    assert rows == _rows(whole) and errors == []
    # Every split reads the footer; a row group's start is not aligned, so the block
    # holding it is read by both neighbours (less than a block per boundary).
    footer = int.from_bytes((root / "a.parquet").read_bytes()[-8:-4], "little") + 8
    block = blocks_kind(file.size).block
    assert read <= file.size + (count - 1) * (footer + min(block, file.size) - 1)


def test_a_parquet_split_without_row_groups_still_has_every_column(tmp_path: Path) -> None:
    pq.write_table(pa.table({"key": [1, 2], "v": ["a", "b"]}), tmp_path / "a.parquet")
    file = _listed(tmp_path, "a.parquet")
    splits = plan_splits(file, max(1, file.size // 4))
    got = [read_split(file, s) for s in splits]
    assert sum(g.raw.num_rows for g in got) == 2
    assert all(g.raw.names == ["key", "v"] for g in got)
    assert any(g.raw.num_rows == 0 for g in got)


def test_plan_covers_the_file_with_contiguous_ranges(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b"{}\n" * 1000)
    (tmp_path / "b.csv").write_bytes(b"key,offset\n" + b"1,1\n" * 1000)
    for split_bytes in (1, 7, 100, 2999, 3000, 10_000):
        splits = plan_splits(_listed(tmp_path, "a.jsonl"), split_bytes)
        assert splits[0].start == 0 and splits[-1].end == 3000
        assert all(a.end == b.start for a, b in zip(splits, splits[1:], strict=False))
        assert len(splits) == -(-3000 // split_bytes)
    with _blocks_of(256):  # a split of at least a block starts at a block boundary
        for split_bytes in (300, 700, 1000, 2999):  # at least a block per split
            splits = plan_splits(_listed(tmp_path, "a.jsonl"), split_bytes)
            assert splits[0].start == 0 and splits[-1].end == 3000
            assert all(a.end == b.start for a, b in zip(splits, splits[1:], strict=False))
            assert all(s.start % 256 == 0 for s in splits)
            assert len(splits) == -(-3000 // split_bytes)  # as many as without blocks
            assert all(s.end - s.start <= -(-3000 // len(splits)) + 256 for s in splits)
            assert all(s.end - s.start >= 256 for s in splits[:-1])
    assert len(plan_splits(_listed(tmp_path, "b.csv"), 10)) == 1  # CSV does not split
    with pytest.raises(IngestError, match="not read in splits"):
        read_split(_listed(tmp_path, "b.csv"), plan_splits(_listed(tmp_path, "b.csv"), 10)[0])


def test_a_file_changed_since_it_was_listed_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"key": 1}\n' * 100)
    file = _listed(tmp_path, "a.jsonl")
    (tmp_path / "a.jsonl").write_bytes(b'{"key": 2}\n' * 101)
    with pytest.raises(LandingFileChanged, match="a.jsonl"):
        read_split(file, plan_splits(file, 300)[1])


def test_damaged_parquet_is_one_file_error(tmp_path: Path) -> None:
    pq.write_table(pa.table({"key": [1, 2]}), tmp_path / "a.parquet")
    data = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "a.parquet").write_bytes(data[:-20] + b"\0" * 16 + data[-4:])
    file = _listed(tmp_path, "a.parquet")
    with pytest.raises(IngestError, match="a.parquet: unreadable or truncated Parquet"):
        read_split(file, plan_splits(file, 10)[0])
    os.truncate(tmp_path / "a.parquet", 10)
    with pytest.raises((IngestError, LandingFileChanged), match="a.parquet"):
        read_split(file, plan_splits(file, 10)[0])
