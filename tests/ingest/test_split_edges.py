"""The split read steps on JSON Lines files as raw bytes, cut at every byte: CRLF line
ends, no final newline, blank and whitespace-only lines, a BOM, multibyte UTF-8 across
a cut, a line longer than many splits, invalid UTF-8, and keys repeated across splits
(the later row in the file wins on an equal order); a Parquet file without rows. Each
file's shard, error rows (with file row numbers) and counts must equal the whole-file
read's."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ingest.helpers import contents, memory_shard, schema_of, write_parquet
from tests.ingest.test_split_steps import SplitInProcess
from upsert_core.errors import IngestError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.engine import InProcessEngine

_OBJ = st.builds(
    lambda k, o, v: json.dumps({"key": k, "offset": o, "v": v}, ensure_ascii=False),
    st.integers(0, 3), st.integers(0, 2),
    st.one_of(st.none(), st.sampled_from(["é", "\U0001f600", "a", "x" * 3000, "€€€"])),
)
_LINE = st.one_of(
    _OBJ, _OBJ, _OBJ,
    st.sampled_from(["", " ", "\t", "{broken", '{"key": null, "offset": 1}', "null", "[]",
                     '{"key": 1, "offset": 1, "v": "\\u00e9"}']),
)
_RAW_LINE = st.one_of(
    _LINE.map(lambda s: s.encode()),
    st.just(b'{"key": 2, "offset": 1, "v": "\xff"}'),  # not UTF-8: an error row
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_RAW_LINE, min_size=1, max_size=14),
       ends=st.sampled_from([b"\n", b"\r\n"]), final=st.booleans(), bom=st.booleans(),
       split_bytes=st.integers(1, 80), scope=st.sampled_from(["batch", "global"]))
def test_raw_jsonl_cut_anywhere_equals_the_whole_file(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], ends: bytes, final: bool,
    bom: bool, split_bytes: int, scope: str,
) -> None:
    landing = tmp_path_factory.mktemp("landing")
    data = ends.join(lines) + (ends if final else b"")
    (landing / "00.jsonl").write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    request = IngestRequest(buckets=2, order_scope=scope)
    split, whole = memory_shard("split"), memory_shard("whole")
    try:
        whole_report = ingest(whole, str(landing), request, engine=InProcessEngine(cache=None))
    except IngestError as exc:
        with pytest.raises(IngestError) as caught:
            ingest(split, str(landing), request, engine=SplitInProcess(split_bytes))
        assert str(caught.value) == str(exc)
        return
    engine = SplitInProcess(split_bytes)
    split_report = ingest(split, str(landing), request, engine=engine)
    assert [(f.name, f.rows_read, f.inserts, f.errors) for f in split_report.files] == [
        (f.name, f.rows_read, f.inserts, f.errors) for f in whole_report.files]
    assert contents(split) == contents(whole)
    assert list(split.errors()) == list(whole.errors())


def test_a_key_repeated_across_splits_with_equal_orders_takes_the_later_row(
    tmp_path: Path,
) -> None:
    # One key, equal orders, one line per split: the last line of the file wins.
    lines = [json.dumps({"key": 1, "offset": 5, "v": f"v{i:03d}"}) for i in range(50)]
    (tmp_path / "00.jsonl").write_text("\n".join(lines) + "\n")
    engine = SplitInProcess(split_bytes=len(lines[0]) + 1, seed=3)
    shard = memory_shard()
    ingest(shard, str(tmp_path), IngestRequest(buckets=3), engine=engine)
    assert engine.split_files == 1 and not engine.fallbacks
    [(snapshot, _)] = contents(shard)
    assert [dict(r)["v"] for r in snapshot] == ["v049"]


def test_a_parquet_file_without_rows_types_its_columns_as_read_whole(tmp_path: Path) -> None:
    # Column types are fixed by the first batch that has the column, rows or not: the
    # splits of a Parquet file without rows carry its typed columns and must vote.
    write_parquet(tmp_path, "00.parquet", pa.table({
        "key": pa.array([], pa.int64()), "offset": pa.array([], pa.int64()),
        "v": pa.array([], pa.string())}))
    write_parquet(tmp_path, "01.parquet", pa.table({"key": [1], "offset": [1], "v": [5]}))
    outcomes = []
    for engine in (InProcessEngine(cache=None), SplitInProcess(split_bytes=10)):
        shard = memory_shard()
        with pytest.raises(IngestError) as caught:
            ingest(shard, str(tmp_path), IngestRequest(buckets=2), engine=engine)
        outcomes.append((str(caught.value), shard.state().upper, schema_of(shard).to_json()))
    assert outcomes[0] == outcomes[1]
    assert "column 'v' changed type from string to int64" in outcomes[0][0]
