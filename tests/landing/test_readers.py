"""Readers: per-format parsing, row numbering, and file-level versus row-level damage."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.landing.helpers import jsonl, parquet
from upsert_core.errors import IngestError
from upsert_core.landing import (
    SourceKind,
    landing_file,
    read_batch,
    read_csv,
    read_jsonl,
    read_parquet,
)


def test_jsonl_zero_bytes_is_an_empty_batch() -> None:
    raw = read_jsonl("e.jsonl", b"")
    assert raw.num_rows == 0 and raw.columns == {} and raw.errors == []


def test_jsonl_columns_in_order_of_first_appearance_missing_values_null() -> None:
    raw = read_jsonl("a.jsonl", jsonl({"b": 1, "a": 2}, {"c": 3}, {"a": 4}))
    assert raw.kind is SourceKind.JSON
    assert raw.names == ["b", "a", "c"]
    assert raw.columns == {"b": [1, None, None], "a": [2, None, 4], "c": [None, 3, None]}
    assert raw.positions.tolist() == [1, 2, 3]


def test_jsonl_malformed_and_non_object_lines_are_row_errors_with_line_numbers() -> None:
    data = jsonl({"k": 1}, "{not json", [1, 2], {"k": 2}, '"text"', "{}")
    data += b"\xff\xfe garbage\n"

    raw = read_jsonl("m.jsonl", data)

    assert raw.positions.tolist() == [1, 4, 6]
    assert [(e.file, e.row) for e in raw.errors] == [("m.jsonl", r) for r in (2, 3, 5, 7)]
    assert raw.errors[0].reason.startswith("malformed JSON line")
    assert "not an object (got list)" in raw.errors[1].reason
    assert raw.errors[3].reason.startswith("malformed JSON line")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_jsonl_nan_and_infinity_are_not_json(literal: str) -> None:
    data = f'{{"key": 1, "offset": 1}}\n{{"key": 2, "offset": 2, "v": {literal}}}\n'.encode()
    raw = read_jsonl("n.jsonl", data)
    assert raw.positions.tolist() == [1]
    [error] = raw.errors
    assert (error.file, error.row) == ("n.jsonl", 2)
    assert f"{literal} is not a JSON value" in error.reason


def test_jsonl_a_duplicated_key_is_an_error_row_not_last_wins() -> None:
    data = b'{"key": 1, "offset": 1}\n{"key": 1, "key": 2, "offset": 2}\n{"a": {"b": 1, "b": 2}}\n'
    raw = read_jsonl("d.jsonl", data)
    assert raw.positions.tolist() == [1]
    assert [(e.row, e.reason) for e in raw.errors] == [
        (2, "malformed JSON line: duplicate key 'key'"),
        (3, "malformed JSON line: duplicate key 'b'"),
    ]


def test_jsonl_blank_lines_crlf_bom_and_missing_final_newline() -> None:
    data = b'\xef\xbb\xbf{"k": 1}\r\n\n   \n{"k": 2}'
    raw = read_jsonl("c.jsonl", data)
    assert raw.columns == {"k": [1, 2]}
    assert raw.positions.tolist() == [1, 4]  # the blank lines still count
    assert raw.errors == []


def test_parquet_roundtrip_and_empty_parquet() -> None:
    table = pa.table({"key": [1, 2], "offset": [5, 6]})
    raw = read_parquet("p.parquet", parquet(table))
    assert raw.kind is SourceKind.TYPED
    assert raw.positions.tolist() == [1, 2]
    assert raw.columns["key"].to_pylist() == [1, 2]

    empty = read_parquet("e.parquet", parquet(table.slice(0, 0)))
    assert empty.num_rows == 0 and empty.names == ["key", "offset"]


@pytest.mark.parametrize("cut", [0, 4, 20, -8, -1])
def test_truncated_parquet_is_a_file_error_naming_the_file(cut: int) -> None:
    data = parquet(pa.table({"key": list(range(100)), "offset": list(range(100))}))
    with pytest.raises(IngestError, match=r"^t\.parquet: unreadable or truncated Parquet"):
        read_parquet("t.parquet", data[:cut])


def test_garbage_parquet_is_a_file_error() -> None:
    with pytest.raises(IngestError, match="g.parquet"):
        read_parquet("g.parquet", b"PAR1 this is not parquet PAR1")


def test_csv_reads_text_and_bad_rows_become_row_errors() -> None:
    data = b'key,offset,v\n1,1,a\n2,2\n"3",3,"multi\nline"\n4,4,x,extra\n5,5,\n'

    raw = read_csv("c.csv", data)

    assert raw.kind is SourceKind.TEXT
    assert raw.positions.tolist() == [1, 3, 5]
    assert raw.columns["key"].to_pylist() == ["1", "3", "5"]
    assert raw.columns["v"].to_pylist() == ["a", "multi\nline", None]
    assert [(e.row, e.reason) for e in raw.errors] == [
        (2, "CSV row has 2 fields, expected 3"),
        (4, "CSV row has 4 fields, expected 3"),
    ]


def test_csv_empty_file_and_header_only() -> None:
    assert read_csv("e.csv", b"").num_rows == 0
    header_only = read_csv("h.csv", b"key,offset\n")
    assert header_only.num_rows == 0 and header_only.names == ["key", "offset"]


def test_csv_duplicate_header_and_bad_encoding_are_file_errors() -> None:
    with pytest.raises(IngestError, match="d.csv: duplicate column 'a'"):
        read_csv("d.csv", b"a,a\n1,2\n")
    with pytest.raises(IngestError, match="u.csv: unreadable CSV"):
        read_csv("u.csv", b"k\xff,offset\n1,2\n")


def test_csv_header_is_the_first_non_empty_line_and_must_be_utf8() -> None:
    # Found by the fuzz suite: pyarrow skips blank lines, so a blank first line must not
    # hide an undecodable header from the UTF-8 check (it raised UnicodeDecodeError).
    with pytest.raises(IngestError, match=r"b\.csv: .*not valid UTF-8"):
        read_csv("b.csv", b"\n\x80key,offset,v\r\n")
    batch = read_csv("b.csv", b"\n\nkey,offset\n1,2\n\n3,4\n")
    assert list(batch.columns) == ["key", "offset"] and batch.positions.tolist() == [1, 2]


def test_read_batch_dispatches_on_suffix(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(jsonl({"key": 1}))
    (tmp_path / "b.CSV").write_bytes(b"key\n1\n")
    (tmp_path / "c.parquet").write_bytes(parquet(pa.table({"key": [1]})))
    kinds = [read_batch(landing_file(str(tmp_path), n)).kind for n in ("a.jsonl", "b.CSV")]
    assert kinds == [SourceKind.JSON, SourceKind.TEXT]
    assert read_batch(landing_file(str(tmp_path), "c.parquet")).kind is SourceKind.TYPED
    with pytest.raises(IngestError, match="not a batch file"):
        read_batch(landing_file(str(tmp_path), "d.txt"))


@pytest.mark.parametrize(
    "line",
    [
        b'{"key": 2, "offset": 2, "v\xed\xa0\x80": 5}',  # CESU-8 surrogate in a name
        b'{"key": 2, "offset": 2, "v": "\xed\xa0\x80"}',  # ... in a value
        '{"key": 2, "offset": 2, "v": "x"}'.encode("utf-16-le"),  # json.loads guessed it
        b'{"key": 2, "offset": 2, "v": "\xff"}',
    ],
)
def test_jsonl_a_line_that_is_not_utf8_is_a_row_error(line: bytes) -> None:
    # CONTRACT.md, bad input: "a string that is not valid UTF-8" is a row error. Parsed
    # from bytes, json.loads accepted surrogate bytes (decoding with "surrogatepass"),
    # so a column name that is not UTF-8 entered the shard's schema and every later
    # `upsertctl snapshot` failed with UnicodeEncodeError; a UTF-16 line was guessed.
    data = b'{"key": 1, "offset": 1}\n' + line + b"\n" + b'{"key": 3, "offset": 3}\n'
    raw = read_jsonl("u.jsonl", data)
    assert [(e.file, e.row) for e in raw.errors] == [("u.jsonl", 2)]
    assert "malformed JSON line" in raw.errors[0].reason
    assert raw.names == ["key", "offset"] and list(raw.positions) == [1, 3]


def test_jsonl_a_byte_order_mark_starting_a_later_line_is_still_skipped() -> None:
    raw = read_jsonl("b.jsonl", b'{"key": 1, "offset": 1}\n\xef\xbb\xbf{"key": 2, "offset": 2}\n')
    assert not raw.errors and raw.columns["key"] == [1, 2]


def test_csv_with_carriage_return_line_ends_is_read_like_pyarrow_reads_it() -> None:
    # The header check read the text with universal newlines off, so a CR-only file
    # (classic Mac / Excel export), which pyarrow reads, was "unreadable CSV file".
    raw = read_csv("r.csv", b"key,offset,v\r1,1,a\r2,2\r3,3,c\r")
    assert raw.names == ["key", "offset", "v"] and list(raw.positions) == [1, 3]
    assert [(e.row, e.reason) for e in raw.errors] == [(2, "CSV row has 2 fields, expected 3")]


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
@pytest.mark.parametrize("shift", [0, 1, 2])
def test_csv_a_quoted_crlf_across_arrows_block_keeps_its_newline(bom: bytes, shift: int) -> None:
    # Arrow drops a "\n" starting a block after one that ends in "\r", even inside a
    # quoted value (apache/arrow#51368, open): the value came back one byte short,
    # silently, wherever a 1 MiB block boundary fell inside a quoted CRLF.
    from upsert_core.landing.readers import CSV_BLOCK_BYTES

    head = b"key,v\n1,\""
    pad = b"a" * (CSV_BLOCK_BYTES - len(head) - 2 + shift)  # "\r" ends block 1 at shift 1
    data = bom + head + pad + b"\r\nb\"\r\n2,\"c\r\nd\"\r\n"
    batch = read_csv("c.csv", data)
    assert batch.columns["v"].to_pylist() == [pad.decode() + "\r\nb", "c\r\nd"]
    assert batch.positions.tolist() == [1, 2] and not batch.errors
