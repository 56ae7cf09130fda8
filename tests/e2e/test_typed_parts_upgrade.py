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
from upsert_core.persist.testing import typed_parts


def _layouts(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For every part of shard ``s``: whether it is typed (value columns and a label)."""
    for name, value in cli.service_env().items():
        monkeypatch.setenv(name, value)
    consensus, blob = cli.stores
    return typed_parts(Shard.open(open_consensus(consensus), open_blob(blob), "s",
                                  create=False))


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
