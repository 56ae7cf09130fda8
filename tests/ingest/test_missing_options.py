"""``--missing`` is a shard option like ``--envelope``: fixed by the first ingest, stored
through ``ShardIngestConfig`` (``ingest.missing`` and ``ingest.unavailable``, written only
for ``keep``), a conflicting later value refused naming both (and, from ``ingest``, the
shard); ``--unavailable`` refused with ``--missing null``; ``sources.yaml`` declares both."""

from __future__ import annotations

from pathlib import Path

import pytest

from upsert_core.errors import ConfigError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.options import resolve_options
from upsert_core.ingest.shard_config import (
    CONFIG_MISSING,
    CONFIG_UNAVAILABLE,
    ShardIngestConfig,
)
from upsert_core.landing.missing import DEFAULT_PLACEHOLDER, Missing

from .helpers import memory_shard, write_jsonl


def _stored(request: IngestRequest) -> dict[str, str]:
    return ShardIngestConfig(options=resolve_options({}, request)).entries()


def test_null_is_the_default_and_writes_no_entry() -> None:
    options = resolve_options({}, IngestRequest())
    assert options.missing is Missing.NULL
    entries = _stored(IngestRequest())
    assert CONFIG_MISSING not in entries and CONFIG_UNAVAILABLE not in entries
    assert _stored(IngestRequest(missing="null")) == entries


def test_keep_round_trips_with_its_placeholder() -> None:
    entries = _stored(IngestRequest(missing=" KEEP "))
    assert entries[CONFIG_MISSING] == "keep"
    assert entries[CONFIG_UNAVAILABLE] == DEFAULT_PLACEHOLDER
    custom = _stored(IngestRequest(missing="keep", unavailable="N/A"))
    read = ShardIngestConfig.read(custom)
    assert read.options is not None
    assert (read.options.missing, read.options.unavailable) == (Missing.KEEP, "N/A")
    assert read.entries() == custom
    assert resolve_options(custom, IngestRequest()).unavailable == "N/A"
    assert resolve_options(custom, IngestRequest(missing="keep", unavailable="N/A")) == (
        read.options)


def test_conflicts_name_both_values() -> None:
    keep = _stored(IngestRequest(missing="keep"))
    with pytest.raises(ConfigError, match=r"--missing null \(shard has keep\)"):
        resolve_options(keep, IngestRequest(missing="null"))
    with pytest.raises(ConfigError, match=r"--unavailable x \(shard has __debezium"):
        resolve_options(keep, IngestRequest(unavailable="x"))
    plain = _stored(IngestRequest())
    with pytest.raises(ConfigError, match=r"--missing keep \(shard has null\)"):
        resolve_options(plain, IngestRequest(missing="keep"))


def test_bad_values_are_refused() -> None:
    with pytest.raises(ConfigError, match="--missing must be 'null' or 'keep'"):
        resolve_options({}, IngestRequest(missing="skip"))
    with pytest.raises(ConfigError, match="--unavailable x is refused with --missing null"):
        resolve_options({}, IngestRequest(unavailable="x"))
    with pytest.raises(ConfigError, match="--unavailable must be a non-empty text"):
        resolve_options({}, IngestRequest(missing="keep", unavailable=""))
    with pytest.raises(ConfigError, match="--missing must be"):
        ShardIngestConfig.read({**_stored(IngestRequest()), CONFIG_MISSING: "maybe"})


def test_ingest_refuses_a_conflict_naming_the_shard_and_writes_nothing(tmp_path: Path) -> None:
    shard = memory_shard("orders")
    write_jsonl(tmp_path, "a.jsonl", [{"key": 1, "offset": 1, "v": "x"}])
    ingest(shard, str(tmp_path), IngestRequest(missing="keep"))
    write_jsonl(tmp_path, "b.jsonl", [{"key": 1, "offset": 2}])
    seqno = shard.state().seqno
    with pytest.raises(ConfigError) as info:
        ingest(shard, str(tmp_path), IngestRequest(missing="null"))
    assert str(info.value).startswith("shard 'orders': conflicting ingest options: ")
    assert "--missing null (shard has keep)" in str(info.value)
    assert shard.state().seqno == seqno


def test_sources_yaml_declares_missing_and_unavailable() -> None:
    from orchestration.sources import parse_source

    spec = parse_source({"name": "cdc", "landing": "/l", "key": "id", "missing": "keep",
                         "unavailable": "N/A"}, "sources.yaml", {})
    options = resolve_options({}, spec.request())
    assert (options.missing, options.unavailable) == (Missing.KEEP, "N/A")
    plain = parse_source({"name": "p", "landing": "/l"}, "sources.yaml", {})
    assert plain.request().missing is None and plain.request().unavailable is None


def test_sources_yaml_missing_null_is_the_setting_null_not_unset() -> None:
    import yaml

    from orchestration.sources import parse_source

    entry = yaml.safe_load("name: cdc\nlanding: /l\nmissing: null\n")
    spec = parse_source(entry, "sources.yaml", {})
    assert spec.request().missing == "null"
    stored = _stored(IngestRequest(missing="keep"))
    with pytest.raises(ConfigError, match="--missing null \\(shard has keep\\)"):
        resolve_options(stored, spec.request())
