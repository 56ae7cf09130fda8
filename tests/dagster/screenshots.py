"""The screenshots of docs/dagster.md, taken from a real ``dagster dev`` on the demo.

``.venv/bin/python -m tests.dagster.screenshots [OUT_DIR]`` (default ``docs/``) starts
``dagster dev`` on the repository's workspace with a temporary ``UPSERT_HOME`` and
``DAGSTER_HOME`` (the in-process engine, so no JVM is needed), then:

1. backfills the demo's four sample files as one run (``orchestration.backfill``) and
   shoots ``upsert_state``'s Plots tab: one point per partition, each its own file's
   figures (``dagster-plots.png``);
2. lands ``batch-0005.jsonl`` without its key column, turns on ``demo_landing_sensor``
   and waits for the sensor's run to fail on it; shoots the partition (``dagster-failed-
   partition.png``);
3. replaces the file with a fixed one under the same name, waits for the sensor's retry
   run to materialize it, and shoots the partition again (``dagster-fixed-partition.png``)
   and its runs: the failed one and the retry, both launched by the sensor
   (``dagster-fixed-runs.png``).

Nothing here is asserted beyond what the steps need to go on (the UI test,
``test_ui.py``, asserts); it exists so the pictures can be taken again, truthfully,
when the UI changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.first_hour import LOCATION, DagsterDev
from orchestration.cli.demo_landing import generate_landing
from tests.dagster.browser import Browser

ROOT = Path(__file__).resolve().parents[2]
STATE = ["demo", "upsert_state"]
BAD = "batch-0005.jsonl"


def _dismiss_dialogs(browser: Browser) -> None:
    """The first visit's "Join the Dagster community" dialog (see ``test_ui.py``): it
    opens a moment after the page renders; click Skip until it is gone."""
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        if "Join the Dagster community" in browser.text():
            browser.click_button("Skip")
            deadline = time.monotonic() + 3
        time.sleep(0.5)


def _runs(dev: DagsterDev) -> list[dict[str, object]]:
    data = dev.gql("""{ runsOrError(limit: 50) { ... on Runs { results {
        runId status tags { key value } } } } }""")
    return list(data["runsOrError"]["results"])


def _partition_runs(dev: DagsterDev, partition: str) -> list[dict[str, object]]:
    return [r for r in _runs(dev) if {"key": "dagster/partition", "value": partition}
            in r["tags"]]  # type: ignore[operator]


def _wait(what: str, predicate, timeout: float = 240) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(1)


CLICK = ("(() => {{ const b = [...document.querySelectorAll('button')]"
         ".find(b => b.innerText.trim() === {label}); if (b) b.click(); return !!b; }})()")
SCROLL_TO = ("(() => {{ const e = [...document.querySelectorAll('*')].find(e => e.innerText"
             " && e.innerText.trim() === {text}); if (e) e.scrollIntoView(); return !!e; }})()")


def _shoot(browser: Browser, url: str, expect: list[str], path: Path, *,
           click: str | None = None, scroll_to: str | None = None) -> str:
    browser.goto(url)
    _dismiss_dialogs(browser)
    text = browser.wait_for(lambda t: all(e in t for e in expect), 120)
    if click is not None:
        assert browser.evaluate(CLICK.format(label=json.dumps(click))), click
    time.sleep(3)
    if scroll_to is not None:
        assert browser.evaluate(SCROLL_TO.format(text=json.dumps(scroll_to))), scroll_to
    time.sleep(2)
    browser.screenshot(path)
    print(f"{path}: {url}\n{browser.text()[:3000]}\n", file=sys.stderr)
    return text


def main(out: Path) -> int:
    root = Path(tempfile.mkdtemp(prefix="upsert-screenshots-"))
    home, dagster_home = root / "upsert_home", root / "dagster_home"
    dagster_home.mkdir(parents=True)
    shutil.copy(ROOT / "deploy" / "dagster-dev.yaml", dagster_home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UPSERT_", "DAGSTER_", "SPARK_"))}
    env.update(UPSERT_HOME=str(home), DAGSTER_HOME=str(dagster_home), UPSERT_ENGINE="local")
    landing = home / "demo-landing"
    files, _ = generate_landing(landing, 400)
    dev = DagsterDev(env, root / "dagster-dev.log")
    browser = Browser(root / "chromium", size=(1400, 1000))
    try:
        done = subprocess.run([sys.executable, "-m", "orchestration.backfill", "demo", "--all"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        _shoot(browser, f"{dev.url}/assets/{'/'.join(STATE)}",
               ["Latest materialization", "Metadata"], out / "dagster-plots.png",
               click="Plots", scroll_to="Metadata")

        (landing / BAD).write_text(json.dumps({"offset": 9001, "name": "Kim L."}) + "\n")
        started = dev.gql(
            """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) {
                 __typename } }""",
            s={"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
               "sensorName": "demo_landing_sensor"})["startSensor"]
        assert started["__typename"] == "Sensor", started
        _wait("the failed run", lambda: any(r["status"] == "FAILURE"
                                            for r in _partition_runs(dev, BAD)))
        _shoot(browser, f"{dev.url}/assets/{'/'.join(STATE)}?view=partitions&partition={BAD}",
               [BAD], out / "dagster-failed-partition.png")

        (landing / BAD).write_text(json.dumps({"key": "cust-09001", "offset": 9001,
                                               "name": "Kim L."}) + "\n")
        _wait("the retry", lambda: any(r["status"] == "SUCCESS"
                                       for r in _partition_runs(dev, BAD)))
        _shoot(browser, f"{dev.url}/assets/{'/'.join(STATE)}?view=partitions&partition={BAD}",
               [BAD, "applied_by", "rows_read"], out / "dagster-fixed-partition.png")
        _shoot(browser, f"{dev.url}/runs?q%5B%5D=tag%3Adagster%2Fpartition%3D{BAD}",
               [BAD, "Success", "Failure"], out / "dagster-fixed-runs.png")
    finally:
        browser.close()
        dev.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"))
