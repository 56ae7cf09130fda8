"""Running one document's blocks in order, as a reader at a shell in the project root.

Invariants:

- One session per document: a *project root* in a temporary directory whose entries are
  symlinks to the checkout's (sources, scripts, deploy, ``.venv``, ``pyproject.toml``,
  ...), while the state the commands create (``.upsert``, ``.dagster``, ``.cluster``, the
  reader's ``landing``) is its own. So the commands run exactly as printed "from the
  project root" (``bash scripts/run-demo.sh``, ``. .venv/bin/activate``,
  ``.venv/bin/dagster``) on the checkout's code and venv, and write nothing into the
  checkout. ``scripts/setup-venv.sh`` finds the venv installed (its stamp for this
  ``pyproject.toml``) and installs nothing; a venv that is not up to date fails the test
  before any block runs, rather than being reinstalled from a temporary directory.
- The environment is the test process's without whatever chooses stores, Spark or
  Dagster (``UPSERT_*``, ``AWS_*``, ``SPARK_REMOTE``, ``SPARK_MASTER``, ``DAGSTER_HOME``,
  an activated venv): the embedded defaults. Embedded blocks add ``UPSERT_ENGINE=local``
  (the in-process engine, as ``tests/e2e``'s embedded deployment; blocks marked
  ``spark`` start a local Spark themselves); cluster blocks run the CLI's default
  engine through the cluster's Spark Connect server.
- Blocks run in document order. A shell block is one ``bash`` script (``set -eo
  pipefail``); the variables it leaves exported and its directory carry over to the
  next block, as in one terminal. Cluster blocks run as in a second terminal opened
  after the blocks before them: what they export (the production stores, the cluster's
  settings) carries over to later cluster blocks only, never into an embedded one. A
  command running ``dagster dev`` is a server: it is started in the background (a
  process group of its own, as a terminal's job), the block goes on once the UI answers
  (its "another shell" lines), and at the block's end it is stopped with Ctrl-C (SIGINT
  to its group): it must exit, and leave no process.
- Cluster blocks: one that starts ``deploy/cluster.sh`` itself runs as printed, with a
  database name of its own (``UPSERT_CLUSTER_DB``, dropped afterwards); any other runs
  against a cluster the session starts (``tests.clusterctl``), with the document's
  example addresses (``db:5432``, ``my-bucket``, ``spark-connect:15002``) replaced by
  that cluster's, and its ``AWS_*`` settings as the reader's credentials.
- Every process a block starts carries ``DOCS_TEST_TAG``; when the session closes none
  may be left running. A warm local Spark server (the reader's default, since
  ``UPSERT_SPARK_SERVER`` is a chooser too) and the warm ``upsertctl`` process (its
  sockets in the session's directory, ``UPSERT_LOCAL_SERVER_DIR``) are stopped first, as
  their idle periods would.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from contextlib import ExitStack, suppress
from pathlib import Path

import boto3
import pytest
import yaml

from tests.clusterctl import ClusterHandle, drop_database, running
from tests.docs.blocks import PYTHON, REPO, SHELL, SOURCE_YAML, Block, blocks
from tests.docs.given import given

STATE_DIRS = {".git", ".upsert", ".dagster", ".cluster", "landing", ".pytest_cache",
              ".mypy_cache", ".ruff_cache", ".hypothesis"}
CHOOSERS = ("UPSERT_", "AWS_", "DAGSTER_")
CHOOSER_NAMES = {"SPARK_REMOTE", "SPARK_MASTER", "VIRTUAL_ENV", "PYTHONPATH"}
EMBEDDED_ENV = {"UPSERT_ENGINE": "local"}
BASH_NOISE = {"_", "SHLVL", "PWD", "OLDPWD"}
TAG = "DOCS_TEST_TAG"
SERVER = re.compile(r"(^|[\s/])dagster dev\b")
SERVING = re.compile(r"Serving dagster-webserver on (http://\S+)")
COMMAND_TIMEOUT_S = 900
SERVER_START_S = 300
SERVER_STOP_S = 90
EXAMPLES: dict[str, Callable[[ClusterHandle], str]] = {
    # README, "Using it": production stores, by configuration alone
    "postgresql+psycopg://user@db:5432/upsert": lambda c: c.exports["UPSERT_CONSENSUS_URL"],
    "s3://my-bucket/": lambda c: f"s3://{c.bucket}/",
    "sc://spark-connect:15002": lambda c: c.exports["SPARK_REMOTE"],
    "spark://spark-master:7077": lambda c: c.exports["SPARK_MASTER"],
}


def venv_is_installed() -> str | None:
    """Why ``scripts/setup-venv.sh`` would install (None: it finds everything there)."""
    digest = subprocess.run(["sha1sum", str(REPO / "pyproject.toml")], capture_output=True,
                            text=True, check=True).stdout[:12]
    if not (REPO / ".venv" / f".installed-{digest}").exists():
        return "the venv is not installed for this pyproject.toml: run scripts/setup-venv.sh"
    return None


def reader_env(tag: str) -> dict[str, str]:
    """The test process's environment with nothing that chooses stores, Spark or Dagster."""
    venv_bin = str(REPO / ".venv" / "bin")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(CHOOSERS) and k not in CHOOSER_NAMES}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and p != venv_bin)
    env[TAG] = tag
    return env


