"""``defer_pandas``: pyarrow stops importing pandas for its probe, and pandas still works
wherever it is asked for. Each case runs in a fresh interpreter (the probe runs once per
process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        cwd=cwd or REPO, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pyarrow_works_without_pandas_and_pandas_still_loads_on_demand() -> None:
    out = run_python(
        """
        import sys
        from upsert_core.arrow_startup import defer_pandas
        defer_pandas()
        import pyarrow as pa, pyarrow.compute as pc
        assert pa.array([1, None]).null_count == 1
        assert pc.sum(pa.array([1, 2])).as_py() == 3
        assert pa.table({"a": [1]}).num_rows == 1
        assert "pandas" not in sys.modules, "the probe imported pandas"
        frame = pa.table({"a": [1, 2]}).to_pandas()    # pandas is imported when asked for
        assert list(frame["a"]) == [1, 2]
        import pandas as pd
        assert pa.array(pd.Series([1, 2])).to_pylist() == [1, 2]
        assert pa.Table.from_pandas(pd.DataFrame({"x": [1.5]})).column("x").to_pylist() == [1.5]
        assert not any(type(f).__name__ == "_WithholdPandas" for f in sys.meta_path)
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_defer_pandas_after_pandas_was_imported_changes_nothing() -> None:
    out = run_python(
        """
        import pandas as pd, pyarrow as pa
        from upsert_core.arrow_startup import defer_pandas
        defer_pandas()
        assert pa.array(pd.Series([1, 2])).to_pylist() == [1, 2]
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_upsertctl_ingest_and_reads_never_import_pandas(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "b1.csv").write_text("id,v,ts\n1,a,1\n2,b,2\n2,,3\n")
    out = run_python(
        f"""
        import os, sys
        os.environ["UPSERT_HOME"] = {str(tmp_path / "home")!r}
        from orchestration.cli.main import main
        assert main(["ingest", {str(landing)!r}, "--shard", "s", "--key", "id",
                     "--order", "ts", "--engine", "local", "--no-progress"],
                    defer_pandas=True) == 0
        for command in ("snapshot", "changes", "errors", "late", "inspect", "check"):
            assert main([command, "--shard", "s"], defer_pandas=True) == 0, command
        assert "pandas" not in sys.modules
        """,
        cwd=tmp_path,
    )
    assert '"v": "a"' in out or '"v":"a"' in out


def test_upsertctl_allocates_with_jemalloc_unless_the_user_chose_a_pool(tmp_path: Path) -> None:
    code = """
        import os
        os.environ["UPSERT_HOME"] = {home!r}
        from orchestration.cli.main import main
        assert main(["shards"], defer_pandas=True) == 0
        import pyarrow as pa
        print("pool=" + pa.default_memory_pool().backend_name)
        """
    import pyarrow as pa

    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:  # then the CLI keeps pyarrow's default, as tested below
        expected = pa.default_memory_pool().backend_name
    else:
        expected = "jemalloc"
    out = run_python(code.format(home=str(tmp_path / "home")), cwd=tmp_path)
    assert f"pool={expected}" in out
    chosen = "import os; os.environ['ARROW_DEFAULT_MEMORY_POOL'] = 'system'\n" + textwrap.dedent(
        code.format(home=str(tmp_path / "home2"))
    )
    assert "pool=system" in run_python(chosen, cwd=tmp_path)


@pytest.mark.parametrize("setting", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                     "GLIBC_TUNABLES"])
def test_keep_freed_memory_leaves_the_users_malloc_settings_alone(
    monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    import ctypes

    from upsert_core.arrow_startup import keep_freed_memory

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("libc was loaded despite the user's setting")

    monkeypatch.setenv(setting, "1048576")
    monkeypatch.setattr(ctypes, "CDLL", refuse)
    keep_freed_memory()


def test_keep_freed_memory_sets_glibcs_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    from upsert_core import arrow_startup

    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    calls: list[tuple[int, int]] = []

    class FakeLibc:
        def mallopt(self, parameter: int, value: int) -> int:
            calls.append((parameter, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeLibc())
    arrow_startup.keep_freed_memory()
    assert sorted(calls) == sorted([(-3, arrow_startup.MMAP_THRESHOLD_BYTES),
                                    (-1, arrow_startup.TRIM_THRESHOLD_BYTES)])
