"""What the Dagster daemon and UI would do, as a process of its own, for the e2e tests.

Run as ``python -m tests.e2e.dagster_probe COMMAND`` in a deployment's environment
(``UPSERT_*``, ``DAGSTER_HOME``, ...); it loads the code location the way
``workspace.yaml`` does (``orchestration.definitions``) and the instance the way the
daemon does (``DagsterInstance.get()``), and prints JSON on stdout:

- ``tick SOURCE``: one evaluation of the source's landing sensor with the instance's
  stored cursor; the dynamic partitions it requests are added and its cursor stored, as
  the daemon does after a tick. Prints ``{"partitions": [...], "runs": [[run_key,
  partition], ...], "skip": REASON or null}`` (a skipped tick may still store a cursor).
- ``runs``: every run in the instance's run storage, oldest first, with its status,
  partition and the asset check evaluations it logged, plus the run storage's class
  name (to prove which storage the instance uses).

It runs in a subprocess so that the test process never imports the code location with
the deployment's environment, and never starts a SparkSession of its own.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from dagster import (
    DagsterEventType,
    DagsterInstance,
    RunsFilter,
    SensorResult,
    SkipReason,
    build_sensor_context,
)

from orchestration.definitions import default_resources, defs
from orchestration.sensors import sensor_name


def tick(source: str) -> dict[str, Any]:
    instance = DagsterInstance.get()
    sensor = defs.get_sensor_def(sensor_name(source))
    resources = default_resources()
    cursor_key = f"probe-cursor:{sensor.name}"
    cursor = instance.run_storage.get_cursor_values({cursor_key}).get(cursor_key)
    context = build_sensor_context(
        instance=instance, cursor=cursor,
        resources={"consensus": resources["consensus"], "blob_store": resources["blob_store"]},
    )
    result = sensor(context)
    if isinstance(result, SkipReason):
        return {"partitions": [], "runs": [], "skip": result.skip_message}
    assert isinstance(result, SensorResult), result
    added: list[str] = []
    for request in result.dynamic_partitions_requests or []:
        keys = list(request.partition_keys or [])
        instance.add_dynamic_partitions(request.partitions_def_name, keys)
        added.extend(keys)
    if result.cursor is not None:
        instance.run_storage.set_cursor_values({cursor_key: result.cursor})
    runs = [[r.run_key, r.partition_key] for r in result.run_requests or []]
    # A skipped tick may still store a cursor (SensorResult with a skip reason).
    skip = None if result.skip_reason is None else result.skip_reason.skip_message
    return {"partitions": added, "runs": runs, "skip": skip}


def runs() -> dict[str, Any]:
    instance = DagsterInstance.get()
    out = []
    for record in reversed(instance.get_run_records(RunsFilter())):
        run = record.dagster_run
        checks = []
        for entry in instance.all_logs(run.run_id,
                                       of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
            evaluation = entry.dagster_event.event_specific_data  # type: ignore[union-attr]
            checks.append({"check": evaluation.check_name, "passed": evaluation.passed})
        out.append({"job": run.job_name, "status": run.status.value,
                    "partition": run.tags.get("dagster/partition"), "checks": checks})
    return {"run_storage": type(instance.run_storage).__name__, "runs": out}


def main(argv: list[str]) -> int:
    if argv[:1] == ["tick"] and len(argv) == 2:
        print(json.dumps(tick(argv[1])))
    elif argv == ["runs"]:
        print(json.dumps(runs()))
    else:
        print("usage: python -m tests.e2e.dagster_probe tick SOURCE | runs", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
