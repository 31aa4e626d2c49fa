"""Random but valid worlds of many queues, for comparing the deciders' logs byte for byte with an optimisation
switched on and off (monkeypatched): `random_world(seed)` makes one run's input events, `run_log(inputs)` runs
them through the deciders in virtual time (libs/sim/pipeline.py) and gives the log as bytes.

A world, all of it drawn from the seed:
- leaf queues in 2-4 cohorts, one or two queues without a cohort, and a small tree in the first cohort (a
  parent queue with quota, sometimes a borrowing limit, bounding its three children, which lend to each other
  in the cohort the parent's name makes);
- per queue a nominal quota of 0-8 GPUs (a queue without a cohort 4-8: it could hold nothing else), some with
  a lending limit (a guaranteed part), some with a borrowing limit, some quota per GPU model (flavors A100 and
  H100) instead of one quota for any model, one or two with a per-user limit, one with a daily GPU-hour budget,
  one ordered by least attained service, one with an eviction budget, assorted weights and reclaim delays;
- nodes of 8 GPUs of the two models, about as many GPUs as the queues' nominal quota together, far fewer than
  the jobs ask for, so that many wait;
- several hundred jobs over WINDOW_S, of mixed priorities (one class, `critical`, cannot be preempted), sizes
  1,1,1,2,4,8 and a few gangs, some asking for one GPU model, with and without a declared runtime (an estimate,
  exact or not, or a limit that may stop them), some checkpointing, several users per queue; each runs its
  actual runtime (the simulated executor's `sim/runtime-s` label);
- mid-run: a few cancellations, a node lost and registered again, one cordoned and uncordoned, one drained and
  uncordoned (A100 nodes only), the first queue without a cohort lowered to half its quota and raised again (it
  gets only three planted jobs: two that cannot be preempted hold its quota from the start, on H100 nodes, and
  one of all its quota waits when it is lowered, so it is told exceeds_queue_quota), and a change of the
  priority classes (experiment above training, or urgent no longer preemptible).

The policy goes through the policy file's own checks (those of `parse_policy`, the queue tree included), so
every world is one an operator could write. Each run takes about a second (0.3-1.6 s, 4,000-9,000 log events).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from contracts import (
    CancelJob,
    EventBase,
    FlavorQuota,
    JobSpec,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PriorityClass,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QueueSpec,
    SubmitJob,
)
from contracts.model import GpuSpec, NodeSpec
from libs.core.kernel.decider import derived_id
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES, PolicyBook
from libs.core.kernel.queue_limits import check_tree
from libs.core.kernel.quota_math import QuotaBook
from libs.runtime.policy_file import PolicyFile, policy_changes, tree_order
from libs.sim import executor as sim_executor
from libs.sim.pipeline import VirtualWorld

SOURCE = "world"
OPERATOR = "operator"
TELEMETRY = "node-telemetry"
MODELS = ("A100", "H100")
GPUS_PER_NODE = 8
WINDOW_S = 4 * 3600.0  # jobs arrive over this long; the mid-run events happen within it
# A run stops here whatever still waits (a guard: worlds drain well before).
HORIZON_S = 7 * 86400.0
CRITICAL = "critical"  # the class that cannot be preempted
PRIORITY_CLASSES = (*DEFAULT_PRIORITY_CLASSES, PriorityClass(name=CRITICAL, value=900, preemptible=False))
# Priority classes a job is drawn from, with weights.
PRIORITIES = (("training", 8), ("batch", 5), ("experiment", 4), ("urgent", 2), (CRITICAL, 1))
SIZES = (1, 1, 1, 2, 4, 8)


@dataclass(slots=True)
class World:
    """What random_world drew, for tests that want to know which queue plays which part."""

    seed: int
    queues: list[QueueSpec]
    nodes: list[NodeSpec]
    inputs: list[EventBase]
    solo: list[str] = field(default_factory=list)  # queues without a cohort
    lowered: str = ""  # the queue whose quota is lowered, then raised again
    user_limited: list[str] = field(default_factory=list)
    budgeted: str = ""


def random_world(seed: int, queues: int = 24) -> list[EventBase]:
    """The input events of one run (inventory and policy first, then submissions and mid-run changes), in
    time order."""
    return make_world(seed, queues).inputs


def make_world(seed: int, queues: int = 24) -> World:
    if queues < 10:
        raise ValueError(f"a world needs at least 10 leaf queues, not {queues}")
    rng = random.Random(seed)
    specs, solo = queue_tree(rng, queues)
    leaves = [q for q in specs if q.name not in {p.parent for p in specs}]
    user_limited = [q.name for q in leaves if q.user_max_gpus is not None]
    budgeted = next(q.name for q in leaves if q.budget_gpu_hours is not None)
    policy = PolicyFile(queues=specs, priority_classes=list(PRIORITY_CLASSES))
    check_policy(policy)
    nodes = cluster(rng, leaves)
    inputs: list[EventBase] = [NodeRegistered(id=derived_id(TELEMETRY, "node", n.name, 0), ts=-10.0,
                                              source=TELEMETRY, correlation_id=n.name, node=n) for n in nodes]
    inputs += policy_changes(PolicyBook(), policy, version=1, now=-5.0)
    book = QuotaBook()
    book.set_queues(policy.queues)
    lowered = solo[0]
    submissions = list(jobs(rng, [q for q in leaves if q.name != lowered], book, hot=[budgeted, *user_limited[:1]]))
    inputs += submissions
    inputs += mid_run(rng, nodes, {q.name: q for q in leaves}[lowered], submissions)
    inputs.sort(key=lambda e: e.ts)  # stable: what happens at one instant stays in the order made
    return World(seed, specs, nodes, inputs, solo, lowered, user_limited, budgeted)


def check_policy(policy: PolicyFile) -> None:
    """The policy file's own checks (libs/runtime/policy_file.parse_policy, without the TOML): the fields
    as a file decodes them, each queue against the tree before it. ValueError when a check fails."""
    msgspec.json.decode(msgspec.json.encode(policy), type=PolicyFile)
    tree: dict[str, QueueSpec] = {}
    for q in tree_order(policy.queues):
        problem = "defined twice" if q.name in tree else check_tree(tree, q)
        if problem is not None:
            raise ValueError(f"queue {q.name!r}: {problem}")
        tree[q.name] = q


def queue_tree(rng: random.Random, leaves: int) -> tuple[list[QueueSpec], list[str]]:
    """The queues (parents before children) and the names of those without a cohort."""
    cohorts = [f"cohort-{c}" for c in "abcd"[:rng.randint(2, 4)]]
    solo_count = rng.randint(1, 2)
    children = 3
    names = [f"q{i:02d}" for i in range(leaves)]
    solo, tree, rest = names[:solo_count], names[solo_count:solo_count + children], names[solo_count + children:]
    out: list[QueueSpec] = []
    for name in solo:
        nominal = rng.randint(4, 8) if name != solo[0] else 8
        out.append(QueueSpec(name=name, team=name, nominal_gpus=nominal, weight=rng.choice((0.5, 1.0, 2.0))))
    # The tree: a parent with quota in the first cohort (bounding its subtree, borrowing included); its
    # children's cohort is the parent (its name).
    parent = "org"
    out.append(QueueSpec(name=parent, team=parent, nominal_gpus=rng.randint(6, 12), cohort=cohorts[0],
                         lending_limit_gpus=rng.choice((None, 4)), borrowing_limit_gpus=rng.choice((None, 0, 2)),
                         reclaim_after_s=rng.choice((0.0, 300.0))))
    for name in tree:
        out.append(cohort_queue(rng, name, parent=parent))
    for i, name in enumerate(rest):
        out.append(cohort_queue(rng, name, cohort=cohorts[i % len(cohorts)]))
    # Special parts, each on a queue of its own among the cohorts' queues.
    special = rng.sample(range(len(out) - len(rest), len(out)), 5)
    by_index = dict(enumerate(out))
    u1, u2, budget, las, evict = special
    by_index[u1] = msgspec.structs.replace(by_index[u1], user_max_gpus=2, nominal_gpus=nominal_of(by_index[u1], 6),
                                           flavors=())
    by_index[u2] = msgspec.structs.replace(by_index[u2], user_max_gpus=rng.choice((4, 8)))
    by_index[budget] = msgspec.structs.replace(by_index[budget], budget_gpu_hours=float(rng.randint(3, 8)),
                                               budget_period="day", over_budget=rng.choice(("borrow", "wait")))
    by_index[las] = msgspec.structs.replace(by_index[las], las_threshold_gpu_hours=1.0)
    by_index[evict] = msgspec.structs.replace(by_index[evict], eviction_budget_gpus=4, eviction_window_s=1800.0)
    return [by_index[i] for i in range(len(out))], solo


def nominal_of(q: QueueSpec, at_least: int) -> int:
    """A queue's nominal as one quota for any model, at least `at_least` (its flavors summed, if it has some)."""
    total = q.nominal_gpus if q.nominal_gpus is not None else sum(f.nominal_gpus for f in q.flavors)
    return max(total, at_least)


