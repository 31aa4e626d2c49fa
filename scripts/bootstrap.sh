#!/usr/bin/env bash
# Create .venv (if missing) and install gpusched with its test and dev tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -e '.[test,dev]'
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server is missing: installing the Debian package" >&2
  (apt-get install -y -q redis-server >/dev/null 2>&1 \
    || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1) \
    || (sudo apt-get update -q >/dev/null && sudo apt-get install -y -q redis-server >/dev/null)) \
    || { echo "could not install redis-server; install it and run again" >&2; exit 1; }
fi
