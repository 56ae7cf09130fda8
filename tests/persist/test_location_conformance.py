"""One conformance suite for every Consensus and Blob implementation.

Consensus: MemoryConsensus, SqlConsensus on a SQLite file, SqlConsensus on the real
PostgreSQL. Blob: MemoryBlob, LocalBlob, S3Blob against a real moto server process.
Implementation-specific checks (error mapping, path escapes, prefixes) follow the
shared ones.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.exc import OperationalError

from tests.services import AWS_TEST_CREDENTIALS, PG_ADMIN_DSN
from upsert_core.errors import (
    ConfigError,
    DeterminateError,
    IndeterminateError,
    InvalidSeqNo,
    InvalidUsage,
)
from upsert_core.persist.location import (
    Blob,
    BlobMetadata,
    CasCommitted,
    CasMismatch,
    Consensus,
    RangedBlob,
    VersionedData,
    open_blob_reader,
)
from upsert_core.persist.location.blob_local import TMP_PREFIX, LocalBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.blob_s3 import S3Blob, classify_s3_error
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.sql_driver import classify_db_error

ROOT = Path(__file__).resolve().parents[2]

# --- fixtures -----------------------------------------------------------------------

CONSENSUS_KINDS = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
]
SQL_KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _sql_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'consensus.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture(params=CONSENSUS_KINDS)
def consensus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Consensus]:
    if request.param == "memory":
        yield MemoryConsensus()
        return
    c = SqlConsensus(_sql_url(request.param, request, tmp_path))
    yield c
    c.close()


@pytest.fixture(params=SQL_KINDS)
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _sql_url(request.param, request, tmp_path)


@pytest.fixture(
    params=["memory", "local", pytest.param("s3", marks=pytest.mark.s3)],
)
def blob(request: pytest.FixtureRequest, tmp_path: Path) -> Blob:
    if request.param == "memory":
        return MemoryBlob()
    if request.param == "local":
        return LocalBlob(tmp_path / "blobs")
    # A tiny page size so listing exercises pagination.
    return S3Blob(
        request.getfixturevalue("s3_bucket"),
        "some/prefix",
        request.getfixturevalue("s3_endpoint"),
        list_page_size=2,
        **AWS_TEST_CREDENTIALS,
    )


def v(seqno: int, data: bytes | None = None) -> VersionedData:
    return VersionedData(seqno, data if data is not None else f"v{seqno}".encode())


# --- consensus ----------------------------------------------------------------------


def test_implements_protocol(consensus: Consensus) -> None:
    assert isinstance(consensus, Consensus)


def test_head_of_empty_key(consensus: Consensus) -> None:
    assert consensus.head("shard-a") is None
    assert consensus.scan("shard-a", 0, 10) == []
    assert list(consensus.list_keys()) == []


def test_cas_from_none_then_chain(consensus: Consensus) -> None:
    assert consensus.compare_and_set("s", None, v(1)) == CasCommitted()
    assert consensus.head("s") == v(1)
    assert consensus.compare_and_set("s", 1, v(2, b"\x00\xffbin")) == CasCommitted()
    assert consensus.head("s") == v(2, b"\x00\xffbin")
    # Gaps are allowed: the new seqno only has to exceed the expected one.
    assert consensus.compare_and_set("s", 2, v(10)) == CasCommitted()
    assert consensus.head("s") == v(10)
    # Keys are independent.
    assert consensus.head("t") is None
    assert consensus.compare_and_set("t", None, v(0)) == CasCommitted()
    assert consensus.head("t") == v(0)


def test_cas_mismatch_is_a_value_with_the_current_head(consensus: Consensus) -> None:
    assert consensus.compare_and_set("s", None, v(1)) == CasCommitted()
    again = consensus.compare_and_set("s", None, v(2))
    assert again == CasMismatch(current=v(1))
    stale = consensus.compare_and_set("s", 0, v(2))
    assert isinstance(stale, CasMismatch) and stale.current == v(1)
    ahead = consensus.compare_and_set("s", 5, v(6))
    assert isinstance(ahead, CasMismatch) and ahead.current == v(1)
    missing = consensus.compare_and_set("empty", 3, v(4))
    assert missing == CasMismatch(current=None)
    assert consensus.head("empty") is None
    assert consensus.scan("s", 0, 100) == [v(1)]


@pytest.mark.parametrize(("expected", "new"), [(3, 3), (3, 2), (None, -1), (-1, 1)])
def test_seqno_must_increase_and_be_valid(
    consensus: Consensus, expected: int | None, new: int
) -> None:
    with pytest.raises(InvalidSeqNo):
        consensus.compare_and_set("s", expected, v(new))
    with pytest.raises(ValueError):  # the protocol's documented exception type
        consensus.compare_and_set("s", expected, v(new))
    assert consensus.head("s") is None


def test_scan_ranges_and_limit(consensus: Consensus) -> None:
    seqnos = [1, 2, 4, 7, 8]
    prev = None
    for s in seqnos:
        assert consensus.compare_and_set("s", prev, v(s)) == CasCommitted()
        prev = s
    assert consensus.scan("s", 0, 100) == [v(s) for s in seqnos]
    assert consensus.scan("s", 3, 100) == [v(4), v(7), v(8)]
    assert consensus.scan("s", 4, 2) == [v(4), v(7)]
    assert consensus.scan("s", 8, 5) == [v(8)]
    assert consensus.scan("s", 9, 5) == []
    assert consensus.scan("s", 0, 1) == [v(1)]
    assert consensus.scan("s", 0, 0) == []
    with pytest.raises(InvalidUsage):
        consensus.scan("s", 0, -1)


def test_truncate_semantics(consensus: Consensus) -> None:
    prev = None
    for s in range(1, 6):
        consensus.compare_and_set("s", prev, v(s))
        prev = s
    consensus.compare_and_set("other", None, v(1))
    assert consensus.truncate("s", 3) == 2
    assert consensus.scan("s", 0, 100) == [v(3), v(4), v(5)]
    assert consensus.truncate("s", 3) == 0  # nothing below any more
    assert consensus.truncate("s", 1) == 0
    # Truncating up to the head keeps the head.
    assert consensus.truncate("s", 5) == 2
    assert consensus.scan("s", 0, 100) == [v(5)]
    assert consensus.head("s") == v(5)
    # Truncating past the head would remove it: an error, and nothing is deleted.
    with pytest.raises(InvalidUsage):
        consensus.truncate("s", 6)
    assert consensus.head("s") == v(5)
    with pytest.raises(InvalidUsage):
        consensus.truncate("never-written", 0)
    # Other keys are untouched, and appending after truncation continues the log.
    assert consensus.scan("other", 0, 10) == [v(1)]
    assert consensus.compare_and_set("s", 5, v(6)) == CasCommitted()
    assert consensus.scan("s", 0, 10) == [v(5), v(6)]


def test_list_keys(consensus: Consensus) -> None:
    for key in ["b", "a", "shard/with/slashes", "ü-unicode"]:
        assert consensus.compare_and_set(key, None, v(1)) == CasCommitted()
    consensus.compare_and_set("a", 1, v(2))
    consensus.compare_and_set("never", 7, v(8))  # a mismatch creates nothing
    assert sorted(consensus.list_keys()) == sorted(["a", "b", "shard/with/slashes", "ü-unicode"])


def _race_once(consensus: Consensus, key: str, expected: int | None, news: list[int]) -> list[int]:
    """All threads CaS ``key`` from ``expected`` at once; returns the winners' seqnos."""
    barrier = threading.Barrier(len(news))

    def attempt(new: int) -> tuple[int, object]:
        barrier.wait()
        return new, consensus.compare_and_set(key, expected, v(new, f"t{new}".encode()))

    with ThreadPoolExecutor(len(news)) as pool:
        results = list(pool.map(attempt, news))
    for _new, result in results:
        assert isinstance(result, CasCommitted | CasMismatch)
    return [new for new, result in results if isinstance(result, CasCommitted)]


