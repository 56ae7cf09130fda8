"""Kafka Connect's wrapper schema parsed once per file (``readers._WrapperSchemaReuse``,
``json_lines(..., reuse_wrapper_schema=True)``, what ``translate_jsonl`` reads with):
every file gives exactly the values, error rows, row numbers and messages of the plain
line-by-line parse, whatever its lines: identical and differing schemas, a schema with
a repeated key, whitespace, the payload first, malformed and non-UTF-8 lines."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.landing.batch import RowError
from upsert_core.landing.readers import json_lines

SCHEMA = (b'{"type":"struct","fields":[{"field":"after","type":"struct","fields":'
          b'[{"field":"id","type":"int64"},{"field":"d","name":"io.debezium.time.Date"}]}]}')
SCHEMAS = [
    SCHEMA,
    SCHEMA.replace(b"int64", b"int32"),  # another schema: its own, not the first one's
    b'{"type":"struct","type":"x"}',  # a repeated key inside the schema
    b'{"type":"struct","fields":[{"field":"a","field":"b"}]}',
    b'{"a":NaN}', b'{"a":}', b'{"a":1', b'{"\\ud800":1}', b'{"k":"\xff"}',
    b"null", b"1", b"12", b'"s"', b"[1,2]", b"{}",
]
SEPARATORS = [b",", b" ,", b", ", b"\t,", b"", b",,"]
RESTS = [
    b'"payload":{"op":"c","after":{"id":1}}}',
    b'"payload":{"op":"c","after":{"id":1}}}  ',
    b'"payload":null}',
    b'"payload":{"x":1,"x":2}}',  # a repeated key inside the payload
    b'"payload":1,"payload":2}',
    b'"schema":1}',  # the wrapper's schema twice
    b'"payload":{"x":NaN}}',
    b'"payload":{"x":1}} extra',
    b'"payload":{"x":1}',
    b'"payload":"\xff"}',
    b'"payload":"\xed\xa0\x80"}',
    b'"\\ud800":1}',
    b'"payload":{"\\ud800":1}}',
    b"}", b" }", b"", b"1}", b'"payload"}',
    b'"payload":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
]
OTHER_LINES = [
    b'{"payload":{"op":"c"},"schema":' + SCHEMA + b"}",  # the payload first
    b' {"schema":' + SCHEMA + b',"payload":1}',
    b'{"schema": ' + SCHEMA + b',"payload":1}',
    b'\xef\xbb\xbf{"schema":' + SCHEMA + b',"payload":1}',
    b'{"schema":' + SCHEMA + b"}",
    b'{"schema":null,"payload":null}',
    b"null", b"[]", b"", b"   ", b"{", b"\xff",
]


def _wrapped(schema: bytes, sep: bytes, rest: bytes) -> bytes:
    return b'{"schema":' + schema + sep + rest


def _both(data: bytes) -> None:
    """The reuse parse of ``data`` equals the plain one: values, numbers, errors."""
    plain_errors: list[RowError] = []
    reuse_errors: list[RowError] = []
    plain = list(json_lines("f.jsonl", data, plain_errors))
    reuse = list(json_lines("f.jsonl", data, reuse_errors, reuse_wrapper_schema=True))
    assert reuse == plain
    assert reuse_errors == plain_errors


def test_two_line_files_exhaustively() -> None:
    lines = [_wrapped(s, sep, r) for s in SCHEMAS for sep in SEPARATORS for r in RESTS]
    firsts = [_wrapped(s, b",", RESTS[0]) for s in SCHEMAS] + [
        _wrapped(SCHEMA, sep, RESTS[0]) for sep in SEPARATORS] + OTHER_LINES
    for first, second in itertools.product(firsts, lines + OTHER_LINES):
        _both(first + b"\n" + second + b"\n" + first)


_LINE = st.one_of(
    st.builds(_wrapped, st.sampled_from(SCHEMAS[:4] + SCHEMAS[9:]),
              st.sampled_from(SEPARATORS), st.sampled_from(RESTS[:-1])),
    st.sampled_from(OTHER_LINES),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINE, max_size=25), st.sampled_from([b"\n", b"\r\n"]))
def test_generated_files_parse_as_without_reuse(lines: list[bytes], end: bytes) -> None:
    _both(end.join(lines))


def test_identical_schemas_are_parsed_once_and_a_new_schema_is_taken() -> None:
    other = SCHEMAS[1]
    data = b"\n".join([_wrapped(SCHEMA, b",", RESTS[0])] * 3
                      + [_wrapped(other, b",", RESTS[0])] * 3)
    parsed = [obj for _, obj in json_lines("f.jsonl", data, [], reuse_wrapper_schema=True)]
    schemas = [obj["schema"] for obj in parsed]  # type: ignore[index]
    assert schemas[1] is schemas[0] and schemas[2] is schemas[0]
    assert schemas[4] is schemas[3] and schemas[5] is schemas[3]
    assert schemas[3] is not schemas[0] and schemas[3] != schemas[0]
    _both(data)
