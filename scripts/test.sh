#!/usr/bin/env bash
# The test command: installs what is missing, checks lint, types, the core's import rule and the
# committed schema, then runs every test (unit, integration and end-to-end against real NATS and Redis
# that the tests start themselves on free ports).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
echo "== ruff" && .venv/bin/ruff check .
echo "== mypy" && .venv/bin/mypy
echo "== import rule of the decision core" && .venv/bin/lint-imports
echo "== contracts schema" && .venv/bin/python -m contracts.export --check
echo "== pytest" && .venv/bin/pytest -q "$@"
