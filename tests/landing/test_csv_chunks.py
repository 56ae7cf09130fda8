"""CSV files read in chunks by Arrow's streaming reader (``landing.csv_chunks``) and
validated chunk by chunk (``validate.validate_text_chunks``) give exactly the whole
read's answer (``readers.read_csv``), or refuse (``StreamNotExact``) so the caller
reads the file whole.

Arrow's CSV block (1 MiB) cuts the rows into batches; the tests shrink it (on both the
whole and the chunked read) so that small files are cut at every row, and
``UPSERT_STREAM_BLOCK_BYTES`` (``size``) so that every batch is a chunk and every
ranged read a few bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from upsert_core.errors import IngestError, LandingFileChanged
from upsert_core.landing import list_landing
from upsert_core.landing.batch import RawBatch
from upsert_core.landing.csv_chunks import csv_chunks
from upsert_core.landing.listing import LandingFile
from upsert_core.landing.readers import CSV_BLOCK_BYTES, read_csv
from upsert_core.landing.schema import LogicalType, SourceSchema
from upsert_core.landing.stream_types import StreamNotExact
from upsert_core.landing.validate import ValidatedBatch, validate_file, validate_text_chunks

_SETTINGS = settings(max_examples=300, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
SCHEMA = SourceSchema()  # key "key", order "offset"
TYPED = SourceSchema(columns=(("key", LogicalType.INT64), ("offset", LogicalType.INT64),
                              ("v", LogicalType.STRING)))

_plain = st.sampled_from(["", "1", "2", "-3", "1.5", "1e400", "true", "False", "x", "é",
                          "2024-01-02", "2024-01-02T03:04:05", " 7 ", "\xff"])
_quoted = st.sampled_from(['"a\nb"', '"a\r\nb"', '"1"', '""', '"q""z"', '","', '"\n"',
                           '"x\ry"'])
_field = st.one_of(_plain, _quoted)
_header = st.sampled_from(["key,offset,v", "key,offset,v,w", '"key","offset","v"',
                           "key,offset", "key,offset,__deleted", "key,key", "k\xff,offset",
                           '"key\nx",offset', ""])


@st.composite
def _files(draw: st.DrawFn) -> bytes:
    rows = [draw(_header)]
    rows += [",".join(draw(st.lists(_field, min_size=1, max_size=5)))
             for _ in range(draw(st.integers(0, 12)))]
    ends = draw(st.lists(st.sampled_from(["\n", "\r\n", "\r", "\n\n"]), min_size=len(rows),
                         max_size=len(rows)))
    text = "".join(r + e for r, e in zip(rows, ends, strict=True))
    if text and draw(st.booleans()):
        text = text[:-1]  # no line end after the last row
    data = text.encode("utf-8", "surrogateescape").replace("\xff".encode(), b"\xff")
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return data


_int = st.sampled_from(["0", "1", "2", "-3", "7", "", "x", "1.5"])


@st.composite
def _tables(draw: st.DrawFn) -> bytes:
    """Files with a key and an order column: validation gets past the header."""
    header = draw(st.sampled_from(["key,offset,v", '"key","offset","v","w"',
                                   "key,offset,v,__deleted"]))
    width = header.count(",") + 1
    rows = [header]
    for _ in range(draw(st.integers(0, 10))):
        fields = [draw(_int), draw(_int)] + draw(st.lists(_field, min_size=width - 2,
                                                          max_size=width - 2))
        if draw(st.integers(0, 9)) == 0:
            fields = fields[: draw(st.integers(1, width + 1))] or ["1"]  # a bad row
        rows.append(",".join(fields))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    data = end.join(rows).encode("utf-8", "surrogateescape").replace("\xff".encode(), b"\xff")
    if draw(st.booleans()):
        data += end.encode()
    return b"\xef\xbb\xbf" + data if draw(st.booleans()) else data


def _landing(tmp_path: Path, data: bytes, name: str = "f.csv") -> LandingFile:
    for old in tmp_path.iterdir():
        old.unlink()
    (tmp_path / name).write_bytes(data)
    (file,) = list_landing(str(tmp_path))
    return file


def _rows(batches: list[RawBatch]) -> tuple[list[int], list[object], dict[str, list[object]]]:
    """Positions, errors and column values of the batches, concatenated."""
    names = list(batches[0].columns)
    assert all(list(b.columns) == names for b in batches)  # every chunk: every column
    return (
        [int(p) for b in batches for p in b.positions],
        [e for b in batches for e in b.errors],
        {n: [v for b in batches for v in b.columns[n].cast(pa.binary()).to_pylist()]
         for n in names},
    )


def _whole(data: bytes, block: int = CSV_BLOCK_BYTES) -> RawBatch | IngestError:
    try:
        return read_csv("f.csv", data, block_size=block)
    except IngestError as exc:
        return exc


def _same(chunks: list[ValidatedBatch], whole: ValidatedBatch) -> None:
    assert chunks[-1].schema == whole.schema
    assert [e for c in chunks for e in c.errors] == whole.errors
    assert [k for c in chunks for k in c.keys] == whole.keys
    assert [r for c in chunks for r in c.rows] == whole.rows
    assert [int(p) for c in chunks for p in c.positions] == [int(p) for p in whole.positions]
    assert [int(o) for c in chunks for o in c.orders] == [int(o) for o in whole.orders]
    assert [bool(d) for c in chunks for d in c.deletes] == [bool(d) for d in whole.deletes]


@_SETTINGS
@given(data=_files(), size=st.integers(1, 40), block=st.sampled_from([16, 24, 48, 1 << 20]))
def test_chunks_are_the_whole_reads_rows(
    tmp_path: Path, data: bytes, size: int, block: int
) -> None:
    file = _landing(tmp_path, data)
    whole = _whole(data, block)
    try:
        chunks = list(csv_chunks(file, size, arrow_block=block))
    except IngestError as exc:
        assert isinstance(whole, IngestError), exc  # refused where the whole read refuses
        return
    assert not isinstance(whole, IngestError), whole
    assert _rows(chunks) == _rows([whole])
    default = _whole(data)
    # Arrow's small blocks are only a way to cut small files: the whole read in
    # its own 1 MiB block is the same.
    assert not isinstance(default, IngestError) and _rows([whole]) == _rows([default])


@_SETTINGS
@given(data=st.one_of(_tables(), _tables(), _files()), size=st.integers(1, 40),
       block=st.sampled_from([32, 64, 1 << 20]), schema=st.sampled_from([SCHEMA, TYPED]))
def test_streamed_validation_is_the_whole_files_or_refused(
    tmp_path: Path, data: bytes, size: int, block: int, schema: SourceSchema
) -> None:
    file = _landing(tmp_path, data)
    try:
        whole: ValidatedBatch | IngestError = validate_file(file, schema)
    except IngestError as exc:
        whole = exc
    try:
        chunks = list(validate_text_chunks(file, schema, block_size=size, csv_block=block))
    except StreamNotExact:
        return  # the engine reads it whole
    assert not isinstance(whole, IngestError), whole
    _same(chunks, whole)


def _typical() -> bytes:
    """Quoted newlines (LF and CRLF), doubled quotes, CRLF line ends, a BOM, a blank
    line, and rows with too few and too many fields between good ones."""
    rows = ['"key","offset","v","__deleted"']
    for i in range(12):
        v = ['"a\nb"', '"c\r\nd"', '"q""z"', "plain", "", '"é,日"'][i % 6]
        rows.append(f"{i % 5},{i},{v},{'true' if i % 4 == 3 else 'false'}")
        if i % 5 == 2:
            rows.append(f"{i},{i}" if i % 2 else f'{i},{i},"x\ny",false,extra')
    rows.insert(4, "")
    return b"\xef\xbb\xbf" + "\r\n".join(rows).encode() + b"\r\n"


def test_every_cut_position_of_a_typical_file_streams_exactly(tmp_path: Path) -> None:
    data = _typical()
    file = _landing(tmp_path, data)
    whole = validate_file(file, SCHEMA)
    assert whole.errors and len(whole.keys) == 12
    longest = max(len(r) for r in data.split(b"\r\n"))
    cuts: set[tuple[int, ...]] = set()
    for block in range(longest + 3, len(data) + 2):  # every Arrow block holding a row
        for size in (1, 7, 64, len(data)):
            chunks = list(validate_text_chunks(file, SCHEMA, block_size=size, csv_block=block))
            _same(chunks, whole)
            if size == 1:
                cuts.add(tuple(int(c.positions[-1]) for c in chunks if len(c.positions)))
    assert len(cuts) > 5  # the blocks did cut the rows in many places


def test_errors_between_and_after_chunks_keep_their_rows(tmp_path: Path) -> None:
    data = b"key,offset\n1,1\nx\n2,2\ny\nz\n3,3\n4,4,4\n"
    file = _landing(tmp_path, data)
    whole = read_csv("f.csv", data)
    assert [e.row for e in whole.errors] == [2, 4, 5, 7]
    for block in range(12, len(data) + 1):
        chunks = list(csv_chunks(file, 1, arrow_block=block))
        assert _rows(chunks) == _rows([whole])
        for c in chunks:  # each chunk's errors lie before its last row (the last: all)
            if len(c.positions) and c is not chunks[-1]:
                assert all(e.row < c.positions[-1] for e in c.errors)


def test_types_that_change_after_the_first_chunk_are_refused(tmp_path: Path) -> None:
    lines = ["key,offset,w,s"] + [f"{i},{i},{i},{i}" for i in range(8)] + ["9,9,2.5,x"]
    file = _landing(tmp_path, "\n".join(lines).encode())
    whole = validate_file(file, SCHEMA)
    assert whole.schema.type_of("w") is LogicalType.FLOAT64
    assert whole.schema.type_of("s") is LogicalType.STRING
    with pytest.raises(StreamNotExact):
        list(validate_text_chunks(file, SCHEMA, block_size=1, csv_block=16))
    _same(list(validate_text_chunks(file, SCHEMA, block_size=1 << 20)), whole)
    # Typed by the shard already, the same values are row errors chunk by chunk as whole.
    typed = SourceSchema(columns=(("w", LogicalType.INT64), ("s", LogicalType.INT64)))
    _same(list(validate_text_chunks(file, typed, block_size=1, csv_block=16)),
          validate_file(file, typed))


def test_types_every_chunk_agrees_on_stream(tmp_path: Path) -> None:
    lines = ["key,offset,f,b,d"] + [
        f"{i},{i},{i}.5,{'TRUE' if i % 2 else 'false'},2024-01-0{i + 1}" for i in range(9)]
    file = _landing(tmp_path, "\r\n".join(lines).encode())
    whole = validate_file(file, SCHEMA)
    assert [t for _, t in whole.schema.columns][2:] == [
        LogicalType.FLOAT64, LogicalType.BOOL, LogicalType.DATE]
    chunks = list(validate_text_chunks(file, SCHEMA, block_size=1, csv_block=40))
    assert len(chunks) > 3
    _same(chunks, whole)


@pytest.mark.parametrize("data", [b"", b"   \n\r\n  ", b"key,offset", b"key,offset\n",
                                  b"\xef\xbb\xbfkey,offset\r\n", b"\n\nkey,offset\n\n",
                                  b"key,offset\n\n\n", b'"key\nk",offset\n'])
@pytest.mark.parametrize("size", [1, 3, 1 << 20])
def test_empty_and_header_only_files(tmp_path: Path, data: bytes, size: int) -> None:
    file = _landing(tmp_path, data)
    whole = _whole(data)
    if isinstance(whole, IngestError):  # "key,offset" without a line end: Arrow refuses
        with pytest.raises(IngestError):
            list(csv_chunks(file, size))
        with pytest.raises(StreamNotExact):
            list(validate_text_chunks(file, SCHEMA, block_size=size))
        return
    chunks = list(csv_chunks(file, size))
    assert len(chunks) == 1
    assert list(chunks[0].columns) == list(whole.columns)
    assert chunks[0].num_rows == 0 and not chunks[0].errors
    _same(list(validate_text_chunks(file, SCHEMA, block_size=size)),
          validate_file(file, SCHEMA))


def test_a_header_past_the_first_reads_is_found(tmp_path: Path) -> None:
    # Blank lines and a quoted newline in the header: the prefix grows until the header
    # is read and a line follows it.
    data = b'\n\n\r\n"k\ne y",offset\n1,1\n2,2\n'
    file = _landing(tmp_path, data)
    whole = read_csv("f.csv", data)
    assert list(whole.columns) == ["k\ne y", "offset"] and whole.positions.tolist() == [1, 2]
    for size in range(1, len(data)):
        assert _rows(list(csv_chunks(file, size, arrow_block=32))) == _rows([whole])


@pytest.mark.parametrize("extra", [10, 2 * CSV_BLOCK_BYTES])
def test_a_row_longer_than_arrows_block_is_read_as_the_whole_read_reads_it(
    tmp_path: Path, extra: int
) -> None:
    # Arrow refuses a row much longer than its block ("straddling object"); the chunks
    # parse in read_csv's block, so they read such a file exactly as the whole read.
    data = b"key,offset,v\n1,1," + b"x" * (CSV_BLOCK_BYTES + extra) + b"\n2,2,y\n"
    file = _landing(tmp_path, data)
    whole = _whole(data)
    if extra > CSV_BLOCK_BYTES:
        assert isinstance(whole, IngestError) and "straddl" in str(whole)
        with pytest.raises(IngestError, match="straddl"):
            list(csv_chunks(file, 1 << 16))
        with pytest.raises(StreamNotExact):
            list(validate_text_chunks(file, SCHEMA, block_size=1 << 16))
    else:
        assert not isinstance(whole, IngestError)
        assert _rows(list(csv_chunks(file, 1 << 16))) == _rows([whole])


def test_a_malformed_row_that_is_not_utf8_is_refused_quietly(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    data = b"key,offset\n" + b"1,1\n" * 20 + b"\xff,2,3\n4,4\n"
    file = _landing(tmp_path, data)
    with pytest.raises(IngestError):
        read_csv("f.csv", data)
    with pytest.raises(StreamNotExact):
        list(validate_text_chunks(file, SCHEMA, block_size=8, csv_block=32))
    assert capfd.readouterr().err == ""  # no "Exception ignored" traceback


def test_values_that_are_not_utf8_are_row_errors_as_whole(tmp_path: Path) -> None:
    data = b"key,offset,v\n" + b"".join(b"%d,%d,\xe6\x97%s\n" % (i, i, b"x" * i)
                                        for i in range(6))
    file = _landing(tmp_path, data)
    whole = validate_file(file, SCHEMA)
    assert len(whole.errors) == 6
    _same(list(validate_text_chunks(file, SCHEMA, block_size=3, csv_block=24)), whole)


def test_a_file_changed_while_read_is_changed(tmp_path: Path) -> None:
    file = _landing(tmp_path, b"key,offset\n" + b"1,1\n" * 4000)
    chunks = csv_chunks(file, 8, arrow_block=16)
    next(chunks)  # Arrow has read a few blocks ahead, not the file
    path = tmp_path / "f.csv"
    path.write_bytes(b"key,offset\n" + b"9,9\n" * 4000)
    os.utime(path, ns=(1, 1))
    with pytest.raises(LandingFileChanged):
        list(chunks)
    with pytest.raises(LandingFileChanged):
        list(validate_text_chunks(file, SCHEMA, block_size=8, csv_block=16))


def test_each_byte_is_read_once(tmp_path: Path) -> None:
    from upsert_core.landing import read_counter

    data = b"key,offset,v\n" + b"".join(b'%d,%d,"v\n%d"\n' % (i, i, i) for i in range(50))
    file = _landing(tmp_path, data)
    before = read_counter.bytes_read(file.url)
    chunks = list(csv_chunks(file, 10, arrow_block=32))
    assert read_counter.bytes_read(file.url) - before == len(data)
    assert len(chunks) > 10
    assert np.array_equal(np.concatenate([c.positions for c in chunks]), np.arange(1, 51))
