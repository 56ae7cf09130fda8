"""``pip install .`` gives a working package without the checkout: the wheel holds the
four packages and ``py.typed``, and from it (with the checkout off the path) ``upsertctl``
ingests and reads a shard and the Dagster code location loads its sources from the
working directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout, unpacked as pip would install it."""
    out = tmp_path_factory.mktemp("wheel")
    # Build from a copy of the tracked files: setuptools writes build/ into the source tree.
    source = out / "source"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(out), str(source)], cwd=out, env=dict(os.environ))
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = out.glob("upsert_platform-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("upsert_core/", "orchestration/", "assets/", "resources/"):
        assert any(n.startswith(package) for n in names), package
    assert "upsert_core/py.typed" in names
    assert not any(n.startswith("tests/") for n in names)
    site = out / "site"
    zipfile.ZipFile(wheel).extractall(site)
    return site


def test_upsertctl_and_the_code_location_run_from_the_wheel(
    installed: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UPSERT_", "SPARK_", "DAGSTER_"))}
    # A user's defaults, the warm upsertctl included, with its sockets here: removed at
    # the end, which makes the warm process this test starts exit.
    warm_dir = tmp_path / "warm-upsertctl"
    env.update(PYTHONPATH=str(installed), UPSERT_HOME=str(tmp_path / "home"),
               UPSERT_LOCAL_SERVER_DIR=str(warm_dir))
    try:
        _commands_from_the_wheel(installed, tmp_path, env)
    finally:
        for socket_file in warm_dir.glob("*.sock"):
            socket_file.unlink()


def _commands_from_the_wheel(installed: Path, tmp_path: Path, env: dict[str, str]) -> None:
    work = tmp_path / "work"
    (work / "landing").mkdir(parents=True)
    (work / "landing" / "b1.csv").write_text("id,v,ts\n1,a,1\n2,b,2\n")
    cli = [sys.executable, "-m", "orchestration.cli"]
    where = _run([sys.executable, "-c", "import orchestration, upsert_core;"
                  " print(orchestration.__file__, upsert_core.__file__)"], work, env)
    assert where.stdout.count(str(installed)) == 2, where.stdout  # not the checkout
    assert _run([*cli, "--version"], work, env).stdout.startswith("upsertctl ")
    ingest = _run([*cli, "ingest", "landing", "--shard", "s", "--key", "id", "--order", "ts",
                   "--engine", "local", "--no-progress"], work, env)
    assert ingest.returncode == 0, ingest.stderr
    snapshot = _run([*cli, "snapshot", "--shard", "s"], work, env)
    assert snapshot.returncode == 0 and '"v": "b"' in snapshot.stdout.replace('":"', '": "')

    (work / "sources.yaml").write_text(
        f"sources:\n  - {{name: feed, landing: {work / 'landing'}, key: [id], order: ts}}\n")
    load = _run([sys.executable, "-c", "from orchestration.definitions import defs;"
                 " print(sorted(k.to_user_string() for k in defs.resolve_asset_graph()"
                 ".get_all_asset_keys()))"], work, env)
    assert load.returncode == 0, load.stderr[-3000:]
    assert "feed/upsert_state" in load.stdout and "demo" not in load.stdout
