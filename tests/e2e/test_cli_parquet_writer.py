"""The Parquet writer behind ``upsertctl snapshot --format parquet``: a dictionary only
for columns with few distinct values (chosen from the first rows), the same rows and
types whatever it chose, and a valid file with the schema when there are no rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from orchestration.cli.output import DICTIONARY_SAMPLE_ROWS, dictionary_columns, row_writer


def _table(n: int) -> pa.Table:
    return pa.table({
        "key": pa.array(range(n), pa.int64()),
        "status": pa.array([["new", "paid", "shipped"][i % 3] for i in range(n)]),
        "note": pa.array([f"note-{i}" for i in range(n)]),
        "maybe": pa.nulls(n, pa.float64()),
    })


def test_only_low_cardinality_columns_get_a_dictionary() -> None:
    assert dictionary_columns(_table(1000)) == ["status", "maybe"]
    # Decided from the first rows: a column that repeats there but not later (or the
    # reverse) is chosen by its start, and the file is the same rows either way.
    n = DICTIONARY_SAMPLE_ROWS
    table = pa.table({"head_repeats": [i % 3 if i < n else i for i in range(2 * n)],
                      "tail_repeats": [i if i < n else 0 for i in range(2 * n)]})
    assert dictionary_columns(table) == ["head_repeats"]


def test_rows_and_types_survive_and_dictionaries_are_where_chosen(tmp_path: Path) -> None:
    table = _table(5000)
    out = tmp_path / "s.parquet"
    with row_writer("parquet", [(f.name, f.type) for f in table.schema], str(out)) as w:
        for batch in table.to_batches(max_chunksize=1500):
            w.write_table(pa.Table.from_batches([batch]))  # type: ignore[attr-defined]
        w.write([{"key": 5000, "status": "new", "note": None}])
    back = pq.read_table(out)
    assert back.schema == table.schema
    assert back.slice(0, 5000).equals(table)
    assert back.slice(5000).to_pylist() == [
        {"key": 5000, "status": "new", "note": None, "maybe": None}]
    meta = pq.ParquetFile(out).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings
                 for i in range(meta.num_columns)}
    assert any("DICTIONARY" in e for e in encodings["status"])
    assert not any("DICTIONARY" in e for e in encodings["note"])


def test_no_rows_is_a_valid_file_with_the_schema(tmp_path: Path) -> None:
    out = tmp_path / "empty.parquet"
    with row_writer("parquet", [("key", pa.int64()), ("v", pa.string())], str(out)):
        pass
    back = pq.read_table(out)
    assert back.num_rows == 0 and back.schema.names == ["key", "v"]
