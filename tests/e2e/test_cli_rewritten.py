"""CONTRACT "Change data capture", files rewritten under an ingested name, through
``upsertctl``: every ingest that finds one names it in a warning on stderr and exits 0,
``inspect`` lists it under ``rewritten_files`` (the last ingest's finding), it is never
ingested again; a file touched without a change of content is silent; a shard ingested
before records were kept gives no false alarm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, write_jsonl


def _touch_later(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_a_rewritten_file_is_named_on_every_ingest_and_never_applied(
    cli: Cli, landing: Path
) -> None:
    first = write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "v": "a"}])
    cli.ingest(landing)
    _touch_later(first)
    touched = cli.ingest(landing)
    assert "warning" not in touched.err and "rewritten" not in touched.err

    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "v": "b"}])  # same size
    write_jsonl(landing, "0002.jsonl", [{"key": 2, "offset": 2, "v": "c"}])
    found = cli.ingest(landing, "--json")
    warnings = [line for line in found.err_lines if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(
        "warning: 0001.jsonl: rewritten since it was ingested at ts 0")
    assert found.json()["rewritten_files"] == ["0001.jsonl"]
    assert sorted((r["key"], r["v"]) for r in cli.snapshot()) == [(1, "a"), (2, "c")]
    info = cli.inspect()
    assert info["rewritten_files"] == ["0001.jsonl"] and info["upper"] == 2

    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "v": "longer"}])
    again = cli.ingest(landing)  # nothing pending: still named, still exit 0
    assert any(line.startswith("warning: 0001.jsonl: rewritten") for line in again.err_lines)
    assert cli.inspect()["upper"] == 2

    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "v": "a"}])  # put back
    restored = cli.ingest(landing)
    assert "rewritten" not in restored.err
    assert cli.inspect()["rewritten_files"] == []
    assert cli.check().rc == 0


def test_a_shard_ingested_without_records_gives_no_false_alarm(
    cli: Cli, landing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "v": "a"}])
    cli.ingest(landing)
    for name, value in cli.service_env().items():  # the deployment's S3, if it has one
        monkeypatch.setenv(name, value)
    _forget_records(cli)  # as a version that kept only names left the shard
    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "v": "rewritten"}])
    quiet = cli.ingest(landing)
    assert "rewritten" not in quiet.err
    assert cli.inspect()["rewritten_files"] == []


def _forget_records(cli: Cli) -> None:
    from upsert_core.ingest.shard_config import CONFIG_FILE_PREFIX
    from upsert_core.persist.location.urls import open_blob, open_consensus
    from upsert_core.persist.shard import Shard
    from upsert_core.persist.state.state import ShardState

    consensus, blob = open_consensus(cli.stores[0]), open_blob(cli.stores[1])
    shard = Shard.open(consensus, blob, "s", create=False)

    def forget(state: ShardState) -> ShardState:
        return state.evolve(config={k: v for k, v in state.config.items()
                                    if not k.startswith(CONFIG_FILE_PREFIX)})

    shard.machine.apply(forget)
    consensus.close()