def test_racing_threads_same_new_seqno_one_winner(consensus: Consensus) -> None:
    expected: int | None = None
    for round_ in range(4):
        new = round_ + 1
        winners = _race_once(consensus, "race", expected, [new] * 6)
        assert winners == [new]
        expected = new
    assert [x.seqno for x in consensus.scan("race", 0, 100)] == [1, 2, 3, 4]


def test_racing_threads_different_new_seqnos_one_winner(consensus: Consensus) -> None:
    # SUBTLE: racers that insert DIFFERENT seqnos do not collide on the primary key;
    # only serializable execution of the conditional insert keeps this to one winner.
    consensus.compare_and_set("race", None, v(1))
    head = 1
    for _round in range(4):
        winners = _race_once(consensus, "race", head, [head + 1 + i for i in range(6)])
        assert len(winners) == 1
        assert consensus.head("race") == v(winners[0], f"t{winners[0]}".encode())
        head = winners[0]


_WORKER = """
import json, os, sys, time
from upsert_core.errors import DeterminateError
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location import CasCommitted, VersionedData
url, key, wid, want, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
c = SqlConsensus(url, max_retries=20)
c.head(key)  # connect (and create the table) before the race starts
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
wins, busy = [], 0
head = c.head(key)
while len(wins) < want:  # every worker keeps racing until it has won `want` times
    expected = None if head is None else head.seqno
    new = 1 if expected is None else expected + 1
    try:
        r = c.compare_and_set(key, expected, VersionedData(new, f"{wid}:{new}".encode()))
    except DeterminateError:
        busy += 1
        head = c.head(key)
        continue
    if isinstance(r, CasCommitted):
        wins.append(new)
        head = VersionedData(new, b"")
    else:
        head = r.current if r.current is not None else c.head(key)
print(json.dumps({"wid": wid, "wins": wins, "busy": busy}), flush=True)
"""


