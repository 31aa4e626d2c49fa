"""The figures of a replayed trace, from its jobs' outcomes (libs/sim/trace_outcome.py), whichever scheduler
ran it.

- offered load: the GPU-time the window's jobs ask for (runtime x GPUs) over the GPU-time the cluster has in
  the window (its GPUs x the window's length);
- JCT: end - submit, over the jobs that finished; queueing delay: first start - submit, over the jobs that
  started (a preempted job's later waits are in its JCT, not its delay);
- bounded slowdown: JCT / max(runtime, BOUND_S), at least 1, over the finished jobs;
- GPU utilisation: the GPU-time jobs held within the window over the cluster's GPU-time in the window. An
  outcome knows a job's first start and end, not its runs: a job's GPU-time (runtime x GPUs, plus the work its
  preemptions threw away) is spread evenly over [first start, end] (exact for a job never preempted), and a
  job still running at the end of the run is counted busy from its first start on;
- the mean queueing delay split by why jobs waited (libs/sim/trace_waits.py);
- per team: jobs, mean queueing delay, and its ratio to the same team's in the baseline set-up (None when
  that is 0 or missing); preemptions of its jobs; and, given the teams' quotas, what the team asked of its
  quota over the window (its jobs' GPU-time over its nominal GPUs x the window) and so its role: a team that
  asked less than its quota lends on net ("lender"), one that asked more borrows ("borrower"). The role is
  the trace's, not the scheduler's: it is the same in every set-up, so set-ups and revisions compare alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from libs.sim.trace_outcome import JobOutcome

BOUND_S = 10.0


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p99": None}
    arr = np.asarray(values, dtype=float)
    return {"mean": round(float(arr.mean()), 2), "median": round(float(np.median(arr)), 2),
            "p99": round(float(np.percentile(arr, 99)), 2)}


def queueing_delays(outcomes: Sequence[JobOutcome]) -> list[float]:
    return [o.first_start_s - o.job.submit_s for o in outcomes if o.first_start_s is not None and not o.rejected]


def bounded_slowdown(jct_s: float, runtime_s: float) -> float:
    return max(1.0, jct_s / max(runtime_s, BOUND_S))


def busy_in_window(o: JobOutcome, window_s: float) -> float:
    """The GPU-seconds the job held in [0, window_s] (see the module's doc)."""
    if o.rejected or o.first_start_s is None:
        return 0.0
    start = o.first_start_s
    if o.end_s is None:
        return max(0.0, window_s - start) * o.job.gpus
    span = o.end_s - start
    held = min(o.job.runtime_s * o.job.gpus + o.lost_gpu_s, span * o.job.gpus)  # stopped at a limit: less
    if span <= 0:
        return 0.0
    inside = max(0.0, min(o.end_s, window_s) - max(start, 0.0))
    return held * inside / span


def team_delays(outcomes: Sequence[JobOutcome]) -> dict[str, float | None]:
    """Mean queueing delay per team (None for a team none of whose jobs started)."""
    per: dict[str, list[float]] = {}
    for o in outcomes:
        if o.rejected:
            continue
        per.setdefault(o.job.team, [])
        if o.first_start_s is not None:
            per[o.job.team].append(o.first_start_s - o.job.submit_s)
    return {team: (sum(v) / len(v) if v else None) for team, v in sorted(per.items())}


def wait_by_reason(outcomes: Sequence[JobOutcome]) -> dict[str, float]:
    """The mean queueing delay split by why jobs waited (over the jobs that started), largest part first;
    empty for a scheduler that tells no reasons."""
    started = [o for o in outcomes if o.first_start_s is not None and not o.rejected]
    total: dict[str, float] = {}
    for o in started:
        for reason, seconds in o.waited_for.items():
            total[reason] = total.get(reason, 0.0) + seconds
    parts = {r: round(s / len(started), 1) for r, s in total.items()}
    return dict(sorted(((r, s) for r, s in parts.items() if s > 0), key=lambda rs: (-rs[1], rs[0])))


def team_roles(outcomes: Sequence[JobOutcome], team_gpus: dict[str, int], window_s: float
               ) -> dict[str, tuple[float, str]]:
    """Per team with a quota: what it asked of its quota over the window, and its role (see the module's doc)."""
    asked: dict[str, float] = {}
    for o in outcomes:
        if not o.rejected:  # a job no set-up could run asks nothing of a quota
            asked[o.job.team] = asked.get(o.job.team, 0.0) + o.job.runtime_s * o.job.gpus
    roles = {}
    for team, gpus in team_gpus.items():
        if gpus > 0 and window_s > 0:
            share = asked.get(team, 0.0) / (gpus * window_s)
            roles[team] = (round(share, 3), "lender" if share < 1.0 else "borrower")
    return roles


def figures(outcomes: Sequence[JobOutcome], cluster_gpus: int, window_s: float,
            baseline: Sequence[JobOutcome] | None = None, team_gpus: dict[str, int] | None = None
            ) -> dict[str, Any]:
    """One set-up's figures; `baseline`: the outcomes its per-team delays are compared with; `team_gpus`:
    each team's nominal GPUs, for its role."""
    jobs = list(outcomes)
    finished = [o for o in jobs if o.end_s is not None and not o.rejected and not o.limit_stopped]
    jct = [o.end_s - o.job.submit_s for o in finished if o.end_s is not None]
    delays = queueing_delays(jobs)
    slowdown = [bounded_slowdown(o.end_s - o.job.submit_s, o.job.runtime_s) for o in finished if o.end_s is not None]
    offered = sum(o.job.runtime_s * o.job.gpus for o in jobs)
    lost = sum(o.lost_gpu_s for o in jobs)
    busy = sum(busy_in_window(o, window_s) for o in jobs)
    span = max((o.end_s for o in jobs if o.end_s is not None), default=0.0)
    base = team_delays(baseline) if baseline is not None else {}
    teams: dict[str, dict[str, Any]] = {}
    mine = team_delays(jobs)
    roles = team_roles(jobs, team_gpus or {}, window_s)
    for team, delay in mine.items():
        ref = base.get(team)
        teams[team] = {"jobs": sum(1 for o in jobs if o.job.team == team and not o.rejected),
                       "mean_queueing_delay_s": None if delay is None else round(delay, 1),
                       "ratio_to_partitioned": round(delay / ref, 3) if delay is not None and ref else None,
                       "preemptions": sum(o.preemptions for o in jobs if o.job.team == team)}
        if team in roles:
            teams[team]["asked_of_quota"], teams[team]["role"] = roles[team]
    return {
        "jobs": len(jobs),
        "finished": len(finished),
        "rejected": sum(1 for o in jobs if o.rejected),
        "never_started": sum(1 for o in jobs if o.first_start_s is None and not o.rejected),
        "unfinished": sum(1 for o in jobs if o.end_s is None and not o.rejected),
        "limit_stopped": sum(1 for o in jobs if o.limit_stopped),
        "offered_load": round(offered / (cluster_gpus * window_s), 4) if cluster_gpus and window_s > 0 else None,
        "jct_s": _stats(jct),
        "queueing_delay_s": _stats(delays),
        "mean_bounded_slowdown": round(sum(slowdown) / len(slowdown), 3) if slowdown else None,
        "gpu_utilisation": round(busy / (cluster_gpus * window_s), 4) if cluster_gpus and window_s > 0 else None,
        "makespan_s": round(span, 1),
        "preemptions": sum(o.preemptions for o in jobs),
        "lost_gpu_hours": round(lost / 3600, 2),
        "mean_wait_by_reason_s": wait_by_reason(jobs),
        "teams": teams,
    }
