"""``spark.read.format("upsert")``: a shard read as a DataFrame equals the Python read API
(``upsert_core.open_shard``) at every time asked, with the shard's column types, split
over key-range tasks; bad options fail at ``load()`` with the platform's message; and
the same read runs through a Spark Connect server."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from resources.spark_source import (
    KEY_SPACE,
    arrow_schema_of,
    key_ranges,
    plan_read,
    read_range,
    read_shard,
)
from tests.ingest.helpers import write_jsonl
from upsert_core import open_shard
from upsert_core.errors import NotReadable, ShardNotFound
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.shard import Shard
from upsert_core.stores import open_stores, resolve

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]


def _bag(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A shard ``t`` of 5 timestamps (updates, deletes, late keys) in SQLite + local files."""
    root = tmp_path_factory.mktemp("source")
    consensus, blob = f"sqlite:///{root / 'consensus.db'}", f"file://{root / 'blob'}"
    landing = root / "landing"
    landing.mkdir()
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for ts in range(5):
        rows: list[dict[str, Any]] = []
        for k in range(ts * 40, ts * 40 + 300):
            rows.append({"key": k, "offset": ts * 1000 + k, "v": f"v{k}-{ts}",
                         "amount": k / 4, "at": (base + dt.timedelta(seconds=k)).isoformat()})
        rows += [{"key": k, "offset": ts * 1000 + 999, "__deleted": True}
                 for k in range(ts * 7, 400, 37)]
        write_jsonl(landing, f"{ts:03d}.jsonl", rows)
    shard = Shard.open(*open_stores(resolve(consensus, blob)), "t")
    ingest(shard, str(landing), IngestRequest(key=("key",), order="offset", buckets=3))
    return consensus, blob


def test_key_ranges_cover_the_key_space_without_overlap() -> None:
    for count in (1, 2, 3, 7, KEY_SPACE):
        ranges = key_ranges(count)
        assert ranges[0].lo == b"" and ranges[-1].hi is None
        assert all(a.hi == b.lo for a, b in zip(ranges, ranges[1:], strict=False))


def test_snapshots_and_changes_equal_the_python_read_api(
    spark: SparkSession, stores: tuple[str, str]
) -> None:
    consensus, blob = stores
    table = open_shard("t", consensus, blob)
    for as_of in (None, 0, 2):
        frame = read_shard(spark, "t", as_of=as_of, consensus=consensus, blob=blob,
                           partitions=3)
        assert frame.rdd.getNumPartitions() == 3
        got = [r.asDict() for r in frame.collect()]
        want = table.snapshot(as_of).to_pylist()
        assert got and _bag(got) == _bag(want), as_of
    types = dict(read_shard(spark, "t", consensus=consensus, blob=blob).dtypes)
    assert types == {"key": "bigint", "offset": "bigint", "v": "string", "amount": "double",
                     "at": "string"}
    changes = read_shard(spark, "t", changes=True, since=1, until=4, consensus=consensus,
                         blob=blob, partitions=5)
    got = [r.asDict() for r in changes.collect()]
    assert _bag(got) == _bag(table.changes(1, 4).to_pylist())
    assert {"__ts", "__diff"} <= set(changes.columns)


def test_format_option_path_and_bad_options(
    spark: SparkSession, stores: tuple[str, str]
) -> None:
    consensus, blob = stores
    read_shard(spark, "t", consensus=consensus, blob=blob)  # registers the format
    frame = (spark.read.format("upsert").option("shard", "t").option("consensus", consensus)
             .option("blob", blob).option("asOf", "1").load())
    assert frame.count() == open_shard("t", consensus, blob).snapshot(1).num_rows
    with pytest.raises(Exception, match=r'needs \.option\("shard", NAME\)'):
        spark.read.format("upsert").option("consensus", consensus).load()
    with pytest.raises(Exception, match="not readable|readable"):
        read_shard(spark, "t", as_of=99, consensus=consensus, blob=blob)
    with pytest.raises(Exception, match="has not been initialised|not found|does not exist"):
        read_shard(spark, "nope", consensus=consensus, blob=blob)
    with pytest.raises(Exception, match="option 'read' must be"):
        (spark.read.format("upsert").option("shard", "t").option("consensus", consensus)
         .option("blob", blob).option("read", "everything").load())
    # Issue 21: a time is an integer, never rounded ("2.5" -> 2, True -> 1).
    for option, text in (("asOf", "1.5"), ("asOf", "True"), ("since", "1_0"), ("until", "1e1"),
                         ("asOf", "\u0661")):
        with pytest.raises(Exception, match="must be an integer"):
            (spark.read.format("upsert").option("shard", "t").option("consensus", consensus)
             .option("blob", blob).option("read", "changes" if option != "asOf" else "snapshot")
             .option(option, text).load())
    for option, text in (("asOf", ""), ("asOf", "  "), ("partitions", "0"), ("partitions", "")):
        with pytest.raises(Exception, match="must be an integer|must be 1"):
            (spark.read.format("upsert").option("shard", "t").option("consensus", consensus)
             .option("blob", blob).option(option, text).load())  # never the default
    for kwargs in ({"as_of": 1.5}, {"as_of": True}, {"changes": True, "since": 1.0}):
        with pytest.raises(Exception, match="must be an integer"):
            read_shard(spark, "t", consensus=consensus, blob=blob, **kwargs)


