"""Files rewritten under an ingested name (``upsert_core.ingest.ledger``; CONTRACT,
"Change data capture"): each file's record (size, content digest, listed version) is
committed with its name; a file touched without a change of content is silent; a file
whose content differs is named in a warning by every ingest that finds it, recorded as
the last ingest's ``rewritten_files`` and never ingested again; a shard ingested before
records were kept gives no false alarm; the record never costs a second read of a
file the ingest just read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import xxhash

from upsert_core.errors import IngestError, LandingFileChanged
from upsert_core.ingest import IngestRequest, ingest, pipeline
from upsert_core.ingest.ledger import FileRecord, find_rewritten, recorded, rewritten_files
from upsert_core.ingest.report import ProgressEvent
from upsert_core.ingest.shard_config import CONFIG_REWRITTEN, file_record_name
from upsert_core.landing import list_landing
from upsert_core.landing.chunks import STREAM_BYTES_ENV
from upsert_core.landing.listing import LandingFile
from upsert_core.shard_summary import shard_summary

from .helpers import contents, memory_shard, write_jsonl, write_parquet

REQUEST = IngestRequest(key=("key",))


def _rows(*values: str) -> list[dict[str, Any]]:
    return [{"key": i, "offset": i, "v": v} for i, v in enumerate(values)]


def _bump_mtime(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_each_file_is_recorded_with_its_name(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path, "a.jsonl", _rows("x", "y"))
    write_parquet(tmp_path, "b.parquet", pa.table({"key": [9], "offset": [1]}))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    state = shard.state()
    record = recorded(state, "a.jsonl")
    assert record is not None
    data = path.read_bytes()
    assert record.size == len(data)
    assert record.digest == f"xxh3_128:{xxhash.xxh3_128_hexdigest(data)}"
    [listed, _] = list_landing(str(tmp_path))
    assert record.version == listed.version
    assert recorded(state, "b.parquet") is not None
    assert rewritten_files(state.config) == [] and CONFIG_REWRITTEN not in state.config


def test_a_touched_file_is_silent_and_changes_nothing(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    seqno = shard.state().seqno
    _bump_mtime(path)
    path.write_bytes(path.read_bytes())  # copied over with the same content
    report = ingest(shard, str(tmp_path), REQUEST)
    assert report.warnings == [] and report.rewritten == []
    assert shard.state().seqno == seqno  # nothing written


@pytest.mark.parametrize("same_size", [True, False])
def test_a_rewritten_file_is_named_recorded_and_never_ingested_again(
    tmp_path: Path, same_size: bool
) -> None:
    path = write_jsonl(tmp_path, "a.jsonl", _rows("x", "y"))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    before = contents(shard)
    write_jsonl(tmp_path, "a.jsonl", _rows("X", "Y") if same_size else _rows("changed"))
    write_jsonl(tmp_path, "b.jsonl", [{"key": 5, "offset": 5, "v": "new"}])
    events: list[ProgressEvent] = []
    report = ingest(shard, str(tmp_path), REQUEST, progress=events.append)
    assert report.rewritten == ["a.jsonl"]
    [warning] = report.warnings
    assert warning.startswith("a.jsonl: rewritten since it was ingested at ts 0 (")
    assert "not ingested again" in warning
    assert [e.message for e in events if e.kind == "warning"] == [warning]
    assert [f.name for f in report.files] == ["b.jsonl"]  # the rest goes on
    state = shard.state()
    assert state.ingested_files == {"a.jsonl": 0, "b.jsonl": 1}
    assert contents(shard)[0] == before[0]  # a.jsonl's new content is not applied
    assert rewritten_files(state.config) == ["a.jsonl"]
    assert shard_summary(shard)["rewritten_files"] == ["a.jsonl"]
    assert report.to_dict()["rewritten_files"] == ["a.jsonl"]

    again = ingest(shard, str(tmp_path), REQUEST)  # every ingest names it
    assert again.rewritten == ["a.jsonl"] and again.warnings == [warning]
    assert shard.state().seqno == state.seqno  # the same finding: nothing written

    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in _rows("x", "y")))
    restored = ingest(shard, str(tmp_path), REQUEST)
    assert restored.rewritten == [] and restored.warnings == []
    assert rewritten_files(shard.state().config) == []
    assert CONFIG_REWRITTEN not in shard.state().config


def test_a_shard_ingested_before_records_were_kept_gives_no_false_alarm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    shard = memory_shard()
    with monkeypatch.context() as old:  # an older version: names only
        old.setattr(pipeline, "with_ledger", lambda request, file: request)
        ingest(shard, str(tmp_path), REQUEST)
    assert recorded(shard.state(), "a.jsonl") is None
    write_jsonl(tmp_path, "a.jsonl", _rows("something else entirely"))
    write_jsonl(tmp_path, "b.jsonl", [{"key": 5, "offset": 5, "v": "new"}])
    report = ingest(shard, str(tmp_path), REQUEST)
    assert report.rewritten == [] and report.warnings == []
    # Files ingested from now on are recorded, and caught.
    assert recorded(shard.state(), "b.jsonl") is not None
    write_jsonl(tmp_path, "b.jsonl", [{"key": 5, "offset": 5, "v": "newer"}])
    assert ingest(shard, str(tmp_path), REQUEST).rewritten == ["b.jsonl"]


def test_a_malformed_record_reads_as_none() -> None:
    for text in (None, "", "{", "[]", '{"size": -1, "digest": "x"}', '{"size": 1}',
                 '{"size": true, "digest": "x"}', '{"size": 1, "digest": ""}'):
        assert FileRecord.decode(text) is None, text
    record = FileRecord(3, "xxh3_128:00", "1:2")
    assert FileRecord.decode(record.encode()) == record


def test_the_ingest_does_not_read_a_file_again_to_record_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    reads: list[str] = []
    original = LandingFile._digest_local

    def counted(self: LandingFile, hasher: Any) -> int:
        reads.append(self.name)
        return original(self, hasher)

    monkeypatch.setattr(LandingFile, "_digest_local", counted)
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    assert reads == []  # the digest of the bytes just read was remembered
    assert recorded(shard.state(), "a.jsonl") is not None


def test_a_streamed_file_is_recorded_by_reading_it_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STREAM_BYTES_ENV, "0")
    path = write_parquet(tmp_path, "a.parquet", pa.table({"key": [1, 2], "offset": [1, 2]}))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    record = recorded(shard.state(), "a.parquet")
    assert record is not None
    assert record.digest == f"xxh3_128:{xxhash.xxh3_128_hexdigest(path.read_bytes())}"


def test_a_file_that_changes_before_its_record_is_taken_stays_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    shard = memory_shard()

    def changed(self: LandingFile) -> tuple[int, str]:
        raise LandingFileChanged(f"{self.name}: changed while being ingested (test)")

    monkeypatch.setattr(LandingFile, "fingerprint", changed)
    report = ingest(shard, str(tmp_path), REQUEST)
    assert report.files == [] and report.pending == ["a.jsonl"]
    state = shard.state()
    assert state.upper == 0 and state.ingested_files == {}
    referenced = set(state.referenced_blob_keys())
    written = {m.key for m in shard.blob.list_keys("") if "/rollup/" not in m.key}
    assert written <= referenced  # the attempt's parts and checkpoints were deleted
    monkeypatch.undo()
    ingest(shard, str(tmp_path), REQUEST)
    assert shard.state().ingested_files == {"a.jsonl": 0}


def test_a_file_that_cannot_be_read_to_compare_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    _bump_mtime(path)  # same size, new version: the content must be read

    def unreadable(self: LandingFile) -> tuple[int, str]:
        raise IngestError(f"{self.name}: cannot read file: permission denied")

    monkeypatch.setattr(LandingFile, "fingerprint", unreadable)
    report = ingest(shard, str(tmp_path), REQUEST)
    assert report.rewritten == []
    assert report.warnings == [
        "a.jsonl: could not be read to compare it with the file ingested at ts 0:"
        " a.jsonl: cannot read file: permission denied"]


def test_the_warning_comes_even_when_a_later_file_fails(tmp_path: Path) -> None:
    write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    write_jsonl(tmp_path, "a.jsonl", _rows("rewritten"))
    write_jsonl(tmp_path, "b.jsonl", [{"offset": 1}])  # no key column: a file error
    events: list[ProgressEvent] = []
    with pytest.raises(IngestError, match="b.jsonl: missing key column"):
        ingest(shard, str(tmp_path), REQUEST, progress=events.append)
    assert [e.message for e in events if e.kind == "warning"][0].startswith("a.jsonl: rewritten")
    assert rewritten_files(shard.state().config) == ["a.jsonl"]


def test_find_rewritten_spares_reading_by_size_and_version(tmp_path: Path) -> None:
    write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    write_jsonl(tmp_path, "b.jsonl", _rows("y"))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    state = shard.state()
    listed = {f.name: f for f in list_landing(str(tmp_path))}

    class Unread(LandingFile):
        def fingerprint(self) -> tuple[int, str]:
            raise AssertionError(f"{self.name} was read")

    same = Unread(listed["a.jsonl"].name, listed["a.jsonl"].root, listed["a.jsonl"].size,
                  listed["a.jsonl"].version)
    resized = Unread("b.jsonl", listed["b.jsonl"].root, listed["b.jsonl"].size + 1,
                     "other-version")
    found, warnings = find_rewritten([same, resized], state)
    assert [r.name for r in found] == ["b.jsonl"] and warnings == []
    assert "then" in found[0].warning()  # both sizes named
    assert file_record_name("b.jsonl") in state.config


@pytest.mark.s3
def test_on_s3_the_etag_spares_reading_and_content_decides(
    s3_env: str, s3_client: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def put(name: str, body: bytes) -> None:
        s3_client.put_object(Bucket=s3_bucket, Key=f"land/{name}", Body=body)

    body = b'{"key": 1, "offset": 1, "v": "x"}\n'
    put("a.jsonl", body)
    landing = f"s3://{s3_bucket}/land"
    shard = memory_shard()
    ingest(shard, landing, REQUEST)
    record = recorded(shard.state(), "a.jsonl")
    assert record is not None and record.version.strip('"')  # the ETag
    assert record.digest == f"xxh3_128:{xxhash.xxh3_128_hexdigest(body)}"

    reads: list[str] = []
    original = LandingFile._digest_s3

    def counted(self: LandingFile, hasher: Any) -> int:
        reads.append(self.name)
        return original(self, hasher)

    monkeypatch.setattr(LandingFile, "_digest_s3", counted)
    put("a.jsonl", body)  # uploaded again, same bytes: same ETag, not read
    assert ingest(shard, landing, REQUEST).rewritten == [] and reads == []
    put("a.jsonl", body.replace(b"x", b"y"))  # same size, new ETag: read, and caught
    report = ingest(shard, landing, REQUEST)
    assert report.rewritten == ["a.jsonl"] and reads == ["a.jsonl"]
