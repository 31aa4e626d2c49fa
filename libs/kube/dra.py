"""Dynamic Resource Allocation (`resource.k8s.io/v1`), pure translation: where a DRA driver publishes
ResourceSlices, their devices are the node's GPUs; a pod asks for GPUs through ResourceClaims made from
templates; and the platform's choice of GPU indices becomes the claim's allocation, device by device, so the pod
gets exactly the GPUs gpusched chose (the kubelet's driver prepares those and no other).

- A GPU device: a device of a GPU driver (`gpu.nvidia.com` unless told otherwise) in a slice of one node; its
  index is its `index` attribute (else its place among the node's devices by name), its model the
  `productName` attribute (as GPU Feature Discovery's product label), its memory the `memory` capacity.
- A claim request counts when its `exactly.deviceClassName` is a GPU class (the driver's name unless told
  otherwise), `allocationMode` ExactCount (default) with its `count` (default 1). Requests with CEL
  `selectors`, `All` mode, admin access or `firstAvailable` alternatives are refused: the platform could not
  promise them.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts import GpuSpec
from libs.core.kernel.decider import derived_id
from libs.kube.client import Obj
from libs.kube.nodes import model_of, quantity_mib
from libs.kube.workloads import Refusal, meta

GPU_DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class Device:
    """One GPU as a driver publishes it: where the claim allocation must point."""

    index: int
    driver: str
    pool: str
    name: str
    model: str
    memory_mib: int
    uuid: str = ""
    shareable: bool = False  # allowMultipleAllocations: several claims may hold shares of it (fractions)


def _attribute(device: Obj, name: str) -> object:
    value = (device.get("attributes", {}) or {}).get(name, {}) or {}
    for kind in ("int", "string", "version", "bool"):
        if kind in value:
            return value[kind]
    return None


def node_devices(slices: list[Obj], driver: str = GPU_DRIVER) -> dict[str, list[Device]]:
    """Every node's GPU devices from the driver's slices, by index."""
    by_node: dict[str, list[tuple[str, str, Obj]]] = {}
    for s in slices:
        spec = s.get("spec", {}) or {}
        node = spec.get("nodeName")
        if spec.get("driver") != driver or not node:
            continue
        pool = str((spec.get("pool", {}) or {}).get("name", ""))
        for device in spec.get("devices", []) or []:
            by_node.setdefault(node, []).append((pool, str(device.get("name", "")), device))
    out: dict[str, list[Device]] = {}
    for node, devices in by_node.items():
        devices.sort(key=lambda d: (d[0], d[1]))
        found = []
        for position, (pool, name, device) in enumerate(devices):
            index = _attribute(device, "index")
            product = _attribute(device, "productName")
            memory = ((device.get("capacity", {}) or {}).get("memory", {}) or {}).get("value", "0")
            found.append(Device(index=int(index) if isinstance(index, int) else position, driver=driver, pool=pool,
                                name=name, model=model_of({"nvidia.com/gpu.product": str(product or "")}),
                                memory_mib=quantity_mib(str(memory)), uuid=str(_attribute(device, "uuid") or ""),
                                shareable=bool(device.get("allowMultipleAllocations", False))))
        out[node] = sorted(found, key=lambda d: d.index)
    return out


def gpus_of(devices: list[Device], nvlink_group: int = -1) -> tuple[GpuSpec, ...]:
    return tuple(GpuSpec(index=d.index, model=d.model, memory_mib=d.memory_mib, uuid=d.uuid, nvlink_group=nvlink_group)
                 for d in devices)


def requested_gpus(claim_spec: Obj, gpu_classes: frozenset[str]) -> int | Refusal:
    """GPUs a claim (or a claim template's spec) asks for; a refusal for what the platform cannot honour."""
    total = 0
    for request in (claim_spec.get("devices", {}) or {}).get("requests", []) or []:
        name = request.get("name", "")
        exact = request.get("exactly")
        if exact is None:
            return Refusal("dra_request_unsupported", f"claim request {name!r}: firstAvailable alternatives are not "
                           "supported; ask for one device class with exactly")
        if exact.get("deviceClassName") not in gpu_classes:
            continue
        if exact.get("selectors") or exact.get("adminAccess") or exact.get("tolerations"):
            return Refusal("dra_request_unsupported", f"claim request {name!r}: CEL selectors and admin access are "
                           "not supported; ask for GPUs by device class and count")
        if exact.get("allocationMode", "ExactCount") != "ExactCount":
            return Refusal("dra_request_unsupported", f"claim request {name!r}: allocationMode must be ExactCount")
        total += int(exact.get("count", 1) or 1)
    return total


def gpu_requests(claim_spec: Obj, gpu_classes: frozenset[str]) -> list[tuple[str, int]]:
    """(request name, count) of the GPU requests of a claim, in order."""
    out = []
    for request in (claim_spec.get("devices", {}) or {}).get("requests", []) or []:
        exact = request.get("exactly") or {}
        if exact.get("deviceClassName") in gpu_classes:
            out.append((str(request.get("name", "")), int(exact.get("count", 1) or 1)))
    return out


def allocation_status(claim: Obj, devices: list[Device], node: str, pod: Obj,
                      gpu_classes: frozenset[str]) -> Obj:
    """The claim's status: its GPU requests satisfied by `devices` in order (the platform's choice), the
    allocation pinned to the node, and the pod as its consumer."""
    results, taken = [], 0
    capacity = {str(r.get("name", "")): ((r.get("exactly", {}) or {}).get("capacity", {}) or {}).get("requests", {})
                for r in ((claim.get("spec", {}) or {}).get("devices", {}) or {}).get("requests", []) or []}
    for request, count in gpu_requests(claim.get("spec", {}) or {}, gpu_classes):
        for device in devices[taken:taken + count]:
            result: Obj = {"request": request, "driver": device.driver, "pool": device.pool, "device": device.name}
            if device.shareable:  # one share of a device others may hold shares of: its own id, what it takes
                result["shareID"] = derived_id("share", meta(claim).get("uid", ""), request, device.name)
                if capacity.get(request):
                    result["consumedCapacity"] = dict(capacity[request])
            results.append(result)
        taken += count
    m = meta(pod)
    return {"status": {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": m.get("name", ""), "uid": m.get("uid", "")}],
    }}


def pod_claims(pod: Obj) -> list[tuple[str, str]]:
    """(the pod's name for the claim, the template it is made from) for each claim of the pod; a claim named
    directly (shared by several pods) has no template ("")."""
    out = []
    for entry in (pod.get("spec", {}) or {}).get("resourceClaims", []) or []:
        out.append((str(entry.get("name", "")), str(entry.get("resourceClaimTemplateName") or "")))
    return out


def generated_claim(pod: Obj, name: str) -> str:
    """The ResourceClaim the claim controller made for the pod's claim `name` ("" until it has)."""
    for status in (pod.get("status", {}) or {}).get("resourceClaimStatuses", []) or []:
        if status.get("name") == name:
            return str(status.get("resourceClaimName") or "")
    return ""
