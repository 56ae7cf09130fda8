"""The Spark engine's split path (``resources/spark_split.py``) on a real ``local[2]``
session: a file read once by several read tasks, its rows exchanged by bucket through a
shuffle and drained in bucket tasks, gives exactly the shard, error rows and row numbers
of the in-process engine; Parquet with several row groups, JSON Lines with bad rows in
several splits and lines across split boundaries; CSV stays on the one-stage path; the
tasks are counted from Spark's task contexts, the landing bytes from the reads. The
ledger's content digest comes from the tasks' reads (each byte read once, digest
included), records what the in-process engine records, and catches a file rewritten
under an ingested name, on local and S3 landings, with records of today's block
digests and of the whole-file digests earlier versions wrote."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from resources.spark_split import slot_keys, spark_hash_int
from tests.ingest.helpers import contents, memory_shard, snapshot_rows, write_jsonl
from upsert_core.errors import ConfigError
from upsert_core.ingest import IngestReport, IngestRequest, ingest
from upsert_core.ingest.ledger import recorded
from upsert_core.ingest.shard_config import file_record_name
from upsert_core.landing import list_landing
from upsert_core.landing.digest import WHOLE_FILE, blocks_kind, digest_of
from upsert_core.landing.splits import plan_splits
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.testing import unreferenced_blobs

pytestmark = pytest.mark.spark


@pytest.fixture
def split_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "on")
    yield monkeypatch


def _shard(tmp_path: Path) -> Shard:
    return Shard.open(
        open_consensus(f"sqlite:///{tmp_path}/c.db"), open_blob(f"file://{tmp_path}/blob"), "s"
    )


def _counts(report: IngestReport) -> list[tuple[str, int, int, int, int, int]]:
    return [(f.name, f.ts, f.rows_read, f.inserts, f.retractions, f.errors) for f in report.files]


def _jsonl_rows(rng: random.Random, n: int, start_key: int = 0) -> list[object]:
    rows: list[object] = []
    for i in range(n):
        if i % 37 == 5:
            rows.append("{not json")  # a malformed line
        elif i % 41 == 9:
            rows.append({"key": None, "offset": 1})  # a null key
        elif i % 43 == 11:
            rows.append({"key": 3, "offset": 1, "__deleted": "perhaps"})  # a bad marker
        elif i % 47 == 13:
            rows.append("")  # a blank line: counted, not a row
        else:
            row: dict[str, object] = {"key": start_key + rng.randrange(200),
                                      "offset": rng.randrange(12)}
            if rng.random() < 0.15:
                row["__deleted"] = True
            else:
                row["v"] = rng.choice(["a", "bb", "ccc" * rng.randrange(1, 30)])
            rows.append(row)
    return rows


def _parquet(path: Path, rng: random.Random, n: int, row_group: int, wide: bool = False) -> None:
    """``n`` rows (every 97th with a null key) in row groups of ``row_group`` rows; with
    ``wide``, values that do not compress, so the row groups outweigh the footer."""
    keys = [None if i % 97 == 3 else rng.randrange(400) for i in range(n)]
    values = [f"{rng.getrandbits(64):016x}" if wide else rng.choice(["p", "q", "r"])
              for _ in range(n)]
    pq.write_table(
        pa.table({"key": pa.array(keys, pa.int64()),
                  "offset": pa.array([rng.randrange(50) for _ in range(n)], pa.int64()),
                  "v": values}),
        path, row_group_size=row_group,
    )


def _landing(root: Path) -> None:
    rng = random.Random(17)
    _parquet(root / "00.parquet", rng, 4000, 500)  # 8 row groups
    write_jsonl(root, "01.jsonl", _jsonl_rows(rng, 900))
    write_jsonl(root, "02.jsonl", _jsonl_rows(rng, 700, start_key=100))
    _parquet(root / "03.parquet", rng, 3000, 300)


def test_the_split_path_equals_the_in_process_engine(
    spark: SparkSession, tmp_path: Path, split_on: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _landing(landing)
    split_on.setenv("UPSERT_SPARK_SPLIT_BYTES", "6000")
    files = {f.name: f for f in list_landing(str(landing))}
    for name in ("01.jsonl", "02.jsonl"):  # some split boundary falls inside a line
        text = (landing / name).read_bytes()
        splits = plan_splits(files[name], 6000)
        assert len(splits) >= 3
        assert any(text[s.start - 1:s.start] != b"\n" for s in splits[1:])
    for scope in ("batch", "global"):
        shard = _shard(tmp_path / scope)
        engine = SparkEngine(spark)
        request = IngestRequest(buckets=8, order_scope=scope)
        report = ingest(shard, str(landing), request, engine=engine)
        local = memory_shard("local")
        local_report = ingest(local, str(landing), request)
        assert _counts(report) == _counts(local_report)
        assert contents(shard) == contents(local)
        errors = list(shard.errors())
        assert errors == list(local.errors())
        assert {e["file"] for e in errors} == set(files)  # bad rows in every file
        jsonl_rows = sorted(e["row"] for e in errors if e["file"] == "01.jsonl")
        assert jsonl_rows[-1] > 800  # numbered over the whole file, not per split
        assert engine.last_split is not None and not engine.last_split.fallback
        assert [f.read_tasks for f in report.files] == [
            len(plan_splits(files[n], 6000)) for n in sorted(files)]
        assert unreferenced_blobs(shard) == set()


def test_a_parquet_file_of_row_groups_runs_several_read_and_bucket_tasks(
    spark: SparkSession, tmp_path: Path, split_on: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _parquet(landing / "00.parquet", random.Random(3), 80_000, 10_000, wide=True)
    assert pq.ParquetFile(landing / "00.parquet").metadata.num_row_groups == 8
    size = (landing / "00.parquet").stat().st_size
    split_on.setenv("UPSERT_SPARK_SPLIT_BYTES", str(size // 8))
    engine = SparkEngine(spark)
    report = ingest(_shard(tmp_path), str(landing), IngestRequest(buckets=8), engine=engine)
    run = engine.last_split
    assert run is not None and not run.fallback
    read_attempts = {t["attempt"] for t in run.read_tasks.values()}
    bucket_attempts = {t["attempt"] for t in run.bucket_tasks.values()}
    assert len(read_attempts) >= 8  # a task per row group (and one without)
    assert sorted(run.bucket_tasks) == list(range(8))  # every bucket drained once
    assert len(bucket_attempts) == 8  # each in a task of its own (slot_keys)
    # Two stages: the reads and the drains are separate stages of one job.
    assert {t["stage"] for t in run.read_tasks.values()}.isdisjoint(
        {t["stage"] for t in run.bucket_tasks.values()})
    (file,) = report.files
    assert (file.read_tasks, file.drain_tasks) == (len(read_attempts), len(bucket_attempts))
    # Each byte read about once: the row groups and the blocks around them, plus each
    # task's footer; the tasks digested what they read, so the ledger reads nothing.
    assert file.digest_bytes_read == 0
    assert file.size <= file.landing_bytes_read <= 1.1 * file.size
    data = (landing / "00.parquet").read_bytes()
    assert blocks_kind(len(data)).block * 8 < len(data)  # several blocks per task
    record = recorded(_shard(tmp_path).state(), "00.parquet")
    assert record is not None and record.digest == digest_of(data, blocks_kind(len(data)))


def test_the_one_stage_path_reads_the_file_in_every_slice(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _parquet(landing / "00.parquet", random.Random(3), 2000, 500)
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "off")
    engine = SparkEngine(spark, slices=2)
    report = ingest(_shard(tmp_path), str(landing), IngestRequest(buckets=4), engine=engine)
    (file,) = report.files
    assert engine.last_split is None and file.read_tasks == 2
    assert (file.landing_bytes_read, file.digest_bytes_read) == (2 * file.size, 0)
    local = memory_shard("local")
    (local_file,) = ingest(local, str(landing), IngestRequest(buckets=4)).files
    assert (local_file.landing_bytes_read, local_file.digest_bytes_read) == (file.size, 0)


def test_auto_splits_only_files_larger_than_a_split(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "00.jsonl", _jsonl_rows(random.Random(1), 300))
    write_jsonl(landing, "01.jsonl", _jsonl_rows(random.Random(2), 20))
    size = (landing / "00.jsonl").stat().st_size
    monkeypatch.setenv("UPSERT_SPARK_SPLIT_BYTES", str(size // 3))
    engine = SparkEngine(spark, slices=2)
    report = ingest(_shard(tmp_path), str(landing), IngestRequest(buckets=4), engine=engine)
    splits = len(plan_splits(list_landing(str(landing))[0], size // 3))
    assert splits >= 3  # about a third each, in whole blocks
    assert [f.read_tasks for f in report.files] == [splits, 2]  # split, then one-stage
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "sometimes")
    with pytest.raises(ConfigError, match="UPSERT_SPARK_SPLIT must be auto, on or off"):
        ingest(_shard(tmp_path / "b"), str(landing), IngestRequest(buckets=4), engine=engine)


def test_csv_and_diverging_splits_take_the_one_stage_path(
    spark: SparkSession, tmp_path: Path, split_on: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    lines = ["key,offset,v"] + [f'{i},1,"line {i}\nstill {i}"' for i in range(200)]
    (landing / "00.csv").write_text("\n".join(lines) + "\n")
    rows = [{"key": i, "offset": 2, "w": i} for i in range(100)]
    rows += [{"key": i, "offset": 2, "w": i + 0.25} for i in range(100, 200)]
    write_jsonl(landing, "01.jsonl", rows)  # w: int64 in early splits, float64 whole
    split_on.setenv("UPSERT_SPARK_SPLIT_BYTES", "1000")
    shard = _shard(tmp_path)
    engine = SparkEngine(spark, slices=2)
    report = ingest(shard, str(landing), IngestRequest(buckets=4), engine=engine)
    csv, jsonl = report.files
    assert csv.read_tasks == 2  # CSV: the one-stage path (quoted newlines)
    assert engine.last_split is not None and engine.last_split.fallback == [
        f"the {len(plan_splits(list_landing(str(landing))[1], 1000))} splits evolve the"
        " schema differently"]
    assert jsonl.read_tasks == 2  # read whole after the split attempt
    assert jsonl.landing_bytes_read - jsonl.digest_bytes_read >= 3 * jsonl.size
    local = memory_shard("local")
    ingest(local, str(landing), IngestRequest(buckets=4))
    assert contents(shard) == contents(local)
    assert unreferenced_blobs(shard) == set()


def test_a_csv_streamed_in_process_equals_the_spark_engines_read(
    spark: SparkSession, tmp_path: Path, split_on: pytest.MonkeyPatch
) -> None:
    # The in-process engine streams a large CSV (landing.csv_chunks); Spark reads it
    # whole in its one-stage tasks (CSV does not split: quoted newlines). Both must hold
    # the same rows, also a quoted CRLF across Arrow's 1 MiB block, whose "\n" Arrow
    # itself drops (apache/arrow#51368; readers.ArrowTextSource).
    from upsert_core.landing.readers import CSV_BLOCK_BYTES

    landing = tmp_path / "landing"
    landing.mkdir()
    head = b'key,offset,v\r\n0,0,"'
    pad = b"p" * (CSV_BLOCK_BYTES - len(head) - 1)  # the quoted "\r" ends Arrow's block
    rows = [b'%d,%d,"line %d\r\nstill\n%d"' % (i, i, i, i) for i in range(1, 30000)]
    rows += [b"7,7", b',9,"null key"']  # a row with too few fields, a null key
    (landing / "00.csv").write_bytes(head + pad + b'\r\nb"\r\n' + b"\r\n".join(rows) + b"\r\n")
    shard = _shard(tmp_path)
    engine = SparkEngine(spark, slices=2)
    report = ingest(shard, str(landing), IngestRequest(buckets=4), engine=engine)
    assert report.files[0].read_tasks == 2  # one-stage: CSV is not split
    split_on.setenv("UPSERT_STREAM_BYTES", "0")
    split_on.setenv("UPSERT_STREAM_BLOCK_BYTES", str(1 << 18))
    local = memory_shard("local")
    local_report = ingest(local, str(landing), IngestRequest(buckets=4))
    assert _counts(report) == _counts(local_report)
    assert contents(shard) == contents(local)
    assert list(shard.errors()) == list(local.errors())
    assert [(e["row"], e["reason"]) for e in local.errors()] == [
        (30001, "CSV row has 2 fields, expected 3"), (30002, "null key column 'key'")]
    values = {dict(row)["key"]: dict(row)["v"] for row in snapshot_rows(local, 0)}
    assert values[0] == pad.decode() + "\r\nb" and values[5] == "line 5\r\nstill\n5"


def test_ingest_json_reports_the_landing_bytes(
    spark: SparkSession, tmp_path: Path, split_on: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "00.jsonl", _jsonl_rows(random.Random(4), 2000))
    split_on.setenv("UPSERT_SPARK_SPLIT_BYTES", "20000")
    report = ingest(_shard(tmp_path), str(landing), IngestRequest(buckets=4),
                    engine=SparkEngine(spark))
    (entry,) = json.loads(json.dumps(report.to_dict()))["files"]
    size = (landing / "00.jsonl").stat().st_size
    assert entry["size"] == size
    assert entry["read_tasks"] == -(-size // 20000)
    assert entry["digest_bytes_read"] == 0  # the read tasks digested the file
    assert size <= entry["landing_bytes_read"] <= 1.1 * size
    assert report.to_dict()["landing_bytes_read"] == entry["landing_bytes_read"]


@pytest.mark.slow
def test_the_split_path_runs_through_spark_connect(connect_url: str, tmp_path: Path) -> None:
    """``upsertctl ingest --json`` with ``SPARK_REMOTE``: the same plan on a Connect
    server (no local JVM: ``JAVA_HOME`` points nowhere), the same shard and error rows as
    the in-process engine, several read and drain tasks, landing bytes counted."""
    from tests.e2e.helpers import Cli

    landing = tmp_path / "landing"
    landing.mkdir()
    _landing(landing)
    home = tmp_path / "remote"
    remote = Cli(home, engine="spark", env={
        "SPARK_REMOTE": connect_url, "UPSERT_BUCKETS": "8", "JAVA_HOME": str(tmp_path / "nojava"),
        "UPSERT_SPARK_SPLIT": "on", "UPSERT_SPARK_SPLIT_BYTES": "6000"})
    report = remote.ingest(landing, "--json").json()
    local = memory_shard("local")
    local_report = ingest(local, str(landing), IngestRequest(buckets=8))
    shard = Shard.open(open_consensus(f"sqlite:///{home}/consensus.db"),
                       open_blob(f"file://{home}/blob"), "s")
    assert contents(shard) == contents(local)
    assert list(shard.errors()) == list(local.errors())
    assert [(f["name"], f["errors"]) for f in report["files"]] == [
        (f.name, f.errors) for f in local_report.files]
    for entry in report["files"]:
        assert entry["read_tasks"] == len(
            plan_splits(next(f for f in list_landing(str(landing)) if f.name == entry["name"]),
                        6000))
        assert entry["read_tasks"] >= 2 and entry["drain_tasks"] >= 2
        assert entry["landing_bytes_read"] - entry["digest_bytes_read"] >= entry["size"]
    assert unreferenced_blobs(shard) == set()


def test_slot_keys_place_each_bucket_in_its_own_partition(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    values = list(range(-50, 300)) + [2**31 - 1, -(2**31)]
    frame = spark.createDataFrame([(v,) for v in values], "v int")
    hashed = {r["v"]: r["h"] for r in frame.select("v", F.hash("v").alias("h")).collect()}
    assert hashed == {v: spark_hash_int(v) for v in values}
    for buckets in (1, 4, 8, 64):
        slots = slot_keys(buckets)
        assert sorted(slots) == list(range(-1, buckets))
        assert sorted(spark_hash_int(k) % (buckets + 1) for k in slots.values()) == list(
            range(buckets + 1))


def test_the_split_path_reads_an_s3_landing_by_ranges(
    spark: SparkSession, s3_bucket: str, s3_env: str, tmp_path: Path,
    split_on: pytest.MonkeyPatch,
) -> None:
    """Read tasks read their ranges of an S3 object (pinned to its ETag) on the moto
    server; the result is the in-process engine's, each object read about once."""
    import boto3

    from tests.services import AWS_TEST_CREDENTIALS

    local_landing = tmp_path / "landing"
    local_landing.mkdir()
    _landing(local_landing)
    client = boto3.session.Session().client("s3", endpoint_url=s3_env, **AWS_TEST_CREDENTIALS)
    for path in sorted(local_landing.iterdir()):
        client.put_object(Bucket=s3_bucket, Key=f"split/{path.name}", Body=path.read_bytes())
    split_on.setenv("UPSERT_SPARK_SPLIT_BYTES", "20000")
    shard = Shard.open(open_consensus(f"sqlite:///{tmp_path}/c.db"),
                       open_blob(f"s3://{s3_bucket}/blob-split"), "s3")
    report = ingest(shard, f"s3://{s3_bucket}/split", IngestRequest(buckets=4),
                    engine=SparkEngine(spark))
    local = memory_shard("local")
    local_report = ingest(local, str(local_landing), IngestRequest(buckets=4))
    assert _counts(report) == _counts(local_report)
    assert contents(shard) == contents(local)
    assert list(shard.errors()) == list(local.errors())
    for file in report.files:
        # Each byte about once: less than a block more at each boundary (Parquet: the
        # block holding a row group's start), and each task's footer or line tails.
        assert file.read_tasks >= 2 and file.digest_bytes_read == 0
        assert file.size <= file.landing_bytes_read <= (
            1.2 * file.size + (file.read_tasks - 1) * blocks_kind(file.size).block)
    assert unreferenced_blobs(shard) == set()
    for path in sorted(local_landing.iterdir()):  # the in-process engine's records
        ours, theirs = recorded(shard.state(), path.name), recorded(local.state(), path.name)
        assert ours is not None and theirs is not None
        assert (ours.size, ours.digest) == (theirs.size, theirs.digest)

    # Uploaded again with the same bytes (same ETag): silent; with other bytes of the
    # same size: named, not ingested.
    body = (local_landing / "01.jsonl").read_bytes()
    client.put_object(Bucket=s3_bucket, Key="split/01.jsonl", Body=body)
    assert ingest(shard, f"s3://{s3_bucket}/split", IngestRequest(),
                  engine=SparkEngine(spark)).warnings == []
    client.put_object(Bucket=s3_bucket, Key="split/01.jsonl", Body=body.replace(b"a", b"b"))
    client.put_object(Bucket=s3_bucket, Key="split/04.jsonl",
                      Body=b'{"key": 1, "offset": 99, "v": "later"}\n')
    again = ingest(shard, f"s3://{s3_bucket}/split", IngestRequest(), engine=SparkEngine(spark))
    assert again.rewritten == ["01.jsonl"]
    assert [f.name for f in again.files] == ["04.jsonl"]


