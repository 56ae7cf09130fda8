"""The real thing: ``dagster dev`` on the repository's workspace.yaml, driven through
the backfill CLI and the GraphQL API, and looked at in headless Chromium.

Uses the repository's ``sources.yaml`` (source ``demo`` on ``$UPSERT_HOME/demo-landing``)
with a temporary ``UPSERT_HOME`` and ``DAGSTER_HOME``, and the in-process engine
(``UPSERT_ENGINE=local``; Spark is covered by ``test_spark_assets``). Saves the asset
lineage screenshot as ``docs/dagster-asset-graph.png`` (the README shows it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestration.cli.demo_landing import generate_landing
from tests.dagster.browser import Browser
from tests.dagster.helpers import fast_tmp

ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).with_name("dagster")
LOCATION = "orchestration.definitions:defs"
FOUR = ["output_shard", "rollup_gc", "source_snapshot", "upsert_state"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    env: dict[str, str]
    root: Path
    home: Path

    def gql(self, query: str, **variables: Any) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
        assert "errors" not in answer, answer
        return dict(answer["data"])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``dagster dev`` and everything it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            # The group may outlive its leader: make sure no member is left.
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def server() -> Iterator[Server]:
    root = fast_tmp("upsert-dagster-ui-")
    home, dagster_home = root / "upsert_home", root / "dagster_home"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UPSERT_", "DAGSTER_", "SPARK_"))}
    env.update(UPSERT_HOME=str(home), DAGSTER_HOME=str(dagster_home), UPSERT_ENGINE="local")
    port = _free_port()
    log = (root / "dagster-dev.log").open("wb")
    proc = subprocess.Popen(
        [str(DAGSTER), "dev", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dagster dev exited: {(root / 'dagster-dev.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("dagster dev did not answer within 120 s")
                time.sleep(0.5)
        yield Server(url, env, root, home)
    finally:
        _stop(proc)
        log.close()
        subprocess.run(["rm", "-rf", str(root)], check=False)


def _launch(server: Server, job: str) -> str:
    data = server.gql(
        """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
             __typename ... on LaunchRunSuccess { run { runId } }
             ... on PythonError { message } } }""",
        p={"selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                        "jobName": job}, "runConfigData": {}},
    )
    launched = data["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = str(launched["run"]["runId"])
    deadline = time.monotonic() + 120
    status = ""
    while time.monotonic() < deadline:
        status = server.gql("query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }",
                            id=run_id)["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(1)
    assert status == "SUCCESS", f"run {run_id} of {job} ended {status}"
    return run_id


def _dismiss_community_dialog(browser: Browser) -> None:
    """Skip the first-visit "Join the Dagster community" dialog. It opens a moment after
    the page renders, and a click before its handlers are attached does nothing: wait a
    few seconds for it, then click Skip until it is gone."""
    dialog = "Join the Dagster community"
    appear_by = time.monotonic() + 8
    while dialog not in browser.text():
        if time.monotonic() > appear_by:
            return
        time.sleep(0.5)
    gone_by = time.monotonic() + 45
    while dialog in browser.text():
        assert time.monotonic() < gone_by, "the Dagster community dialog did not close"
        browser.click_button("Skip")
        time.sleep(1)


@pytest.mark.slow
def test_dagster_dev_ui_shows_the_assets_and_materializations(server: Server) -> None:
    files, _ = generate_landing(server.home / "demo-landing", 40)
    # Backfill every partition through the CLI: one run (it is recorded in the same
    # instance) that applies the files in name order, one ts each.
    cli = subprocess.run(
        [sys.executable, "-m", "orchestration.backfill", "demo"],
        cwd=ROOT, env=server.env, capture_output=True, text=True, timeout=240,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert cli.stdout.splitlines() == [
        f"{name}: applied at ts {ts}" for ts, name in enumerate(files)
    ]
    # Launch the rollup/GC job through the webserver, as the UI's "Materialize" does.
    _launch(server, "demo_rollup_gc")

    nodes = server.gql("{ assetNodes { assetKey { path } groupName } }")["assetNodes"]
    assert sorted(n["assetKey"]["path"][1] for n in nodes if n["groupName"] == "demo") == FOUR
    for name in ("source_snapshot", "upsert_state", "output_shard"):
        done = server.gql(
            """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) {
                 ... on Asset { assetMaterializations(limit: 20) { partition } } } }""",
            k={"path": ["demo", name]},
        )["assetOrError"]["assetMaterializations"]
        # Newest first, as the UI lists them: the run's events in ts order, so "Latest
        # materialization" is the last file (issue 23: it named a random one).
        assert [m["partition"] for m in done] == files[::-1], name

    browser = Browser(server.root / "chromium")
    try:
        browser.goto(f"{server.url}/asset-groups/demo")
        browser.wait_for(lambda text: all(n in text for n in FOUR), 120)
        _dismiss_community_dialog(browser)
        time.sleep(2)  # let the graph settle before the screenshot
        shot = ROOT / "docs" / "dagster-asset-graph.png"
        shot.parent.mkdir(exist_ok=True)
        browser.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        browser.goto(f"{server.url}/assets/demo/upsert_state")
        text = browser.wait_for(
            lambda t: all(s in t for s in ("Latest materialization", files[-1], "status",
                                            "Latest check results")),
            120,
        )
        assert "Never materialized" not in text
        assert f"applied {len(files)} file(s) through {files[-1]}" in text
        assert "Latest check results" in text
        browser.screenshot(server.root / "upsert-state.png")
    finally:
        browser.close()
