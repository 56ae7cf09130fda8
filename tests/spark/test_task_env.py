"""What a Spark task takes from the driver's environment (``resources/spark_ingest.py``).

Python workers are reused across tasks, and cluster executors do not inherit the
driver's environment, so each task applies the driver's shipped values itself: AWS_*
override the worker's own (never an earlier task's), and the writer token is mirrored
exactly, removed when the driver has none (an earlier driver's token on a new blob would
let GC delete it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resources import task_env
from resources.spark_ingest import _task_blob
from upsert_core.persist.keys import WRITER_TOKEN_ENV, current_writer_token, unique_name


def test_the_writer_token_is_mirrored_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path / 'blob'}"
    monkeypatch.setenv(WRITER_TOKEN_ENV, "stale.4242")  # left by an earlier driver's task
    first = _task_blob(url, {WRITER_TOKEN_ENV: "abcdef012345.77"})
    assert current_writer_token() == "abcdef012345.77"
    assert unique_name().startswith("abcdef012345.77-")
    second = _task_blob(url, {WRITER_TOKEN_ENV: ""})
    assert WRITER_TOKEN_ENV not in os.environ
    assert "-" not in unique_name()
    assert second is first  # the token is not part of the blob cache key


def test_shipped_aws_settings_override_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path / 'blob'}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1/stale")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    # The worker's own settings (captured when the worker imported task_env).
    monkeypatch.setattr(task_env, "_WORKER_ENV", {
        **{name: None for name in task_env.SHIPPED_ENV}, "AWS_DEFAULT_REGION": "eu-west-1"})
    a = _task_blob(url, {"AWS_ENDPOINT_URL": "http://127.0.0.1:2/new"})
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:2/new"
    assert os.environ["AWS_DEFAULT_REGION"] == "eu-west-1"  # not shipped: left alone
    b = _task_blob(url, {"AWS_ENDPOINT_URL": "http://127.0.0.1:3/other"})
    assert a is not b  # different S3 settings never share a cached client


def test_a_driver_never_inherits_an_earlier_drivers_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers of a shared Connect session serve several client processes: settings an
    earlier driver shipped go back to the worker's own when the next one ships none."""
    url = f"file://{tmp_path / 'blob'}"
    monkeypatch.setattr(task_env, "_WORKER_ENV", {
        **{name: None for name in task_env.SHIPPED_ENV}, "AWS_DEFAULT_REGION": "worker-own"})
    monkeypatch.setenv("AWS_DEFAULT_REGION", "worker-own")
    _task_blob(url, {"AWS_ENDPOINT_URL": "http://127.0.0.1:2/a", "AWS_DEFAULT_REGION": "a"})
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:2/a"
    assert os.environ["AWS_DEFAULT_REGION"] == "a"
    _task_blob(url, {})  # a driver with no S3 settings of its own
    assert "AWS_ENDPOINT_URL" not in os.environ
    assert os.environ["AWS_DEFAULT_REGION"] == "worker-own"
