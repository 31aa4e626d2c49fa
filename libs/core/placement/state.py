"""What the placement decider knows, as data: the cluster and its placer, the jobs waiting for a place and
those placed, the preemptors nominated, the starving job, and the speed shortcuts' memory. The fold
(libs/core/placement/fold.py) changes it; the cycle (libs/core/placement/cycle.py) reads it to decide."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.scoring import DEFAULT_POLICY
from libs.core.cluster.shapes import ShapeWindow
from libs.core.cluster.starving_room import EmptyInventory
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.retries import RetryBook
from libs.core.placement.order import WaitKey
from libs.core.placement.shortcuts import Shortcuts


@dataclass(slots=True)
class Nomination:
    """A preemptor whose victims were chosen: until it is placed or the nomination lapses, the room its victims
    leave is held for it."""

    priority: int
    victims: tuple[str, ...]  # those still leaving for it (a victim placed again elsewhere is dropped)
    at: float  # when it was nominated, on the log's clock
    reclaim: bool  # its queue takes back its nominal quota: it holds its room against every other queue too
    least_served: bool  # nominated for least attained service: it holds its room against its own queue too


@dataclass(frozen=True, slots=True)
class StarvingJob:
    """The job capacity is held for after waiting too long, found on ticks (libs/core/placement/starvation.py)."""

    job_id: str
    priority: int
    shadow: float  # when it could start: UNKNOWN_START when the running jobs do not say
    ending: tuple[str, ...]  # the running jobs that end by its shadow time


@dataclass(slots=True)
class PlacementState:
    cluster: Cluster = field(default_factory=Cluster)
    placer: Placer = field(init=False)
    policy: PolicyBook = field(default_factory=PolicyBook)
    retries: RetryBook = field(default_factory=RetryBook)
    # The same nodes with no job on them: who may starve (a job they could not hold never does).
    inventory: EmptyInventory = field(default_factory=EmptyInventory)
    # Fragmentation is judged against the shapes recently asked for.
    shapes: ShapeWindow = field(default_factory=ShapeWindow)
    specs: dict[str, JobSpec] = field(default_factory=dict)
    # The submitted spec of a job whose spec a reservation narrowed to one GPU model: a later reservation
    # (another flavor, or any model) narrows it afresh from this one.
    submitted: dict[str, JobSpec] = field(default_factory=dict)
    waiting: dict[str, WaitKey] = field(default_factory=dict)  # job -> its place in the order (order.wait_key)
    reservations: int = 0  # reservations folded so far: the next one's place in the order
    waiting_since: dict[str, float] = field(default_factory=dict)  # job -> when its quota was first reserved
    placed: dict[str, tuple[ReplicaPlacement, ...]] = field(default_factory=dict)
    ends: dict[str, float] = field(default_factory=dict)  # placed job -> its declared end
    deferred: dict[str, str] = field(default_factory=dict)  # job -> the reason it was last told it waits
    cancelled: dict[str, None] = field(default_factory=dict)  # placed jobs cancelled: over once reported gone
    nominated: dict[str, Nomination] = field(default_factory=dict)
    # Waiting jobs whose reservation a queue change moved to another flavor (fold.queue_policy), to try again.
    recharged: list[str] = field(default_factory=list)
    # The waiting job whose reservation quota just asked back (fold.quota_recalled): let go, to answer quota.
    let_go: str | None = None
    lapsed: bool = False  # did the last tick end a nomination?
    held_back_free: bool = False  # did a hold end (a nomination, the starving job's quota gone) since the last tick?
    starving: StarvingJob | None = None
    # Inference services' placed replicas: service -> {job: its nodes}, to keep them apart.
    service_nodes: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    # Bumped by every event that can change where (or whether) a request fits: capacity taken or given
    # back, nodes and GPUs coming or going, policy, the typical shapes that scoring judges against.
    generation: int = 0
    # The job whose JobPlaced, about to be folded, the cycle has allocated already.
    allocated_here: str | None = None
    shortcuts: Shortcuts = field(default_factory=Shortcuts)

    def __post_init__(self) -> None:
        self.placer = Placer(self.cluster)

    def policy_for(self, spec: JobSpec) -> str:
        """The priority class's placement policy, else the queue's, else the default."""
        cls = self.policy.classes.get(spec.priority)
        queue = self.policy.queues.get(spec.queue)
        return (cls.placement_policy if cls else "") or (queue.placement_policy if queue else "") or DEFAULT_POLICY

    def pure(self, spec: JobSpec) -> bool:
        """Would placing `spec` now depend on the cluster's state alone (not on how the placer's caches got
        there)? Gang domains refresh the placer out of step, so requests with a topology never are."""
        return not spec.topology and self.placer.consistent()
