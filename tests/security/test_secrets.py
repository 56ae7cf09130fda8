"""No credential is logged, stored in the shard or shown in Dagster metadata.

Two unique secrets are configured the way users configure them: a PostgreSQL password
inside ``UPSERT_CONSENSUS_URL`` and ``AWS_SECRET_ACCESS_KEY`` for the S3 (moto) blob
store. Then

- ``upsertctl`` runs ingest (good rows, bad rows and a file-level error), inspect,
  errors, snapshot, changes, check, gc and demo, plus failing commands whose error line
  quotes the URL (unreachable port, unparsable port, unsupported scheme), with
  ``UPSERT_DEBUG`` on so tracebacks are printed too: no stdout/stderr holds a secret;
- every blob in the bucket and every consensus row (raw bytes) is read: none holds one;
- a Dagster partition run (ingest assets + checks) and ``rollup_gc`` materialize with
  the stores from ``EnvVar``\\ s: no materialization or check metadata, no event in the
  run's event log and nothing captured from logging or the process's output holds one.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest

from tests.e2e.helpers import Cli, write_jsonl
from tests.services import AWS_TEST_CREDENTIALS, PG_ADMIN_DSN

pytestmark = [pytest.mark.postgres, pytest.mark.s3]


class Secrets:
    def __init__(self, pg_url: str, s3_endpoint: str, bucket: str) -> None:
        self.password = f"PgPw-{uuid.uuid4().hex}"
        self.aws_secret = f"AwsSk-{uuid.uuid4().hex}"
        assert pg_url.startswith("postgresql+psycopg://postgres@"), pg_url
        self.consensus_url = pg_url.replace("postgres@", f"postgres:{self.password}@", 1)
        self.schema = pg_url.rsplit("search_path%3D", 1)[-1]
        self.bucket = bucket
        self.blob_url = f"s3://{bucket}/tenant"
        self.s3_endpoint = s3_endpoint
        self.env = {
            "UPSERT_CONSENSUS_URL": self.consensus_url,
            "UPSERT_BLOB_URL": self.blob_url,
            "AWS_ENDPOINT_URL": s3_endpoint,
            "AWS_ACCESS_KEY_ID": "AKIDTESTING",
            "AWS_SECRET_ACCESS_KEY": self.aws_secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    @property
    def values(self) -> list[str]:
        return [self.password, self.aws_secret]

    def assert_absent(self, where: str, text: str | bytes) -> None:
        data = text if isinstance(text, bytes) else text.encode("utf-8", "replace")
        for secret in self.values:
            assert secret.encode() not in data, f"secret found in {where}"

    def assert_stores_clean(self) -> int:
        """Read every blob and every consensus row; return how many items were read."""
        client = boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id=AWS_TEST_CREDENTIALS["aws_access_key_id"],
            aws_secret_access_key=AWS_TEST_CREDENTIALS["aws_secret_access_key"],
            region_name="us-east-1",
        )
        read = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"].read()
                self.assert_absent(f"blob {obj['Key']}", obj["Key"].encode() + body)
                read += 1
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            rows = conn.execute(
                f'SELECT shard, sequence_number, data FROM "{self.schema}".consensus'
            ).fetchall()
        for shard, seqno, data in rows:
            self.assert_absent(f"consensus row {shard}/{seqno}", shard.encode() + bytes(data))
        return read + len(rows)


@pytest.fixture
def secrets(fresh_postgres_url: str, s3_endpoint: str, s3_bucket: str) -> Secrets:
    return Secrets(fresh_postgres_url, s3_endpoint, s3_bucket)


def test_cli_never_shows_or_stores_credentials(secrets: Secrets, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    write_jsonl(landing, "b-01.jsonl", [{"key": 1, "offset": 1, "v": "a"}, {"key": 2, "offset": 2}])
    write_jsonl(landing, "b-02.jsonl", [{"key": None, "offset": 3}, {"key": 1, "offset": 4}])
    cli = Cli(tmp_path / "home", env={**secrets.env, "UPSERT_DEBUG": "1"})
    outputs = [
        cli.ingest(landing, "--key", "key", "--order", "offset"),
        cli.run("inspect", "--shard", "s"),
        cli.run("errors", "--shard", "s"),
        cli.run("snapshot", "--shard", "s"),
        cli.run("changes", "--shard", "s"),
        cli.run("check", "--shard", "s"),
        cli.run("gc", "--shard", "s", "--retain", "1"),
        cli.run("demo", "--engine", "local", rc=None),
    ]
    (landing / "b-03.jsonl").write_text('{"offset": 5}\n')  # file-level: no key column
    outputs.append(cli.ingest(landing, rc=None))
    assert outputs[-1].rc != 0 and "b-03.jsonl" in outputs[-1].err
    assert len(cli.run("errors", "--shard", "s").jsonl()) == 1
    broken = {
        "unreachable": secrets.consensus_url.replace(":5432/", ":1/"),
        "bad port": secrets.consensus_url.replace(":5432/", ":notaport/"),
        "bad scheme": secrets.consensus_url.replace("postgresql+psycopg", "mysql"),
    }
    # The unreachable port is retried for the reconnect window; keep that short here.
    impatient = cli.derive(env={"UPSERT_CONSENSUS_RECONNECT_S": "0.3"})
    for what, url in broken.items():
        result = impatient.run("--consensus", url, "inspect", "--shard", "s", rc=None)
        assert result.rc != 0, what
        assert "upsertctl: error:" in result.err and "***" in result.err, result.err
        outputs.append(result)
    for result in outputs:
        secrets.assert_absent(f"upsertctl {result.args}", result.out_bytes + result.err.encode())
    assert secrets.assert_stores_clean() > 5


def _plain(metadata: Any) -> dict[str, Any]:
    """Metadata values as JSON-ready data; records (e.g. a ``TableSchema``, which
    ``json`` would try to iterate) as their repr, so their text is searched too."""
    plain: dict[str, Any] = {}
    for key, value in metadata.items():
        raw = value.value
        json_ready = isinstance(raw, (str, int, float, bool, list, dict, type(None)))
        plain[key] = raw if json_ready else repr(raw)
    return plain


def test_dagster_metadata_and_logs_never_show_credentials(
    secrets: Secrets,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from dagster import EnvVar, materialize

    from resources.stores import UrlBlobStore, UrlConsensus
    from tests.dagster.helpers import platform, spark_resource

    for name, value in secrets.env.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.DEBUG)
    with platform() as plat:
        names = plat.write_batches()
        spec = plat.spec()
        built, _ = plat.build(spec)
        plat.add_partitions(spec, names)
        resources = {
            "consensus": UrlConsensus(consensus_url=EnvVar("UPSERT_CONSENSUS_URL")),
            "blob_store": UrlBlobStore(blob_url=EnvVar("UPSERT_BLOB_URL")),
            "spark": spark_resource("local"),
        }
        runs = [
            materialize(
                [*built.assets, built.checks],
                selection=list(built.ingest_keys),
                partition_key=names[-1],
                instance=plat.instance,
                resources=resources,
            ),
            materialize(
                [*built.assets],
                selection=[built.key("rollup_gc")],
                instance=plat.instance,
                resources=resources,
            ),
        ]
        seen: list[Any] = []
        for result in runs:
            assert result.success
            for event in result.get_asset_materialization_events():
                seen.append(_plain(event.materialization.metadata))
            for check in result.get_asset_check_evaluations():
                seen.append(_plain(check.metadata))
            for record in plat.instance.all_logs(result.run_id):
                secrets.assert_absent("the run's event log", repr(record))
        assert len(seen) >= 4 and any("rows_read" in m for m in seen)
        secrets.assert_absent("Dagster metadata", json.dumps(seen, default=repr))
    out, err = capfd.readouterr()
    secrets.assert_absent("process output", out + err)
    secrets.assert_absent("log records", "\n".join(r.getMessage() for r in caplog.records))
    assert secrets.assert_stores_clean() > 5
