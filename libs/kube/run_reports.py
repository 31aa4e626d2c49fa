"""What a run's pods (or its Job) say about the run, as the executor reports the platform reads (pure): started
once every replica runs, finished once all succeeded, failed with the first failure's exit code. A pod being
deleted is a stop (a cancel, an eviction), reported as such elsewhere, never as a failure here."""

from __future__ import annotations

from dataclasses import dataclass

from contracts import EventBase
from libs.kube.client import Obj
from libs.kube.workloads import exit_code, meta
from libs.nodes.reports import RunReports

EXECUTOR = "kubernetes"
TERMINAL = ("Succeeded", "Failed")
# A failed batch/v1 Job has spent its own retries (backoffLimit) and cannot run again: its failure is reported
# with an exit code below 128 (the platform retries those from 128 up), the last pod's own code in the reason.
FINAL_EXIT_CODE = 1


@dataclass(frozen=True)
class Run(RunReports):
    """A run of pods: the shared reports (libs/nodes/reports.py), with what the pods' phases are read against."""

    executor: str = EXECUTOR
    replicas: int = 0
    started_reported: bool = False


def phase(pod: Obj) -> str:
    return str((pod.get("status", {}) or {}).get("phase", ""))


def pods_reports(run: Run, pods: list[Obj], now: float) -> tuple[list[EventBase], list[Obj]]:
    """The reports the run's bound pods call for, and its failed pods (whose gang mates must stop)."""
    bound = [p for p in pods if (p.get("spec", {}) or {}).get("nodeName")]
    if len(bound) < run.replicas:
        return [], []
    out: list[EventBase] = []
    phases = [phase(p) for p in bound]
    if not run.started_reported and all(ph in ("Running", *TERMINAL) for ph in phases):
        out.append(run.started(now))
    if any(meta(p).get("deletionTimestamp") for p in bound):
        return out, []
    failed = [p for p in bound if phase(p) == "Failed"]
    if failed:
        code = exit_code(failed[0])
        out.append(run.failed(now, code, "killed_by_signal" if code > 128 else "exit_code"))
    elif all(ph == "Succeeded" for ph in phases):
        out.append(run.finished(now))
    return out, failed


def batch_job_reports(run: Run, job: Obj, pods: list[Obj], gone: list[Obj], now: float) -> list[EventBase]:
    """The reports a placed Job's status calls for: started once its pods all run (or it completed at once),
    finished on its Complete condition, failed on its Failed condition."""
    conditions = {c.get("type"): c.get("status") for c in (job.get("status", {}) or {}).get("conditions", []) or []}
    running = [p for p in pods if phase(p) == "Running"]
    out: list[EventBase] = []
    if not run.started_reported and (len(running) >= run.replicas or conditions.get("Complete") == "True"):
        out.append(run.started(now))
    if conditions.get("Complete") == "True":
        out.append(run.finished(now))
    elif conditions.get("Failed") == "True":
        failed = [p for p in pods + gone if phase(p) == "Failed"]
        last = exit_code(failed[-1]) if failed else FINAL_EXIT_CODE
        out.append(run.failed(now, last if 0 < last < 128 else FINAL_EXIT_CODE, f"job_failed: last pod exited {last}"))
    return out
