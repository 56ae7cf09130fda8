"""The arrows point one way: upsert_core never imports dagster or pyspark."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import upsert_core

ROOT = Path(__file__).resolve().parent.parent


def _all_core_modules() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.walk_packages(upsert_core.__path__, prefix="upsert_core.")
    )


def test_core_has_modules() -> None:
    assert "upsert_core.errors" in _all_core_modules()


def test_core_imports_neither_dagster_nor_pyspark() -> None:
    modules = _all_core_modules()
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'pyspark'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"upsert_core pulled in: {out.stdout.strip()}"


def test_core_errors_share_one_root() -> None:
    from upsert_core import errors

    roots = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, Exception)
    ]
    assert roots, "no errors defined"
    assert all(issubclass(e, errors.UpsertPlatformError) for e in roots)
