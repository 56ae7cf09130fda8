"""Review of issue 24 (a run of many small files through Spark is one job): attempts to
break the group path (``resources/spark_group.py``, ``ingest/group.py``) on a real
``local[2]`` session, each landing ingested three ways and compared ts by ts
(snapshot and changes, error rows, late rows, ingested files, the run's error):

- grouped (the default): the Spark engine runs the run's small files as groups;
- per file: ``UPSERT_SPARK_GROUP_FILES=1`` (every file its own Spark job);
- in process: the ``--engine local`` engine (``InProcessEngine``).

Landings: JSON Lines, CSV and Parquet files mixed in one group, empty files of each
kind, columns added along the way; Debezium events (JSON Lines with Kafka Connect's
wrapper and Parquet, tombstone lines, ``t``/``m`` events); an order of several columns
with late rows; ``--missing keep``. And the run's edges: the group bounds
(``UPSERT_SPARK_GROUP_FILES`` / ``UPSERT_SPARK_GROUP_BYTES``) at exactly their limits
and malformed; a file that fails validation in the middle of a group; a file removed
after the listing, before the group's job reads it; a shard whose checkpoints are not
current (the group's first file rebuilds every bucket from the shipped shard state, the
next ones carry them); value checks on a column the group adds; a new shard whose first
file is empty (0-byte JSON Lines, Parquet of no rows, a CSV header).
"""

from __future__ import annotations

import csv
import io
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from tests.debezium_events import event, write_events_jsonl, write_events_parquet
from tests.ingest.helpers import contents, memory_shard, write_jsonl
from upsert_core.errors import ConfigError, IngestError
from upsert_core.ingest import FileTask, IngestReport, IngestRequest, InProcessEngine, ingest
from upsert_core.ingest.outcome import FileOutcome
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

pytestmark = pytest.mark.spark


@contextmanager
def counted_jobs(spark: SparkSession) -> Iterator[list[int]]:
    """The Spark jobs this thread starts inside the block (a job group of its own)."""
    context = spark.sparkContext
    group = f"upsert-review-{uuid.uuid4().hex}"
    context.setJobGroup(group, "counted by a test")
    counted: list[int] = []
    try:
        yield counted
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        counted.append(len(context.statusTracker().getJobIdsForGroup(group)))


def _shard(root: Path) -> Shard:
    root.mkdir(parents=True, exist_ok=True)
    return Shard.open(open_consensus(f"sqlite:///{root / 'c.db'}"),
                      open_blob(f"file://{root / 'blob'}"), "s")


def _run(shard: Shard, landing: Path, request: IngestRequest, engine: Any
         ) -> tuple[IngestReport | None, str | None]:
    try:
        return ingest(shard, str(landing), request, engine=engine), None
    except IngestError as exc:
        return None, str(exc)


def _same(a: Shard, b: Shard) -> None:
    sa, sb = a.state(), b.state()
    assert sa.upper == sb.upper
    assert dict(sa.ingested_files) == dict(sb.ingested_files)
    assert contents(a) == contents(b)
    errors = [(e["file"], e["row"], e["reason"]) for e in a.errors()]
    assert errors == [(e["file"], e["row"], e["reason"]) for e in b.errors()]
    assert len(errors) == len(set(errors)), "an error row recorded twice"
    assert list(ShardTable(a).late_records()) == list(ShardTable(b).late_records())


def _per_file_counts(report: IngestReport | None) -> list[tuple[Any, ...]]:
    if report is None:
        return []
    return [(f.name, f.ts, f.rows_read, f.inserts, f.retractions, f.errors, f.late_rows,
             f.skipped) for f in report.files]


