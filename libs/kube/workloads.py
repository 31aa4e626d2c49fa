"""Pods and batch/v1 Jobs as the platform's jobs (pure translation, no I/O).

A pod is gpusched's when `spec.schedulerName` is `gpusched`; a Job when its pod template's is. What the
platform reads of them (`docs/kubernetes.md` lists it for users):

- queue: the label `gpusched.io/queue`, or Kueue's `kueue.x-k8s.io/queue-name`; the queue's team is the job's
  team, the namespace its project;
- priority: `spec.priorityClassName`, the platform's priority class of that name (none: `training`);
- resources per replica: the containers' `nvidia.com/gpu` (whole GPUs) or one `nvidia.com/mig-<profile>`,
  or the Ascend device plugin's `huawei.com/Ascend910` (whole NPUs) or one `huawei.com/Ascend910-<N>c` vNPU
  (libs/kube/ascend.py); CPU and memory requests;
- a gang: the scheduler-plugins label `scheduling.x-k8s.io/pod-group` (size: the PodGroup's `minMember`, or
  the annotation `gpusched.io/gang-size`), Kueue's `kueue.x-k8s.io/pod-group-name` label with its
  `kueue.x-k8s.io/pod-group-total-count` annotation, or `gpusched.io/gang` with `gpusched.io/gang-size`;
  a Job's gang is its `parallelism` (an Indexed Job: replica i is completion index i);
- annotations `gpusched.io/`: `gpu-models` (comma list), `topology` (node, rack, block),
  `topology-required`, `spread`, `duration-s` (the runtime estimate), `checkpoint-interval-s`, `workload`,
  `retry-exit-codes`; `spec.activeDeadlineSeconds` is the enforced `max_runtime_s`.

A pod the platform can never serve is refused here with a code (`Refusal`); everything else is decided by the
platform's own admission, which refuses with its codes.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts import JobSpec
from libs.core.kernel.decider import derived_id
from libs.kube.ascend import RESOURCE_PREFIX, NpuAsk, npu_ask
from libs.kube.client import Obj
from libs.kube.nodes import GPU_RESOURCE, MIG_RESOURCE_PREFIX, parse_quantity, quantity_mib, quantity_milli

SCHEDULER_NAME = "gpusched"
PREFIX = "gpusched.io/"
QUEUE_LABELS = ("gpusched.io/queue", "kueue.x-k8s.io/queue-name")
# A pod made again by the bridge (after a preemption or a retryable failure) is the same job's next run.
JOB_ID_ANNOTATION = "gpusched.io/job-id"
RUN_ANNOTATION = "gpusched.io/run"  # the run a pod was bound for (the platform's JobPlaced id)
RESUME_ANNOTATION = "gpusched.io/resume-checkpoint"
RESUME_PROGRESS_ANNOTATION = "gpusched.io/resume-progress-s"
# What a job that checkpoints writes on its pod (or a sidecar for it): its last checkpoint and its progress.
CHECKPOINT_ANNOTATION = "gpusched.io/checkpoint"
PROGRESS_ANNOTATION = "gpusched.io/progress-s"
FRACTION_ANNOTATIONS = ("gpusched.io/gpu-milli", "gpusched.io/gpu-memory-mib")
# Gang conventions: (label naming the group, annotation or None giving its size).
GANG_CONVENTIONS = (("gpusched.io/gang", "gpusched.io/gang-size"),
                    ("kueue.x-k8s.io/pod-group-name", "kueue.x-k8s.io/pod-group-total-count"),
                    ("scheduling.x-k8s.io/pod-group", "gpusched.io/gang-size"))
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str


@dataclass(frozen=True)
class Resources:
    gpus: int = 0
    mig_profile: str = ""  # a MIG profile, or an Ascend vNPU template
    npu_models: tuple[str, ...] = ()  # the NPU models the resources ask for; () for GPUs
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class GangKey:
    namespace: str
    name: str
    size: int | None  # None: the size comes from the PodGroup object


def meta(obj: Obj) -> Obj:
    return obj.get("metadata", {}) or {}


def labels(obj: Obj) -> dict[str, str]:
    return meta(obj).get("labels", {}) or {}


def notes_of(obj: Obj) -> dict[str, str]:
    return meta(obj).get("annotations", {}) or {}


def is_ours(pod_spec: Obj) -> bool:
    return pod_spec.get("schedulerName") == SCHEDULER_NAME


def pod_resources(pod_spec: Obj) -> Resources | Refusal:
    """Per-replica resources: the sum over containers (limits stand in for missing requests, as for
    extended resources they must be equal)."""
    gpus, cpu, memory = 0, 0, 0
    migs: dict[str, int] = {}
    npus: list[NpuAsk] = []
    try:
        for container in pod_spec.get("containers", []) or []:
            res = container.get("resources", {}) or {}
            wanted = {**(res.get("limits", {}) or {}), **(res.get("requests", {}) or {})}
            gpus += int(parse_quantity(wanted.get(GPU_RESOURCE, "0")))
            npus.append(npu_ask({k: parse_quantity(v) for k, v in wanted.items() if k.startswith(RESOURCE_PREFIX)}))
            cpu += quantity_milli(wanted.get("cpu", "0"))
            memory += quantity_mib(wanted.get("memory", "0"))
            for name, value in wanted.items():
                if name.startswith(MIG_RESOURCE_PREFIX):
                    migs[name.removeprefix(MIG_RESOURCE_PREFIX)] = (migs.get(name.removeprefix(MIG_RESOURCE_PREFIX), 0)
                                                                    + int(parse_quantity(value)))
    except ValueError as err:
        return Refusal("invalid_resources", str(err))
    if migs and gpus:
        return Refusal("mixed_gpu_resources", "a replica asks for whole GPUs and MIG instances at once")
    asked = [a for a in npus if a.npus or a.template]
    if asked:
        return _npu_resources(asked, gpus + sum(migs.values()), cpu, memory)
    if len(migs) > 1 or any(n != 1 for n in migs.values()):
        return Refusal("invalid_mig_request", "a replica asks for one MIG instance of one profile, got "
                       + ", ".join(f"{n} x {p}" for p, n in sorted(migs.items())))
    return Resources(gpus=gpus, mig_profile=next(iter(migs), ""), cpu_milli=cpu, memory_mib=memory)


def _npu_resources(asked: list[NpuAsk], gpus: int, cpu: int, memory: int) -> Resources | Refusal:
    """A replica's NPUs: whole NPUs of one resource, or one vNPU; never beside GPUs."""
    if gpus:
        return Refusal("mixed_vendors", "a replica asks for NVIDIA GPUs and Ascend NPUs at once")
    templates = [a.template for a in asked if a.template]
    whole = sum(a.npus for a in asked)
    if len({a.models for a in asked}) > 1 or len(templates) > 1 or (templates and whole):
        return Refusal("invalid_npu_request", "a replica asks for whole NPUs of one kind, or one vNPU")
    return Resources(gpus=whole or 1, mig_profile=templates[0] if templates else "", npu_models=asked[0].models,
                     cpu_milli=cpu, memory_mib=memory)