def cohort_queue(rng: random.Random, name: str, cohort: str = "", parent: str = "") -> QueueSpec:
    """A leaf queue of a cohort (or, with `parent`, of its parent's): quota for any model or per model."""
    nominal = rng.choice((0, 1, 2, 3, 4, 4, 6, 8))
    lend = rng.randint(0, nominal) if rng.random() < 0.3 else None
    borrow = rng.choice((0, 2, 4, 8)) if rng.random() < 0.3 else None
    base = QueueSpec(name=name, team=name, cohort=cohort, parent=parent, weight=rng.choice((0.5, 1.0, 1.0, 2.0, 3.0)),
                     reclaim_after_s=rng.choice((0.0, 60.0, 300.0, 600.0)))
    if nominal >= 2 and rng.random() < 0.3:
        a100 = rng.randint(1, nominal - 1)
        flavors = tuple(FlavorQuota(model=m, nominal_gpus=n,
                                    lending_limit_gpus=None if lend is None else min(lend, n),
                                    borrowing_limit_gpus=borrow)
                        for m, n in rng.sample([("A100", a100), ("H100", nominal - a100)], 2))
        return msgspec.structs.replace(base, flavors=flavors)
    return msgspec.structs.replace(base, nominal_gpus=nominal, lending_limit_gpus=lend, borrowing_limit_gpus=borrow)


