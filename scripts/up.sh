#!/usr/bin/env bash
# Run the whole platform from a fresh clone: installs what is missing, then `gpusched up`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec .venv/bin/gpusched up "$@"