def _three_ways(
    spark: SparkSession, tmp_path: Path, landing: Path, request: IngestRequest,
    monkeypatch: pytest.MonkeyPatch, *, jobs: int | None = 1,
) -> tuple[Shard, str | None]:
    """Ingest ``landing`` grouped, per file and in process; assert the three shards (and
    the runs' errors and per-file counts) are the same; returns the grouped shard and
    the run's error."""
    grouped = _shard(tmp_path / "grouped")
    with counted_jobs(spark) as counted:
        g_report, g_error = _run(grouped, landing, request, SparkEngine(spark))
    if jobs is not None:
        assert counted == [jobs]
    with monkeypatch.context() as m:
        m.setenv("UPSERT_SPARK_GROUP_FILES", "1")
        single = _shard(tmp_path / "single")
        s_report, s_error = _run(single, landing, request, SparkEngine(spark))
    local = memory_shard()
    l_report, l_error = _run(local, landing, request, InProcessEngine())
    assert g_error == s_error == l_error
    _same(grouped, local)
    _same(single, local)
    assert _per_file_counts(g_report) == _per_file_counts(l_report) == _per_file_counts(
        s_report)
    assert unreferenced_blobs(grouped) == set()
    return grouped, g_error


def _csv(root: Path, name: str, header: list[str], rows: list[list[Any]]) -> Path:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(["" if v is None else v for v in row] for row in rows)
    path = root / name
    path.write_text(text.getvalue())
    return path


def _parquet(root: Path, name: str, table: pa.Table) -> Path:
    path = root / name
    pq.write_table(table, path)
    return path


def test_mixed_jsonl_csv_parquet_and_empty_files_in_one_group(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "00.jsonl", [{"key": k, "offset": 1, "v": f"a{k}"} for k in range(8)])
    _csv(landing, "01.csv", ["key", "offset", "v", "w"],
         [[1, 2, "csv", 5], [2, 2, None, None], ["", 2, "null key", 1], [9, 2, "new", 7]])
    _parquet(landing, "02.parquet", pa.table({
        "key": pa.array([3, 4, 10], pa.int64()), "offset": pa.array([3, 3, 3], pa.int64()),
        "v": ["pq", None, "pq10"], "w": pa.array([1, 2, None], pa.int64()),
        "__deleted": [False, True, None]}))
    (landing / "03.jsonl").touch()  # a 0-byte batch
    _parquet(landing, "04.parquet", pa.table({  # no rows, columns declared
        "key": pa.array([], pa.int64()), "offset": pa.array([], pa.int64()),
        "v": pa.array([], pa.string())}))
    (landing / "05.csv").write_text("key,offset,v,w\n")  # a header and no rows
    write_jsonl(landing, "06.jsonl", [{"key": 5, "offset": 4, "w": 2.5},
                                      {"key": 6, "offset": 4, "w": 3, "z": True},
                                      {"key": 8, "offset": 4, "w": "x"},
                                      {"key": 7, "offset": 4, "__deleted": "TRUE"}])
    _csv(landing, "07.csv", ["offset", "key", "z"], [[5, 1, "false"], [5, 2, "yes"]])
    _parquet(landing, "08.parquet", pa.table({
        "key": pa.array([1, 11], pa.int32()), "offset": pa.array([6, 6], pa.int64()),
        "v": ["last", "eleven"]}))
    request = IngestRequest(buckets=3, inline_threshold=64, maintain=False)
    grouped, error = _three_ways(spark, tmp_path, landing, request, monkeypatch, jobs=None)
    assert error is None
    assert grouped.state().upper == 9


