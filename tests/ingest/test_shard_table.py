"""``upsert_core.open_shard``: typed Arrow reads of a shard, found where ``upsertctl`` finds it.

Shards are written by the library ingest into the embedded default stores under
``UPSERT_HOME`` (or explicit URLs) and read back through the API; the tables must equal
the dict model at every readable time, with the shard's column types.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import upsert_core
from tests.model import UpsertModel
from upsert_core.errors import NotReadable, ShardNotFound, UpsertPlatformError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.shard import Shard
from upsert_core.row_view import RowView
from upsert_core.shard_table import DIFF_COLUMN, TS_COLUMN
from upsert_core.stores import open_stores, resolve

from .helpers import write_jsonl, write_parquet

UTC = dt.UTC


def _ingest(landing: Path, batches: list[list[dict[str, Any]]], **options: Any) -> None:
    consensus, blob = open_stores(resolve(None, None))
    shard = Shard.open(consensus, blob, "t")
    for i, rows in enumerate(batches):
        write_jsonl(landing, f"{i:03d}.jsonl", rows)
    ingest(shard, str(landing), IngestRequest(**options))


def _bag(table: pa.Table) -> Counter[tuple[tuple[str, Any], ...]]:
    return Counter(
        tuple(sorted((k, v) for k, v in row.items() if v is not None))
        for row in table.to_pylist()
    )


BATCHES: list[list[dict[str, Any]]] = [
    [
        {"key": 1, "offset": 1, "v": "a", "x": 1.5, "ok": True},
        {"key": 2, "offset": 1, "v": "b", "x": -0.0, "ok": False},
        {"key": 3, "offset": 1, "v": "c"},
    ],
    [
        {"key": 1, "offset": 2, "v": "a2", "x": 2.5},
        {"key": 2, "offset": 2, "__deleted": True},
        {"key": 4, "offset": 2, "v": "d", "w": "2024-01-02T03:04:05.123456+00:00"},
        {"key": None, "offset": 3},  # a row error
    ],
    [{"key": 3, "offset": 3, "v": "c3", "w": "1999-12-31T23:59:59+00:00"}],
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("UPSERT_CONSENSUS_URL", "UPSERT_BLOB_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("UPSERT_HOME", str(tmp_path / "home"))
    return tmp_path


def test_snapshot_and_changes_are_typed_and_equal_the_model(home: Path) -> None:
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, BATCHES)
    table = upsert_core.open_shard("t")
    assert table.schema.names == ["key", "offset", "v", "x", "ok", "w"]
    assert table.schema.field("w").type == pa.string()  # JSON Lines has no timestamps
    assert table.schema.field("x").type == pa.float64()
    model = UpsertModel("batch")
    for ts, rows in enumerate(BATCHES):
        model.apply(rows)  # the null-key row is an error row, not applied
        snap = table.snapshot(ts)
        assert snap.schema == table.schema
        expected = Counter(
            tuple(sorted((k, v) for k, v in row)) for row in model.rows(ts).elements()
        )
        assert _bag(snap) == expected, ts
        changes = table.changes(ts, ts + 1)
        assert changes.schema.names[-2:] == [TS_COLUMN, DIFF_COLUMN]
        assert set(changes.column(TS_COLUMN).to_pylist()) <= {ts}
        signed: Counter[tuple[tuple[str, Any], ...]] = Counter()
        for row in changes.to_pylist():
            diff = row.pop(DIFF_COLUMN)
            row.pop(TS_COLUMN)
            signed[tuple(sorted((k, v) for k, v in row.items() if v is not None))] += diff
        want = Counter({
            tuple(sorted((k, v) for k, v in r)): d
            for r, d in model.row_changes(ts).items()
        })
        assert +signed == +want and -signed == -want
    latest = table.snapshot()
    assert latest.equals(table.snapshot(2))
    assert table.to_batches().read_all().equals(latest)
    # A column a row predates reads as null; pandas sees the same rows.
    by_key = {r["key"]: r for r in latest.to_pylist()}
    assert by_key[1]["w"] is None and by_key[1]["ok"] is None and by_key[1]["x"] == 2.5
    assert by_key[4]["w"] == "2024-01-02T03:04:05.123456+00:00"
    assert sorted(latest.to_pandas()["key"].tolist()) == [1, 3, 4]
    errors = table.errors()
    assert errors.to_pylist() == [{"file": "001.jsonl", "row": 4, "reason": errors[2][0].as_py()}]
    info = table.inspect()
    assert info["upper"] == 3 and info["columns"]["w"] == "string"


def test_parquet_types_read_back_as_they_went_in(home: Path) -> None:
    landing = home / "landing"
    landing.mkdir()
    when = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    source = pa.table({
        "key": pa.array([1, 2], pa.int64()),
        "offset": pa.array([when, when], pa.timestamp("us", tz="UTC")),
        "day": pa.array([dt.date(2020, 2, 29), None], pa.date32()),
        "blob": pa.array([b"\x00\xff", b""], pa.binary()),
        "f": pa.array([float("nan"), 1e300], pa.float64()),
    })
    write_parquet(landing, "000.parquet", source)
    consensus, blob = open_stores(resolve(None, None))
    ingest(Shard.open(consensus, blob, "p"), str(landing), IngestRequest())
    table = upsert_core.open_shard("p").snapshot().sort_by("key")
    assert table.schema == source.schema
    assert table.column("offset").to_pylist() == [when, when]
    assert table.column("day").to_pylist() == [dt.date(2020, 2, 29), None]
    assert table.column("blob").to_pylist() == [b"\x00\xff", b""]
    f = table.column("f").to_pylist()
    assert f[0] != f[0] and f[1] == 1e300


def test_reads_follow_the_cli_rules_and_never_create_a_shard(home: Path) -> None:
    with pytest.raises(ShardNotFound):
        upsert_core.open_shard("missing")
    consensus, blob = open_stores(resolve(None, None))
    with pytest.raises(ShardNotFound):
        Shard.open(consensus, blob, "missing", create=False)
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, BATCHES)
    table = upsert_core.open_shard("t")
    for bad in (-1, 3, 10):
        with pytest.raises(NotReadable, match="readable"):
            table.snapshot(bad)
    with pytest.raises(NotReadable):
        table.changes(2, 9)
    assert issubclass(NotReadable, UpsertPlatformError)


def test_explicit_urls_win_over_the_environment(home: Path, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, BATCHES[:1])
    config = resolve(None, None)
    monkeypatch.setenv("UPSERT_HOME", str(home / "elsewhere"))
    with pytest.raises(ShardNotFound):
        upsert_core.open_shard("t")
    table = upsert_core.open_shard("t", config.consensus_url, config.blob_url)
    assert table.snapshot().num_rows == 3


def test_an_empty_shard_reads_as_an_empty_table(home: Path) -> None:
    consensus, blob = open_stores(resolve(None, None))
    Shard.open(consensus, blob, "empty")
    table = upsert_core.open_shard("empty")
    assert table.schema == pa.schema([]) and table.changes().num_rows == 0
    with pytest.raises(NotReadable):
        table.snapshot()


def test_pandas_duckdb_and_polars_read_the_arrow_tables(home: Path) -> None:
    import duckdb
    import polars as pl

    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, BATCHES)
    snapshot = upsert_core.open_shard("t").snapshot()
    frame = snapshot.to_pandas()
    assert sorted(frame["key"].tolist()) == [1, 3, 4]
    con = duckdb.connect()
    con.register("orders", snapshot)
    assert con.execute("select key, v from orders order by key").fetchall() == [
        (1, "a2"), (3, "c3"), (4, "d")
    ]
    polars_frame = pl.from_arrow(snapshot)
    assert isinstance(polars_frame, pl.DataFrame)
    assert polars_frame.sort("key")["v"].to_list() == ["a2", "c3", "d"]
    changes = upsert_core.open_shard("t").changes()
    assert con.execute(
        "select sum(__diff) from changes where __ts = 1"
    ).fetchone() == (sum(d for d, t in zip(changes.column("__diff").to_pylist(),
                                             changes.column("__ts").to_pylist(),
                                             strict=True) if t == 1),)


def test_streamed_batches_keep_read_order_and_errors_surface_at_their_batch(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merged read's batches are decoded one ahead on a helper thread: the output
    keeps the read's order, a batch that fails to decode raises when its turn comes
    (after the batches before it were delivered), and a reader closed early stops the
    helper."""
    import upsert_core.shard_table as shard_table

    monkeypatch.setattr(shard_table, "open_typed_snapshot", lambda *args: None)
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, BATCHES)
    table = upsert_core.open_shard("t")
    read = list(table.shard.snapshot(None))
    assert len(read) == 1
    slices = [read[0].slice(i, 1) for i in range(read[0].num_rows)]
    monkeypatch.setattr(table.shard, "snapshot", lambda as_of: iter(slices))
    want = [shard_table.decode_snapshot_batch(table.row_view(), s).to_pylist()
            for s in slices]
    got = [b.to_pylist() for b in table.to_batches()]
    assert got == want and len(got) == 3

    real = shard_table.decode_snapshot_batch
    calls = []

    def failing(schema: Any, batch: pa.RecordBatch) -> pa.Table:
        calls.append(1)
        if len(calls) == 3:
            raise upsert_core.errors.CorruptData("bad row")
        return real(schema, batch)

    monkeypatch.setattr(shard_table, "decode_snapshot_batch", failing)
    reader = table.to_batches()
    assert reader.read_next_batch().to_pylist() == want[0]
    assert reader.read_next_batch().to_pylist() == want[1]
    with pytest.raises(upsert_core.errors.CorruptData, match="bad row"):
        reader.read_next_batch()

    calls.clear()
    early = table.to_batches()
    assert early.read_next_batch().to_pylist() == want[0]
    early.close()


