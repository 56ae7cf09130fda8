"""The engine is chosen in one place (``resources.engines``) and Spark starts lazily:
an ingest or a Dagster run with nothing pending creates no Spark session and starts no
JVM; the session factory prefers a Spark Connect URL, and an explicit argument wins
over the environment. No JVM runs in these tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import resources.spark_session as spark_session
from orchestration.cli.ingest import ingest_landing
from resources.engines import LazySparkEngine, engine_named, make_engine
from resources.spark import SparkResource, spark_resource_from_env
from resources.spark_session import spark_target
from tests.e2e.helpers import Cli
from tests.ingest.helpers import write_jsonl
from upsert_core.errors import ConfigError, IngestError
from upsert_core.ingest import IngestRequest, InProcessEngine, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard

pytestmark = pytest.mark.spark


class FactoryCalled(Exception):
    pass


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """``get_spark`` replaced by a recorder that refuses to make a session."""
    calls: list[object] = []

    def refuse(*args: object, **kwargs: object) -> object:
        calls.append((args, kwargs))
        raise FactoryCalled("get_spark was called")

    monkeypatch.setattr(spark_session, "get_spark", refuse)
    return calls


def _applied_landing(tmp_path: Path) -> tuple[Shard, Path]:
    """A shard that has already ingested every file of its landing."""
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "1.jsonl", [{"key": k, "offset": 1, "v": "a"} for k in range(5)])
    shard = Shard.open(open_consensus(f"sqlite:///{tmp_path}/c.db"),
                       open_blob(f"file://{tmp_path}/blob"), "s")
    ingest(shard, str(landing), IngestRequest(), engine=InProcessEngine())
    return shard, landing


def test_nothing_pending_starts_no_spark(tmp_path: Path, no_spark: list[object]) -> None:
    from pyspark.sql import SparkSession

    shard, landing = _applied_landing(tmp_path)
    active = SparkSession.getActiveSession()
    report = ingest_landing(shard, str(landing), IngestRequest(), "spark", progress_bar=False)
    assert report.files == [] and shard.state().upper == 1
    engine = SparkResource(engine="spark").ingest_engine()  # the Dagster run's engine
    assert isinstance(engine, LazySparkEngine)
    report = ingest(shard, str(landing), IngestRequest(), engine=engine)
    assert report.files == [] and not engine.started
    assert no_spark == [] and SparkSession.getActiveSession() is active

    # The control: a pending file does ask for a session (and its failure is the run's).
    write_jsonl(landing, "2.jsonl", [{"key": 1, "offset": 2, "v": "b"}])
    with pytest.raises(IngestError, match=r"^2\.jsonl: no Spark session: get_spark was") as info:
        ingest_landing(shard, str(landing), IngestRequest(), "spark", progress_bar=False)
    assert isinstance(info.value.__cause__, FactoryCalled)
    assert len(no_spark) == 1 and shard.state().upper == 1


def test_upsertctl_with_nothing_pending_needs_no_java(tmp_path: Path) -> None:
    """A fresh ``upsertctl ingest`` process whose landing is all applied succeeds with
    no Java at all (JAVA_HOME points nowhere); with a pending file it needs one."""
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "1.jsonl", [{"key": k, "offset": 1} for k in range(3)])
    cli = Cli(tmp_path / "home", env={"JAVA_HOME": str(tmp_path / "no-java")}, engine="local")
    cli.ingest(landing)
    spark_cli = Cli(tmp_path / "home", env={"JAVA_HOME": str(tmp_path / "no-java")},
                    engine="spark")
    result = spark_cli.ingest(landing)
    assert "upper 1 -> 1" in result.err or "nothing" in result.err, result.err
    write_jsonl(landing, "2.jsonl", [{"key": 1, "offset": 2}])
    failed = spark_cli.ingest(landing, rc=None)
    assert failed.rc != 0 and cli.inspect()["upper"] == 1
    assert failed.error_line().startswith("upsertctl: error: 2.jsonl: no Spark session: ")
    # Why, on that one line: the JVM's own words are in its log, not on stderr.
    assert "no-java/bin/java: No such file or directory" in failed.error_line(), failed.err
    assert (tmp_path / "home" / "spark" / "driver.log").exists()


def test_an_engine_stops_only_a_session_it_created() -> None:
    class Session:
        stopped = 0

        def stop(self) -> None:
            self.stopped += 1

    made = Session()
    engine = LazySparkEngine(lambda: made)
    engine.spark, engine.created = made, True  # as run_file leaves it
    engine.stop()
    assert made.stopped == 1 and engine.spark is None
    shared = Session()
    engine.spark, engine.created = shared, False
    engine.stop()
    assert shared.stopped == 0
    with engine_named("local") as local:
        assert isinstance(local, InProcessEngine)
    with pytest.raises(ConfigError, match="engine must be one of"):
        make_engine("flink")


def test_the_factory_prefers_spark_connect_and_arguments_win() -> None:
    env = {"SPARK_REMOTE": "sc://127.0.0.1:15002", "SPARK_MASTER": "spark://h:7077"}
    assert spark_target(env=env).remote and spark_target(env=env).url == env["SPARK_REMOTE"]
    assert spark_target(env={"SPARK_MASTER": "spark://h:7077"}).url == "spark://h:7077"
    assert spark_target(env={}).url == "local[*]" and not spark_target(env={}).remote
    assert spark_target("local[2]", env=env).url == "local[2]"  # explicit master wins
    assert spark_target(remote="sc://other:1", env=env).url == "sc://other:1"
    with pytest.raises(ConfigError, match="sc://HOST:PORT"):
        spark_target(env={"SPARK_REMOTE": "127.0.0.1:15002"})
    with pytest.raises(ConfigError, match="not both"):
        spark_target("local[2]", "sc://h:1")

    resource = spark_resource_from_env({**env, "UPSERT_ENGINE": "spark"})
    assert (resource.remote, resource.master, resource.engine) == (env["SPARK_REMOTE"], None,
                                                                   "spark")
    resource = spark_resource_from_env({"SPARK_MASTER": "spark://h:7077", "UPSERT_ENGINE": "local"})
    assert (resource.remote, resource.master, resource.engine) == (None, "spark://h:7077", "local")
    assert isinstance(resource.ingest_engine(), InProcessEngine)


@pytest.mark.parametrize(
    ("rows", "problem"),
    [([{"id": 1, "offset": 1}], "missing key column 'key'"),
     ([{"key": "one", "offset": 1}], "column 'key' changed type"),
     (["{not json", {"key": 1}], "missing order column 'offset'")],
)
def test_a_file_level_problem_is_reported_before_any_spark_session(
    tmp_path: Path, no_spark: list[object], rows: list[object], problem: str
) -> None:
    """Issue 23: a file refused from its schema alone waited 10-30 s for a JVM first."""
    shard, landing = _applied_landing(tmp_path)
    write_jsonl(landing, "2.jsonl", rows)
    with pytest.raises(IngestError, match=rf"^2\.jsonl: .*{problem}"):
        ingest_landing(shard, str(landing), IngestRequest(), "spark", progress_bar=False)
    assert no_spark == [] and shard.state().upper == 1
    # Nothing of the file was written: no error part, no blob beyond the first file's.
    assert shard.state().num_errors() == 0


def test_upsertctl_refuses_a_bad_file_without_java(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "1.jsonl", [{"id": 1, "offset": 1}])
    cli = Cli(tmp_path / "home", env={"JAVA_HOME": str(tmp_path / "no-java")}, engine="spark")
    failed = cli.ingest(landing, rc=1)
    assert failed.error_line() == "upsertctl: error: 1.jsonl: missing key column 'key'"


def test_the_warm_local_server_is_the_default_on_the_embedded_defaults() -> None:
    from resources import local_spark

    assert local_spark.enabled({}) and local_spark.enabled({"UPSERT_SPARK_SERVER": "auto"})
    assert not local_spark.enabled({"UPSERT_SPARK_SERVER": "off"})
    assert not local_spark.enabled({"SPARK_REMOTE": "sc://h:15002"})
    assert not local_spark.enabled({"SPARK_MASTER": "spark://h:7077"})
    with pytest.raises(ConfigError, match=r"UPSERT_SPARK_SERVER='on': use auto .* or off"):
        local_spark.enabled({"UPSERT_SPARK_SERVER": "on"})


@pytest.mark.parametrize("url", ["sc://localhost:4242/;token=t", None])
def test_commands_attach_to_the_local_server_or_run_their_own_jvm(
    url: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's and Dagster's session factories attach to the server ensure_server gives,
    with the local server's retries; without one (a server of other code, busy) they
    start Spark in the process, with pyspark's."""
    from resources import engines, local_spark
    from resources.local_session import LocalServerRetries

    monkeypatch.delenv("UPSERT_SPARK_SERVER")  # the product's default
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    server = None if url is None else local_spark.LocalServer(Path("/nowhere"), 1, url)
    monkeypatch.setattr(local_spark, "ensure_server", lambda: server)
    calls: list[tuple[object, object, object]] = []

    def fake_get_spark(master: object = None, *, remote: object = None,
                       retry_policies: list[object] | None = None, **_: object) -> str:
        servers = [p.server for p in retry_policies or () if isinstance(p, LocalServerRetries)]
        calls.append((master, remote, servers))
        return "session"

    monkeypatch.setattr(spark_session, "get_spark", fake_get_spark)
    engines._default_factory()
    session = SparkResource().ingest_engine().factory  # type: ignore[attr-defined]
    session()
    retries = [] if server is None else [server]
    assert calls == [(None, url, retries), (None, url, retries)]