def tagged_processes(tag: str) -> dict[int, str]:
    """Running processes carrying ``DOCS_TEST_TAG=tag``: pid -> command line."""
    wanted = f"{TAG}={tag}".encode()
    out: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(
                        b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            continue
    return out


def session_members(sid: int) -> dict[int, str]:
    """Live processes of session ``sid`` (a job started with ``start_new_session``)."""
    out: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[4]) == sid and fields[0] != "Z":
                out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(
                    b"\0", b" ").decode(errors="replace")[:200]
        except (OSError, ValueError, IndexError):
            continue
    return out


def commands(script: str) -> list[str]:
    """The script's command lines (backslash continuations joined), comments kept."""
    out: list[str] = []
    pending = ""
    for line in script.splitlines():
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        out.append(pending)
        pending = ""
    if pending:
        out.append(pending)
    return out


class Failed(Exception):
    """A block failed: the message says which command and what it printed."""


class DocSession:
    """The project root, environment and progress of one document (module docstring)."""

    def __init__(self, doc: str, tmp: Path) -> None:
        self.doc = doc
        self.blocks = [b for b in blocks(doc) if b.runs]
        self.tag = uuid.uuid4().hex[:12]
        self.tmp = tmp
        self.root = tmp / "project"
        self.root.mkdir(parents=True)
        for entry in REPO.iterdir():
            if entry.name not in STATE_DIRS:
                (self.root / entry.name).symlink_to(entry)
        given(doc, self.root)
        self.env = reader_env(self.tag)
        # The reader's warm upsertctl (on by default), with its sockets in the session's
        # directory so that close() can stop it (its socket removed: it exits).
        self.warm_dir = tmp / "warm-upsertctl"
        self.env["UPSERT_LOCAL_SERVER_DIR"] = str(self.warm_dir)
        self.cluster_exports: dict[str, str] = {}  # what cluster blocks changed
        self.cwd = self.root
        self.done: set[int] = set()
        self.failed: str | None = None
        self._stack = ExitStack()
        self._cluster: ClusterHandle | None = None
        self._cluster_stack: ExitStack | None = None
        self.cluster_db = f"upsert_docs_{self.tag}"
        self._servers = 0

    # --- running blocks in order ------------------------------------------------------

    def run_through(self, block: Block) -> None:
        """Run every earlier block of the document this half needs, then ``block``."""
        if self.failed:
            pytest.fail(f"an earlier block of {self.doc} failed ({self.failed})")
        for earlier in self.blocks:
            if earlier.line > block.line:
                break
            if earlier.line in self.done or (earlier.cluster and not block.cluster):
                continue
            try:
                self._run(earlier)
            except Failed as exc:
                self.failed = earlier.id
                pytest.fail(f"{earlier.id}: {exc}", pytrace=False)
            self.done.add(earlier.line)

    def _run(self, block: Block) -> None:
        if block.kind == SHELL:
            self._shell(block)
        elif block.kind == PYTHON:
            self._python(block)
        elif block.kind == SOURCE_YAML:
            self._source_yaml(block)

    def _block_env(self, block: Block) -> tuple[dict[str, str], dict[str, str]]:
        """(environment, the overlay added for this half)."""
        if not block.cluster:
            overlay = dict(EMBEDDED_ENV)
        elif "deploy/cluster.sh start" in block.text:
            self._stop_cluster()
            overlay = {"UPSERT_CLUSTER_DB": self.cluster_db}
        else:
            handle = self._start_cluster()
            overlay = {k: v for k, v in handle.exports.items() if k.startswith("AWS_")}
        env = {k: v for k, v in self.env.items() if k not in EMBEDDED_ENV}
        if block.cluster:
            env.update(self.cluster_exports)
        return {**env, **overlay}, overlay

    def _text(self, block: Block) -> str:
        text = block.text
        if block.cluster and self._cluster is not None:
            for example, real in EXAMPLES.items():
                text = text.replace(example, real(self._cluster))
        return text

    # --- shell ------------------------------------------------------------------------

    def _shell(self, block: Block) -> None:
        env, overlay = self._block_env(block)
        segment: list[str] = []
        servers: list[subprocess.Popen[bytes]] = []
        try:
            for command in commands(self._text(block)):
                if SERVER.search(command.split("#")[0]):
                    env = self._bash("\n".join(segment), env)
                    segment = []
                    servers.append(self._serve(command, env))
                else:
                    segment.append(command)
            env = self._bash("\n".join(segment), env)
        finally:
            for server in servers:
                self._stop_server(server)
        after = {k: v for k, v in env.items() if overlay.get(k) != v or k in self.env}
        if block.cluster:
            self.cluster_exports = {k: v for k, v in after.items() if self.env.get(k) != v}
        else:
            self.env = after

    def _bash(self, script: str, env: dict[str, str]) -> dict[str, str]:
        """Run ``script`` in ``bash`` in the session's directory; the environment after."""
        if not script.strip():
            return env
        out = self.tmp / f"after-{uuid.uuid4().hex[:8]}"
        wrapper = (f"set -eo pipefail\n__docs_after() {{ env -0 > {shlex.quote(str(out))}.env;"
                   f" pwd > {shlex.quote(str(out))}.pwd; }}\ntrap __docs_after EXIT\n{script}\n")
        proc = subprocess.run(["bash", "-c", wrapper], cwd=self.cwd, env=env,
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        if proc.returncode != 0:
            raise Failed(f"exit status {proc.returncode} running:\n{script}\n--- stdout\n"
                         f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}")
        after = Path(f"{out}.env").read_bytes().split(b"\0")
        self.cwd = Path(Path(f"{out}.pwd").read_text().strip())
        pairs = (item.decode().partition("=") for item in after if item)
        return {k: v for k, _, v in pairs if k not in BASH_NOISE}

    def _serve(self, command: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ``dagster dev`` as a terminal job; return once its UI answers."""
        self._servers += 1
        log_path = self.tmp / f"server-{self._servers}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(["bash", "-c", command], cwd=self.cwd, env=env,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        deadline = time.monotonic() + SERVER_START_S
        while True:
            text = log_path.read_text(errors="replace")
            if proc.poll() is not None:
                raise Failed(f"{command!r} exited ({proc.returncode}):\n{text[-4000:]}")
            found = SERVING.search(text)
            if found and _answers(f"{found[1]}/server_info"):
                return proc
            if time.monotonic() > deadline:
                self._stop_server(proc, quiet=True)
                raise Failed(f"{command!r} did not answer in {SERVER_START_S} s:\n{text[-4000:]}")
            time.sleep(0.5)

    def _stop_server(self, proc: subprocess.Popen[bytes], quiet: bool = False) -> None:
        """Ctrl-C: SIGINT to the job's process group. It must exit and leave nothing."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(SERVER_STOP_S)
            except subprocess.TimeoutExpired:
                left = session_members(proc.pid)
                os.killpg(proc.pid, signal.SIGKILL)
                if not quiet:
                    raise Failed(f"dagster dev did not stop on Ctrl-C in {SERVER_STOP_S} s;"
                                 f" running: {left}") from None
        deadline = time.monotonic() + 30
        while (left := session_members(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if left and not quiet:
            raise Failed(f"dagster dev left {len(left)} process(es) after Ctrl-C: {left}")

    # --- python and sources.yaml fragments ---------------------------------------------

    def _python(self, block: Block) -> None:
        env, _ = self._block_env(block)
        proc = subprocess.run([sys.executable, "-"], input=self._text(block), cwd=self.cwd,
                              env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)
        if proc.returncode != 0:
            raise Failed(f"exit status {proc.returncode}:\n--- stdout\n{proc.stdout[-4000:]}"
                         f"\n--- stderr\n{proc.stderr[-6000:]}")

    def _source_yaml(self, block: Block) -> None:
        """The fragment, added to the demo source of the checkout's sources.yaml, loads."""
        from orchestration.sources import read_sources_file

        fragment = yaml.safe_load(block.text)
        if not isinstance(fragment, dict):
            raise Failed("a 'yaml source' block must be a mapping of source settings")
        text = yaml.safe_load((REPO / "sources.yaml").read_text())
        text["sources"][0].update(fragment)
        path = self.tmp / f"sources-{block.line}.yaml"
        path.write_text(yaml.safe_dump(text))
        try:
            [spec, *_] = read_sources_file(path, {**self.env, "UPSERT_HOME": str(self.root)})
        except Exception as exc:  # the error is what the test reports
            raise Failed(f"sources.yaml with this fragment does not load: {exc}") from exc
        if "checks" in fragment:
            names = {check.column for check in spec.checks}
            if names != set(fragment["checks"]):
                raise Failed(f"checks on {sorted(names)}, the fragment names"
                             f" {sorted(fragment['checks'])}")

    # --- the cluster --------------------------------------------------------------------

    def _start_cluster(self) -> ClusterHandle:
        if self._cluster is None:
            stack = ExitStack()
            self._cluster = stack.enter_context(running(self.tmp / "cluster"))
            self._cluster_stack = stack
            self._upload_landing(self._cluster)
        return self._cluster

    def _stop_cluster(self) -> None:
        if self._cluster_stack is not None:
            self._cluster_stack.close()
        self._cluster = self._cluster_stack = None

    def _upload_landing(self, handle: ClusterHandle) -> None:
        """The reader's landing files, also under the cluster bucket's landing/orders/."""
        exports = handle.exports
        s3 = boto3.client("s3", endpoint_url=exports["AWS_ENDPOINT_URL"],
                          aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
                          region_name=exports["AWS_DEFAULT_REGION"])
        landing = self.root / "landing"
        for path in sorted(landing.glob("*")) if landing.is_dir() else []:
            if path.is_file():
                s3.put_object(Bucket=handle.bucket, Key=f"landing/orders/{path.name}",
                              Body=path.read_bytes())

    # --- the end ------------------------------------------------------------------------

    def close(self) -> dict[int, str]:
        """Stop what the session started; the processes that were still left over."""
        try:
            self._stop_cluster()
        finally:
            if (self.root / ".cluster").is_dir():
                subprocess.run(["bash", "deploy/cluster.sh", "stop"], cwd=self.root,
                               env=self.env, capture_output=True, timeout=120)
                drop_database(self.cluster_db)
            self._stack.close()
            self._stop_local_spark()
            for socket_file in self.warm_dir.glob("*.sock"):
                socket_file.unlink()  # the warm upsertctl exits within its tick (5 s)
        deadline = time.monotonic() + 30
        while (left := tagged_processes(self.tag)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left


    def _stop_local_spark(self) -> None:
        """Stop a warm local Spark server the blocks started (it would stop after its
        idle period; the session ends now), as ``upsertctl spark stop`` does."""
        from resources import local_spark

        homes = {self.root / ".upsert"}
        exported = self.env.get("UPSERT_HOME")
        if exported:
            homes.add(self.root / exported)  # an absolute one stays itself
        for home in homes:
            local_spark.stop(home)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False
