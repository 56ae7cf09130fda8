#!/usr/bin/env bash
# The README's first command: install everything into .venv, generate a realistic sample
# landing and ingest it on the embedded defaults (SQLite consensus + local blob store
# under ./.upsert), then print what happened and how to read it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
exec .venv/bin/upsertctl demo "$@"