def test_a_wrong_shard_name_is_one_line_naming_the_stores_and_the_shards(
    spark: SparkSession, stores: tuple[str, str]
) -> None:
    # Issue 23: read_shard of a typo raised Spark's AnalysisException carrying a 15-line
    # Python data source traceback; it is the caller's own one-line ShardNotFound now,
    # as upsertctl and open_shard say it, and the format path names the shards too.
    consensus, blob = stores
    with pytest.raises(ShardNotFound) as raised:
        read_shard(spark, "typo", consensus=consensus, blob=blob)
    assert str(raised.value) == (
        f"shard 'typo' has not been initialised (shards in {consensus}: t)")
    with pytest.raises(Exception, match=re.escape(f"shards in {consensus}: t)")):
        (spark.read.format("upsert").option("shard", "typo").option("consensus", consensus)
         .option("blob", blob).load())


def test_read_shard_registers_the_data_source_once_per_session(
    spark: SparkSession, stores: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each registration replaced the previous one, and Spark logged "replaced a
    previously registered data source" on every ``read_shard`` (issue 23)."""
    import weakref

    import resources.spark_source as spark_source

    consensus, blob = stores
    registration = type(spark.dataSource)
    calls: list[str] = []
    real = registration.register

    def counted(self: Any, source: Any) -> Any:
        calls.append(source.name())
        return real(self, source)

    monkeypatch.setattr(spark_source, "_registered", weakref.WeakSet(),  # a fresh session
                        raising=False)
    monkeypatch.setattr(registration, "register", counted)
    for as_of in (1, 2, 3):
        assert read_shard(spark, "t", as_of=as_of, consensus=consensus, blob=blob).count() > 0
    assert calls == ["upsert"]


CONNECT_READ = """
import json, sys
from pyspark.sql import SparkSession
from resources.spark_source import read_shard
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
rows = read_shard(spark, "t", as_of=3, consensus=sys.argv[2], blob=sys.argv[3],
                  partitions=2).collect()
print(json.dumps([r.asDict() for r in rows], default=str))
"""


def test_the_same_read_through_spark_connect(connect_url: str, stores: tuple[str, str]) -> None:
    consensus, blob = stores
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_MASTER")}
    done = subprocess.run([sys.executable, "-c", CONNECT_READ, connect_url, consensus, blob],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    want = json.loads(json.dumps(open_shard("t", consensus, blob).snapshot(3).to_pylist(),
                                 default=str))
    assert _bag(got) == _bag(want) and got


def test_a_plan_ships_the_planners_s3_settings_and_each_task_applies_them(
    stores: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Executors do not inherit the driver's environment: the plan carries the planning
    process's AWS_* (not as options, and not in its repr), and every task applies them,
    overriding what an earlier task left in a reused worker."""
    consensus, blob = stores
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9/planner")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "planner-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    plan = plan_read({"shard": "t", "consensus": consensus, "blob": blob})
    assert dict(plan.env) == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9/planner",
                              "AWS_SECRET_ACCESS_KEY": "planner-secret"}
    assert "planner-secret" not in repr(plan)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9/stale-worker")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "stale")
    rows = [r for b in read_range(plan, key_ranges(1)[0]) for r in b.to_pylist()]
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9/planner"
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == "planner-secret"
    assert len(rows) == open_shard("t", consensus, blob).snapshot().num_rows > 0


def _fresh_shard(root: Path, files: int) -> tuple[str, str, Path]:
    """A shard ``s`` of ``files`` timestamps of keys 0..59 (every key changes every time)."""
    consensus, blob = f"sqlite:///{root / 'consensus.db'}", f"file://{root / 'blob'}"
    landing = root / "landing"
    landing.mkdir()
    for ts in range(files):
        write_jsonl(landing, f"{ts:03d}.jsonl",
                    [{"key": k, "offset": ts * 100 + k, "v": f"v{k}-{ts}"} for k in range(60)])
    shard = Shard.open(*open_stores(resolve(consensus, blob)), "s")
    ingest(shard, str(landing), IngestRequest(key=("key",), order="offset", buckets=2))
    return consensus, blob, landing


def _read_plan(plan: Any) -> list[dict[str, Any]]:
    return [row for part in key_ranges(plan.partitions)
            for batch in read_range(plan, part) for row in batch.to_pylist()]


def test_changes_planned_before_since_reaches_them_never_fold_history_in(
    tmp_path: Path,
) -> None:
    """A changes read planned at ``since`` 3 while the shard's since is 0 means the pure
    changes of times 3..; if GC moves the shard's since to 3 before the tasks run, the
    updates at 3 would include all history folded there: the tasks must refuse (as
    ``Shard.changes`` does when since moves under one read), never return those rows."""
    consensus, blob, _ = _fresh_shard(tmp_path, 5)
    table = open_shard("s", consensus, blob)
    want = table.changes(3, 5).to_pylist()
    plan = plan_read({"shard": "s", "consensus": consensus, "blob": blob,
                      "read": "changes", "since": "3", "partitions": "2"})
    assert _bag(_read_plan(plan)) == _bag(want)
    table.shard.gc(retain=2, leak_grace_ms=0)
    assert table.shard.state().since == 3
    try:
        got = _read_plan(plan)
    except Exception as exc:  # noqa: BLE001 - refusing is right; which error is not
        assert "since" in str(exc)
    else:
        assert _bag(got) == _bag(want), "rows folded from before since 3 were returned"


def test_a_column_added_after_planning_does_not_change_what_tasks_return(
    tmp_path: Path,
) -> None:
    """Spark checks every task's batches against the schema planned at ``load()``; a
    later ingest adding a value column must not change the columns a pinned read
    returns (Spark fails the whole read with DATA_SOURCE_RETURN_SCHEMA_MISMATCH)."""
    consensus, blob, landing = _fresh_shard(tmp_path, 3)
    for read in ("snapshot", "changes"):
        plan = plan_read({"shard": "s", "consensus": consensus, "blob": blob, "read": read})
        planned = arrow_schema_of(plan)
        name = f"{9 if read == 'snapshot' else 10:03d}.jsonl"
        write_jsonl(landing, name, [{"key": 1, "offset": 10_000, "v": "x", f"new_{read}": 1}])
        ingest(open_shard("s", consensus, blob).shard, str(landing), IngestRequest())
        for part in key_ranges(plan.partitions):
            for batch in read_range(plan, part):
                assert batch.schema.names == planned.names, read


def test_a_late_read_planned_before_gc_refuses_rather_than_losing_rows(
    tmp_path: Path,
) -> None:
    """A ``read=late`` planned while the shard's since is 0 means every late row; if GC
    moves since before the tasks run, a task must refuse (as a changes read does), never
    return the collection without the batches now before since: the read would silently
    lose rows, and tasks that ran before and after the GC would disagree."""
    consensus, blob = f"sqlite:///{tmp_path / 'consensus.db'}", f"file://{tmp_path / 'blob'}"
    landing = tmp_path / "landing"
    landing.mkdir()
    for ts in range(5):  # from the second file on, key 2 is late once per file
        write_jsonl(landing, f"{ts:03d}.jsonl", [{"key": 1, "offset": 10 + ts, "v": "x"},
                                                {"key": 2, "offset": 0, "v": "y"}])
    shard = Shard.open(*open_stores(resolve(consensus, blob)), "s")
    ingest(shard, str(landing), IngestRequest(key=("key",), order="offset", buckets=2,
                                              order_scope="global"))
    plan = plan_read({"shard": "s", "consensus": consensus, "blob": blob,
                      "read": "late", "partitions": "2"})
    assert [r["file"] for r in sorted(_read_plan(plan), key=lambda r: r["file"])] == [
        f"{ts:03d}.jsonl" for ts in range(1, 5)]
    shard.gc(retain=2, leak_grace_ms=0)
    assert shard.state().since == 3
    with pytest.raises(NotReadable, match="since moved from 0 to 3"):
        _read_plan(plan)


def test_a_debezium_shard_reads_as_the_columns_of_after(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The order field a Debezium shard stores in its rows is not a column of the
    DataFrame (CONTRACT.md: the shard's columns are ``after``'s); an update that changed
    only the LSN is no change, whichever task reads its key."""
    from tests.debezium_events import event, write_events_jsonl

    consensus, blob = f"sqlite:///{tmp_path / 'consensus.db'}", f"file://{tmp_path / 'blob'}"
    landing = tmp_path / "landing"
    landing.mkdir()
    write_events_jsonl(landing, "0001.jsonl", [
        event("r", 10 + k, after={"id": k, "name": f"n{k}"}) for k in range(20)])
    write_events_jsonl(landing, "0002.jsonl", [
        *(event("u", 40 + k, after={"id": k, "name": f"n{k}"}) for k in range(10)),  # LSN only
        event("u", 60, after={"id": 15, "name": "renamed"})])
    shard = Shard.open(*open_stores(resolve(consensus, blob)), "cdc")
    ingest(shard, str(landing), IngestRequest(key=("id",), envelope="debezium", buckets=3,
                                              order_scope="global"))
    table = open_shard("cdc", consensus, blob)
    for as_of in (None, 0):
        frame = read_shard(spark, "cdc", as_of=as_of, consensus=consensus, blob=blob,
                           partitions=2)
        assert frame.columns == ["id", "name"]
        got = [r.asDict() for r in frame.collect()]
        assert len(got) == 20 and _bag(got) == _bag(table.snapshot(as_of).to_pylist())
    changes = read_shard(spark, "cdc", changes=True, since=1, consensus=consensus, blob=blob,
                         partitions=3)
    assert changes.columns == ["id", "name", "__ts", "__diff"]
    assert sorted((r["name"], r["__diff"]) for r in changes.collect()) == [
        ("n15", -1), ("renamed", 1)]
