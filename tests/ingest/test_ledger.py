"""Files rewritten under an ingested name (``upsert_core.ingest.ledger``; CONTRACT,
"Change data capture"): each file's record (size, content digest, listed version) is
committed with its name; a file touched without a change of content is silent; a file
whose content differs is named in a warning by every ingest that finds it, recorded as
the last ingest's ``rewritten_files`` and never ingested again; a shard ingested before
records were kept gives no false alarm; the record never costs a second read of a
file the ingest just read. Records hold block digests (``landing.digest``); a record
of the whole-file digest older versions wrote keeps working: the file is compared in
that kind."""

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
from upsert_core.landing.digest import WHOLE_FILE, DigestKind
from upsert_core.landing.listing import LandingFile
from upsert_core.landing.text_chunks import BLOCK_BYTES_ENV
from upsert_core.persist.state.state import ShardState
from upsert_core.shard_summary import shard_summary

from .helpers import contents, memory_shard, write_jsonl, write_parquet

REQUEST = IngestRequest(key=("key",))


def _rows(*values: str) -> list[dict[str, Any]]:
    return [{"key": i, "offset": i, "v": v} for i, v in enumerate(values)]


def _blocks_digest(data: bytes, block: int = 1 << 12) -> str:
    """The block digest, computed here from its definition (``landing.digest``)."""
    digests = b"".join(xxhash.xxh3_128_digest(data[at:at + block])
                       for at in range(0, len(data), block))
    return f"xxh3_128_blocks/{block}:{xxhash.xxh3_128_hexdigest(digests)}"


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
    assert record.digest == _blocks_digest(data)
    [listed, _] = list_landing(str(tmp_path))
    assert record.version == listed.version
    stored = json.loads(state.config[file_record_name("a.jsonl")])
    assert stored == {"size": len(data), "kind": "xxh3_128_blocks", "block": 1 << 12,
                      "hash": record.digest.rpartition(":")[2], "version": listed.version}
    # No "digest": a version that knows only whole-file digests reads no record here
    # (no false alarm after a downgrade) rather than a digest it would compare wrongly.
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
        old.setattr(pipeline, "with_ledger", lambda request, file, digest: request)
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
    hexdigest = "0" * 32
    for text in (None, "", "{", "[]", '{"size": -1, "digest": "x"}', '{"size": 1}',
                 '{"size": true, "digest": "x"}', '{"size": 1, "digest": ""}',
                 '{"size": 1, "digest": "md5:00"}',
                 *(json.dumps({"size": 1, **fields}) for fields in (
                     {"kind": "xxh3_128_blocks", "block": 0, "hash": hexdigest},
                     {"kind": "xxh3_128_blocks", "block": 8, "hash": "00"},
                     {"kind": "xxh3_128_blocks", "hash": hexdigest},
                     {"kind": "sha256_tree", "block": 8, "hash": hexdigest}))):
        assert FileRecord.decode(text) is None, text
    whole = FileRecord(3, f"xxh3_128:{hexdigest}", "1:2")
    assert FileRecord.decode(whole.encode()) == whole
    assert whole.encode() == (  # exactly as versions before block digests wrote it
        f'{{"size":3,"digest":"xxh3_128:{hexdigest}","version":"1:2"}}')
    assert whole.kind == WHOLE_FILE
    blocks = FileRecord(3, f"xxh3_128_blocks/65536:{hexdigest}", "1:2")
    assert FileRecord.decode(blocks.encode()) == blocks
    assert blocks.kind == DigestKind("xxh3_128_blocks", 65536)


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
    [file] = ingest(shard, str(tmp_path), REQUEST).files
    assert reads == []  # the digest of the bytes just read was remembered
    assert (file.landing_bytes_read, file.digest_bytes_read) == (file.size, 0)
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
    assert record.digest == _blocks_digest(path.read_bytes())


def test_a_streamed_json_lines_file_is_digested_as_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STREAM_BYTES_ENV, "0")
    monkeypatch.setenv(BLOCK_BYTES_ENV, "100")  # read in many pieces
    path = write_jsonl(tmp_path, "a.jsonl", _rows(*(f"value {i}" for i in range(40))))
    shard = memory_shard()
    [file] = ingest(shard, str(tmp_path), REQUEST).files
    assert (file.landing_bytes_read, file.digest_bytes_read) == (file.size, 0)
    record = recorded(shard.state(), "a.jsonl")
    assert record is not None and record.digest == _blocks_digest(path.read_bytes())


