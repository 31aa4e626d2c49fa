"""How jobs read on the command line: their GPUs in their user's terms, the `jobs` table (active jobs by default,
in the order people look for them), one job's fields and runs, and what `wait` says while it waits.

Pure functions of the API's JSON (fields at their default are left out of a spec, so every read has its default).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from contracts.views import FINAL_JOB_STATES, gpu_request
from libs.cli.tables import Column

FULL = 1000
MIB_PER_GIB = 1024


def spec_of(job: dict[str, Any]) -> dict[str, Any]:
    return job.get("spec") or {}


def job_gpus(job: dict[str, Any], short: bool = False) -> str:
    """"2 x 1 whole GPU", "1 x 250m of one GPU", "1 x MIG 1g.10gb" (short: "2x1", "1x250m", "1x1g.10gb");
    "" for a job whose spec the view does not hold yet."""
    spec = spec_of(job)
    if not spec:
        return ""
    return gpu_request(spec.get("replicas", 1), spec.get("gpus", 1), spec.get("gpu_milli", 0),
                       spec.get("mig_profile", ""), short=short)


def models(job: dict[str, Any]) -> str:
    return " or ".join(spec_of(job).get("gpu_models") or []) or "any"


def age(seconds: float | None) -> str:
    """A duration as kubectl shows an age: 42s, 7m, 5h, 3d."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def duration(seconds: float) -> str:
    """A duration to the nearest second below an hour, to the minute above: 42s, 7m05s, 5h03m, 3d04h."""
    s = int(max(seconds, 0.0) + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def when(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="seconds")


def declared(job: dict[str, Any]) -> str:
    """What its user declared of its runtime: the estimate (what the deciders plan with) and the limit (where
    an executor stops it)."""
    spec = spec_of(job)
    parts = [f"{name} {duration(spec[key])}" for name, key in (("estimate", "duration_s"), ("limit", "max_runtime_s"))
             if spec.get(key) is not None]
    return ", ".join(parts) or "no runtime declared"


# --- the `jobs` table --------------------------------------------------------------------------------------------


def is_active(job: dict[str, Any]) -> bool:
    """Not final: waiting, placed or running (pending, running)."""
    return job.get("state") not in FINAL_JOB_STATES


def list_order(job: dict[str, Any]) -> tuple[int, float, str]:
    """Running jobs first (longest running first), then the waiting ones by submission (the next in line
    first), then the finished ones newest first; the id breaks ties."""
    state = job.get("state")
    if state == "running":
        return 0, job.get("started_at") or 0.0, job["id"]
    if state not in FINAL_JOB_STATES:
        return 1, job.get("submitted_at") or 0.0, job["id"]
    return 2, -(job.get("finished_at") or job.get("submitted_at") or 0.0), job["id"]


def sort_jobs(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(jobs, key=list_order)


def list_title(shown: int, hidden: int = 0, at_least: bool = False, active_only: bool = False) -> str:
    """"3 active jobs (12 finished hidden; -A shows them)", or "15 jobs"."""
    what = f"{shown} {'active ' if active_only else ''}job{'' if shown == 1 else 's'}"
    if not hidden:
        return what
    return f"{what} ({'at least ' if at_least else ''}{hidden} finished hidden; -A shows them)"


def _nodes(job: dict[str, Any]) -> str:
    return ",".join(dict.fromkeys(p["node"] for p in job.get("placements", [])))


def job_columns(now: float) -> list[Column[dict[str, Any]]]:
    """`gpusched jobs`: id, name, queue, state, GPUs and why it waits by default (the id alone takes 36 of 80
    columns); the rest with -o wide."""
    return [
        Column("ID", lambda j: j["id"]),
        Column("NAME", lambda j: spec_of(j).get("name")),
        Column("TEAM", lambda j: j["team"], wide=True),
        Column("QUEUE", lambda j: j["queue"]),
        Column("STATE", lambda j: j["state"]),
        Column("PHASE", lambda j: j.get("phase"), wide=True),
        Column("PRIORITY", lambda j: spec_of(j).get("priority", "training"), wide=True),
        Column("USER", lambda j: spec_of(j).get("user"), wide=True),
        Column("GPUS", lambda j: job_gpus(j, short=True)),
        Column("MODELS", lambda j: ",".join(spec_of(j).get("gpu_models") or []) or "any", wide=True),
        Column("NODES", _nodes, wide=True),
        Column("EVICTIONS", lambda j: j.get("evictions", 0), wide=True, right=True),
        Column("AGE", lambda j: age(now - j["submitted_at"]) if j.get("submitted_at") else None, wide=True,
               right=True),
        Column("REASON", lambda j: j.get("reason"), fit="cut"),
        Column("MESSAGE", lambda j: j.get("message"), wide=True, fit="cut"),
    ]


# --- one job -----------------------------------------------------------------------------------------------------

FIELD_COLUMNS: list[Column[tuple[str, Any]]] = [
    Column("FIELD", lambda f: f[0]),
    Column("VALUE", lambda f: f[1], fit="wrap"),
]
# `gpusched job ID`: these by default (then what it asks for, then its runs), the others only with -o wide.
JOB_FIELDS = ("id", "state", "phase", "team", "queue", "reason", "message", "submitted_at", "started_at",
              "finished_at", "exit_code", "evictions", "gpu_seconds")
WIDE_JOB_FIELDS = ("admitted_at", "first_started_at", "retries", "progress_s", "lost_gpu_seconds",
                   "shortfall_milli", "seq")


def request_fields(job: dict[str, Any]) -> list[tuple[str, Any]]:
    """What the job asks for, as its user wrote it: name, command, GPUs, GPU memory, models, runtime."""
    spec = spec_of(job)
    fields: list[tuple[str, Any]] = [("name", spec.get("name")), ("gpus", job_gpus(job))]
    if spec.get("gpu_memory_mib"):
        fields.append(("gpu_memory", f"{spec['gpu_memory_mib'] / MIB_PER_GIB:g} GiB per replica"))
    return [*fields, ("models", models(job)), ("runtime", declared(job)),
            ("command", " ".join(spec.get("command") or []))]


def _share(p: dict[str, Any]) -> str:
    milli, slices = p.get("gpu_milli", FULL), p.get("mig_slices", 0)
    if slices:
        return f" (MIG, {slices} slice{'' if slices == 1 else 's'})"
    return "" if milli >= FULL else f" ({milli}m)"


def where(placements: Sequence[dict[str, Any]]) -> str:
    """Where a run's replicas went, per node: "n1 GPUs 0,1 + n2 GPU 3 (250m)"."""
    by_node: dict[str, list[str]] = {}
    share: dict[str, str] = {}
    for p in placements:
        by_node.setdefault(p["node"], []).extend(str(i) for i in p.get("gpu_indices", []))
        share[p["node"]] = _share(p)
    return " + ".join(f"{node} GPU{'s' if len(idx) > 1 else ''} {','.join(idx)}{share[node]}"
                      for node, idx in by_node.items()) or "-"


def _outcome(run: dict[str, Any]) -> str:
    outcome, reason, code = run.get("outcome", ""), run.get("reason", ""), run.get("exit_code")
    if outcome == "failed":
        return "failed" + (f": {reason}" if reason else "") + (f" (exit code {code})" if code is not None else "")
    return outcome + (f": {reason}" if reason and reason != outcome else "")


def run_text(run: dict[str, Any], now: float) -> str:
    """One run: where, when, and how it ended: "n1 GPUs 0,1; started 2030-01-01T08:00:00+00:00, ran 5m02s;
    evicted: preempted"."""
    started, ended = run.get("started_at"), run.get("ended_at")
    parts = [where(run.get("placements", []))]
    if started is not None:
        parts.append(f"started {when(started)}, " + (f"ran {duration(ended - started)}" if ended is not None
                                                     else f"running for {duration(now - started)}"))
    else:
        parts.append(f"placed {when(run.get('placed_at'))}" + ("" if ended is not None else ", not started yet"))
    if ended is not None:
        parts.append(_outcome(run))
    return "; ".join(parts)


def run_fields(job: dict[str, Any], now: float) -> list[tuple[str, Any]]:
    """Each run kept in the view, numbered from the job's first; where the view keeps no runs (an older API),
    the current placement, replica by replica."""
    if "runs" not in job:
        return [(f"replica {p['replica']}", f"{p['node']} GPUs {p['gpu_indices']} ({p['gpu_milli']}m)")
                for p in job.get("placements", [])]
    runs, total = job.get("runs") or [], job.get("run_count", 0)
    first = max(total - len(runs), 0) + 1
    fields: list[tuple[str, Any]] = [(f"run {first + i}", run_text(r, now)) for i, r in enumerate(runs)]
    if total > len(runs):
        fields.insert(0, ("runs", f"{total} in all; the last {len(runs)} follow"))
    return fields


def _value(name: str, value: Any) -> Any:
    """A field as people read it: times in UTC, seconds to a tenth."""
    if name.endswith("_at"):
        return when(value)
    seconds = name.endswith(("_s", "seconds")) and isinstance(value, float)
    return f"{value:.1f}" if seconds else value


def job_fields(job: dict[str, Any], every: bool = False, now: float | None = None) -> list[tuple[str, Any]]:
    """The job's fields as (name, value), times in UTC: who and where it is, what it asks for, when it ran, and its
    runs; `every`: the wide set too."""
    names = JOB_FIELDS + WIDE_JOB_FIELDS if every else JOB_FIELDS
    fields = [(k, _value(k, job.get(k))) for k in names]
    asks = request_fields(job)
    if every:
        spec = spec_of(job)
        asks += [("priority", spec.get("priority", "training")), ("user", spec.get("user")),
                 ("project", spec.get("project"))]
    name = asks.pop(0)
    at = names.index("message") + 1
    fields[at:at] = asks  # what it asks for, after why it is where it is
    fields.insert(1, name)  # the name, next to the id
    now = datetime.now(tz=UTC).timestamp() if now is None else now
    return fields + run_fields(job, now)


# --- `wait` ------------------------------------------------------------------------------------------------------


def doing(job: dict[str, Any], now: float) -> str:
    """What the job is doing, in a line: "running for 2m05s (estimate 5m00s, limit 10m00s)", "pending, admitted:
    queue_quota_exhausted (...)"."""
    state, phase = job.get("state", ""), job.get("phase", "")
    if state == "running" and job.get("started_at") is not None:
        text = f"running for {duration(now - job['started_at'])} ({declared(job)})"
    else:
        text = state + (f", {phase}" if phase and phase != state else "")
    reason, message = job.get("reason"), job.get("message")
    if reason and state != "running":
        text += f": {reason}" + (f" ({message})" if message else "")
    return text
