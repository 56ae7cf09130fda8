#!/usr/bin/env bash
# The README's second command: install everything and run the whole test suite.
# Exits non-zero when any test fails or when no test ran (pytest exit 5), in any of the
# parallel pytest processes. Arguments, if any, go to one plain pytest process instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
bash scripts/ensure-services.sh
bash scripts/ensure-chromium.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
echo "[tests] ruff + mypy on upsert_core" >&2
.venv/bin/ruff check upsert_core
.venv/bin/mypy upsert_core
if [ $# -gt 0 ]; then  # a chosen part of the suite (tests/core -x, -m "not cluster"): one pytest
  echo "[tests] pytest $*" >&2
  exec .venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@"
fi
# The whole suite: four pytest processes at once (see scripts/run_test_groups.py).
exec .venv/bin/python scripts/run_test_groups.py
