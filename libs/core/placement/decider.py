"""Placement: where each job with reserved quota runs, all replicas or none.

The decider wires the package together: its state (state.py), folded one handler per event type (fold.py), and
its cycle (cycle.py), which tries the waiting jobs in their order (order.py), one at a time (attempt.py), under
the holds of nominated preemptors (nomination.py) and of the starving job (starvation.py). A job whose
reservation quota asks back before it is placed (its placement timeout, QuotaRecalled) is let go, and quota is
told so (the reservation goes back on that answer): it is forgotten until quota reserves it again, its wait for
capacity going on.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobSpec,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaRecalled,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettingsChanged,
)
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.kernel.decider import Chain, Decisions, Trigger
from libs.core.kernel.dependencies import PassDependencies, Reads
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.runs import CurrentRuns
from libs.core.placement.cycle import decide
from libs.core.placement.fold import fold
from libs.core.placement.state import PlacementState

SERVICE = "placement"
_NEXT_TICK = ("a hold that ends with it, a nominee's or the starving job's, is looked at on the next tick "
              "(state.held_back_free; a cancelled starving job's, as the tick finds the starving job again)")
# What a placement pass reads; its triggers follow (libs/core/kernel/dependencies.py), and cycle.REACTIONS
# answers each. A pass can place a job only once something is gained: a job to place, GPUs come free, an
# order or a flavor that lets a held-back job go, a hold ended; a change that only takes away waits.
PASS = PassDependencies(
    reads=(Reads.QUEUES | Reads.CLASSES | Reads.SETTINGS | Reads.NODES | Reads.FREED | Reads.SUBMISSIONS
           | Reads.HELD | Reads.RESERVED | Reads.DEFERRALS | Reads.NOMINATIONS | Reads.RUNS | Reads.CLOCK
           | Reads.RECALLS),
    not_triggered={
        Reads.SETTINGS: "the starvation limit is read on ticks, which find the starving job; retries on a run's end",
        Reads.NODES: "a node lost or cordoned only takes GPUs away; one that may bring some frees them (FREED)",
        Reads.SUBMISSIONS: "a submitted job is placed only once quota reserves it (RESERVED)",
        Reads.HELD: "a reservation gone back, or a job cancelled, only takes a job from those waiting (its GPUs "
                    "come free with its run's end, FREED); " + _NEXT_TICK,
        Reads.DEFERRALS: "what a waiting job was told is placement's own word, and changes no fit",
        Reads.NOMINATIONS: "a nomination only holds others back; one ending is looked at on the next tick "
                           "(nomination.lapse)",
        Reads.RUNS: "runs' declared ends are read on ticks (the starving job's shadow)",
    })


class PlacementDecider:
    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.runs = CurrentRuns()  # executors' reports about runs that are over never reach it (run_decider)
        self.state = PlacementState()

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned, NodeUncordoned, QueuePolicyChanged,
                PriorityClassesChanged, SchedulingSettingsChanged, JobSubmitted, QuotaReserved, JobCancelled,
                JobFinished, JobFailed, JobEvicted, PreemptionDecided, ClockTick, QuotaReleased, QuotaRecalled)

    def reacts_to(self) -> tuple[type[EventBase], ...]:
        """The inputs `react` may decide something about: those that change what a pass reads (PASS); to any
        other (a node lost, a submission, a preemption) it answers [] and changes nothing."""
        return PASS.triggers(self.input_types())

    def fold(self, event: EventBase) -> None:
        fold(self.state, event)

    def react(self, trigger: Trigger) -> list[EventBase]:
        out = Decisions(SERVICE, trigger, self.fold, self.chain)
        decide(self.state, out)
        return out.out

    def policy_for(self, spec: JobSpec) -> str:
        """The priority class's placement policy, else the queue's, else the default."""
        return self.state.policy_for(spec)

    # The parts of the state that other components read (the services' wiring, replays, tests).
    @property
    def cluster(self) -> Cluster:
        return self.state.cluster

    @property
    def placer(self) -> Placer:
        return self.state.placer

    @property
    def policy(self) -> PolicyBook:
        return self.state.policy

    def snapshot(self) -> bytes:
        state = self.state
        return msgspec.json.encode({
            "placed": state.placed,
            "waiting": state.waiting,
            "free": {n.name: [g.free_milli for g in n.gpus] for n in state.cluster.sorted_nodes()},
        })
