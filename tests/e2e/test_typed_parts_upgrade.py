"""Typed parts through the CLI, on both deployments (the cluster one: PostgreSQL, the S3
server, Spark): ingests with ``UPSERT_TYPED_PARTS=0`` write plain parts, ``upsertctl
gc`` leaves such a shard plain, and once an ingest writes typed parts again, ``upsertctl
gc --retain 1`` rewrites the whole shard typed, with the same snapshot throughout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, bag, write_jsonl
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import part_formats, typed_parts


def _shard(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> Shard:
    """Shard ``s`` in the CLI's stores, opened in this process."""
    for name, value in cli.service_env().items():
        monkeypatch.setenv(name, value)
    consensus, blob = cli.stores
    return Shard.open(open_consensus(consensus), open_blob(blob), "s", create=False)


def _layouts(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For every part of shard ``s``: whether it is typed (value columns and a label)."""
    return typed_parts(_shard(cli, monkeypatch))


def test_gc_upgrades_plain_parts_only_once_ingests_write_typed_ones(
    cli: Cli, landing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = cli.derive(env={"UPSERT_TYPED_PARTS": "0"})
    for i in range(3):
        write_jsonl(landing, f"{i:02}.jsonl",
                    [{"key": k, "offset": i, "v": f"{i}-{k}"} for k in range(0, 40, i + 1)])
        plain.ingest(landing)
    snapshot = bag(cli.snapshot())
    assert not any(_layouts(cli, monkeypatch))

    cli.run("gc", "--shard", "s", "--retain", "1")  # without the setting: still plain
    assert not any(_layouts(cli, monkeypatch))
    assert bag(cli.snapshot()) == snapshot

    write_jsonl(landing, "03.jsonl", [{"key": 1, "offset": 3, "v": "typed"}])
    cli.ingest(landing)
    snapshot = bag(cli.snapshot())
    assert not all(_layouts(cli, monkeypatch))
    cli.run("gc", "--shard", "s", "--retain", "1")
    layouts = _layouts(cli, monkeypatch)
    assert layouts and all(layouts)
    assert bag(cli.snapshot()) == snapshot
    assert cli.check().json()["ok"] is True


def _formats(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """For every part of shard ``s``: its format (1, 2 or 3)."""
    return part_formats(_shard(cli, monkeypatch))


def test_a_shard_of_earlier_part_formats_reads_ingests_and_is_upgraded_by_compaction(
    cli: Cli, landing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Format 3 (each row once, as its values) beside today's formats 1 and 2: a shard
    written by the previous release reads and ingests as before, and compaction
    rewrites it in format 3 with every readable time unchanged."""
    for i, fmt in enumerate(["1", "2", "2"]):
        write_jsonl(landing, f"{i:02}.jsonl",
                    [{"key": k, "offset": i, "v": f"{i}-{k}", "f": -0.0 if k % 3 else None,
                      "t": "2024-01-02T03:04:05.123456+00:00"} for k in range(0, 60, i + 1)]
                    + [{"key": 7, "offset": i, "__deleted": True}])
        cli.derive(env={"UPSERT_PART_FORMAT": fmt}).ingest(landing)
    assert _formats(cli, monkeypatch) and set(_formats(cli, monkeypatch)) == {1, 2}
    write_jsonl(landing, "03.jsonl", [{"key": 1, "offset": 3, "v": "values only", "n": 5}])
    cli.ingest(landing)  # the default: format 3, beside the older parts
    assert 3 in _formats(cli, monkeypatch)
    before = [bag(cli.snapshot(as_of=ts)) for ts in range(4)]
    changes = [bag(cli.changes(since=ts, until=ts + 1)) for ts in range(4)]
    assert cli.check().json()["ok"] is True

    cli.run("gc", "--shard", "s")  # history kept: compaction rewrites what it merges
    assert [bag(cli.snapshot(as_of=ts)) for ts in range(4)] == before
    assert [bag(cli.changes(since=ts, until=ts + 1)) for ts in range(4)] == changes
    cli.run("gc", "--shard", "s", "--retain", "1")
    assert set(_formats(cli, monkeypatch)) == {3}
    assert bag(cli.snapshot()) == before[-1]
    assert cli.check().json()["ok"] is True
    write_jsonl(landing, "04.jsonl", [{"key": 1, "offset": 4, "v": "after"}])
    cli.ingest(landing)
    assert {r["key"]: r["v"] for r in cli.snapshot()}[1] == "after"
