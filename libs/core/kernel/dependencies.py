"""What a decider's pass reads, and which inputs change it: the triggers of a pass follow from these, so that a
change to anything a pass reads either triggers it or is left to a later trigger for a stated reason, never
missed silently.

`CHANGES` says, for every input a decider folds, which parts of the world it changes (`Reads`); a decider
declares the parts its pass reads (`PassDependencies.reads`) and, for each part whose change it leaves to a
later trigger, why (`not_triggered`). Its triggers are then the inputs that change a part it reads and reacts
to (`PassDependencies.triggers`). tests/unit/core/kernel/test_dependencies.py checks both sides: each decider
reacts to exactly its derived triggers, and no fold changes a part of the state that `CHANGES` does not name
for that input."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Flag, auto

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobAdmitted,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaRecalled,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettingsChanged,
)


class Reads(Flag):
    """The parts of the world a pass may read."""

    QUEUES = auto()  # the queue tree: quotas, cohorts and parents, budgets, least attained service
    CLASSES = auto()  # priority classes: values, minimum runtimes, preemptibility
    SETTINGS = auto()  # the scheduling settings
    NODES = auto()  # the nodes present: their GPU models, sizes, health and cordons
    FREED = auto()  # GPUs that may come free: a run over, a node registered or uncordoned, a GPU healthy again
    SUBMISSIONS = auto()  # jobs' specs, before admission
    ARRIVALS = auto()  # jobs admitted, waiting for quota
    HELD = auto()  # quota and GPUs held: reservations, placements, runs and jobs ending
    RESERVED = auto()  # jobs whose quota was just reserved: placement's arrivals
    DEFERRALS = auto()  # what waiting jobs were last told
    NOMINATIONS = auto()  # preemptors whose victims were chosen
    RUNS = auto()  # runs going on: GPU time spent (budgets, attained service), checkpoints
    CLOCK = auto()  # time itself: budgets spent, graces, minimum runtimes, backoffs, nominations lapsing
    # reservations quota asks back at their placement timeout, and placement's answers: a reservation goes back
    # only once placement let its job go (so no placement runs on quota given back)
    RECALLS = auto()


_NODES_GOING = (NodeLost, NodeCordoned)  # (only ever take GPUs away)
_NODES_COMING = (NodeRegistered, NodeUncordoned, GpuHealthChanged)  # (may bring GPUs)
_RUN_ENDS = (JobFinished, JobFailed, JobEvicted)

# Every input a decider folds -> the parts of the world it changes.
CHANGES: Mapping[type[EventBase], Reads] = {
    QueuePolicyChanged: Reads.QUEUES | Reads.HELD,  # reservations follow the queue's flavors
    PriorityClassesChanged: Reads.CLASSES,
    SchedulingSettingsChanged: Reads.SETTINGS,
    **dict.fromkeys(_NODES_GOING, Reads.NODES),
    **dict.fromkeys(_NODES_COMING, Reads.NODES | Reads.FREED),
    JobSubmitted: Reads.SUBMISSIONS,
    JobAdmitted: Reads.ARRIVALS | Reads.SUBMISSIONS,  # the submission it admits is consumed
    # its job's wait for quota, and nomination, end; it waits for a place
    QuotaReserved: Reads.HELD | Reads.RESERVED | Reads.DEFERRALS | Reads.NOMINATIONS,
    QuotaReleased: Reads.HELD | Reads.NOMINATIONS,  # a nominee whose quota went back holds no room for itself
    # placement lets the job go (it waits no more, holds nothing for itself) and answers
    QuotaRecalled: Reads.HELD | Reads.NOMINATIONS | Reads.RECALLS,
    JobPlaced: Reads.HELD | Reads.RUNS | Reads.NOMINATIONS,  # a nominee placed holds nobody any more
    **dict.fromkeys(_RUN_ENDS, Reads.HELD | Reads.RUNS | Reads.NOMINATIONS | Reads.FREED),  # nor one that ends
    JobCancelled: Reads.HELD | Reads.NOMINATIONS,
    QuotaDeferred: Reads.DEFERRALS,
    PlacementDeferred: Reads.DEFERRALS | Reads.RECALLS,  # (placement's answer to a recall is one)
    PreemptionDecided: Reads.NOMINATIONS,
    JobStarted: Reads.RUNS,
    JobCheckpointed: Reads.RUNS,
    ClockTick: Reads.CLOCK | Reads.NOMINATIONS,  # nominations lapse with time
}


@dataclass(frozen=True)
class PassDependencies:
    """What a decider's pass reads, and the parts whose change it leaves to a later trigger (with why)."""

    reads: Reads
    not_triggered: dict[Reads, str] = field(default_factory=dict)

    def live(self) -> Reads:
        """The parts a change of which triggers the pass."""
        live = self.reads
        for part in self.not_triggered:
            live &= ~part
        return live

    def triggers(self, inputs: Iterable[type[EventBase]]) -> tuple[type[EventBase], ...]:
        """The inputs (of `inputs`, in their order) that change a part the pass reads and reacts to."""
        live = self.live()
        return tuple(kind for kind in inputs if CHANGES.get(kind, Reads(0)) & live)