def test_changes_keep_user_columns_named_like_the_change_columns(home: Path) -> None:
    # Issue 21: a source with columns __ts/__diff gave changes() two columns of each name;
    # to_pylist() kept the change's ts and dropped the user's value.
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, [[{"key": 1, "offset": 1, "__ts": 50, "__diff": "user"}],
                      [{"key": 1, "offset": 2, "__ts": 51, "___ts": 9.5}]])
    table = upsert_core.open_shard("t")
    ts_name, diff_name = table.change_columns()
    assert (ts_name, diff_name) == ("____ts", "____diff")  # ___ts is a column too
    changes = table.changes()
    assert len(set(changes.schema.names)) == len(changes.schema.names)
    rows = sorted(changes.to_pylist(), key=lambda r: (r[ts_name], r[diff_name]))
    assert rows == [
        {"key": 1, "offset": 1, "__ts": 50, "__diff": "user", "___ts": None,
         ts_name: 0, diff_name: 1},
        {"key": 1, "offset": 1, "__ts": 50, "__diff": "user", "___ts": None,
         ts_name: 1, diff_name: -1},
        {"key": 1, "offset": 2, "__ts": 51, "__diff": None, "___ts": 9.5,
         ts_name: 1, diff_name: 1},
    ]
    assert sorted(changes.column("__ts").to_pylist()) == [50, 50, 51]  # one column of the name
    # A shard without such columns keeps the documented names.
    assert upsert_core.shard_table.change_columns(RowView(None)) == (TS_COLUMN, DIFF_COLUMN)