def test_a_file_that_changes_before_its_record_is_taken_stays_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    shard = memory_shard()

    def changed(self: LandingFile, kind: object = None) -> tuple[int, str]:
        raise LandingFileChanged(f"{self.name}: changed while being ingested (test)")

    # An engine whose read gives no digest: the record is taken at commit, and fails.
    monkeypatch.setattr(LandingFile, "known_digest", lambda self: None)
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

    def unreadable(self: LandingFile, kind: object = None) -> tuple[int, str]:
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
        def fingerprint(self, kind: object = None) -> tuple[int, str]:
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
    assert record.digest == _blocks_digest(body)

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


def _as_before_block_digests(shard: Any, ingested: dict[str, bytes]) -> None:
    """Rewrite the records of the files ``ingested`` (name: the bytes ingested) as
    versions before block digests wrote them (``{"size", "digest": "xxh3_128:<hex of
    the whole file>", "version"}``): the shard as that version left it."""

    def older(state: ShardState) -> ShardState:
        config = dict(state.config)
        for name, data in ingested.items():
            record = recorded(state, name)
            assert record is not None
            config[file_record_name(name)] = json.dumps(
                {"size": record.size, "digest": f"xxh3_128:{xxhash.xxh3_128_hexdigest(data)}",
                 "version": record.version}, separators=(",", ":"))
        return state.evolve(config=config)

    shard.machine.apply(older)


def test_records_of_whole_file_digests_keep_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    touched = write_jsonl(tmp_path, "a.jsonl", _rows("x", "y"))
    rewritten = write_jsonl(tmp_path, "b.jsonl", _rows("p", "q"))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    _as_before_block_digests(shard, {"a.jsonl": touched.read_bytes(),
                                     "b.jsonl": rewritten.read_bytes()})
    before = contents(shard)
    assert recorded(shard.state(), "a.jsonl").kind == WHOLE_FILE  # type: ignore[union-attr]

    kinds: list[DigestKind | None] = []
    original = LandingFile.fingerprint

    def seen(self: LandingFile, kind: DigestKind | None = None) -> tuple[int, str]:
        kinds.append(kind)
        return original(self, kind)

    monkeypatch.setattr(LandingFile, "fingerprint", seen)
    _bump_mtime(touched)  # same content, new version: read and compared whole
    write_jsonl(tmp_path, "b.jsonl", _rows("P", "Q"))  # same size, other content
    write_jsonl(tmp_path, "c.jsonl", [{"key": 7, "offset": 7, "v": "new"}])
    report = ingest(shard, str(tmp_path), REQUEST)
    assert kinds == [WHOLE_FILE, WHOLE_FILE]  # each compared in its record's kind
    assert report.rewritten == ["b.jsonl"]
    assert [w.split(" (")[0] for w in report.warnings] == [
        "b.jsonl: rewritten since it was ingested at ts 1"]
    assert [f.name for f in report.files] == ["c.jsonl"]
    assert contents(shard)[:2] == before  # b.jsonl's new content is not applied
    state = shard.state()
    assert recorded(state, "a.jsonl").kind == WHOLE_FILE  # type: ignore[union-attr]
    assert recorded(state, "c.jsonl").kind.name == "xxh3_128_blocks"  # type: ignore[union-attr]


def test_a_record_written_before_block_digests_is_read_as_it_was_written(
    tmp_path: Path,
) -> None:
    """The record text is what main at d5ed5d2 (before block digests) committed for this
    file's bytes (copied from a shard it wrote): the file is compared with it as such."""
    path = tmp_path / "0001.jsonl"
    path.write_bytes(b'{"key":1,"offset":1,"v":"a"}\n')
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    version = recorded(shard.state(), "0001.jsonl").version  # type: ignore[union-attr]
    old = (f'{{"size":29,"digest":"xxh3_128:46027b7df2e46089d26973984dc2bd1f",'
           f'"version":"{version}"}}')

    def as_written(state: ShardState) -> ShardState:
        return state.evolve(config={**state.config, file_record_name("0001.jsonl"): old})

    shard.machine.apply(as_written)
    assert recorded(shard.state(), "0001.jsonl") == FileRecord(
        29, "xxh3_128:46027b7df2e46089d26973984dc2bd1f", version)
    _bump_mtime(path)
    assert ingest(shard, str(tmp_path), REQUEST).warnings == []  # same bytes: silent
    path.write_bytes(b'{"key":1,"offset":1,"v":"b"}\n')
    assert ingest(shard, str(tmp_path), REQUEST).rewritten == ["0001.jsonl"]
    assert shard.state().config[file_record_name("0001.jsonl")] == old  # left as it was


