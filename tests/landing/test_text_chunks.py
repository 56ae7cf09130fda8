"""JSON Lines files read in blocks cut at line ends (``landing.text_chunks``) and
validated chunk by chunk (``validate.validate_text_chunks``) give exactly the whole
read's answer, or refuse (``StreamNotExact``) so the caller reads the file whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from upsert_core.errors import LandingFileChanged, UpsertPlatformError
from upsert_core.landing import list_landing, read_batch
from upsert_core.landing.convert import JsonKinds
from upsert_core.landing.missing import MissingPolicy
from upsert_core.landing.schema import LogicalType, SourceSchema
from upsert_core.landing.stream_types import StreamNotExact
from upsert_core.landing.text_chunks import jsonl_chunks, line_blocks
from upsert_core.landing.validate import ValidatedBatch, validate_file, validate_text_chunks
from upsert_core.landing.value_checks import parse_value_checks

_SETTINGS = settings(max_examples=300, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
SCHEMA = SourceSchema()  # key "key", order "offset"
TYPED = SourceSchema(columns=(("key", LogicalType.INT64), ("offset", LogicalType.INT64),
                              ("v", LogicalType.STRING)))

_value = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(2**63 - 2, 2**63 + 1),
    st.sampled_from([1.5, 2.0, -0.0, 1e300]),
    st.sampled_from(["a", "é", "日本", "2024-01-02", "7"]),
    st.just({"x": 1}), st.just([1]),
)
_object = st.dictionaries(st.sampled_from(["key", "offset", "v", "w", "ü"]), _value, max_size=5)
_line = st.one_of(
    _object.map(lambda o: json.dumps(o, ensure_ascii=False).encode()),
    _object.map(lambda o: json.dumps(o).encode()),
    st.sampled_from([b"", b"  ", b"\r", b"{", b"[1]", b"null", b"\xff\xfe", b"\xe6\x97",
                     b'{"a": NaN}', b'{"k": 1, "k": 2}', b"\xef\xbb\xbf{}", b'{"\\ud800": 1}']),
)


@st.composite
def _files(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_line, max_size=14))
    ends = draw(st.lists(st.sampled_from([b"\n", b"\r\n"]), min_size=len(lines),
                         max_size=len(lines)))
    data = b"".join(line + end for line, end in zip(lines, ends, strict=True))
    if data and draw(st.booleans()):
        data = data[:-1]  # a last line without newline
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return data


def _landing(tmp_path: Path, data: bytes, name: str = "f.jsonl"):  # type: ignore[no-untyped-def]
    for old in tmp_path.iterdir():
        old.unlink()
    (tmp_path / name).write_bytes(data)
    (file,) = list_landing(str(tmp_path))
    return file


def _same(chunks: list[ValidatedBatch], whole: ValidatedBatch) -> None:
    assert chunks[-1].schema == whole.schema
    assert [e for c in chunks for e in c.errors] == whole.errors
    assert [k for c in chunks for k in c.keys] == whole.keys
    assert [r for c in chunks for r in c.rows] == whole.rows
    assert [int(p) for c in chunks for p in c.positions] == [int(p) for p in whole.positions]
    assert [int(o) for c in chunks for o in c.orders] == [int(o) for o in whole.orders]
    assert [bool(d) for c in chunks for d in c.deletes] == [bool(d) for d in whole.deletes]
    if whole.missing is not None:
        width = len(whole.schema.names)
        got = [list(m[:width]) + [False] * (width - len(m)) for c in chunks
               if c.missing is not None for m in c.missing.tolist()]
        assert got == whole.missing.tolist()


_CHECKS = st.sampled_from([
    None, {"w": {"min": 0}}, {"w": {"isin": [1.5, 2.0]}}, {"v": {"not_null": True}},
    {"v": {"regex": "a"}},
])


@_SETTINGS
@given(data=_files(), block=st.integers(1, 40), schema=st.sampled_from([SCHEMA, TYPED]),
       keep=st.booleans(), checks=_CHECKS)
def test_streamed_validation_is_the_whole_files_or_refused(
    tmp_path: Path, data: bytes, block: int, schema: SourceSchema, keep: bool,
    checks: dict[str, object] | None,
) -> None:
    file = _landing(tmp_path, data)
    missing = MissingPolicy() if keep else None
    value_checks = parse_value_checks(checks)
    try:
        whole: ValidatedBatch | UpsertPlatformError = validate_file(
            file, schema, value_checks, missing=missing)
    except UpsertPlatformError as exc:  # IngestError, or ConfigError of a value check
        whole = exc
    try:
        chunks = list(validate_text_chunks(file, schema, value_checks, missing=missing,
                                           block_size=block))
    except StreamNotExact:
        return  # the engine reads it whole
    assert not isinstance(whole, UpsertPlatformError), whole
    _same(chunks, whole)


@_SETTINGS
@given(data=_files(), block=st.integers(1, 40))
def test_blocks_are_the_whole_reads_rows(tmp_path: Path, data: bytes, block: int) -> None:
    file = _landing(tmp_path, data)
    blocks = list(line_blocks(file, block))
    assert b"".join(b for _, b in blocks) == data
    assert all(b.endswith(b"\n") for _, b in blocks[:-1])
    whole = read_batch(file, track_missing=True)
    chunks = list(jsonl_chunks(file, block, track_missing=True))
    assert [e for c in chunks for e in c.errors] == whole.errors
    assert [int(p) for c in chunks for p in c.positions] == [int(p) for p in whole.positions]
    rows = [{k: v[i] for k, v in c.columns.items() if not c.missing[k][i]}
            for c in chunks for i in range(c.num_rows)]
    assert rows == [{k: v[i] for k, v in whole.columns.items() if not whole.missing[k][i]}
                    for i in range(whole.num_rows)]


def test_every_cut_position_of_a_typed_file_streams_exactly(tmp_path: Path) -> None:
    lines = [{"key": i % 4, "offset": i, "v": "é日" * (i % 3), "w": i * 1.5} for i in range(9)]
    data = "\n".join(json.dumps(o, ensure_ascii=False) for o in lines).encode()
    file = _landing(tmp_path, data)
    whole = validate_file(file, SCHEMA)
    for block in range(1, len(data) + 2):
        _same(list(validate_text_chunks(file, SCHEMA, block_size=block)), whole)


def test_types_the_first_chunk_cannot_know_are_refused(tmp_path: Path) -> None:
    # ints then a float: the whole file makes w a float column, the first chunk an int one
    data = b'{"key": 1, "offset": 1, "w": 1}\n{"key": 2, "offset": 2, "w": 2.5}\n'
    file = _landing(tmp_path, data)
    assert validate_file(file, SCHEMA).schema.type_of("w") is LogicalType.FLOAT64
    with pytest.raises(StreamNotExact):
        list(validate_text_chunks(file, SCHEMA, block_size=8))
    assert len(list(validate_text_chunks(file, SCHEMA, block_size=1 << 20))) == 1


def test_a_file_changed_while_read_is_changed(tmp_path: Path) -> None:
    file = _landing(tmp_path, b'{"key": 1, "offset": 1}\n' * 4)
    chunks = jsonl_chunks(file, 24)
    next(chunks)
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"key": 9, "offset": 9}\n' * 4)
    os.utime(path, ns=(1, 1))
    with pytest.raises(LandingFileChanged):
        list(chunks)
    with pytest.raises(LandingFileChanged):
        list(validate_text_chunks(file, SCHEMA, block_size=24))


def test_rows_without_the_typed_key_are_null_key_errors(tmp_path: Path) -> None:
    # Found by the property above: the whole read raised ValueError for two such rows
    # and kept ONE such row as a good row with a null key.
    for data in (b"{}\n{}\n", b"{}\n"):
        batch = validate_file(_landing(tmp_path, data), TYPED)
        assert not batch.keys
        assert {e.reason for e in batch.errors} == {
            "null key column 'key'; null order column 'offset'"}


@pytest.mark.parametrize(
    ("checks", "lines"),
    [
        # w first appears after the first block: that block alone knows no column w
        ({"w": {"min": 0}}, [{"key": 1, "offset": 1}, {"key": 2, "offset": 2, "w": 5}]),
        # w is int64 in the first block, float64 in the whole file: isin([1.5]) applies
        # to float64 only
        ({"w": {"isin": [1.5]}}, [{"key": 1, "offset": 1, "w": 1},
                                  {"key": 2, "offset": 2, "w": 1.5}]),
    ],
    ids=["column-first-seen-later", "check-fits-the-whole-type-only"],
)
def test_a_value_check_a_block_alone_refuses_is_refused_to_the_whole_read(
    tmp_path: Path, checks: dict[str, object], lines: list[dict[str, object]]
) -> None:
    # A block is not the file: a check the first block cannot apply (ConfigError) must
    # send the file to the whole read, which applies it, not fail the file.
    data = b"".join(json.dumps(o).encode() + b"\n" for o in lines)
    file = _landing(tmp_path, data)
    value_checks = parse_value_checks(checks)
    whole = validate_file(file, SCHEMA, value_checks)
    assert len(whole.keys) + len(whole.errors) == 2
    with pytest.raises(StreamNotExact):
        list(validate_text_chunks(file, SCHEMA, value_checks, block_size=8))


def test_columns_the_shard_types_are_not_scanned_for_their_kinds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the whole read does with a column the shard already types does not depend on
    # its values' JSON kinds (a value column keeps its type; a key or order column keeps
    # it when a value converts): a Python pass over every value of every chunk for them
    # made a streamed file of a typed shard cost ~40% more CPU than the whole read.
    scanned: list[int] = []
    real = JsonKinds.of.__func__  # type: ignore[attr-defined]

    def counted(cls: type[JsonKinds], values: list[object]) -> JsonKinds:
        scanned.append(len(values))
        return real(cls, values)

    monkeypatch.setattr(JsonKinds, "of", classmethod(counted))
    lines = [{"key": i, "offset": i, "v": f"s{i}"} for i in range(12)]
    file = _landing(tmp_path, b"".join(json.dumps(o).encode() + b"\n" for o in lines))
    chunks = list(validate_text_chunks(file, TYPED, block_size=64))
    assert len(chunks) > 3 and scanned == []
    _same(chunks, validate_file(file, TYPED))
