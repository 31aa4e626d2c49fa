"""The bridge's own metrics (docs/metrics.md): what it did to the API server."""

from __future__ import annotations

from prometheus_client import Counter

BINDS = Counter("gpusched_kube_binds_total", "pods bound to the node the platform chose")
BIND_CONFLICTS = Counter("gpusched_kube_bind_conflicts_total",
                         "binds refused because the pod was already bound to another node")
ROLLBACKS = Counter("gpusched_kube_rollbacks_total", "runs rolled back before they were bound whole", ["reason"])
EVICTIONS = Counter("gpusched_kube_evictions_total", "pods stopped for a preemption, drain or cancel",
                    ["outcome"])  # evicted, budget_overridden
CLAIMS = Counter("gpusched_kube_claims_allocated_total", "DRA claims allocated to the GPUs the platform chose")
RELISTS = Counter("gpusched_kube_relists_total", "informer relists after 410 Gone", ["resource"])