def test_a_streamed_csv_file_is_digested_as_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CSV file streamed in ranged reads (``landing.csv_chunks``) is recorded from the
    bytes those reads returned: the commit does not read it again."""
    monkeypatch.setenv(STREAM_BYTES_ENV, "0")
    monkeypatch.setenv(BLOCK_BYTES_ENV, "100")  # read in many pieces
    path = tmp_path / "a.csv"
    path.write_text("key,offset,v\n" + "".join(f"{i},{i},value {i}\n" for i in range(200)))
    shard = memory_shard()
    [file] = ingest(shard, str(tmp_path), REQUEST).files
    assert (file.landing_bytes_read, file.digest_bytes_read) == (file.size, 0)
    record = recorded(shard.state(), "a.csv")
    assert record is not None and record.digest == _blocks_digest(path.read_bytes())
    # A same-size rewrite of one byte in its last block is still caught.
    data = bytearray(path.read_bytes())
    data[-3] = ord("X")
    path.write_bytes(bytes(data))
    assert ingest(shard, str(tmp_path), REQUEST).rewritten == ["a.csv"]


def _replace_record(shard: Any, name: str, text: str) -> None:
    def store(state: ShardState) -> ShardState:
        return state.evolve(config={**state.config, file_record_name(name): text})

    shard.machine.apply(store)


def test_a_record_of_an_unknown_kind_still_tells_a_size_change(tmp_path: Path) -> None:
    """A record a later version wrote in a kind this one does not know cannot compare
    content, but its size can: a file of another size is rewritten (never a false
    alarm), one of the same size is not reported."""
    path = write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    same = write_jsonl(tmp_path, "b.jsonl", _rows("y"))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    for name in ("a.jsonl", "b.jsonl"):
        was = json.loads(shard.state().config[file_record_name(name)])
        _replace_record(shard, name, json.dumps(
            {"size": was["size"], "kind": "sha256_tree", "block": 8, "hash": "ab" * 32,
             "version": was["version"]}))
    assert recorded(shard.state(), "a.jsonl") is None  # its content cannot be compared
    write_jsonl(tmp_path, "a.jsonl", _rows("a much longer value than before"))
    write_jsonl(tmp_path, "b.jsonl", _rows("z"))  # same size, other content: unknown
    report = ingest(shard, str(tmp_path), REQUEST)
    assert report.rewritten == ["a.jsonl"]
    assert [w.split(" (")[0] for w in report.warnings] == [
        "a.jsonl: rewritten since it was ingested at ts 0"]
    assert same.exists() and path.exists()


def test_a_record_whose_hash_is_not_hex_reads_as_none(tmp_path: Path) -> None:
    """A record whose digest is not 32 lowercase hex digits can never equal a computed
    one: it is malformed (read as none), not a rewrite of every touched file."""
    path = write_jsonl(tmp_path, "a.jsonl", _rows("x"))
    shard = memory_shard()
    ingest(shard, str(tmp_path), REQUEST)
    was = json.loads(shard.state().config[file_record_name("a.jsonl")])
    for bad in ("zz" * 16, was["hash"].upper(), " " + was["hash"][1:]):
        _replace_record(shard, "a.jsonl", json.dumps({**was, "hash": bad}))
        assert recorded(shard.state(), "a.jsonl") is None, bad
        _bump_mtime(path)  # touched: read and compared, were the record readable
        assert ingest(shard, str(tmp_path), REQUEST).rewritten == [], bad
    old = {"size": was["size"], "digest": "xxh3_128:" + "Q" * 32, "version": was["version"]}
    assert FileRecord.decode(json.dumps(old)) is None
