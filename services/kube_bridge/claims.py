"""DRA claims of a pod, allocated to the very GPUs the platform chose before the pod is bound: the bridge plays
the part of kube-scheduler's DRA plugin (write the claim's allocation and reserve it for the pod), with the
platform's choice instead of its own."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from libs.kube.client import ApiError, KubeClient, Obj
from libs.kube.dra import GPU_DRIVER, Device, allocation_status, generated_claim, gpu_requests, pod_claims
from libs.kube.workloads import meta, notes_of
from services.kube_bridge.metrics import CLAIMS

log = logging.getLogger(__name__)
READY, WAIT = "", "wait"


def _pinned_to(allocation: Obj) -> str:
    """The node an allocation is pinned to (the bridge pins each to one node by name)."""
    for term in ((allocation.get("nodeSelector", {}) or {}).get("nodeSelectorTerms", []) or []):
        for field_ in term.get("matchFields", []) or []:
            if field_.get("key") == "metadata.name" and field_.get("values"):
                return str(field_["values"][0])
    return ""


@dataclass
class ClaimAllocator:
    client: KubeClient
    gpu_classes: frozenset[str] = frozenset({GPU_DRIVER})
    devices: dict[str, list[Device]] = field(default_factory=dict)  # node -> its GPU devices, from the slices

    async def allocate(self, pod: Obj, node: str, indices: tuple[int, ...]) -> str:
        """Allocate the pod's claims on `node` to the devices of `indices`, in order. READY once every claim is
        allocated there (again after a restart: an allocation already there is kept); WAIT while the claim
        controller has not made the pod's claims yet; otherwise why it cannot be done."""
        claims = pod_claims(pod)
        if not claims:
            return READY
        on_node = {d.index: d for d in self.devices.get(node, [])}
        missing = [i for i in indices if i not in on_node]
        if missing:
            return f"node {node} publishes no GPU device of index {missing[0]}"
        chosen = [on_node[i] for i in indices]
        if notes_of(pod).get("gpusched.io/gpu-milli") and not all(d.shareable for d in chosen):
            return f"a GPU fraction placed on device {chosen[0].name} of {node}, which its driver does not share"
        ns = meta(pod).get("namespace", "default")
        taken = 0
        for name, _template in claims:
            claim_name = generated_claim(pod, name)
            if not claim_name:
                return WAIT
            path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{claim_name}"
            try:
                claim = await self.client.get(path)
            except ApiError as err:
                if err.status == 404:
                    return WAIT
                raise
            wanted = sum(count for _, count in gpu_requests(claim.get("spec", {}) or {}, self.gpu_classes))
            mine = chosen[taken:taken + wanted]
            taken += wanted
            allocation = (claim.get("status", {}) or {}).get("allocation")
            if allocation:
                got = [r.get("device") for r in (allocation.get("devices", {}) or {}).get("results", [])]
                if got == [d.name for d in mine] and _pinned_to(allocation) == node:
                    continue
                if (pod.get("spec", {}) or {}).get("nodeName"):
                    return f"claim {claim_name} is allocated to {got}, not {[d.name for d in mine]}"
                # Allocated for an earlier placement that was rolled back before the bind: released, then allocated
                # to the GPUs placed now.
                try:
                    claim = await self.client.merge_patch(f"{path}/status", {
                        "metadata": {"resourceVersion": meta(claim).get("resourceVersion", "")},
                        "status": {"allocation": None, "reservedFor": None}})
                except ApiError as err:
                    return f"releasing claim {claim_name} failed: {err}"
            body = allocation_status(claim, mine, node, pod, self.gpu_classes)
            body["metadata"] = {"resourceVersion": meta(claim).get("resourceVersion", "")}
            try:
                await self.client.merge_patch(f"{path}/status", body)
            except ApiError as err:
                return f"allocating claim {claim_name} failed: {err}"
            CLAIMS.inc()
        return READY
