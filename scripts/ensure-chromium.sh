#!/usr/bin/env bash
# The real-browser test of the Dagster UI needs Debian's headless Chromium.
# Install it when missing (CI machines start without it).
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "[services] installing Debian's chromium for the UI test" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi
chromium --version >&2
