"""The code location loads; sources come from sources.yaml and the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetKey, Definitions

from orchestration.definitions import build_definitions, default_resources, defs
from orchestration.sources import load_sources
from resources.spark import SparkResource
from resources.stores import LocalBlobStore, SqliteConsensus, UrlBlobStore, UrlConsensus
from upsert_core.errors import ConfigError

FOUR = ("source_snapshot", "upsert_state", "output_shard", "rollup_gc")


def test_repository_definitions_load() -> None:
    Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = graph.get_all_asset_keys()
    assert {AssetKey(["demo", n]) for n in FOUR} <= keys
    for name in FOUR:
        node = graph.get(AssetKey(["demo", name]))
        assert node.group_name == "demo"
        assert (node.partitions_def is None) == (name == "rollup_gc")
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert checks >= {
        ("demo/upsert_state", n)
        for n in ("shard_consolidated", "storage_invariants", "state_matches_shard",
                  "error_rows_did_not_grow")
    }
    blocking = {
        spec.name: spec.blocking
        for checks_def in defs.asset_checks or [] for spec in checks_def.check_specs
    }
    assert blocking == {"shard_consolidated": True, "storage_invariants": True,
                        "state_matches_shard": True, "error_rows_did_not_grow": False,
                        "landing_files_unchanged": False,
                        "full_shard_consolidated": False, "full_storage_invariants": False,
                        "full_state_matches_shard": False}
    assert defs.resolve_job_def("demo_ingest") and defs.resolve_job_def("demo_rollup_gc")
    assert defs.resolve_job_def("demo_full_check")
    assert defs.resolve_schedule_def("demo_full_check_schedule").cron_schedule == "0 3 * * *"
    assert defs.resolve_sensor_def("demo_landing_sensor")
    assert defs.resolve_schedule_def("demo_rollup_gc_schedule").cron_schedule == "0 * * * *"


def test_environment_adds_a_source_and_picks_the_stores(tmp_path: Path) -> None:
    env = {
        "UPSERT_HOME": str(tmp_path / "home"),
        "UPSERT_LANDING": "s3://bucket/orders",
        "UPSERT_SHARD": "orders-v2",
        "UPSERT_KEY": "id,region",
        "UPSERT_ORDER": "lsn",
    }
    sources = load_sources(env=env)
    by_name = {s.name: s for s in sources}
    assert set(by_name) == {"demo", "orders_v2"}
    orders = by_name["orders_v2"]
    assert (orders.shard, orders.landing, orders.key, orders.order) == (
        "orders-v2", "s3://bucket/orders", ("id", "region"), "lsn"
    )
    assert by_name["demo"].landing == str(tmp_path / "home" / "demo-landing")

    graph = build_definitions(sources, default_resources(env)).resolve_asset_graph()
    assert {AssetKey(["orders_v2", n]) for n in FOUR} <= graph.get_all_asset_keys()

    embedded = default_resources(env)
    assert isinstance(embedded["consensus"], SqliteConsensus)
    assert isinstance(embedded["blob_store"], LocalBlobStore)
    assert isinstance(embedded["spark"], SparkResource)
    assert embedded["spark"].engine == "spark"
    production = default_resources({
        **env, "UPSERT_CONSENSUS_URL": "postgresql+psycopg://u@db/x",
        "UPSERT_BLOB_URL": "s3://b/p", "UPSERT_ENGINE": "local",
    })
    assert isinstance(production["consensus"], UrlConsensus)
    assert isinstance(production["blob_store"], UrlBlobStore)
    assert production["spark"].engine == "local"


def test_environment_source_replaces_a_file_source_of_the_same_shard(tmp_path: Path) -> None:
    sources = load_sources(env={"UPSERT_HOME": str(tmp_path), "UPSERT_LANDING": "/data/in",
                                "UPSERT_SHARD": "demo"})
    assert [(s.name, s.landing, s.origin) for s in sources] == [
        ("demo", "/data/in", "environment")
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sources:\n  - name: bad-name\n    landing: /x\n", "letters, digits"),
        ("sources:\n  - name: a\n", "needs a landing"),
        ("sources:\n  - name: a\n    landing: /x\n    colour: red\n", "unknown fields"),
        ("sources:\n  - {name: a, landing: /x}\n  - {name: b, landing: /y, shard: a}\n",
         "share the shard 'a'"),
        ("sources:\n  - {name: a, landing: '${NOPE}/x'}\n", "${NOPE} is not set"),
        ("sources: {name: a}\n", "must be a list"),
        ("sources:\n  - {name: a, landing: /x, gc_retain: 0}\n",
         "gc_retain must be an integer >= 1"),
        ("sources:\n  - {name: a, landing: /x, gc_retain: -1}\n",
         "gc_retain must be an integer >= 1"),
        ("sources:\n  - {name: a, landing: /x, sensor_interval_s: 0}\n",
         "sensor_interval_s must be an integer >= 1"),
        ("sources:\n  - {name: a, landing: /x, sensor_interval_s: fast}\n",
         "sensor_interval_s must be an integer >= 1"),
    ],
)
def test_malformed_sources_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("$", r"\$").replace("{", r"\{")):
        load_sources(path, env={})


def test_sources_file_options_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(
        "sources:\n"
        "  - name: orders\n"
        "    landing: ${ROOT:-/srv}/orders\n"
        "    key: id, region\n"
        "    order_scope: global\n"
        "    gc_cron: '*/5 * * * *'\n"
        "    gc_retain: 10\n"
        "    sensor_interval_s: 3\n"
        "  - {name: other, landing: /y}\n"
    )
    [orders, other] = load_sources(path, env={})
    assert (orders.sensor_interval_s, other.sensor_interval_s) == (3, 10)
    sensor = build_definitions([orders]).resolve_sensor_def("orders_landing_sensor")
    assert sensor.minimum_interval_seconds == 3
    assert orders.landing == "/srv/orders" and orders.shard == "orders"
    assert orders.key == ("id", "region") and orders.order is None
    assert (orders.gc_cron, orders.gc_retain) == ("*/5 * * * *", 10)
    request = orders.request()
    assert (request.key, request.order_scope, request.order) == (("id", "region"), "global", None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("12", ("keep", 12)), ("7d", ("keep_for", 7 * 86400)), ("all", ("all", None)),
     ("null", None)],
)
def test_a_source_retention_is_parsed_and_stored_in_its_shard(
    tmp_path: Path, value: str, expected: object
) -> None:
    from upsert_core.persist.location.blob_memory import MemoryBlob
    from upsert_core.persist.location.consensus_memory import MemoryConsensus
    from upsert_core.persist.shard import Shard

    path = tmp_path / "sources.yaml"
    path.write_text(f"sources:\n  - {{name: a, landing: /x, retention: {value}}}\n")
    (spec,) = load_sources(path, env={})
    assert spec.retention == expected
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "a")
    shard.set_retention(3)
    spec.store_retention(shard)
    assert (shard.retention_for(), shard.state().config.get("retention.keep")) == {
        ("keep", 12): (None, "12"), ("keep_for", 604800): (604800, None),
        ("all", None): (None, None), None: (None, "3"),
    }[expected]  # type: ignore[index]


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "7x", "true", "[1]"])
def test_a_malformed_source_retention_is_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(f"sources:\n  - {{name: a, landing: /x, retention: {value}}}\n")
    with pytest.raises(ConfigError, match="retention must be an integer >= 1"):
        load_sources(path, env={})
