"""The order in which running jobs are tried as victims (Kueue's candidate order, costed by work lost)."""

from __future__ import annotations

from libs.core.preemption.state import Running

VictimOrder = tuple[int, float, float, int, str]


def victim_order(run: Running, now: float) -> VictimOrder:
    """The sort key of a candidate victim at `now`; the first in this order is evicted first:
      1. the lowest priority;
      2. the least work lost (GPU-time since its last checkpoint or start, Running.lost);
      3. the most recently started;
      4. the most recently placed (among jobs started at the same instant);
      5. the job id, so that no two jobs ever tie.
    """
    return (run.priority, run.lost(now), -run.started, -run.placed_order, run.job_id)