def _as_before_block_digests(shard: Shard, ingested: dict[str, bytes]) -> None:
    """Rewrite the records of the files ``ingested`` (name: bytes) as versions before
    block digests wrote them: the xxh3-128 of the whole file, no ``kind``."""
    import xxhash

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


def test_rewritten_files_are_caught_on_both_spark_paths_and_old_records(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Parquet file on the split path and a CSV file on the one-stage path: each
    recorded as the in-process engine records it, without a second read; touched
    files are silent, rewritten ones (same size) named and never applied, whether the
    record is a block digest or the whole-file digest of an earlier version."""
    landing = tmp_path / "landing"
    landing.mkdir()
    _parquet(landing / "00.parquet", random.Random(5), 40_000, 5_000, wide=True)
    lines = ["key,offset,v"] + [f"{i},1,v{i % 10}" for i in range(300)]
    (landing / "01.csv").write_text("\n".join(lines) + "\n")
    size = (landing / "00.parquet").stat().st_size
    monkeypatch.setenv("UPSERT_SPARK_SPLIT_BYTES", str(size // 4))
    shard = _shard(tmp_path)
    engine = SparkEngine(spark, slices=2)
    report = ingest(shard, str(landing), IngestRequest(buckets=4), engine=engine)
    splits = len(plan_splits(list_landing(str(landing))[0], size // 4))
    assert [f.read_tasks for f in report.files] == [splits, 2]  # split, then one stage
    assert [f.digest_bytes_read for f in report.files] == [0, 0]
    local = memory_shard("local")
    ingest(local, str(landing), IngestRequest(buckets=4))
    for name in ("00.parquet", "01.csv"):
        ours, theirs = recorded(shard.state(), name), recorded(local.state(), name)
        assert ours is not None and theirs is not None and ours.digest == theirs.digest

    def touch(name: str) -> None:
        st = (landing / name).stat()
        os.utime(landing / name, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))

    def rewrite(name: str) -> None:  # one byte of a value: same size, other content
        data = bytearray((landing / name).read_bytes())
        at = data.rindex(b"v1")
        data[at + 1:at + 2] = b"2"
        (landing / name).write_bytes(bytes(data))

    before = contents(shard)
    for name in ("00.parquet", "01.csv"):
        touch(name)
    assert ingest(shard, str(landing), IngestRequest(), engine=engine).warnings == []
    rewrite("01.csv")
    found = ingest(shard, str(landing), IngestRequest(), engine=engine)
    assert found.rewritten == ["01.csv"] and found.files == []
    assert contents(shard) == before

    # The same shard as an earlier version left it: whole-file digests.
    _as_before_block_digests(shard, {"00.parquet": (landing / "00.parquet").read_bytes()})
    assert recorded(shard.state(), "00.parquet").kind == WHOLE_FILE  # type: ignore[union-attr]
    touch("00.parquet")
    assert ingest(shard, str(landing), IngestRequest(), engine=engine).rewritten == ["01.csv"]
    data = bytearray((landing / "00.parquet").read_bytes())
    at = len(data) // 2  # inside a row group's values: the file stays readable
    data[at] ^= 0x01
    (landing / "00.parquet").write_bytes(bytes(data))
    write_jsonl(landing, "02.jsonl", [{"key": 1, "offset": 99, "v": "later"}])
    last = ingest(shard, str(landing), IngestRequest(), engine=engine)
    assert last.rewritten == ["00.parquet", "01.csv"]
    assert [f.name for f in last.files] == ["02.jsonl"]
    assert contents(shard)[:2] == before