def _float(notes: dict[str, str], key: str) -> float | None:
    text = notes.get(PREFIX + key)
    if text is None:
        return None
    value = float(text)
    if value != value or value < 0:
        raise ValueError(f"{PREFIX}{key} must be a number >= 0, got {text!r}")
    return value


def _fraction(notes: dict[str, str]) -> int:
    """A share of one GPU in thousandths (`gpusched.io/gpu-milli`, 1 to 999); 0 for whole GPUs."""
    milli = _float(notes, "gpu-milli")
    if milli is None:
        return 0
    if not 1 <= milli <= 999 or milli != int(milli):
        raise ValueError(f"{PREFIX}gpu-milli must be a whole number from 1 to 999, got {milli:g}")
    return int(milli)


def job_spec(obj: Obj, pod_spec: Obj, replicas: int, team_of_queue: dict[str, str], kind: str) -> JobSpec | Refusal:
    """The JobSpec of a pod, a gang (its first member) or a Job (its template), `replicas` of it."""
    queue = next((labels(obj)[k] for k in QUEUE_LABELS if labels(obj).get(k)), "")
    if not queue:
        return Refusal("no_queue", f"label the {kind} with gpusched.io/queue (or kueue.x-k8s.io/queue-name)")
    notes = notes_of(obj)
    if any(k in notes for k in FRACTION_ANNOTATIONS) and not pod_spec.get("resourceClaims"):
        return Refusal("gpu_fraction_unsupported",
                       "a GPU fraction needs a DRA claim on a shareable device (its driver isolates the share); "
                       "the classic device plugin gives whole GPUs only (docs/kubernetes.md)")
    resources = pod_resources(pod_spec)
    if isinstance(resources, Refusal):
        return resources
    namespace = str(meta(obj).get("namespace", "default"))
    try:
        models = tuple(m.strip() for m in notes.get(PREFIX + "gpu-models", "").split(",") if m.strip()) \
            or resources.npu_models
        topology = notes.get(PREFIX + "topology", "")
        if topology not in ("", "node", "rack", "block"):
            raise ValueError(f"{PREFIX}topology must be node, rack or block, got {topology!r}")
        retry = tuple(int(c) for c in notes.get(PREFIX + "retry-exit-codes", "").split(",") if c.strip())
        deadline = pod_spec.get("activeDeadlineSeconds")
        spec = JobSpec(
            team=team_of_queue.get(queue, namespace), queue=queue, project=namespace,
            name=f"{namespace}/{meta(obj).get('name', '')}",
            workload=notes.get(PREFIX + "workload", "training"),
            priority=pod_spec.get("priorityClassName") or "training",
            replicas=replicas, gpus=resources.gpus if not resources.mig_profile else 1,
            mig_profile=resources.mig_profile, cpu_milli=resources.cpu_milli, memory_mib=resources.memory_mib,
            gpu_models=models, duration_s=_float(notes, "duration-s"),
            max_runtime_s=float(deadline) if deadline is not None else None,
            topology=topology, topology_required=notes.get(PREFIX + "topology-required", "") == "true",
            spread=notes.get(PREFIX + "spread", "") == "true",
            checkpoint_interval_s=_float(notes, "checkpoint-interval-s"), retry_exit_codes=retry,
            gpu_milli=_fraction(notes), gpu_memory_mib=int(_float(notes, "gpu-memory-mib") or 0),
            labels={"kubernetes.io/kind": kind, "kubernetes.io/namespace": namespace,
                    "kubernetes.io/name": str(meta(obj).get("name", ""))})
    except (ValueError, TypeError) as err:
        return Refusal("invalid_annotation", str(err))
    return spec


