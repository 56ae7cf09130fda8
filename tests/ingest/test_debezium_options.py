"""``--envelope`` is a shard option like ``--order-scope``: fixed by the first ingest,
stored through ``ShardIngestConfig`` (``ingest.envelope``, written only for debezium),
a conflicting later value refused naming both; ``--deleted-col`` refused with debezium."""

from __future__ import annotations

import pytest

from upsert_core.order_scope import OrderScope
from upsert_core.errors import ConfigError
from upsert_core.ingest.options import IngestRequest, resolve_options
from upsert_core.ingest.shard_config import CONFIG_ENVELOPE, ShardIngestConfig
from upsert_core.landing.debezium import DELETE_MARKER, Envelope


def _stored(request: IngestRequest) -> dict[str, str]:
    return ShardIngestConfig(options=resolve_options({}, request)).entries()


def test_a_new_shard_is_plain_by_default_and_writes_no_envelope_entry() -> None:
    options = resolve_options({}, IngestRequest())
    assert options.envelope is Envelope.PLAIN
    assert options.schema.order == "offset" and options.schema.deleted == "__deleted"
    assert CONFIG_ENVELOPE not in _stored(IngestRequest())


def test_debezium_defaults_and_round_trip() -> None:
    options = resolve_options({}, IngestRequest(envelope=" Debezium ", key=("id",)))
    assert options.envelope is Envelope.DEBEZIUM
    assert options.schema.order == "source.lsn" and options.schema.deleted == DELETE_MARKER
    entries = _stored(IngestRequest(envelope="debezium", key=("id",)))
    assert entries[CONFIG_ENVELOPE] == "debezium"
    read = ShardIngestConfig.read(entries)
    assert read.options == options
    assert read.entries() == entries
    # later runs may omit it, or repeat it
    assert resolve_options(entries, IngestRequest()).envelope is Envelope.DEBEZIUM
    assert resolve_options(entries, IngestRequest(envelope="debezium")) == options


def test_a_conflicting_envelope_names_both_values() -> None:
    debezium = _stored(IngestRequest(envelope="debezium", key=("id",)))
    with pytest.raises(ConfigError, match=r"--envelope plain \(shard has debezium\)"):
        resolve_options(debezium, IngestRequest(envelope="plain"))
    plain = _stored(IngestRequest(order_scope=OrderScope.GLOBAL))
    with pytest.raises(ConfigError, match=r"--envelope debezium \(shard has plain\)"):
        resolve_options(plain, IngestRequest(envelope="debezium"))


def test_deleted_col_is_refused_with_debezium() -> None:
    with pytest.raises(ConfigError, match="--deleted-col gone is refused with --envelope debezium"):
        resolve_options({}, IngestRequest(envelope="debezium", deleted_col="gone"))
    stored = _stored(IngestRequest(envelope="debezium"))
    with pytest.raises(ConfigError, match="--deleted-col __deleted is refused"):
        resolve_options(stored, IngestRequest(deleted_col="__deleted"))


def test_an_unknown_envelope_is_refused() -> None:
    with pytest.raises(ConfigError, match="--envelope must be 'plain' or 'debezium'"):
        resolve_options({}, IngestRequest(envelope="avro"))
    with pytest.raises(ConfigError, match="--envelope must be"):
        ShardIngestConfig.read({**_stored(IngestRequest()), CONFIG_ENVELOPE: "avro"})


def test_sources_yaml_declares_the_envelope() -> None:
    from orchestration.sources import parse_source

    spec = parse_source({"name": "cdc", "landing": "/l", "key": "id", "envelope": "debezium"},
                        "sources.yaml", {})
    request = spec.request()
    assert request.envelope == "debezium"
    options = resolve_options({}, request)
    assert options.envelope is Envelope.DEBEZIUM and options.schema.key == ("id",)
    plain = parse_source({"name": "p", "landing": "/l"}, "sources.yaml", {})
    assert plain.request().envelope is None
