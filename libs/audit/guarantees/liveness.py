"""Liveness: what must be true once the platform has had time to act.

Judged on the log's tail: after its last event other than a clock tick or an audit checkpoint, once at least
`quiet_s` of ticks followed (the deciders saw time pass and decided nothing more). A log that ends sooner is
not judged there: its last decisions may still be on their way. Then every job is running, ended (finished,
failed, cancelled, or rejected with a code), or waiting with a recorded reason that is true at that moment;
and no job waits while idle quota and idle GPUs could run it.

The reclaim bound is watched over the whole log: for jobs waiting for quota lent out (reclaim.py) and for jobs
holding quota within their nominal that wait for the GPUs borrowers hold (placement_reclaim.py); and each
reservation's flavor is judged on the world just before it (flavor_fungibility.py)."""

from __future__ import annotations

from collections.abc import Sequence

from contracts import AuditCheckpoint, ClockTick, EventBase, QuotaReserved
from libs.audit.guarantees import holds, reasons
from libs.audit.guarantees.flavor_fungibility import FlavorFungibility
from libs.audit.guarantees.placement_reclaim import PlacementReclaimWatch
from libs.audit.guarantees.reclaim import ReclaimWatch
from libs.audit.guarantees.violation import (
    JOB_FINAL_OR_EXPLAINED,
    NO_IDLE_WHILE_FITTING_WAITS,
    WAITING_REASON_TRUE,
    Violation,
)
from libs.audit.guarantees.world import ENDED, LEAVING, PLACEMENT, QUOTA, RUNNING, SUBMITTED, JobState, World

# Events that say only that time passes (or attest the log): the tail of these is the quiet the log is judged on.
QUIET = (ClockTick, AuditCheckpoint)
DEFAULT_QUIET_S = 2.0
_WAITING_FOR = {QUOTA: "quota", PLACEMENT: "a place"}


def check_liveness(events: Sequence[tuple[int, EventBase]], *, quiet_s: float = DEFAULT_QUIET_S) -> list[Violation]:
    """The reclaim bound over the whole log, then (once the log was quiet for `quiet_s`) every job's state."""
    world = World()
    watch = ReclaimWatch()
    gpu_watch = PlacementReclaimWatch()
    flavors = FlavorFungibility()
    out: list[Violation] = []
    last_busy: float | None = None
    for seq, event in events:
        if isinstance(event, QuotaReserved):  # judged on the world before it
            out.extend(flavors.reserved(seq, event, world))
        flavors.fold(seq, event)
        world.apply(event)
        if isinstance(event, ClockTick):
            previous_tick = watch.last_tick
            out.extend(watch.tick(seq, world))
            out.extend(gpu_watch.tick(seq, world, previous_tick, watch.tick_s))
        if not isinstance(event, QUIET):
            last_busy = event.ts
    if events and last_busy is not None and world.now - last_busy >= quiet_s:
        out.extend(settled_violations(world, events[-1][0]))
    return out


def settled_violations(world: World, seq: int) -> list[Violation]:
    """Every job's state, judged on a world that has been quiet for a while."""
    out = []
    for job_id in sorted(world.jobs):
        found = _judge(world, job_id, world.jobs[job_id])
        if found is not None:
            out.append(Violation(found[0], seq, (job_id,), f"job {job_id}: {found[1]}"))
    return out


def _judge(world: World, job_id: str, job: JobState) -> tuple[str, str] | None:
    """The one guarantee the job breaks, most telling first: it could run now; it waits without a reason; its
    reason is false."""
    if job.phase in (ENDED, RUNNING):
        return None
    if job.phase == SUBMITTED:
        return JOB_FINAL_OR_EXPLAINED, "submitted and neither admitted nor rejected"
    if job.phase == LEAVING:
        return JOB_FINAL_OR_EXPLAINED, "stopped (evicted or failed) and neither requeued nor ended"
    waiting = f"waits for {_WAITING_FOR[job.phase]} since {job.since:.0f}"
    idle = holds.could_run(world, job_id, job)
    if idle:
        return NO_IDLE_WHILE_FITTING_WAITS, f"{waiting} ({job.reason or 'no reason given'}), yet {idle}"
    if not job.reason:
        return JOB_FINAL_OR_EXPLAINED, f"{waiting} and was never told why"
    false = reasons.untrue(world, job_id, job)
    if false:
        return WAITING_REASON_TRUE, f"{waiting} with reason {job.reason}, which is not true: {false}"
    return None
