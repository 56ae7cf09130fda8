"""Servers bind to 127.0.0.1 by default: Dagster's UI, Spark's driver, the test services.

- Every ``dagster dev`` / ``dagster-webserver`` command the project documents or runs
  (README, scripts, deploy files, the UI test) passes ``-h 127.0.0.1``, and the
  webserver's own default host is 127.0.0.1, so leaving the flag out is safe too;
- no script or deploy file binds anything to ``0.0.0.0``;
- ``get_spark`` sets ``SPARK_LOCAL_IP=127.0.0.1`` before the JVM starts (the driver and
  its block manager bind there) unless the user chose otherwise, and turns the Spark UI
  off unless asked for (checked with a recording builder; no JVM is started);
- the moto S3 server the tests start listens on 127.0.0.1.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGSTER_CMD = re.compile(r"dagster(?:-webserver| dev)\b[^\n`]*")


def _project_texts() -> dict[str, str]:
    paths = [REPO / "README.md", REPO / "workspace.yaml", REPO / "tests/dagster/test_ui.py"]
    for folder in ("scripts", "deploy", "docs"):
        if (REPO / folder).is_dir():
            paths += [
                p
                for p in (REPO / folder).rglob("*")
                if p.suffix in (".sh", ".md", ".py", ".yaml", ".yml", "")
            ]
    return {str(p.relative_to(REPO)): p.read_text(errors="replace") for p in paths if p.is_file()}


def test_documented_dagster_commands_bind_loopback() -> None:
    commands = [
        (name, m.group(0))
        for name, text in _project_texts().items()
        for m in DAGSTER_CMD.finditer(text)
        if re.search(r"dagster(?:-webserver| dev) +-", m.group(0))  # an actual invocation
    ]
    assert commands, "no dagster dev command documented"
    for name, command in commands:
        assert re.search(r"(?:-h|--host)[ =]127\.0\.0\.1\b", command), f"{name}: {command}"


def test_ui_test_starts_dagster_dev_on_loopback() -> None:
    text = (REPO / "tests/dagster/test_ui.py").read_text()
    assert "127.0.0.1" in text and "0.0.0.0" not in text


def test_nothing_binds_all_interfaces() -> None:
    for name, text in _project_texts().items():
        assert "0.0.0.0" not in text, f"{name} binds all interfaces"


def test_dagster_webserver_default_host_is_loopback() -> None:
    from dagster_webserver.cli import DEFAULT_WEBSERVER_HOST

    assert DEFAULT_WEBSERVER_HOST == "127.0.0.1"


class _RecordingBuilder:
    def __init__(self) -> None:
        self.conf: dict[str, str] = {}
        self.master_url = ""

    def master(self, url: str) -> _RecordingBuilder:
        self.master_url = url
        return self

    def appName(self, _name: str) -> _RecordingBuilder:  # noqa: N802 (Spark's name)
        return self

    def config(self, key: str, value: str) -> _RecordingBuilder:
        self.conf[key] = value
        return self

    def getOrCreate(self) -> str:  # noqa: N802 (Spark's name)
        return "session"


def _get_spark(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> _RecordingBuilder:
    import resources.spark_session as spark_session

    builder = _RecordingBuilder()

    class _Session:
        pass

    _Session.builder = builder  # type: ignore[attr-defined]
    monkeypatch.setattr(spark_session, "SparkSession", _Session)
    # The driver JVM the builder attaches to (started with its output in a log): none.
    monkeypatch.setattr(spark_session, "start_driver_quietly", lambda *args: None)
    assert spark_session.get_spark(**kwargs) == "session"
    return builder


def test_spark_driver_binds_loopback_and_ui_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    builder = _get_spark(monkeypatch)
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert builder.master_url == "local[*]"
    assert builder.conf["spark.ui.enabled"] == "false"
    assert builder.conf.get("spark.driver.host", "127.0.0.1") == "127.0.0.1"
    assert builder.conf.get("spark.driver.bindAddress", "127.0.0.1") == "127.0.0.1"


def test_spark_keeps_a_deliberate_local_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    _get_spark(monkeypatch, ui=True)
    assert os.environ["SPARK_LOCAL_IP"] == "10.1.2.3"


def test_test_services_listen_on_loopback() -> None:
    from tests.services import _moto_command

    command = _moto_command(5555)
    assert command[command.index("-H") + 1] == "127.0.0.1"