def cluster(rng: random.Random, leaves: list[QueueSpec]) -> list[NodeSpec]:
    """Nodes of 8 GPUs, about as many GPUs as the leaves' nominal quota together; a third of them H100."""
    total = sum(nominal_of(q, 0) for q in leaves)
    count = max(6, round(total / GPUS_PER_NODE * rng.uniform(0.75, 1.0)))
    h100 = max(2, count // 3)
    return [node(f"node-{i:03d}", MODELS[1] if i < h100 else MODELS[0]) for i in range(count)]


def node(name: str, model: str) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=96_000, memory_mib=786_432, labels={"rack": f"rack-{int(name[-3:]) // 4}"},
                    gpus=tuple(GpuSpec(index=g, model=model, memory_mib=81_920, uuid=f"{name}-{g}", nvlink_group=0)
                               for g in range(GPUS_PER_NODE)))


def jobs(rng: random.Random, leaves: list[QueueSpec], book: QuotaBook, hot: list[str],
         count: int | None = None) -> Iterator[SubmitJob]:
    """Several hundred submissions over WINDOW_S; a few queues (`hot` and two more) get far more than their
    share."""
    count = rng.randint(300, 420) if count is None else count
    hot = [*hot, *rng.sample([q.name for q in leaves if q.name not in hot], 2)]
    weights = [nominal_of(q, 1) * (4 if q.name in hot else 1) for q in leaves]
    users = {q.name: rng.randint(2, 4) for q in leaves}
    t = 0.0
    for i in range(count):
        t += rng.expovariate(count / WINDOW_S)
        q = rng.choices(leaves, weights)[0]
        yield SubmitJob(id=derived_id(SOURCE, "submit", i), ts=round(t, 1), source=SOURCE, job_id=f"j{i:04d}",
                        spec=job_spec(rng, q, f"j{i:04d}", users[q.name], book))