@pytest.mark.parametrize("bad", [2.5, 1.0, True, False, "1", None])
def test_times_that_are_not_integers_are_refused_not_rounded(home: Path, bad: object) -> None:
    # Issue 21: snapshot(as_of=2.5) returned ts 2, as_of=True ts 1, since=1.5 started at 2.
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, BATCHES)
    table = upsert_core.open_shard("t")
    calls = [lambda: table.changes(since=bad), lambda: table.changes(since=0, until=bad)]
    if bad is not None:  # None is "the default" for as_of
        calls += [lambda: table.snapshot(as_of=bad), lambda: table.to_batches(as_of=bad)]
    else:
        calls = [lambda: table.shard.changes(bad)]  # type: ignore[arg-type]
    for call in calls:
        with pytest.raises(UpsertPlatformError, match="must be an integer ts"):
            call()
    assert table.snapshot(as_of=np.int64(1)).num_rows == table.snapshot(as_of=1).num_rows


def test_shard_level_times_are_integers_or_refused(home: Path) -> None:
    # The review: downgrade_since(1.5) and append(..., 4.0) committed a float, and every
    # later read of the shard failed ("corrupt state diff ... got float").
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, BATCHES)
    shard = upsert_core.open_shard("t").shard
    empty = pa.table({"key": pa.array([], pa.binary()), "row": pa.array([], pa.binary()),
                      "ts": pa.array([], pa.int64()), "diff": pa.array([], pa.int64())})
    with shard.register_reader() as reader:
        for bad in (1.5, True, 1.0):
            with pytest.raises(UpsertPlatformError, match="must be an integer"):
                reader.downgrade_since(bad)  # type: ignore[arg-type]
        reader.downgrade_since(np.int64(1))  # numpy's integers are integers
    for args in ((3.0,), (3, 4.5), (True,)):
        with pytest.raises(UpsertPlatformError, match="must be an integer"):
            shard.append(empty, *args)  # type: ignore[arg-type]
    assert upsert_core.open_shard("t").snapshot().num_rows == 3  # still readable
    assert shard.append(empty, np.int64(3)).committed  # type: ignore[union-attr]


def test_change_columns_avoid_names_that_differ_only_in_case(home: Path) -> None:
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, [[{"key": 1, "offset": 1, "__TS": "user", "__Diff": 2}]])
    table = upsert_core.open_shard("t")
    assert table.change_columns() == ("___ts", "___diff")
    names = [n.casefold() for n in table.changes().schema.names]
    assert len(set(names)) == len(names)


def test_reads_of_a_missing_shard_create_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    # Issue 23: open_shard("x") and `upsertctl inspect --shard x` in an empty directory
    # created .upsert/consensus.db and blob/.
    for var in ("UPSERT_CONSENSUS_URL", "UPSERT_BLOB_URL", "UPSERT_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ShardNotFound, match="shard 'x' has not been initialised"):
        upsert_core.open_shard("x")
    home = tmp_path / "elsewhere"
    with pytest.raises(ShardNotFound, match="consensus.db does not exist"):
        upsert_core.open_shard("x", f"sqlite:///{home}/consensus.db", f"file://{home}/blob")
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_name_lists_the_shards_that_exist(home: Path) -> None:
    landing = home / "landing"
    landing.mkdir()
    _ingest(landing, BATCHES)  # shard "t"
    with pytest.raises(ShardNotFound, match=r"\(shards in sqlite:///.*consensus\.db: t\)"):
        upsert_core.open_shard("typo")
