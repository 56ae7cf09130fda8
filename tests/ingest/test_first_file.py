"""``upsert_core.ingest.first_file``: a new shard's first file is checked, as the ingest
would read it, without creating anything (issue 23: a failed first ingest left an empty
shard behind)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from upsert_core.errors import ConfigError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest import first_file as first_file_module
from upsert_core.ingest.first_file import first_file_problem
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard

REQUEST = IngestRequest(key=["key"], order="offset")


def _jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _ingest_error(landing: Path, request: IngestRequest) -> str | None:
    """What the ingest itself says of the same landing on a new shard."""
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s", create=True)
    try:
        ingest(shard, str(landing), request)
    except Exception as exc:  # noqa: BLE001 - the message is what is compared
        return str(exc)
    return None


def test_a_first_file_without_its_key_column_is_the_ingests_own_error(tmp_path: Path) -> None:
    _jsonl(tmp_path / "a.jsonl", [{"id": 1, "offset": 1}])
    _jsonl(tmp_path / "b.jsonl", [{"key": 1, "offset": 2}])
    found = first_file_problem("s", str(tmp_path), REQUEST)
    assert found == "a.jsonl: missing key column 'key'"
    assert found == _ingest_error(tmp_path, REQUEST)


def test_only_the_first_pending_file_through_the_partition_is_read(tmp_path: Path) -> None:
    _jsonl(tmp_path / "a.jsonl", [{"key": 1, "offset": 1}])
    _jsonl(tmp_path / "b.jsonl", [{"offset": 2}])  # no key, but not the first file
    assert first_file_problem("s", str(tmp_path), REQUEST) is None
    (tmp_path / "a.jsonl").unlink()
    assert first_file_problem("s", str(tmp_path), REQUEST) == "b.jsonl: missing key column 'key'"
    assert first_file_problem("s", str(tmp_path), REQUEST, through="a.jsonl") is None
    (tmp_path / "empty").mkdir()
    assert first_file_problem("s", str(tmp_path / "empty"), REQUEST) is None  # nothing pending


def test_row_errors_are_not_file_problems(tmp_path: Path) -> None:
    _jsonl(tmp_path / "a.jsonl", [{"key": None, "offset": 1}, {"key": 2, "offset": "x"}])
    assert first_file_problem("s", str(tmp_path), REQUEST) is None


def test_a_parquet_order_column_of_a_wrong_type_is_found(tmp_path: Path) -> None:
    pq.write_table(pa.table({"key": [1], "offset": [True]}), tmp_path / "a.parquet")
    found = first_file_problem("s", str(tmp_path), REQUEST)
    assert found is not None and found.startswith("a.parquet: ")
    assert found == _ingest_error(tmp_path, REQUEST)


def test_a_file_too_big_to_read_twice_is_left_to_the_ingest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _jsonl(tmp_path / "a.jsonl", [{"id": 1, "offset": 1}])
    monkeypatch.setattr(first_file_module, "PREFLIGHT_BYTES", 4)
    assert first_file_problem("s", str(tmp_path), REQUEST) is None


def test_conflicting_options_raise_as_the_ingest_raises_them(tmp_path: Path) -> None:
    _jsonl(tmp_path / "a.jsonl", [{"key": 1, "offset": 1}])
    bad = IngestRequest(key=["key"], envelope="debezium", deleted_col="gone")
    with pytest.raises(ConfigError):
        first_file_problem("s", str(tmp_path), bad)