def gang_of(pod: Obj) -> GangKey | None:
    """The gang a pod belongs to, under whichever convention labels it; None for a pod on its own."""
    pod_labels, notes = labels(pod), notes_of(pod)
    namespace = str(meta(pod).get("namespace", "default"))
    for label, size_note in GANG_CONVENTIONS:
        name = pod_labels.get(label)
        if name:
            size = notes.get(size_note)
            return GangKey(namespace, name, int(size) if size and size.isdigit() else None)
    return None


def pod_job_id(pod: Obj) -> str:
    """A pod on its own: its first incarnation's uid names the job (a remade pod carries it on)."""
    return notes_of(pod).get(JOB_ID_ANNOTATION) or derived_id("kube", "pod", meta(pod).get("uid", ""))


def gang_job_id(gang: GangKey, member_uids: list[str]) -> str:
    """A gang: its name and the uids of the members it was submitted with (a gang of the same name made again
    later is another job)."""
    return derived_id("kube", "gang", gang.namespace, gang.name, *sorted(member_uids))


def batch_job_id(job: Obj) -> str:
    return job_id_of_batch_job(str(meta(job).get("uid", "")))


def job_id_of_batch_job(uid: str) -> str:
    """A batch/v1 Job: its uid names the job (its pods name it by their owner reference)."""
    return derived_id("kube", "job", uid)


def owning_job(pod: Obj) -> Obj:
    """The owner reference of the batch/v1 Job that controls the pod ({} for a pod of no Job)."""
    for ref in meta(pod).get("ownerReferences", []) or []:
        if ref.get("kind") == "Job" and ref.get("controller"):
            return dict(ref)
    return {}


def completion_index(pod: Obj) -> int | None:
    text = notes_of(pod).get(COMPLETION_INDEX) or labels(pod).get(COMPLETION_INDEX)
    return int(text) if text is not None and text.isdigit() else None


def exit_code(pod: Obj) -> int:
    """The exit status of a pod that ended: its first failed container's (0 when all succeeded; 1 when the
    kubelet gave none)."""
    statuses = pod.get("status", {}).get("containerStatuses", []) or []
    codes = [int(s.get("state", {}).get("terminated", {}).get("exitCode", 0) or 0) for s in statuses
             if "terminated" in (s.get("state", {}) or {})]
    failed = [c for c in codes if c != 0]
    if failed:
        return failed[0]
    return 0 if pod.get("status", {}).get("phase") == "Succeeded" else 1


def checkpoint_of(pod: Obj) -> tuple[float, str]:
    notes = notes_of(pod)
    try:
        progress = float(notes.get(PROGRESS_ANNOTATION, "0") or 0)
    except ValueError:
        progress = 0.0
    return progress, notes.get(CHECKPOINT_ANNOTATION, "")
