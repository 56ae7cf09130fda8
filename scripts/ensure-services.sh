#!/usr/bin/env bash
# Make sure the local services the integration tests use are up: PostgreSQL on
# 127.0.0.1:5432. (The moto S3 server is started by the tests themselves.)
set -euo pipefail
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "[services] starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 1 30); do
    pg_isready -h 127.0.0.1 -p 5432 -q && break
    sleep 1
  done
fi
pg_isready -h 127.0.0.1 -p 5432
