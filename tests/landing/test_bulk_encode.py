"""Validation encodes rows with the bulk encoder; the result is identical to the per-row
path (keys, rows, errors, orders) for Parquet, JSON Lines and CSV files, with nulls in
every column, composite keys and timestamp orders."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import upsert_core.landing.validate as validate_module
from tests.landing.helpers import jsonl, validate_csv, validate_jsonl, validate_parquet
from upsert_core.landing import SourceSchema, ValidatedBatch

_UTC = dt.UTC


def _both(run: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[ValidatedBatch, ValidatedBatch]:
    fast = run()
    with monkeypatch.context() as m:
        m.setattr(validate_module, "encode_columns_in_chunks", lambda *a, **k: None)
        slow = run()
    return fast, slow


def _same(fast: ValidatedBatch, slow: ValidatedBatch) -> None:
    assert fast.keys == slow.keys
    assert fast.rows == slow.rows
    assert fast.errors == slow.errors
    assert fast.orders.tolist() == slow.orders.tolist()
    assert fast.deletes.tolist() == slow.deletes.tolist()
    assert fast.positions.tolist() == slow.positions.tolist()
    assert fast.schema == slow.schema


_ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "a": st.one_of(st.none(), st.integers(-5, 5)),
            "b": st.one_of(st.none(), st.text(max_size=4)),
            "offset": st.one_of(st.none(), st.integers(0, 9)),
        },
        optional={
            "f": st.one_of(st.none(), st.floats(allow_nan=False)),
            "ok": st.one_of(st.none(), st.booleans()),
            "__deleted": st.one_of(st.none(), st.booleans()),
        },
    ),
    max_size=15,
)


@given(_ROWS)
def test_jsonl_bulk_equals_per_row(rows: list[dict[str, Any]]) -> None:
    schema = SourceSchema(key=("a", "b"))
    with pytest.MonkeyPatch.context() as mp:
        fast, slow = _both(lambda: validate_jsonl(jsonl(*rows), schema), mp)
    _same(fast, slow)


def test_parquet_and_csv_bulk_equals_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 200
    table = pa.table(
        {
            "key": pa.array([i % 50 for i in range(n)], pa.int64()),
            "offset": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=_UTC) + dt.timedelta(seconds=i) for i in range(n)],
                pa.timestamp("us", tz="UTC"),
            ),
            "value": pa.array([None if i % 7 == 0 else f"v{i}é" for i in range(n)]),
            "amount": pa.array([None if i % 5 == 0 else i / 3 for i in range(n)]),
            "day": pa.array([dt.date(2024, 1, 1 + i % 28) for i in range(n)]),
            "blob": pa.array([bytes([i % 256]) * (i % 4) for i in range(n)]),
            "flag": pa.array([None if i % 3 else i % 2 == 0 for i in range(n)]),
            "__deleted": pa.array([i % 11 == 0 for i in range(n)]),
        }
    )
    schema = SourceSchema()
    fast, slow = _both(lambda: validate_parquet(table, schema), monkeypatch)
    _same(fast, slow)
    assert len(fast) == n

    csv = "key,offset,value\n" + "".join(f"{i % 9},{i},x{i}\n" for i in range(60)) + ",1,z\n"
    fast, slow = _both(lambda: validate_csv(csv.encode(), schema), monkeypatch)
    _same(fast, slow)
    assert len(fast.errors) == 1
