"""Fixtures for the end-to-end tests: a CLI per deployment, and a landing dir.

Every test that takes ``cli`` runs twice: on the embedded defaults and on the cluster
configuration (``tests/e2e/deployment.py``). The cluster is started once for this
package (``deploy/cluster.sh`` in a temporary directory, ~10 s) and stopped when the
package's tests are done; pytest groups the tests by deployment, so it is up only
while the cluster half runs. ``-m "not cluster"`` runs the embedded half alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clusterctl import running
from tests.e2e.deployment import Cluster, Deployment, Embedded
from tests.e2e.helpers import Cli

CLUSTER_MARKS = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.postgres, pytest.mark.s3,
                 pytest.mark.slow]


@pytest.fixture(
    scope="package",
    params=["embedded", pytest.param("cluster", marks=CLUSTER_MARKS)],
)
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    if request.param == "embedded":
        yield Embedded()
        return
    with running(tmp_path_factory.mktemp("cluster")) as handle:
        yield Cluster(handle)


@pytest.fixture
def cli(deployment: Deployment, tmp_path: Path) -> Cli:
    """``upsertctl`` on fresh stores of the deployment under test."""
    return deployment.make_cli(tmp_path)


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    path = tmp_path / "landing"
    path.mkdir()
    return path
