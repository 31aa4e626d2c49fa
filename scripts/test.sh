#!/usr/bin/env bash
# The test command: installs what is missing (and builds the Kubernetes control plane the first time), checks
# lint, types, the core's import rule and the committed schema, then runs every test (unit, integration and
# end-to-end against real NATS, Redis and kube-apiserver that the tests start themselves on free ports).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
# The Kubernetes tests run a real kube-apiserver, etcd and kube-controller-manager: built from the Go module proxy
# on the first run (about 9 minutes on 2 cores from empty Go caches, with progress), found in
# ~/.cache/gpusched/kube afterwards.
echo "== Kubernetes control plane (scripts/build_kube.sh)" && ./scripts/build_kube.sh >/dev/null
echo "== ruff" && .venv/bin/ruff check .
echo "== mypy" && .venv/bin/mypy
echo "== import rule of the decision core" && .venv/bin/lint-imports
echo "== contracts schema" && .venv/bin/python -m contracts.export --check
echo "== pytest" && .venv/bin/pytest -q "$@"