def test_status_and_stop_create_nothing(tmp_path: Path) -> None:
    from resources import local_spark

    home = tmp_path / "home"
    assert local_spark.status(home)["running"] is False
    assert local_spark.stop(home) is False
    assert not home.exists()


def test_the_code_fingerprint_follows_the_checkouts_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resources import local_spark

    monkeypatch.setattr(spark_session, "REPO_ROOT", tmp_path)
    source = tmp_path / "upsert_core" / "a.py"
    source.parent.mkdir()
    source.write_text("x = 1\n")
    first = local_spark.code_fingerprint()
    assert local_spark.code_fingerprint() == first
    source.write_text("x = 22\n")  # an edit, a git pull
    assert local_spark.code_fingerprint() != first


def test_another_users_server_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared UPSERT_HOME: the server (and its token) of whoever started it first is
    never used by another user, nor its directory taken over; one line says what to do."""
    import os

    from resources import local_spark

    state = local_spark.state_dir(tmp_path)
    state.mkdir(mode=0o755)
    monkeypatch.setattr(os, "getuid", lambda: state.stat().st_uid + 1)
    with pytest.raises(ConfigError, match="belongs to another user.*UPSERT_SPARK_SERVER=off"):
        local_spark.ensure_server(tmp_path)
    assert oct(state.stat().st_mode & 0o777) == oct(0o755)  # left as it was


def test_a_session_failure_never_prints_the_local_servers_token(tmp_path: Path) -> None:
    shard, landing = _applied_landing(tmp_path)
    write_jsonl(landing, "2.jsonl", [{"key": 1, "offset": 2, "v": "b"}])

    def refused() -> object:
        raise RuntimeError("cannot reach sc://localhost:4242/;token=s3cret-t0ken here")

    with pytest.raises(IngestError, match="no Spark session") as info:
        ingest(shard, str(landing), IngestRequest(), engine=LazySparkEngine(refused))
    assert "s3cret-t0ken" not in str(info.value) and "token=***" in str(info.value)