@pytest.mark.slow
def test_racing_processes_exactly_one_winner_per_seqno(sql_url: str, tmp_path: Path) -> None:
    want, n_procs, key = 12, 3, "proc-race"
    target = want * n_procs
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, sql_url, key, f"w{i}", str(want), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for i in range(n_procs)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        go.touch()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    claimed = [(s, o["wid"]) for o in outs for s in o["wins"]]
    claimed_seqnos = sorted(s for s, _ in claimed)
    assert claimed_seqnos == list(range(1, target + 1))  # no seqno claimed twice, no gaps
    reader = SqlConsensus(sql_url)
    log = reader.scan(key, 0, 1000)
    reader.close()
    assert [x.seqno for x in log] == list(range(1, target + 1))
    winner = dict(claimed)
    for x in log:
        assert x.data == f"{winner[x.seqno]}:{x.seqno}".encode()


# --- consensus: implementation-specific error mapping ---------------------------------


def test_sql_rejects_unsupported_urls(tmp_path: Path) -> None:
    for url in ["sqlite://", "sqlite:///:memory:", "mysql://x/y", "not a url"]:
        with pytest.raises(ConfigError):
            SqlConsensus(url)


def test_sqlite_locked_is_retried_then_determinate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    c = SqlConsensus(url, busy_timeout_s=0.05, max_retries=2, backoff_s=0.01)
    assert c.head("k") is None  # creates the table
    holder = sqlite3.connect(tmp_path / "c.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(DeterminateError, match="busy"):
            c.compare_and_set("k", None, v(1))
        assert c.head("k") is None  # WAL: readers are not blocked by the writer
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert c.compare_and_set("k", None, v(1)) == CasCommitted()


@pytest.mark.postgres
def test_postgres_connection_refused_is_determinate() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        c = SqlConsensus(
            f"postgresql+psycopg://postgres@127.0.0.1:{port}/test", connect_timeout_s=1
        )
        with pytest.raises(DeterminateError) as info:
            c.compare_and_set("k", None, v(1))
        assert not isinstance(info.value, IndeterminateError)


@pytest.mark.postgres
def test_postgres_connection_lost_mid_statement_is_indeterminate(fresh_postgres_url: str) -> None:
    c = SqlConsensus(fresh_postgres_url, max_retries=0)
    assert c.compare_and_set("k", None, v(1)) == CasCommitted()
    schema = fresh_postgres_url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(PG_ADMIN_DSN, autocommit=False) as blocker:
        # Hold an uncommitted row at seqno 2 so our compare-and-set blocks on it.
        blocker.execute(
            f'INSERT INTO "{schema}".consensus VALUES (%s, %s, %s)', ("k", 2, b"blocker")
        )
        outcome: list[BaseException | object] = []
        t = threading.Thread(
            target=lambda: outcome.append(_capture(lambda: c.compare_and_set("k", 1, v(2))))
        )
        t.start()
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            victims: list[int] = []
            for _ in range(500):
                rows = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    (blocker.info.backend_pid,),
                ).fetchall()
                victims = [r[0] for r in rows]
                if victims:
                    break
                time.sleep(0.01)
            assert victims, "the compare-and-set never blocked"
            admin.execute("SELECT pg_terminate_backend(%s)", (victims[0],))
        t.join(10)
        blocker.rollback()
    assert len(outcome) == 1 and isinstance(outcome[0], IndeterminateError)
    # The store is still usable, and the lost statement did not commit.
    assert c.head("k") == v(1)
    assert c.compare_and_set("k", 1, v(2)) == CasCommitted()


