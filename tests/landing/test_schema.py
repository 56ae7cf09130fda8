"""SourceSchema: options, evolution rules, persistence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.errors import ConfigError, IngestError
from upsert_core.landing import LogicalType, SourceSchema

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
