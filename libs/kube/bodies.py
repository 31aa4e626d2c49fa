"""The bodies the bridge sends to the API server (pure): a Binding per placed replica, an Eviction with the
priority class's grace, the PodScheduled and DisruptionTarget conditions, an Event, a Job's suspension, and
a bare pod made again for its next run."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime

from libs.core.kernel.decider import derived_id
from libs.kube.client import Obj
from libs.kube.workloads import JOB_ID_ANNOTATION, RESUME_ANNOTATION, RESUME_PROGRESS_ANNOTATION, RUN_ANNOTATION, meta

REPORTER = "gpusched"


def timestamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def binding(namespace: str, pod: str, node: str, run: str = "", notes: dict[str, str] | None = None) -> Obj:
    """A Binding; its annotations land on the pod: `gpusched.io/run` names the run the pod was bound for, so a pod
    that ended is told apart from one of an earlier run; `notes` add others (the NPUs chosen for it)."""
    body: Obj = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": namespace},
                 "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    annotations = {**({RUN_ANNOTATION: run} if run else {}), **(notes or {})}
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


def remake_templates(namespace: str, job_id: str, pods: dict[str, Obj]) -> Obj:
    """A ConfigMap holding what it takes to make a job's bare pods again (their bodies, unbound): written before
    the bridge deletes them, so a bridge that takes over after the deletion can still make them again."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": remake_templates_name(job_id), "namespace": namespace,
                         "labels": {"gpusched.io/remake": "true"}},
            "data": {name: json.dumps(body, sort_keys=True) for name, body in sorted(pods.items())}}


def remake_templates_name(job_id: str) -> str:
    return f"gpusched-remake-{job_id}"


def eviction(namespace: str, pod: str, grace_s: float) -> Obj:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace},
            "deleteOptions": {"gracePeriodSeconds": round(grace_s)}}


def delete_options(grace_s: float) -> Obj:
    return {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": round(grace_s)}


def condition(kind: str, status: bool, reason: str, message: str, ts: float) -> Obj:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": timestamp(ts), "lastProbeTime": None}


def status_patch(*conditions: Obj) -> Obj:
    """A strategic merge patch of pods/status: conditions merge by their type."""
    return {"status": {"conditions": list(conditions)}}


def waiting_condition(code: str, message: str, ts: float) -> Obj:
    return condition("PodScheduled", False, code or "Unschedulable", message, ts)


def disruption_condition(reason: str, message: str, ts: float) -> Obj:
    # The reasons Kubernetes itself uses: PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager.
    return condition("DisruptionTarget", True, reason, message, ts)


def event(involved: Obj, kind: str, reason: str, message: str, ts: float, count_key: str = "") -> Obj:
    """A core/v1 Event about an object, named after it and what it says (so the same news is one Event)."""
    m = meta(involved)
    name = f"{m.get('name', '')}.{derived_id('event', m.get('uid', ''), reason, count_key or message)[:13]}"
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": m.get("namespace", "default")},
        "involvedObject": {"apiVersion": involved.get("apiVersion", "v1"), "kind": involved.get("kind", "Pod"),
                           "name": m.get("name", ""), "namespace": m.get("namespace", "default"),
                           "uid": m.get("uid", ""), "resourceVersion": m.get("resourceVersion", "")},
        "reason": reason, "message": message[:1024], "type": kind, "source": {"component": REPORTER},
        "reportingComponent": REPORTER, "reportingInstance": REPORTER,
        "firstTimestamp": timestamp(ts), "lastTimestamp": timestamp(ts), "count": 1,
    }


def suspend_patch(suspend: bool, notes: dict[str, str] | None = None) -> Obj:
    body: Obj = {"spec": {"suspend": suspend}}
    if notes:
        body["metadata"] = {"annotations": notes}
    return body


def remade_pod(pod: Obj, job_id: str, resume: tuple[float, str]) -> Obj:
    """The next incarnation of a bare pod: its spec without the node it was bound to, the same name, the job's
    id and the checkpoint to resume from."""
    m = meta(pod)
    spec = copy.deepcopy(pod.get("spec", {}))
    spec.pop("nodeName", None)
    notes = {k: v for k, v in (m.get("annotations", {}) or {}).items()}
    notes[JOB_ID_ANNOTATION] = job_id
    if resume[1]:
        notes[RESUME_ANNOTATION] = resume[1]
        notes[RESUME_PROGRESS_ANNOTATION] = f"{resume[0]:g}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": m.get("name"), "namespace": m.get("namespace"), "labels": m.get("labels", {}),
                         "annotations": notes},
            "spec": spec}