def _capture(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 - the test inspects whatever was raised
        return e


def _dbapi(orig: Exception) -> OperationalError:
    return OperationalError("INSERT ...", {}, orig)


def test_postgres_error_classification() -> None:
    lost = _dbapi(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert isinstance(classify_db_error(lost, dialect="postgresql", wrote=True), IndeterminateError)
    read = classify_db_error(lost, dialect="postgresql", wrote=False)
    assert type(read) is DeterminateError
    timeout = _dbapi(psycopg.errors.QueryCanceled("canceling statement due to statement timeout"))
    assert isinstance(
        classify_db_error(timeout, dialect="postgresql", wrote=True), IndeterminateError
    )
    syntax = _dbapi(psycopg.errors.SyntaxError("bad"))
    assert type(classify_db_error(syntax, dialect="postgresql", wrote=True)) is DeterminateError
    serial = _dbapi(psycopg.errors.SerializationFailure("could not serialize"))
    assert not isinstance(
        classify_db_error(serial, dialect="postgresql", wrote=True), DeterminateError
    )  # retried internally, never surfaced as a failure of the store


# --- blob -----------------------------------------------------------------------------


def test_blob_implements_protocol(blob: Blob) -> None:
    assert isinstance(blob, Blob)


def test_blob_get_missing(blob: Blob) -> None:
    assert blob.get("missing/key") is None
    assert list(blob.list_keys("")) == []


def test_blob_set_get_overwrite(blob: Blob) -> None:
    blob.set("shard/rollup/1", b"first")
    assert blob.get("shard/rollup/1") == b"first"
    blob.set("shard/rollup/1", b"second, longer value")
    assert blob.get("shard/rollup/1") == b"second, longer value"
    blob.set("shard/rollup/1", b"")
    assert blob.get("shard/rollup/1") == b""
    assert list(blob.list_keys("shard/")) == [BlobMetadata("shard/rollup/1", 0)]


def test_blob_delete_is_idempotent(blob: Blob) -> None:
    blob.set("k", b"12345")
    assert blob.delete("k") == 5
    assert blob.get("k") is None
    assert blob.delete("k") is None
    assert blob.delete("never-there") is None
    assert list(blob.list_keys("")) == []


def test_blob_list_prefix(blob: Blob) -> None:
    data = {"a/1": b"x", "a/2": b"yy", "ab": b"zzz", "b/1": b"", "a/deep/er/3": b"wwww"}
    for k, val in data.items():
        blob.set(k, val)

    def listed(prefix: str) -> list[BlobMetadata]:
        return sorted(blob.list_keys(prefix), key=lambda m: m.key)

    everything = [BlobMetadata(k, len(data[k])) for k in sorted(data)]
    assert listed("") == everything
    assert listed("a/") == [m for m in everything if m.key.startswith("a/")]
    assert [m.key for m in listed("a")] == ["a/1", "a/2", "a/deep/er/3", "ab"]
    assert [m.key for m in listed("a/de")] == ["a/deep/er/3"]
    assert listed("a/1") == [BlobMetadata("a/1", 1)]
    assert listed("zzz") == []
    assert listed("b/1/") == []


def test_blob_binary_and_large_values(blob: Blob) -> None:
    binary = bytes(range(256)) * 3 + b"\x00\r\n\x00"
    blob.set("bin", binary)
    assert blob.get("bin") == binary
    large = os.urandom(4 * 1024 * 1024 + 17)
    blob.set("large/value", large)
    assert blob.get("large/value") == large
    assert BlobMetadata("large/value", len(large)) in list(blob.list_keys("large/"))


def test_blob_takes_any_bytes_like_value_and_refuses_the_rest(blob: Blob) -> None:
    """Writers hand over views of Arrow buffers (``parts.encode_parquet``), not only
    bytes; what is stored is the bytes, whatever the view."""
    import numpy as np
    import pyarrow as pa

    data = bytes(range(256)) * 40
    for i, value in enumerate([memoryview(data), bytearray(data),
                               memoryview(pa.py_buffer(data)),
                               memoryview(np.frombuffer(data, dtype="<u8"))]):
        blob.set(f"view/{i}", value)  # type: ignore[arg-type]
        assert blob.get(f"view/{i}") == data
    strided = memoryview(data)[::2]
    for bad in ["text", [1, 2, 3], 7, strided]:
        with pytest.raises(InvalidUsage):
            blob.set("view/bad", bad)  # type: ignore[arg-type]
    assert blob.get("view/bad") is None


def test_blob_set_is_atomic_under_concurrent_readers(blob: Blob) -> None:
    values = [bytes([i]) * (128 * 1024) for i in range(1, 5)]
    blob.set("hot", values[0])
    stop = threading.Event()
    seen: list[bytes | None] = []

    def reader() -> None:
        while not stop.is_set():
            seen.append(blob.get("hot"))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(2):
            for val in values:
                blob.set("hot", val)
    finally:
        stop.set()
        t.join()
    assert seen and all(s in values for s in seen)  # never a prefix or a mix


# --- blob: ranged readers (the optional RangedBlob capability) --------------------------


def test_every_blob_offers_ranged_readers(blob: Blob) -> None:
    assert isinstance(blob, RangedBlob)
    assert blob.open_reader("missing/key") is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", [0, 1, 1000, 64 * 1024, 200 * 1024 + 3])
def test_blob_reader_reads_any_range(blob: Blob, size: int) -> None:
    data = os.urandom(size)
    blob.set("r/part", data)
    reader = open_blob_reader(blob, "r/part")
    assert reader is not None and reader.seekable() and reader.readable()
    try:
        assert reader.read() == data
        assert reader.read(10) == b""  # at the end
        assert reader.seek(0, os.SEEK_END) == size
        for start, length in [(0, 7), (size // 2, 100), (max(0, size - 5), 50), (3, size)]:
            assert reader.seek(start) == start
            assert reader.read(length) == data[start : start + length]
            assert reader.tell() == max(start, min(size, start + length))
        if size >= 10:
            reader.seek(size - 10)
            assert reader.seek(-3, os.SEEK_CUR) == size - 13
            assert reader.read(4) == data[size - 13 : size - 9]
    finally:
        reader.close()
    assert reader.closed
    with pytest.raises(ValueError):
        reader.read(1)


def test_blob_reader_never_mixes_versions(blob: Blob) -> None:
    first, second = b"a" * (300 * 1024), b"b" * (300 * 1024)
    blob.set("v", first)
    reader = open_blob_reader(blob, "v")
    assert reader is not None
    try:
        assert reader.read(10) == first[:10]
        blob.set("v", second)
        try:
            rest = reader.read()
        except FileNotFoundError:
            pass  # a store that reads lazily notices the change
        else:
            assert rest == first[10:]  # a store that holds the opened version
        reopened = open_blob_reader(blob, "v")
        assert reopened is not None and reopened.read() == second
        reopened.close()
    finally:
        reader.close()


def test_blob_reader_after_delete_reads_the_opened_bytes_or_raises(blob: Blob) -> None:
    data = os.urandom(300 * 1024)
    blob.set("gone", data)
    reader = open_blob_reader(blob, "gone")
    assert reader is not None
    try:
        head = reader.read(100)
        assert head == data[:100]
        blob.delete("gone")
        try:
            rest = reader.read()
        except FileNotFoundError:
            pass
        else:
            assert head + rest == data
    finally:
        reader.close()
    assert open_blob_reader(blob, "gone") is None


def test_open_blob_reader_falls_back_to_get_without_the_capability() -> None:
    class PlainBlob:
        def __init__(self) -> None:
            self.inner = MemoryBlob()

        def get(self, key: str) -> bytes | None:
            return self.inner.get(key)

    plain = PlainBlob()
    assert not isinstance(plain, RangedBlob)
    assert open_blob_reader(plain, "k") is None  # type: ignore[arg-type]
    plain.inner.set("k", b"0123456789")
    reader = open_blob_reader(plain, "k")  # type: ignore[arg-type]
    assert reader is not None
    reader.seek(4)
    assert reader.read(3) == b"456"


@pytest.mark.s3
def test_s3_reader_fetches_only_the_tail_then_the_ranges_asked(
    s3_bucket: str, s3_endpoint: str
) -> None:
    blob = S3Blob(s3_bucket, "ranged", s3_endpoint, **AWS_TEST_CREDENTIALS)
    data = os.urandom(1024 * 1024)
    blob.set("big", data)
    calls: list[dict[str, Any]] = []
    real_get = blob._client.get_object

    def spy(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return real_get(**kwargs)

    blob._client.get_object = spy  # type: ignore[method-assign]
    reader = blob.open_reader("big")
    assert reader is not None
    reader.seek(-100, os.SEEK_END)
    assert reader.read() == data[-100:]  # served from the tail fetched at open
    assert len(calls) == 1 and calls[0]["Range"].startswith("bytes=-")
    reader.seek(1000)
    assert reader.read(5000) == data[1000:6000]
    assert calls[1]["Range"] == "bytes=1000-5999" and "IfMatch" in calls[1]
    assert len(calls) == 2
    # The reader is pinned to the version it opened: a replaced or deleted object fails
    # the next fetch instead of mixing versions.
    blob.set("big", os.urandom(len(data)))
    with pytest.raises(FileNotFoundError, match="replaced"):
        reader.read(10)
    reader.close()
    reader = blob.open_reader("big")
    assert reader is not None
    blob.delete("big")
    with pytest.raises(FileNotFoundError, match="deleted"):
        reader.read(10)


# --- blob: implementation-specific ------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "../escape",
        "a/../../escape",
        "a/..",
        "..",
        "/etc/passwd",
        "a\\..\\b",
        "a\x00b",
        "a//b",
        "a/",
        ".",
        "a/./b",
        "",
        f"x/{TMP_PREFIX}123",
    ],
)
def test_local_blob_rejects_escaping_keys(tmp_path: Path, key: str) -> None:
    root = tmp_path / "root"
    blob = LocalBlob(root)
    with pytest.raises((ConfigError, InvalidUsage)):
        blob.set(key, b"nope")
    with pytest.raises((ConfigError, InvalidUsage)):
        blob.get(key)
    with pytest.raises((ConfigError, InvalidUsage)):
        blob.delete(key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert list(root.rglob("*")) == []


def test_local_blob_layout_and_temp_files_ignored(tmp_path: Path) -> None:
    blob = LocalBlob(tmp_path)
    blob.set("shard/part/x.parquet", b"abc")
    assert (tmp_path / "shard" / "part" / "x.parquet").read_bytes() == b"abc"
    (tmp_path / "shard" / "part" / f"{TMP_PREFIX}leftover").write_bytes(b"partial")
    assert list(blob.list_keys("")) == [BlobMetadata("shard/part/x.parquet", 3)]
    assert list(blob.list_keys("../")) == []
    assert list(blob.list_keys("shard/../../")) == []
    # A key cannot be both a file and a directory of other keys.
    with pytest.raises(ConfigError):
        blob.set("shard/part", b"x")
    assert blob.get("shard/part") is None
    assert blob.delete("shard/part") is None
    assert blob.get("shard/part/x.parquet/below") is None


@pytest.mark.s3
def test_s3_blob_keys_live_under_the_prefix(
    s3_endpoint: str, s3_bucket: str, s3_client: object
) -> None:
    blob = S3Blob(s3_bucket, "/pre/fix/", s3_endpoint, **AWS_TEST_CREDENTIALS)
    other = S3Blob(s3_bucket, "pre/fixother", s3_endpoint, **AWS_TEST_CREDENTIALS)
    blob.set("k/1", b"one")
    other.set("k/1", b"other")
    names = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]]  # type: ignore[attr-defined]
    assert sorted(names) == ["pre/fix/k/1", "pre/fixother/k/1"]
    assert list(blob.list_keys("")) == [BlobMetadata("k/1", 3)]
    assert blob.get("k/1") == b"one"
    assert blob.delete("k/1") == 3
    assert other.get("k/1") == b"other"


def test_s3_unreachable_endpoint_is_determinate() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        blob = S3Blob(
            "bucket", "", f"http://127.0.0.1:{port}", max_attempts=1, **AWS_TEST_CREDENTIALS
        )
        for op in (lambda: blob.get("k"), lambda: blob.set("k", b"v"), lambda: blob.delete("k")):
            with pytest.raises(DeterminateError) as info:
                op()
            assert not isinstance(info.value, IndeterminateError)


def test_s3_error_classification() -> None:
    timeout = ReadTimeoutError(endpoint_url="http://x")
    assert isinstance(classify_s3_error(timeout, wrote=True, what="set"), IndeterminateError)
    assert type(classify_s3_error(timeout, wrote=False, what="get")) is DeterminateError

    def client_error(status: int, code: str) -> ClientError:
        return ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
        )

    server = client_error(500, "InternalError")
    assert isinstance(classify_s3_error(server, wrote=True, what="set"), IndeterminateError)
    denied = client_error(403, "AccessDenied")
    assert type(classify_s3_error(denied, wrote=True, what="set")) is DeterminateError
    refused = EndpointConnectionError(endpoint_url="http://x")
    assert type(classify_s3_error(refused, wrote=True, what="set")) is DeterminateError


# --- consensus: model-based sequences ----------------------------------------------------


class _ConsensusModel:
    """The obviously correct consensus: a dict of seqno-ordered version lists."""

    def __init__(self) -> None:
        self.logs: dict[str, list[VersionedData]] = {}

    def head(self, key: str) -> VersionedData | None:
        log = self.logs.get(key)
        return log[-1] if log else None


_KEYS = st.sampled_from(["a", "b"])


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@settings(max_examples=25)
@given(data=st.data())
def test_consensus_matches_model(kind: str, data: st.DataObject, tmp_path_factory: Any) -> None:
    store: Consensus = (
        MemoryConsensus()
        if kind == "memory"
        else SqlConsensus(f"sqlite:///{tmp_path_factory.mktemp('model')}/c.db")
    )
    model = _ConsensusModel()
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        op = data.draw(st.sampled_from(["cas", "cas_head", "scan", "truncate"]), label="op")
        key = data.draw(_KEYS, label="key")
        head = model.head(key)
        if op in ("cas", "cas_head"):
            if op == "cas_head":
                expected = head.seqno if head else None
            else:
                expected = data.draw(st.none() | st.integers(0, 8), label="expected")
            new = VersionedData(
                (expected or 0) + data.draw(st.integers(1, 3), label="step"),
                data.draw(st.binary(max_size=8), label="bytes"),
            )
            result = store.compare_and_set(key, expected, new)
            if (head.seqno if head else None) == expected:
                assert result == CasCommitted()
                model.logs.setdefault(key, []).append(new)
            else:
                assert result == CasMismatch(current=head)
        elif op == "scan":
            lo = data.draw(st.integers(0, 12), label="from")
            limit = data.draw(st.integers(0, 4), label="limit")
            want = [x for x in model.logs.get(key, []) if x.seqno >= lo][:limit]
            assert store.scan(key, lo, limit) == want
        else:
            bound = data.draw(st.integers(0, 12), label="bound")
            if head is None or head.seqno < bound:
                with pytest.raises(InvalidUsage):
                    store.truncate(key, bound)
            else:
                log = model.logs[key]
                kept = [x for x in log if x.seqno >= bound]
                assert store.truncate(key, bound) == len(log) - len(kept)
                model.logs[key] = kept
        assert store.head(key) == model.head(key)
    assert sorted(store.list_keys()) == sorted(k for k, log in model.logs.items() if log)