def job_spec(rng: random.Random, q: QueueSpec, name: str, users: int, book: QuotaBook) -> JobSpec:
    """One job for the queue; mostly (not always: admission's refusal is part of the world too) one the queue
    could ever hold."""
    priority = rng.choices([p for p, _ in PRIORITIES], [w for _, w in PRIORITIES])[0]
    replicas, gpus = 1, rng.choice(SIZES)
    if rng.random() < 0.06:  # a gang
        replicas, gpus = rng.choice(((2, 2), (2, 4), (3, 2), (2, 8)))
    if q.user_max_gpus is not None:
        replicas, gpus = 1, min(gpus, q.user_max_gpus)
    models: tuple[str, ...] = ()
    if rng.random() < (0.5 if q.flavors else 0.15):
        models = (rng.choice(q.flavors).model,) if q.flavors else (rng.choice(MODELS),)
    shape = JobSpec(team=q.team, queue=q.name, gpus=gpus, replicas=replicas, gpu_models=models)
    if priority == CRITICAL and replicas * gpus > ceiling(book, shape, borrows=False):
        priority = "training"  # it could never run: it never borrows
    most = ceiling(book, shape, borrows=True)
    if replicas * gpus > most and rng.random() < 0.85:
        replicas, gpus = 1, max((s for s in SIZES if s <= most), default=gpus)
    actual = round(rng.uniform(300.0, 5400.0), 1)
    labels = {sim_executor.SIM_RUNTIME_S: f"{actual:g}"}
    declared = rng.random()
    duration = max_runtime = None
    if declared < 0.15:
        duration = actual
    elif declared < 0.45:
        duration = round(actual * rng.uniform(0.5, 2.0), 1)
    elif declared < 0.55:
        max_runtime = round(actual * rng.choice((0.8, 1.5, 2.0)), 1)  # 0.8: stopped at its limit
    checkpoint = None
    if rng.random() < 0.5:
        checkpoint = 600.0
        labels[sim_executor.SIM_CHECKPOINT_S] = rng.choice(("5", "5", "45"))  # 45: past the grace, killed
    return JobSpec(team=q.team, queue=q.name, user=f"{q.name}-u{rng.randrange(users)}", name=name, priority=priority,
                   replicas=replicas, gpus=gpus, gpu_models=models, duration_s=duration, max_runtime_s=max_runtime,
                   checkpoint_interval_s=checkpoint, labels=labels)


def ceiling(book: QuotaBook, spec: JobSpec, borrows: bool) -> int:
    """The most GPUs the job's queue could ever hold of the models the job may use (admission's check)."""
    flavors = book.flavors_for(spec.queue, spec)
    return max((book.ceiling(spec.queue, f, borrows) for f in flavors), default=0) // 1000


