"""Fuzz the landing readers and validation with random and malformed files.

The property (CONTRACT.md, "Bad input: a clear error, and nothing lost"): for any bytes
under a batch file name, reading and validating either

- succeeds, and then every row of the file is accounted for exactly once: the good
  rows' positions and the error rows' numbers are disjoint and together are exactly
  the rows the reader saw (for JSON Lines: exactly the non-blank lines), every
  error names the file, and every good row decodes; or
- raises :class:`IngestError` whose message starts with the file name.

Any other exception type is a failure; pytest-timeout turns a hang into one. Inputs are
built from valid files and then damaged (truncated, bytes flipped, junk inserted), plus
random JSON values of every type (huge integers, NaN, odd Unicode incl. lone surrogates,
bidi overrides and fullwidth characters) and wrong types per column. Files are
validated in sequences, each against the schema the previous one left, so type
conflicts between files are exercised too.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.errors import IngestError
from upsert_core.landing import (
    RawBatch,
    SourceSchema,
    ValidatedBatch,
    decode_row,
    read_csv,
    read_jsonl,
    read_parquet,
    validate_batch,
)
from upsert_core.landing.readers import _READERS

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=300, deadline=None)

ODD_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(
            ["\u202e", "\u2066", "\uff0e", "\uff0f", "\x00", "\ufeff", "\r", "\n", '"', ","]
        ),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates
    ),
    max_size=12,
)
HUGE_INTS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30]),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    HUGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    ODD_TEXT,
    st.sampled_from(["true", "FALSE", "2024-01-01T00:00:00Z", "2024-13-45", "1e400", "-0"]),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(ODD_TEXT, inner, max_size=3)
    ),
    max_leaves=6,
)
COLUMN_NAMES = st.one_of(st.sampled_from(["key", "offset", "__deleted", "v", "w", "k2"]), ODD_TEXT)
ROWS = st.dictionaries(COLUMN_NAMES, JSON_VALUES, max_size=5)


def _typical_row() -> st.SearchStrategy[dict[str, object]]:
    """Rows that mostly validate, so the good path is fuzzed as much as the bad."""
    return st.fixed_dictionaries(
        {"key": st.one_of(st.integers(0, 5), SCALARS), "offset": st.one_of(HUGE_INTS, SCALARS)},
        optional={"v": JSON_VALUES, "__deleted": SCALARS, "w": SCALARS},
    )


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """``data``, possibly truncated, with bytes flipped or junk inserted."""
    how = draw(st.sampled_from(["none", "truncate", "flip", "insert", "junk"]))
    if how == "junk" or not data:
        return draw(st.binary(max_size=200))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(out) - 1))
            out[i] ^= draw(st.integers(1, 255))
        return bytes(out)
    if how == "insert":
        i = draw(st.integers(0, len(data)))
        return data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
    return data


def _json_line(value: object) -> str:
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


@st.composite
def jsonl_files(draw: st.DrawFn) -> bytes:
    lines = draw(
        st.lists(
            st.one_of(
                _typical_row().map(_json_line),
                ROWS.map(_json_line),
                JSON_VALUES.map(_json_line),  # not an object
                ODD_TEXT,  # malformed
                st.just(""),  # blank
            ),
            max_size=8,
        )
    )
    text = "\n".join(lines) + draw(st.sampled_from(["", "\n", "\r\n"]))
    return draw(damaged(text.encode("utf-8", "surrogatepass")))


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    header = draw(
        st.one_of(
            st.just(["key", "offset", "v"]),
            st.just(["key", "offset", "__deleted", "v"]),
            st.lists(COLUMN_NAMES, min_size=1, max_size=4),
        )
    )
    cells = st.one_of(st.integers(-5, 5).map(str), HUGE_INTS.map(str), ODD_TEXT)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for row in draw(st.lists(st.lists(cells, min_size=0, max_size=5), max_size=8)):
        writer.writerow(row)
    return draw(damaged(buf.getvalue().encode("utf-8", "surrogatepass")))


_PARQUET_COLUMNS: dict[str, tuple[pa.DataType, st.SearchStrategy[object]]] = {
    "int": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "float": (pa.float64(), st.floats()),
    "str": (pa.string(), ODD_TEXT.map(lambda s: s.encode("utf-8", "replace").decode())),
    "bool": (pa.bool_(), st.booleans()),
    "bin": (pa.binary(), st.binary(max_size=8)),
    "ts": (pa.timestamp("ns"), st.integers(-(2**62), 2**62)),
    "tsz": (pa.timestamp("us", tz="UTC"), st.integers(-(2**62), 2**62)),
    "date": (pa.date32(), st.integers(-(2**20), 2**20)),
    "list": (pa.list_(pa.int64()), st.lists(st.integers(-3, 3), max_size=2)),
}


@st.composite
def parquet_files(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(0, 6))
    names = draw(st.lists(st.sampled_from(["key", "offset", "__deleted", "v", "w"]), unique=True))
    arrays, fields = [], []
    for name in names:
        typ, values = _PARQUET_COLUMNS[draw(st.sampled_from(sorted(_PARQUET_COLUMNS)))]
        col = draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n))
        arrays.append(pa.array(col, type=typ))
        fields.append(pa.field(name, typ))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields)) if names else pa.table({})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=draw(st.sampled_from([2, 1024])))
    return draw(damaged(sink.getvalue()))


SCHEMAS = st.sampled_from(
    [
        SourceSchema(),
        SourceSchema(key=("key", "k2")),
        SourceSchema(key=("v",), order="w"),
    ]
)


def _check_accounting(raw: RawBatch, out: ValidatedBatch) -> None:
    seen = sorted([*raw.positions.tolist(), *(e.row for e in raw.errors)])
    assert len(seen) == len(set(seen)), "the reader reported a row twice"
    good = out.positions.tolist()
    bad = [e.row for e in out.errors]
    assert sorted(good + bad) == seen, "validation lost or duplicated a row"
    assert len(out.keys) == len(out.rows) == len(out.deletes) == len(out.orders) == len(good)
    assert all(e.file == raw.file for e in out.errors)
    assert out.total_rows == len(seen)
    for row in out.rows:  # the shard never holds a row it cannot read back
        decode_row(out.schema, row)


def _ingest(
    name: str, data: bytes, schema: SourceSchema, counter: Counter[str], kind: str
) -> tuple[RawBatch | None, SourceSchema]:
    """Read + validate; returns the raw batch (None on a file error) and the new schema."""
    counter[kind] += 1
    try:
        raw = _READERS[name[name.rfind(".") :]](name, data)
        out = validate_batch(raw, schema)
    except IngestError as exc:
        assert str(exc).startswith(f"{name}: "), f"file error does not name the file: {exc}"
        return None, schema
    _check_accounting(raw, out)
    return raw, out.schema


@FUZZ
@given(files=st.lists(jsonl_files(), min_size=1, max_size=3), schema=SCHEMAS)
def test_jsonl_any_bytes(
    files: list[bytes], schema: SourceSchema, fuzz_counter: Counter[str]
) -> None:
    for i, data in enumerate(files):
        raw, schema = _ingest(f"b{i}.jsonl", data, schema, fuzz_counter, "jsonl")
        if raw is None:
            continue
        body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
        lines = body.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        expected = [n for n, line in enumerate(lines, start=1) if line.strip()]
        seen = sorted([*raw.positions.tolist(), *(e.row for e in raw.errors)])
        assert seen == expected, "a JSON line was not accounted for exactly once"


@FUZZ
@given(files=st.lists(csv_files(), min_size=1, max_size=3), schema=SCHEMAS)
def test_csv_any_bytes(
    files: list[bytes], schema: SourceSchema, fuzz_counter: Counter[str]
) -> None:
    for i, data in enumerate(files):
        raw, schema = _ingest(f"b{i}.csv", data, schema, fuzz_counter, "csv")
        if raw is not None:
            seen = sorted([*raw.positions.tolist(), *(e.row for e in raw.errors)])
            assert seen == list(range(1, len(seen) + 1)), "CSV rows are not numbered 1..n"


@FUZZ
@given(files=st.lists(parquet_files(), min_size=1, max_size=3), schema=SCHEMAS)
def test_parquet_any_bytes(
    files: list[bytes], schema: SourceSchema, fuzz_counter: Counter[str]
) -> None:
    for i, data in enumerate(files):
        raw, schema = _ingest(f"b{i}.parquet", data, schema, fuzz_counter, "parquet")
        if raw is not None:
            assert raw.positions.tolist() == list(range(1, raw.num_rows + 1))


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".jsonl", ".csv", ".parquet"]))
def test_random_bytes_any_format(data: bytes, suffix: str, fuzz_counter: Counter[str]) -> None:
    _ingest(f"x{suffix}", data, SourceSchema(), fuzz_counter, "random")


def test_readers_are_the_fuzzed_ones() -> None:
    """The fuzz above reaches every reader the ingest dispatches to."""
    assert set(_READERS.values()) == {read_jsonl, read_csv, read_parquet}
