"""``live_rows`` in the shard summary (issue 23): ``upsertctl inspect``,
``open_shard().inspect()`` and Dagster's shard metadata show the live rows at the
shard's upper as the ingest recorded them, beside ``live_diffs``, and null (never a
number that may be another upper's) when the shard does not record them for its upper."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import upsert_core
from assets.metadata import row_count_metadata, shard_metadata
from tests.e2e.helpers import Cli
from upsert_core.ingest import IngestRequest, ingest, pipeline
from upsert_core.ingest.shard_config import ShardIngestConfig, recorded_live_rows
from upsert_core.landing.rows import encode_key, encode_row
from upsert_core.persist.shard import Shard
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA
from upsert_core.shard_summary import shard_summary
from upsert_core.stores import open_stores, resolve

from .helpers import write_jsonl

BATCHES: list[list[dict[str, object]]] = [
    [{"key": k, "offset": 1, "v": f"a{k}"} for k in range(5)],
    [
        {"key": 1, "offset": 2, "v": "b1"},  # an update: still one row
        {"key": 2, "offset": 2, "__deleted": True},
        {"key": 9, "offset": 2, "v": "b9"},
        {"key": None, "offset": 2},  # an error row, not a live row
    ],
    [{"key": 3, "offset": 3, "__deleted": True}, {"key": 4, "offset": 3, "v": "c4"}],
]
LIVE = 4  # keys 0, 1, 4, 9


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("UPSERT_CONSENSUS_URL", "UPSERT_BLOB_URL"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("UPSERT_HOME", str(home))
    return home


def _shard_with_batches(home: Path, batches: list[list[dict[str, object]]] = BATCHES) -> Shard:
    landing = home.parent / "landing"
    landing.mkdir(exist_ok=True)
    for i, rows in enumerate(batches):
        write_jsonl(landing, f"{i:03d}.jsonl", rows)
    shard = Shard.open(*open_stores(resolve(None, None)), "s")
    ingest(shard, str(landing), IngestRequest())
    return shard


def _append_outside_the_ingest(shard: Shard) -> None:
    """A commit the ingest did not make: it moves the upper past the recorded count."""
    empty = pa.Table.from_pylist([], schema=UPDATE_SCHEMA)
    assert shard.append(empty, shard.state().upper).committed


def _surfaces(shard: Shard, home: Path) -> list[object]:
    """``live_rows`` as the Python API, ``upsertctl inspect`` and Dagster show it."""
    python = upsert_core.open_shard("s").inspect()
    cli = Cli(home).inspect()
    meta = shard_metadata(shard_summary(shard))["live_rows"]
    return [python["live_rows"], cli["live_rows"], meta.value]


def test_live_rows_is_the_snapshot_row_count_on_every_surface(home: Path) -> None:
    shard = _shard_with_batches(home)
    assert upsert_core.open_shard("s").snapshot().num_rows == LIVE
    assert _surfaces(shard, home) == [LIVE, LIVE, LIVE]
    names = list(upsert_core.open_shard("s").inspect())
    assert names[names.index("live_diffs") + 1] == "live_rows"
    summary = shard_summary(shard)
    assert row_count_metadata(summary)["dagster/row_count"].value == LIVE


def test_live_rows_is_null_after_a_commit_made_outside_the_ingest(home: Path) -> None:
    shard = _shard_with_batches(home)
    _append_outside_the_ingest(shard)
    # The stored count is still there, but it is the previous upper's: not shown.
    assert ShardIngestConfig.read(shard.state().config).live_rows == LIVE
    assert _surfaces(shard, home) == [None, None, None]
    assert '"live_rows":null' in Cli(home).run("inspect", "--shard", "s").out
    assert row_count_metadata(shard_summary(shard)) == {}
    # The next ingest commit records the count for its upper again.
    landing = home.parent / "landing"
    write_jsonl(landing, "100.jsonl", [{"key": 20, "offset": 9, "v": "z"}])
    ingest(shard, str(landing), IngestRequest())
    assert _surfaces(shard, home) == [LIVE + 1] * 3


def test_live_rows_is_null_for_a_shard_ingested_before_the_count_was_kept(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "_live_rows_after", lambda task, outcome: None)
    shard = _shard_with_batches(home)
    # (Today a commit that cannot count writes "unknown"; a shard from before has none.)
    assert shard.state().config.get("stats.live_rows") in (None, "unknown")
    assert _surfaces(shard, home) == [None, None, None]


def test_an_empty_shard_has_no_live_rows(home: Path) -> None:
    shard = _shard_with_batches(home, [])
    assert shard.state().upper == 0
    assert shard_summary(shard)["live_rows"] == 0


@pytest.mark.parametrize(("config", "upper", "rows"), [
    ({}, 0, 0),
    ({"checkpoint.upper": "3", "stats.live_rows": "7"}, 3, 7),
    ({"checkpoint.upper": "3", "stats.live_rows": "7"}, 4, None),  # another upper's count
    ({"checkpoint.upper": "3"}, 3, None),  # not kept when this shard was first ingested
    ({"stats.live_rows": "7"}, 3, None),
    ({"checkpoint.upper": "stale", "stats.live_rows": "7"}, 3, None),
    ({"checkpoint.upper": "3", "stats.live_rows": "unknown"}, 3, None),
    ({"ingest.schema": "not json", "checkpoint.upper": "3", "stats.live_rows": "7"}, 3, 7),
])
def test_the_recorded_count_is_known_only_for_the_upper_it_was_written_at(
    config: dict[str, str], upper: int, rows: int | None
) -> None:
    assert recorded_live_rows(config, upper) == rows


def test_rows_added_outside_the_ingest_are_counted_again_after_the_rebuild(
    home: Path,
) -> None:
    # Review: the ingest after an outside commit carried the stale count forward, so
    # rows that commit added were missing from every later count. Now every bucket is
    # rebuilt from the shard then (its checkpoints are stale) and counts exactly.
    shard = _shard_with_batches(home)
    upper = shard.state().upper
    extra = pa.table({
        "key": pa.array([encode_key([999])], pa.binary()),
        "row": pa.array([encode_row([999, 5, "outside"])], pa.binary()),
        "ts": pa.array([upper], pa.int64()), "diff": pa.array([1], pa.int64()),
    })
    assert shard.append(extra, upper).committed
    assert _surfaces(shard, home) == [None, None, None]
    landing = home.parent / "landing"
    write_jsonl(landing, "100.jsonl", [{"key": 20, "offset": 9, "v": "z"}])
    ingest(shard, str(landing), IngestRequest())
    assert upsert_core.open_shard("s").snapshot().num_rows == LIVE + 2
    assert _surfaces(shard, home) == [LIVE + 2] * 3


def test_python_inspect_reports_what_upsertctl_inspect_prints_field_by_field(
    home: Path,
) -> None:
    """One vocabulary, one source (issue 23): the options, buckets and columns too."""
    landing = home.parent / "landing"
    landing.mkdir()
    write_jsonl(landing, "000.jsonl", [
        {"region": "eu", "id": 1, "seq": 3, "gone": False, "v": "a", "x": 1.5},
        {"region": "us", "id": 2, "seq": 4, "gone": True},
    ])
    cli = Cli(home)
    cli.ingest(landing, "--key", "region,id", "--order", "seq", "--deleted-col", "gone",
               "--order-scope", "global", "--buckets", "8")
    printed = cli.inspect()
    python = upsert_core.open_shard("s").inspect()
    assert list(python) == list(printed)  # the same fields, in the same order
    for name, value in printed.items():
        assert python[name] == value, name
    assert {name: printed[name] for name in ("key", "order", "deleted_col", "order_scope",
                                             "envelope", "buckets")} == {
        "key": ["region", "id"], "order": "seq", "deleted_col": "gone",
        "order_scope": "global", "envelope": "plain", "buckets": 8}
    assert printed["columns"] == {"region": "string", "id": "int64", "seq": "int64",
                                  "v": "string", "x": "float64"}


def test_a_shard_without_an_ingest_has_null_options_on_both_surfaces(home: Path) -> None:
    Shard.open(*open_stores(resolve(None, None)), "s")
    printed = Cli(home).inspect()
    assert upsert_core.open_shard("s").inspect() == printed
    assert [printed[name] for name in ("key", "order", "order_scope", "buckets")] == [None] * 4
    assert printed["columns"] == {}
