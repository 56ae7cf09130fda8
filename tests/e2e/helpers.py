"""Running ``upsertctl`` as fresh processes, writing landing files, comparing outputs.

Every test here drives the CLI the way a user does: a new ``python -m orchestration.cli``
process per command, stores chosen by flags or environment, output parsed from stdout
and checked on stderr. Nothing is imported from the platform to produce results; the
library is used only to look inside stores when a test must (e.g. unreferenced blobs).
Expected results come from the dict model in :mod:`tests.model`.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestration.cli"]
TIMEOUT_S = 300


@dataclass
class Result:
    args: list[str]
    rc: int
    out: str
    err: str
    out_bytes: bytes = b""

    def jsonl(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    def error_line(self) -> str:
        """The one ``upsertctl: error:`` line (asserting there is exactly one)."""
        errors = [line for line in self.err_lines if line.startswith("upsertctl: error:")]
        assert len(errors) == 1, f"expected one error line, got:\n{self.err}"
        return errors[0]

    def __str__(self) -> str:
        return f"$ upsertctl {' '.join(self.args)}\nrc={self.rc}\n--- stderr\n{self.err}"


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPSERT_")}
    # The suite's choice (tests/conftest.py: off); a test's ``extra`` may ask for the server.
    env["UPSERT_SPARK_SERVER"] = os.environ.get("UPSERT_SPARK_SERVER", "off")
    for name in ("UPSERT_LOCAL_SERVER", "UPSERT_LOCAL_SERVER_DIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    # No empty entry (it would mean the working directory, which may be gone).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.update(extra or {})
    return env


class Cli:
    """``upsertctl`` with a fixed environment (UPSERT_HOME, URLs) and global options.

    ``landing_url`` turns the test's local landing directory into the LANDING argument
    (identity by default; the cluster deployment mirrors it to S3 first); ``stores`` are
    the (consensus, blob) URLs the commands use, for tests that look inside them.
    """

    def __init__(
        self,
        home: Path,
        *,
        env: Mapping[str, str] | None = None,
        global_args: Sequence[str] = (),
        engine: str = "local",
        cwd: Path | None = None,
        landing_url: Callable[[Path | str], str] = str,
        stores: tuple[str, str] | None = None,
    ) -> None:
        self.home = home
        self.extra_env = dict(env or {})
        self.env = base_env({"UPSERT_HOME": str(home), **(env or {})})
        self.global_args = list(global_args)
        self.engine = engine
        self.cwd = cwd or REPO
        self.landing_url = landing_url
        self.stores = stores or (f"sqlite:///{home / 'consensus.db'}", f"file://{home / 'blob'}")

    def derive(
        self, *, env: Mapping[str, str] | None = None, global_args: Sequence[str] = ()
    ) -> Cli:
        """The same deployment with more environment and/or global options."""
        return Cli(self.home, env={**self.extra_env, **(env or {})},
                   global_args=[*self.global_args, *global_args], engine=self.engine,
                   cwd=self.cwd, landing_url=self.landing_url, stores=self.stores)

    def service_env(self) -> dict[str, str]:
        """The ``AWS_*`` settings the commands see (to open the same S3 from a test)."""
        return {k: v for k, v in self.env.items() if k.startswith("AWS_")}

    def command(self, *args: str) -> list[str]:
        return [*CLI, *self.global_args, *args]

    def run(self, *args: str, rc: int | None = 0, timeout: float = TIMEOUT_S) -> Result:
        """Run one command; assert its exit status is ``rc`` (None: any)."""
        proc = subprocess.run(
            self.command(*args),
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            timeout=timeout,
        )
        result = Result(
            list(args),
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
            proc.stdout,
        )
        if rc is not None:
            assert result.rc == rc, str(result)
        return result

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(*args),
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    # --- commands ---------------------------------------------------------------------

    def ingest(self, landing: Path | str, *options: str, shard: str = "s", rc: int | None = 0,
               engine: str | None = None) -> Result:
        return self.run(*self.ingest_args(landing, *options, shard=shard, engine=engine),
                        rc=rc)

    def ingest_args(self, landing: Path | str, *options: str, shard: str = "s",
                    engine: str | None = None) -> list[str]:
        return ["ingest", self.landing_url(landing), "--shard", shard,
                "--engine", engine or self.engine, "--no-progress", *options]

    def snapshot(self, shard: str = "s", as_of: int | None = None) -> list[dict[str, Any]]:
        extra = [] if as_of is None else ["--as-of", str(as_of)]
        return self.run("snapshot", "--shard", shard, *extra).jsonl()

    def changes(self, shard: str = "s", since: int | None = None,
                until: int | None = None) -> list[dict[str, Any]]:
        extra = [] if since is None else ["--since", str(since)]
        extra += [] if until is None else ["--until", str(until)]
        return self.run("changes", "--shard", shard, *extra).jsonl()

    def errors(self, shard: str = "s") -> list[dict[str, Any]]:
        return self.run("errors", "--shard", shard).jsonl()

    def late(self, shard: str = "s") -> list[dict[str, Any]]:
        return self.run("late", "--shard", shard).jsonl()

    def inspect(self, shard: str = "s") -> dict[str, Any]:
        return self.run("inspect", "--shard", shard).json()

    def check(self, shard: str = "s") -> Result:
        return self.run("check", "--shard", shard)


# --- landing files ----------------------------------------------------------------------


def jsonl_bytes(rows: Iterable[object]) -> bytes:
    """One JSON object per line; a ``str`` row is written verbatim (malformed lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    return "".join(line + "\n" for line in lines).encode()


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def write_jsonl(root: Path, name: str, rows: Iterable[object]) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(jsonl_bytes(rows))
    return path


def write_parquet(root: Path, name: str, table: pa.Table | list[dict[str, Any]]) -> Path:
    if isinstance(table, list):
        table = pa.Table.from_pylist(table)
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(parquet_bytes(table))
    return path


def write_csv(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- Spark's own output ---------------------------------------------------------------------

SPARK_NOISE = ("WARNING: Using incubator modules", "log4j", "WARN NativeCodeLoader",
               "Setting default log level", "WARN Utils", "ERROR TaskSetManager")


def spark_noise(text: str) -> list[str]:
    """The lines of ``text`` that Spark's JVM printed (what stays off stderr by default),
    and lines of a JVM stack trace."""
    return [line for line in text.splitlines()
            if any(n in line for n in SPARK_NOISE) or line.startswith("\tat ")]


# --- comparing outputs --------------------------------------------------------------------


def canon(row: Mapping[str, Any]) -> str:
    """A hashable form of an output row (column order and key order independent)."""
    return json.dumps(dict(sorted(row.items())), sort_keys=True)


def bag(rows: Iterable[Mapping[str, Any]]) -> Counter[str]:
    return Counter(canon(r) for r in rows)


def by_key(rows: Iterable[Mapping[str, Any]], key: str = "key") -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        assert r[key] not in out, f"two rows for key {r[key]!r}"
        out[r[key]] = dict(r)
    return out


def apply_changes(
    snapshot: Counter[str], changes: Iterable[Mapping[str, Any]], ts: int
) -> Counter[str]:
    """``snapshot + changes(ts)`` as bags of canonical rows (zero counts dropped)."""
    out = Counter(snapshot)
    for c in changes:
        if c["ts"] == ts:
            out[canon(c["row"])] += c["diff"]
    return Counter({k: v for k, v in out.items() if v != 0})