def _debezium_landing(landing: Path) -> None:
    wrapper_schema = {"type": "struct", "fields": [
        {"field": "after", "type": "struct", "fields": [
            {"field": "id", "type": "int64"},
            {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp"}]},
    ]}
    write_events_jsonl(landing, "00.jsonl", [
        event("r", 1, before=None, after={"id": 1, "name": "one"}),
        event("c", 2, before=None, after={"id": 2, "name": "two"}),
        "null",
        {"op": "t", "source": {"lsn": 3}, "ts_ms": 1},
    ])
    write_events_parquet(landing, "01.parquet", [
        event("u", 4, before=None, after={"id": 1, "name": "uno"}),
        event("c", 5, before=None, after={"id": 3, "name": "three"}),
    ])
    write_events_jsonl(landing, "02.jsonl", [
        {"schema": wrapper_schema,
         "payload": event("u", 6, before=None, after={"id": 2, "at": 1_700_000_000_000_000})},
        event("d", 7, before={"id": 3}, after=None),
        {"op": "m", "source": {"lsn": 8}, "ts_ms": 1},
        event("x", 9, before=None, after={"id": 4}),  # an unknown op: an error row
    ])
    (landing / "03.jsonl").touch()
    write_events_jsonl(landing, "04.jsonl", [
        event("c", 10, before=None, after={"id": 4, "name": "four", "qty": 3}),
        event("u", None, before=None, after={"id": 4, "name": "no lsn"}),
        event("d", 11, before={"id": 1}, after=None),
    ])


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_debezium_files_in_one_group(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _debezium_landing(landing)
    request = IngestRequest(key=("id",), envelope="debezium", order_scope=scope, buckets=2,
                            inline_threshold=64, maintain=False)
    grouped, error = _three_ways(spark, tmp_path, landing, request, monkeypatch, jobs=None)
    assert error is None
    assert grouped.state().upper == 5


def test_an_order_of_several_columns_with_late_rows_in_one_group(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    files = [
        [{"key": k, "bf": "b2", "pos": 5, "v": f"v{k}"} for k in range(6)],
        [{"key": 1, "bf": "b1", "pos": 99, "v": "late: older binlog file"},
         {"key": 2, "bf": "b2", "pos": 5, "v": "late: same order"},
         {"key": 3, "bf": "b2", "pos": 6, "v": "newer"},
         {"key": 4, "bf": "b10", "pos": 0, "v": "b10 < b2 as text: late"},
         {"key": 5, "bf": "b3", "pos": None, "v": "null order: error row"}],
        [{"key": 6, "bf": "b1", "pos": 1, "__deleted": True}],  # tombstone of a new key
        [{"key": 6, "bf": "b1", "pos": 1, "v": "late after its tombstone"},
         {"key": 0, "bf": "b3", "pos": 0, "__deleted": True}],
        [{"key": 0, "bf": "b2", "pos": 9, "v": "late after a delete"}],
    ]
    for f, rows in enumerate(files):
        write_jsonl(landing, f"{f:02d}.jsonl", rows)
    request = IngestRequest(order="bf,pos", order_scope="global", buckets=3,
                            inline_threshold=64, maintain=False)
    # Two jobs: in a new shard's first group, 02 (no value column) ends the group.
    grouped, error = _three_ways(spark, tmp_path, landing, request, monkeypatch, jobs=2)
    assert error is None
    assert len(list(ShardTable(grouped).late_records())) == 5


def test_missing_keep_in_one_group(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    ph = "__debezium_unavailable_value"
    write_jsonl(landing, "00.jsonl", [{"key": k, "offset": 1, "v": f"v{k}", "w": k}
                                      for k in range(6)])
    write_jsonl(landing, "01.jsonl", [{"key": 1, "offset": 2, "w": 10},
                                      {"key": 2, "offset": 2, "v": ph},
                                      {"key": 9, "offset": 2, "w": 9}])
    _csv(landing, "02.csv", ["key", "offset", "w", "x"], [[1, 3, ph, "added"], [3, 3, 7, None]])
    _parquet(landing, "03.parquet", pa.table({
        "key": pa.array([4, 1], pa.int64()), "offset": pa.array([4, 4], pa.int64()),
        "v": ["pq", None]}))
    write_jsonl(landing, "04.jsonl", [{"key": 5, "offset": 5, "__deleted": True},
                                      {"key": 5, "offset": 6, "x": "after delete"},
                                      {"key": 1, "offset": 7}])
    for scope in ("batch", "global"):
        request = IngestRequest(missing="keep", order_scope=scope, buckets=2,
                                inline_threshold=64, maintain=False)
        _, error = _three_ways(spark, tmp_path / scope, landing, request, monkeypatch,
                               jobs=None)
        assert error is None


def _small_landing(landing: Path, files: int) -> list[int]:
    landing.mkdir()
    sizes = []
    for f in range(files):
        path = write_jsonl(landing, f"{f:02d}.jsonl",
                           [{"key": (f * 5 + j) % 7, "offset": f, "v": f"{f}-{j}"}
                            for j in range(3 + f % 2)])
        sizes.append(path.stat().st_size)
    return sizes


@pytest.mark.parametrize(("files_env", "bytes_of", "jobs"), [
    ("2", None, 3),  # 2 + 2 + 1 (alone)
    ("4", None, 2),  # 4 + 1 (alone)
    ("5", None, 1),
    (None, 3, 2),  # exactly the bytes of the first three: 3 + 2
    (None, -3, 3),  # one byte short of three: 2 + 2 + 1 (alone)
    (None, 0, 5),  # less than the first file: every file alone
])
def test_group_bounds_at_their_edges(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    files_env: str | None, bytes_of: int | None, jobs: int,
) -> None:
    landing = tmp_path / "landing"
    sizes = _small_landing(landing, 5)
    if files_env is not None:
        monkeypatch.setenv("UPSERT_SPARK_GROUP_FILES", files_env)
    if bytes_of is not None:
        budget = sum(sizes[:abs(bytes_of)]) - (1 if bytes_of < 0 else 0)
        monkeypatch.setenv("UPSERT_SPARK_GROUP_BYTES", str(max(1, budget)))
    request = IngestRequest(buckets=2, maintain=False)
    _three_ways(spark, tmp_path, landing, request, monkeypatch, jobs=jobs)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", " "])
def test_malformed_group_bounds_are_refused_before_anything_is_applied(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    landing = tmp_path / "landing"
    _small_landing(landing, 3)
    shard = _shard(tmp_path / "s")
    for name in ("UPSERT_SPARK_GROUP_FILES", "UPSERT_SPARK_GROUP_BYTES"):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            if not value.strip():  # blank: the default
                ingest(shard, str(landing), IngestRequest(buckets=2, maintain=False),
                       engine=SparkEngine(spark))
                continue
            with pytest.raises(ConfigError, match=name):
                ingest(shard, str(landing), IngestRequest(buckets=2, maintain=False),
                       engine=SparkEngine(spark))
            assert shard.state().upper == 0


def test_a_truncated_parquet_file_in_the_middle_of_a_group(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in range(6):
        rows = [{"key": k, "offset": f, "v": f"{f}-{k}"} for k in range(4)]
        rows.append({"key": None, "offset": f})
        write_jsonl(landing, f"{f:02d}.jsonl", rows)
    good = io.BytesIO()
    pq.write_table(pa.table({"key": [1], "offset": [9], "v": ["pq"]}), good)
    (landing / "03a.parquet").write_bytes(good.getvalue()[:-20])
    request = IngestRequest(buckets=2, inline_threshold=64, maintain=False)
    # The shard has its columns first, so the group trusts the file's problem (no rerun).
    for root in ("grouped", "single"):
        ingest(_shard(tmp_path / root), str(landing), request, through="00.jsonl")
    local = memory_shard()
    ingest(local, str(landing), request, through="00.jsonl")
    grouped = _shard(tmp_path / "grouped")
    with counted_jobs(spark) as jobs:
        _, g_error = _run(grouped, landing, request, SparkEngine(spark))
    assert jobs == [1]
    with monkeypatch.context() as m:
        m.setenv("UPSERT_SPARK_GROUP_FILES", "1")
        single = _shard(tmp_path / "single")
        _, s_error = _run(single, landing, request, SparkEngine(spark))
    _, l_error = _run(local, landing, request, InProcessEngine())
    assert g_error is not None and g_error.startswith("03a.parquet: ")
    assert g_error == s_error == l_error
    assert sorted(grouped.state().ingested_files) == [f"{f:02d}.jsonl" for f in range(4)]
    _same(grouped, local)
    _same(single, local)
    assert unreferenced_blobs(grouped) == set()

    (landing / "03a.parquet").unlink()
    for shard in (grouped, local):
        ingest(shard, str(landing), request, engine=SparkEngine(spark)
               if shard is grouped else None)
    _same(grouped, local)


def test_a_file_removed_after_the_listing_stops_the_group_there(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in range(6):
        write_jsonl(landing, f"{f:02d}.jsonl",
                    [{"key": k, "offset": f, "v": f"{f}-{k}"} for k in range(4)])

    class Removing(SparkEngine):
        """Removes 03.jsonl once the run listed it, before any job reads it."""

        def _gone(self) -> None:
            (landing / "03.jsonl").unlink(missing_ok=True)

        def run_group(self, tasks: list[FileTask], shard: IngestShard) -> list[FileOutcome]:
            self._gone()
            return super().run_group(tasks, shard)

        def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
            self._gone()
            return super().run_file(task, shard)

    request = IngestRequest(buckets=2, maintain=False)
    grouped = _shard(tmp_path / "grouped")
    g_report, g_error = _run(grouped, landing, request, Removing(spark))
    write_jsonl(landing, "03.jsonl", [{"key": k, "offset": 3, "v": f"3-{k}"} for k in range(4)])
    with monkeypatch.context() as m:
        m.setenv("UPSERT_SPARK_GROUP_FILES", "1")
        single = _shard(tmp_path / "single")
        s_report, s_error = _run(single, landing, request, Removing(spark))
    assert g_error == s_error
    assert (g_report is None) == (s_report is None)
    if g_report is not None and s_report is not None:
        assert g_report.pending == s_report.pending
        assert [f.name for f in g_report.files] == [f.name for f in s_report.files]
    assert dict(grouped.state().ingested_files) == dict(single.state().ingested_files)
    assert sorted(grouped.state().ingested_files) == ["00.jsonl", "01.jsonl", "02.jsonl"]
    assert unreferenced_blobs(grouped) == set()


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_a_group_on_a_shard_whose_checkpoints_are_not_current_rebuilds_and_carries(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    """A commit made outside the ingest leaves no checkpoint current: the group's first
    file runs every bucket, rebuilt from the shard state the group ships once, and the
    next files carry those states (global scope: with their tombstones)."""
    from tests.ingest.test_tombstones import _lose_checkpoints

    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "00.jsonl", [{"key": k, "offset": 5, "v": f"v{k}"} for k in range(12)]
                + [{"key": 20, "offset": 9, "__deleted": True}])
    request = IngestRequest(buckets=3, order_scope=scope, inline_threshold=0, maintain=False)
    shards = {"grouped": _shard(tmp_path / "grouped"), "single": _shard(tmp_path / "single"),
              "local": memory_shard()}
    for shard in shards.values():
        ingest(shard, str(landing), request)
        _lose_checkpoints(shard)
    for f in range(1, 6):
        write_jsonl(landing, f"{f:02d}.jsonl",
                    [{"key": (f * 7) % 21, "offset": f + 3, "v": f"{f}"},
                     {"key": 20, "offset": 8, "v": "late in the global scope"}])
    with counted_jobs(spark) as jobs:
        report = ingest(shards["grouped"], str(landing), request, engine=SparkEngine(spark))
    assert jobs == [1]
    assert len(report.rehydrations) == 3  # every bucket, once, in the first file
    with monkeypatch.context() as m:
        m.setenv("UPSERT_SPARK_GROUP_FILES", "1")
        ingest(shards["single"], str(landing), request, engine=SparkEngine(spark))
    ingest(shards["local"], str(landing), request)
    _same(shards["grouped"], shards["local"])
    _same(shards["single"], shards["local"])
    assert unreferenced_blobs(shards["grouped"]) == set()


def test_value_checks_on_a_column_a_group_adds(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Value checks (Dagster sources' ``checks``) turn off the group's leniency; a check
    on a column the group's first schema lacks fails (file-level) in a file read with
    it, which the group must not take for the file's own problem."""
    from upsert_core.landing import parse_value_checks

    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "00.jsonl", [{"key": k, "offset": 1, "w": k} for k in range(4)])
    write_jsonl(landing, "01.jsonl", [{"key": 1, "offset": 2, "w": -1, "u": "a"},
                                      {"key": 2, "offset": 2, "w": 50, "u": "zz"}])
    write_jsonl(landing, "02.jsonl", [{"key": 3, "offset": 3, "w": 7}])  # no u
    write_jsonl(landing, "03.jsonl", [{"key": 3, "offset": 4, "w": 8, "u": "b"}])
    # The shard has 00 (no u) first; the checks are the run's own, not stored.
    request = IngestRequest(buckets=2, maintain=False)
    for root in ("grouped", "single"):
        ingest(_shard(tmp_path / root), str(landing), request, through="00.jsonl")
    checks = parse_value_checks({"w": {"min": 0, "max": 10},
                                 "u": {"isin": ["a", "b"], "not_null": True}})
    checked = IngestRequest(buckets=2, value_checks=checks, maintain=False)
    _, g_error = _run(_shard(tmp_path / "grouped"), landing, checked, SparkEngine(spark))
    with monkeypatch.context() as m:
        m.setenv("UPSERT_SPARK_GROUP_FILES", "1")
        _, s_error = _run(_shard(tmp_path / "single"), landing, checked,
                               SparkEngine(spark))
    local = memory_shard()
    ingest(local, str(landing), request, through="00.jsonl")
    _, l_error = _run(local, landing, checked, InProcessEngine())
    assert g_error == s_error == l_error is None
    _same(_shard(tmp_path / "grouped"), local)
    _same(_shard(tmp_path / "single"), local)
    reasons = [(e["file"], e["row"], e["reason"]) for e in local.errors()]
    assert [r[:2] for r in reasons] == [("01.jsonl", 1), ("01.jsonl", 2), ("02.jsonl", 1)]


@pytest.mark.parametrize(("scope", "first"), [("batch", "jsonl"), ("global", "parquet"),
                                              ("batch", "csv")])
def test_a_new_shards_first_group_opening_with_an_empty_file(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scope: str,
    first: str,
) -> None:
    """The shard's first file (ts 0, whose options the commit stores) is empty: a 0-byte
    JSON Lines file, a Parquet file of no rows whose columns are typed, a CSV header."""
    landing = tmp_path / "landing"
    landing.mkdir()
    if first == "jsonl":
        (landing / "00.jsonl").touch()
    elif first == "parquet":
        _parquet(landing, "00.parquet", pa.table({"key": pa.array([], pa.int64()),
                                                  "offset": pa.array([], pa.int64()),
                                                  "w": pa.array([], pa.float64())}))
    else:
        (landing / "00.csv").write_text("key,offset,v\n")
    write_jsonl(landing, "01.jsonl", [{"key": k, "offset": 2, "v": f"{k}", "w": 1}
                                      for k in range(5)])
    (landing / "02.jsonl").touch()
    write_jsonl(landing, "03.jsonl", [{"key": 1, "offset": 1, "__deleted": True},
                                      {"key": 2, "offset": 3, "v": "x", "w": 2.5}])
    request = IngestRequest(buckets=2, order_scope=scope, inline_threshold=64, maintain=False)
    grouped, error = _three_ways(spark, tmp_path, landing, request, monkeypatch, jobs=None)
    assert error is None
    assert grouped.state().upper == 4