def mid_run(rng: random.Random, nodes: list[NodeSpec], lowered: QueueSpec,
            submissions: list[SubmitJob]) -> list[EventBase]:
    """Cancellations, nodes going and coming back, a quota lowered and raised, the classes changed."""
    out: list[EventBase] = []
    for sub in rng.sample(submissions, 6):
        out.append(CancelJob(id=derived_id(SOURCE, "cancel", sub.job_id), ts=round(sub.ts + rng.uniform(30, 3600), 1),
                             source=SOURCE, correlation_id=sub.job_id, job_id=sub.job_id, team=sub.spec.team))
    lost, cordoned, drained = rng.sample([n for n in nodes if n.gpus[0].model == MODELS[0]], 3)
    w = WINDOW_S
    out += [
        NodeLost(id=derived_id(TELEMETRY, "lost", lost.name), ts=round(0.3 * w, 1), source=TELEMETRY,
                 correlation_id=lost.name, node=lost.name, reason="heartbeat_timeout"),
        NodeRegistered(id=derived_id(TELEMETRY, "node", lost.name, 1), ts=round(0.5 * w, 1), source=TELEMETRY,
                       correlation_id=lost.name, node=lost),
        NodeCordoned(id=derived_id(OPERATOR, "cordon", cordoned.name), ts=round(0.35 * w, 1), source=OPERATOR,
                     correlation_id=cordoned.name, node=cordoned.name, reason="maintenance"),
        NodeUncordoned(id=derived_id(OPERATOR, "uncordon", cordoned.name), ts=round(0.6 * w, 1), source=OPERATOR,
                       correlation_id=cordoned.name, node=cordoned.name),
        NodeCordoned(id=derived_id(OPERATOR, "drain", drained.name), ts=round(0.7 * w, 1), source=OPERATOR,
                     correlation_id=drained.name, node=drained.name, drain=True, reason="firmware"),
        NodeUncordoned(id=derived_id(OPERATOR, "undrain", drained.name), ts=round(0.8 * w, 1), source=OPERATOR,
                       correlation_id=drained.name, node=drained.name),
    ]
    # The queue's quota halved, then given back. The queue gets no other jobs, so that a job above the half
    # surely waits then at the head of its queue: two jobs that cannot be preempted take the whole quota from the
    # start (on H100 nodes, which no node event above touches), and one of the highest class that can be
    # preempted asks for all of it.
    nominal = lowered.nominal_gpus or GPUS_PER_NODE
    before = 0.4 * w
    planted = [("hold-1", CRITICAL, nominal // 2, 60.0, 2 * before),
               ("hold-2", CRITICAL, nominal - nominal // 2, 70.0, 2 * before),
               ("big", "urgent", nominal, before - 300, 1800.0)]
    for job_id, priority, gpus, ts, runtime in planted:
        out.append(SubmitJob(id=derived_id(SOURCE, "submit", job_id), ts=round(ts, 1), source=SOURCE, job_id=job_id,
                             spec=JobSpec(team=lowered.team, queue=lowered.name, user=f"{lowered.name}-u0",
                                          name=job_id, priority=priority, gpus=gpus, gpu_models=(MODELS[1],),
                                          labels={sim_executor.SIM_RUNTIME_S: f"{runtime:g}"})))
    half = msgspec.structs.replace(lowered, nominal_gpus=nominal // 2)
    out += [QueuePolicyChanged(id=derived_id(OPERATOR, "queue", lowered.name, 2), ts=round(before, 1),
                               source=OPERATOR, correlation_id=lowered.name, queue=half, version=2),
            QueuePolicyChanged(id=derived_id(OPERATOR, "queue", lowered.name, 3), ts=round(0.65 * w, 1),
                               source=OPERATOR, correlation_id=lowered.name, queue=lowered, version=3)]
    # The classes changed: experiments now above training, or urgent jobs no longer preemptible.
    which = rng.choice(("experiment", "urgent"))
    changes: dict[str, dict[str, object]] = {"experiment": {"value": 600}, "urgent": {"preemptible": False}}
    changed = changes[which]
    classes = tuple(msgspec.structs.replace(c, **changed) if c.name == which else c for c in PRIORITY_CLASSES)
    out.append(PriorityClassesChanged(id=derived_id(OPERATOR, "classes", 4), ts=round(0.55 * w, 1), source=OPERATOR,
                                      classes=tuple(sorted(classes, key=lambda c: (-c.value, c.name))), version=4))
    return out


def run_world(inputs: list[EventBase], tick_s: float = 60.0) -> VirtualWorld:
    """The inputs through the deciders and the simulated executor in virtual time, until nothing is left to
    happen (or HORIZON_S)."""
    world = VirtualWorld(tick_s)
    world.feed(inputs)
    world.begin()
    start = world.now
    while world.busy():
        if world.step() and world.now - start > HORIZON_S:
            break
    return world


def run_log(inputs: list[EventBase], tick_s: float = 60.0) -> list[bytes]:
    """The run's log, each event as msgspec JSON: what two runs are compared by, byte for byte."""
    return [msgspec.json.encode(e) for _, e in run_world(inputs, tick_s).log]
