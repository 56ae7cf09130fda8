"""What a catalog reads from the code location: descriptions, owners, tags and kinds from
``sources.yaml`` and the stores; and warnings logged by ``upsert_core`` during a run show
in that run's event log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType

from orchestration.definitions import build_definitions, store_kinds
from orchestration.sources import load_sources
from upsert_core.errors import ConfigError
from upsert_core.persist.shard import Shard

from .helpers import Platform

YAML = """sources:
  - name: orders
    landing: /srv/orders
    description: Orders from the shop
    owners: [team:data-eng, alice@example.com]
    tags: {domain: sales, tier: gold}
"""


def test_description_owners_tags_and_kinds_reach_every_asset(tmp_path: Path) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(YAML)
    [orders] = load_sources(path, env={})
    assert orders.owners == ("team:data-eng", "alice@example.com")
    assert dict(orders.tags) == {"domain": "sales", "tier": "gold"}
    graph = build_definitions([orders]).resolve_asset_graph()
    for name in ("source_snapshot", "upsert_state", "output_shard", "rollup_gc"):
        node = graph.get(AssetKey(["orders", name]))
        assert node.owners == ["team:data-eng", "alice@example.com"], name
        assert {k: v for k, v in node.tags.items() if not k.startswith("dagster/")} == {
            "domain": "sales", "tier": "gold"}, name
        assert (node.description or "").startswith("Orders from the shop. "), name
    kinds = {name: set(graph.get(AssetKey(["orders", name])).kinds)
             for name in ("source_snapshot", "upsert_state", "output_shard")}
    assert kinds == {"source_snapshot": {"file"}, "upsert_state": {"spark", "sqlite", "file"},
                     "output_shard": {"sqlite", "file"}}


def test_store_kinds_follow_the_environment() -> None:
    assert store_kinds({}) == ("sqlite", "file")
    assert store_kinds({"UPSERT_CONSENSUS_URL": "postgresql+psycopg://u@h/db",
                        "UPSERT_BLOB_URL": "s3://bucket/shards"}) == ("postgres", "s3")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("owners: [bob]", "neither emails nor team:NAME"),
        ("owners: {a: b}", "owners must be a list"),
        ("tags: [a, b]", "tags must be a mapping"),
        ("tags: {'bad key': x}", "names and values are up to 63"),
        ("tags: {k: 'has space'}", "names and values are up to 63"),
    ],
)
def test_bad_catalog_fields_are_config_errors(tmp_path: Path, entry: str, message: str) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(f"sources:\n  - name: a\n    landing: /x\n    {entry}\n")
    with pytest.raises(ConfigError, match=message):
        load_sources(path, env={})


def test_core_warnings_show_in_the_run_event_log(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = plat.write_batches(["b-01.jsonl"])
    spec = plat.spec()
    _, defs = plat.build(spec)
    plat.add_partitions(spec, names)
    assert defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=names[0], instance=plat.instance).success
    real_gc = Shard.gc

    def gc_with_a_warning(self: Shard, *args: object, **kwargs: object) -> object:
        logging.getLogger("upsert_core.persist.maintenance.gc").warning("shard %s: a recovered hiccup",
                                                            self.shard_id)
        return real_gc(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Shard, "gc", gc_with_a_warning)
    result = defs.resolve_job_def("feed_rollup_gc").execute_in_process(instance=plat.instance)
    assert result.success
    messages = [e.message for e in plat.instance.all_logs(result.run_id)
                if e.dagster_event_type in (None, DagsterEventType.LOGS_CAPTURED)]
    assert any("upsert_core.persist.maintenance.gc: shard feed: a recovered hiccup" in (m or "")
               for m in messages), messages


def test_no_forwarding_when_the_instance_captures_the_core_logger(tmp_path: Path) -> None:
    from dagster import DagsterInstance

    from assets.core_logs import forward_core_logs, instance_captures_core

    root = Path(__file__).resolve().parents[2]
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((root / "deploy" / "dagster-dev.yaml").read_text())
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance_captures_core(instance)
    assert not instance_captures_core(DagsterInstance.ephemeral())

    class Log:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def warning(self, msg: str) -> None:
            self.lines.append(msg)

        def error(self, msg: str) -> None:
            self.lines.append("E " + msg)

    log = Log()
    with forward_core_logs(log):
        logging.getLogger("upsert_core.x").warning("one")
        logging.getLogger("upsert_core.x").info("not forwarded")
        logging.getLogger("upsert_core.x").error("two")
        logging.getLogger("elsewhere").warning("not ours")
    logging.getLogger("upsert_core.x").warning("after the block")
    assert log.lines == ["upsert_core.x: one", "E upsert_core.x: two"]
