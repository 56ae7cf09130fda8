"""SourceSchema: options, evolution rules, persistence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.errors import ConfigError, IngestError
from upsert_core.landing import LogicalType, SourceSchema
from upsert_core.landing.schema import parse_order

T = LogicalType
BASE = SourceSchema(columns=(("key", T.INT64), ("offset", T.INT64), ("v", T.INT64)))


def test_new_value_columns_are_appended_in_order_of_appearance() -> None:
    evolved = BASE.evolve([("w", T.STRING), ("v", T.INT64), ("a", T.BOOL), ("z", None)], "f")
    assert evolved.names == ("key", "offset", "v", "w", "a")
    assert BASE.evolve([("v", T.INT64)], "f") is BASE


def test_delete_marker_is_never_a_column() -> None:
    assert BASE.evolve([("__deleted", T.BOOL)], "f") is BASE


def test_int_batch_widens_into_a_float_value_column_only() -> None:
    floats = SourceSchema(columns=(("key", T.INT64), ("offset", T.INT64), ("v", T.FLOAT64)))
    assert floats.evolve([("v", T.INT64)], "f") is floats
    with pytest.raises(IngestError, match="f.parquet: column 'v' changed type from int64"):
        BASE.evolve([("v", T.FLOAT64)], "f.parquet")
    float_key = SourceSchema(columns=(("key", T.FLOAT64),))
    with pytest.raises(IngestError, match="key and order column types never change"):
        float_key.evolve([("key", T.INT64)], "f")


@pytest.mark.parametrize("typ", [T.STRING, T.FLOAT64, T.DATE, T.BOOL])
def test_order_column_must_be_integer_or_timestamp(typ: LogicalType) -> None:
    with pytest.raises(IngestError, match="f.csv: order column 'offset' has type"):
        SourceSchema().evolve([("key", T.INT64), ("offset", typ)], "f.csv")
    assert SourceSchema().evolve([("offset", T.TIMESTAMP)], "f").type_of("offset") is T.TIMESTAMP


def test_options_conflicts_and_invalid_options() -> None:
    schema = SourceSchema(key=("a", "b"), order="ts", deleted="gone")
    schema.check_options(key=["a", "b"], order="ts", deleted="gone")
    schema.check_options()
    with pytest.raises(ConfigError, match="--key b,a .shard has a,b.*--order x"):
        schema.check_options(key=["b", "a"], order="x")
    for bad in [dict(key=()), dict(key=("a", "a")), dict(key=("a",), order="a"), dict(order="")]:
        with pytest.raises(ConfigError):
            SourceSchema(**bad)  # type: ignore[arg-type]


NAMES = st.text(min_size=1, max_size=8)


@given(
    key=st.lists(NAMES, min_size=1, max_size=3, unique=True),
    cols=st.lists(st.tuples(NAMES, st.sampled_from(list(T))), max_size=6, unique_by=lambda c: c[0]),
)
def test_json_roundtrip(key: list[str], cols: list[tuple[str, LogicalType]]) -> None:
    order, deleted = "\x00order", "\x00deleted"
    cols = [c for c in cols if c[0] not in (order, deleted)]
    schema = SourceSchema(key=tuple(key), order=order, deleted=deleted, columns=tuple(cols))
    text = schema.to_json()
    assert SourceSchema.from_json(text) == schema
    assert SourceSchema.from_json(text).to_json() == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"version": 2}',
        '{"version": 1, "key": ["k"]}',
        '{"version":1,"key":["k"],"order":"o","deleted":"d","columns":[["x","decimal"]]}',
    ],
)
def test_malformed_stored_schema_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        SourceSchema.from_json(text)


# --- orders of several columns --------------------------------------------------------

TWO = SourceSchema(order=("file", "pos"))


def test_parse_order_splits_on_commas_and_keeps_one_name_as_given() -> None:
    assert parse_order("offset") == "offset"
    assert parse_order(" odd name ") == " odd name "  # no comma: exactly as before
    assert parse_order("file, pos") == ("file", "pos")
    for bad in ("file,", ",pos", "file,,pos", "file,file"):
        with pytest.raises(ConfigError, match="--order"):
            parse_order(bad)


def test_an_order_of_one_column_is_held_and_stored_exactly_as_before() -> None:
    one = SourceSchema(order=("offset",))
    assert one.order == "offset" and not one.several_orders and one == SourceSchema()
    stored = SourceSchema(columns=(("key", T.INT64), ("offset", T.INT64))).to_json()
    assert stored == ('{"columns":[["key","int64"],["offset","int64"]],"deleted":"__deleted",'
                      '"key":["key"],"order":"offset","version":1}')
    # a stored single order column whose name has a comma stays one column
    legacy = SourceSchema.from_json(stored.replace('"offset"', '"a,b"'))
    assert legacy.order == "a,b" and legacy.order_columns == ("a,b",)


def test_several_order_columns_are_stored_as_version_2() -> None:
    schema = TWO.evolve([("key", T.INT64), ("file", T.STRING), ("pos", T.INT64)], "f")
    text = schema.to_json()
    assert '"version":2' in text and '"order":["file","pos"]' in text
    assert SourceSchema.from_json(text) == schema
    assert schema.role("file") == schema.role("pos") == "order"
    with pytest.raises(ConfigError, match="version 2 needs an order of several"):
        SourceSchema.from_json(text.replace('["file","pos"]', '["file"]'))


def test_order_column_types_of_an_order_of_several() -> None:
    for typ in (T.INT64, T.TIMESTAMP, T.STRING):
        assert TWO.evolve([("file", typ)], "f").type_of("file") is typ
    for typ in (T.FLOAT64, T.BOOL, T.DATE, T.BINARY):
        with pytest.raises(IngestError, match=f"f.jsonl: order column 'pos' has type {typ}"):
            TWO.evolve([("pos", typ)], "f.jsonl")
    with pytest.raises(IngestError, match="a string only in an order of several columns"):
        SourceSchema(order="file").evolve([("file", T.STRING)], "f.jsonl")


def test_several_order_columns_conflicts_and_invalid_options() -> None:
    TWO.check_options(order="file,pos")
    TWO.check_options(order=("file", "pos"))
    for other in ("file", "pos,file", "file,pos,x"):
        with pytest.raises(ConfigError, match=f"--order {other} \\(shard has file,pos\\)"):
            TWO.check_options(order=other)
    with pytest.raises(ConfigError, match="conflicting ingest options: --order file,pos"):
        SourceSchema().check_options(order="file,pos")
    with pytest.raises(ConfigError, match="must be distinct"):
        SourceSchema(order=("key", "pos"))
    with pytest.raises(ConfigError, match="duplicate order columns"):
        SourceSchema(order=("pos", "pos"))


# --- envelope orders under reserved names ------------------------------------------------

DBZ = "(debezium delete)"


def test_an_envelope_order_is_stored_under_reserved_names_as_version_3() -> None:
    """A Debezium shard's order fields name envelope fields; its rows store them under
    ``ENVELOPE_ORDER_PREFIX + field``, so ``after`` may have a column of the field's name.
    The schema says so by its version (3), which earlier releases refuse."""
    from upsert_core.landing.schema import ENVELOPE_ORDER_PREFIX as P

    one = SourceSchema(key=("id",), order="ts_ms", deleted=DBZ, envelope_order=True)
    assert one.order == "ts_ms" and one.order_fields == ("ts_ms",)
    assert one.order_columns == (P + "ts_ms",) and not one.several_orders
    evolved = one.evolve([("id", T.INT64), (P + "ts_ms", T.INT64), ("ts_ms", T.STRING)], "f")
    assert evolved.role(P + "ts_ms") == "order" and evolved.role("ts_ms") == "value"
    text = evolved.to_json()
    assert text == ('{"columns":[["id","int64"],["(debezium order) ts_ms","int64"],'
                    '["ts_ms","string"]],"deleted":"(debezium delete)","key":["id"],'
                    '"order":["ts_ms"],"version":3}')
    assert SourceSchema.from_json(text) == evolved
    # the user's names everywhere the user sees the order
    evolved.check_options(order="ts_ms")
    with pytest.raises(ConfigError, match=r"--order source.lsn \(shard has ts_ms\)"):
        evolved.check_options(order="source.lsn")
    assert evolved.label(P + "ts_ms") == "ts_ms" and evolved.label("ts_ms") == "ts_ms"
    with pytest.raises(IngestError, match="f: order column 'ts_ms' has type string"):
        one.evolve([(P + "ts_ms", T.STRING)], "f")
    with pytest.raises(IngestError, match="f: column 'ts_ms' changed type from int64"):
        evolved.evolve([(P + "ts_ms", T.TIMESTAMP)], "f")

    several = SourceSchema(key=("id",), order=("source.file", "source.pos"), deleted=DBZ,
                           envelope_order=True)
    assert several.several_orders and several.order_text == "source.file,source.pos"
    assert several.order_columns == (P + "source.file", P + "source.pos")
    assert SourceSchema.from_json(several.to_json()) == several
    assert '"version":3' in several.to_json()
    # a key may be named like an order field: they are different stored columns
    SourceSchema(key=("ts_ms",), order="ts_ms", deleted=DBZ, envelope_order=True)
    with pytest.raises(ConfigError, match="must be distinct"):
        SourceSchema(key=("ts_ms",), order="ts_ms", deleted=DBZ)


def test_without_reserved_names_a_schema_is_stored_exactly_as_before() -> None:
    """Plain shards and Debezium shards created before reserved names: versions 1 and 2,
    byte for byte, their order columns named by the order itself."""
    old = SourceSchema(key=("id",), order="ts_ms", deleted=DBZ,
                       columns=(("id", T.INT64), ("ts_ms", T.INT64)))
    assert old.to_json() == ('{"columns":[["id","int64"],["ts_ms","int64"]],'
                             '"deleted":"(debezium delete)","key":["id"],"order":"ts_ms",'
                             '"version":1}')
    assert SourceSchema.from_json(old.to_json()) == old and not old.envelope_order
    assert old.order_columns == ("ts_ms",) and old.label("ts_ms") == "ts_ms"


@pytest.mark.parametrize("text", [
    '{"version":3,"key":["id"],"order":[],"deleted":"d","columns":[]}',
    '{"version":3,"key":["id"],"order":"ts_ms","deleted":"d","columns":[]}',
])
def test_a_malformed_version_3_schema_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="version 3 needs a list of order fields"):
        SourceSchema.from_json(text)


def test_a_newer_schema_version_says_a_newer_release_wrote_it() -> None:
    with pytest.raises(ConfigError, match="version 4 .*newer release"):
        SourceSchema.from_json('{"version":4,"key":["id"],"order":["x"],"deleted":"d",'
                               '"columns":[]}')
