"""Buckets that grow with the table: an ingest doubles a shard's bucket count between
two of its files once the recorded checkpoint bases say a bucket outgrew the target
state per bucket (the one a new shard's count aims at), unless the ingest named a count
or ``UPSERT_AUTO_REBUCKET=0``; and what it grows to (:func:`grown_buckets`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from upsert_core.errors import ConfigError
from upsert_core.ingest import options
from upsert_core.ingest.rebucket import AUTO_REBUCKET_ENV, STATE_PER_STORED_BYTE, grown_buckets
from upsert_core.ingest.shard_config import ShardIngestConfig, ShardOptions
from upsert_core.ingest.tasks import Base
from upsert_core.landing import SourceSchema
from upsert_core.order_scope import OrderScope
from upsert_core.persist.state.state import ShardState

from .helpers import memory_shard
from .test_rebucket import Landing, assert_matches, labels

MB = 1 << 20
TARGET = options.TARGET_BUCKET_BYTES


def _state(buckets: int, sizes: list[int], *, current: bool = True) -> ShardState:
    """A shard at upper 10 whose buckets' bases have the stored ``sizes``."""
    schema = SourceSchema(key=("key",), order="offset", deleted="__deleted",
                          columns=(("key", "int64"), ("offset", "int64")))
    config = ShardIngestConfig(
        options=ShardOptions(schema, OrderScope.BATCH, buckets),
        checkpoint_upper=10 if current else 9,
        checkpoint_bases={b: Base(10, 0, 1, size).encode() for b, size in enumerate(sizes)},
    ).entries()
    return ShardState("s", 1, upper=10, config=config)


def _stored(state_bytes: float) -> int:
    """The base size whose estimated state is ``state_bytes``."""
    return int(state_bytes / STATE_PER_STORED_BYTE)


def test_what_the_count_grows_to() -> None:
    at_target = _stored(TARGET)
    assert grown_buckets(_state(4, [at_target] * 4)) is None  # within the target
    assert grown_buckets(_state(4, [_stored(2 * TARGET)] * 4)) is None  # not past 2x
    # Past twice the target: doubled until each bucket is within it again.
    assert grown_buckets(_state(4, [_stored(2.5 * TARGET)] * 4)) == 16
    assert grown_buckets(_state(4, [at_target, at_target, at_target,
                                    _stored(3 * TARGET)])) == 8
    assert grown_buckets(_state(6, [_stored(2.1 * TARGET)] * 6)) == 24  # a multiple
    assert grown_buckets(_state(128, [_stored(8 * TARGET)] * 128)) == 256  # at most 256
    assert grown_buckets(_state(256, [_stored(8 * TARGET)] * 256)) is None
    # Unknown sizes are left out of the estimate; nothing known, nothing done.
    assert grown_buckets(_state(4, [-1, -1, -1, _stored(3 * TARGET)])) == 16
    assert grown_buckets(_state(4, [-1] * 4)) is None
    # Checkpoints not current (something else appended): the sizes may be stale.
    assert grown_buckets(_state(4, [_stored(3 * TARGET)] * 4, current=False)) is None


def test_an_ingest_grows_the_buckets_of_a_growing_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    land = Landing(tmp_path, "global")
    shard = memory_shard()
    land.add()
    land.ingest(shard)  # a small first file: the default count
    assert labels(shard) == {4}
    monkeypatch.setattr(options, "TARGET_BUCKET_BYTES", 300)  # the table "grew"
    land.add()
    report = land.ingest(shard)
    [grew] = report.rebucketed
    grown = grew["buckets"]
    assert isinstance(grown, int) and grown > 4 and grown % 4 == 0
    assert grew["buckets_before"] == 4 and grew["after_ts"] == 1
    assert labels(shard) == {grown}
    assert_matches(shard, land)
    land.add([{"key": k, "offset": 2, "v": "old"} for k in range(60)])
    land.ingest(shard)
    assert_matches(shard, land)


def test_a_first_load_of_many_files_grows_while_it_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A first load split into many files (Spark's part files): sized by the first one,
    # the count grows between files, never after the whole load only.
    monkeypatch.setattr(options, "TARGET_BUCKET_BYTES", 2000)
    land = Landing(tmp_path, "batch")
    for n in range(6):
        land.add([{"key": 100 * n + k, "offset": 1, "v": f"{n}-{k}" * 4} for k in range(100)])
    shard = memory_shard()
    report = land.ingest(shard)
    assert [f.ts for f in report.files] == list(range(6))
    counts = [r["buckets"] for r in report.rebucketed]
    assert counts and counts == sorted(counts) and len(set(counts)) == len(counts)
    assert all(r["after_ts"] < 5 for r in report.rebucketed)  # during the load
    assert labels(shard) == {counts[-1]}
    assert_matches(shard, land)


@pytest.mark.parametrize("why", ["named", "off"])
def test_a_named_count_or_the_setting_keeps_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    land = Landing(tmp_path, "batch")
    shard = memory_shard()
    land.add()
    land.ingest(shard)
    monkeypatch.setattr(options, "TARGET_BUCKET_BYTES", 300)
    if why == "off":
        monkeypatch.setenv(AUTO_REBUCKET_ENV, "0")
    land.add()
    report = land.ingest(shard, **({"buckets": 4} if why == "named" else {}))
    assert report.rebucketed == []
    assert labels(shard) == {4}
    assert_matches(shard, land)


def test_a_bad_setting_is_refused_before_anything_is_ingested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    land = Landing(tmp_path, "batch")
    shard = memory_shard()
    land.add()
    monkeypatch.setenv(AUTO_REBUCKET_ENV, "sometimes")
    with pytest.raises(ConfigError, match=AUTO_REBUCKET_ENV):
        land.ingest(shard)
    assert shard.upper == 0


def test_growth_that_fails_is_tried_once_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rebucket can rewrite all the retained history (three times when it loses races):
    # one that failed is not tried again after every later file of the same run.
    from upsert_core.errors import ConcurrentModification
    from upsert_core.ingest import pipeline

    monkeypatch.setattr(options, "TARGET_BUCKET_BYTES", 2000)
    attempts: list[int] = []

    def failing(*args: object, **kwargs: object) -> None:
        attempts.append(1)
        raise ConcurrentModification("shard s was concurrently modified")

    monkeypatch.setattr(pipeline, "rebucket", failing)
    land = Landing(tmp_path, "batch")
    for n in range(6):
        land.add([{"key": 100 * n + k, "offset": 1, "v": f"{n}-{k}" * 4} for k in range(100)])
    shard = memory_shard()
    report = land.ingest(shard)
    assert [f.ts for f in report.files] == list(range(6))
    assert len(attempts) == 1
    grow_warnings = [w for w in report.warnings if "outgrew" in w]
    assert len(grow_warnings) == 1 and "the next ingest tries again" in grow_warnings[0]
    assert_matches(shard, land)
