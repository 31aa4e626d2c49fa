#!/usr/bin/env bash
# Three NATS servers on this machine, from node.conf: client ports 4222-4224, routes 6222-6224, monitoring
# 8222-8224 (PORT_BASE=5222 shifts them all by 1000), stores under .data/nats-cluster/. Prints the settings that
# point gpusched at them; Ctrl-C stops them. Usage, from the repository root:
#   infra/nats/cluster/local.sh            # then, in another shell, what it printed, and: .venv/bin/gpusched up
set -euo pipefail
cd "$(dirname "$0")/../../.."
base=${PORT_BASE:-4222}
cluster=$((base + 2000)) monitor=$((base + 4000))
server=.venv/bin/nats-server
[ -x "$server" ] || server=$(command -v nats-server)
data="$PWD/.data/nats-cluster"
routes="[nats://127.0.0.1:$cluster, nats://127.0.0.1:$((cluster + 1)), nats://127.0.0.1:$((cluster + 2))]"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
for i in 0 1 2; do
  mkdir -p "$data/n$((i + 1))"
  GPUSCHED_NATS_NAME="n$((i + 1))" GPUSCHED_NATS_HOST=127.0.0.1 GPUSCHED_NATS_PORT=$((base + i)) \
  GPUSCHED_NATS_CLUSTER_PORT=$((cluster + i)) GPUSCHED_NATS_MONITOR_PORT=$((monitor + i)) \
  GPUSCHED_NATS_STORE="$data/n$((i + 1))" GPUSCHED_NATS_ROUTES="$routes" \
    "$server" -c infra/nats/cluster/node.conf >>"$data/n$((i + 1)).log" 2>&1 &
  pids+=($!)
done
echo "export NATS_URL=nats://127.0.0.1:$base,nats://127.0.0.1:$((base + 1)),nats://127.0.0.1:$((base + 2))"
echo "export GPUSCHED_STREAM_REPLICAS=3"
echo "# meta leader: curl -s localhost:$monitor/jsz; logs: $data/n*.log" >&2
wait
