"""What preemption guarantees, each shown by a sequence of events through the whole pipeline (admission,
quota, placement, preemption):

  - a reclaim takes a queue's whole jobs only while it borrows (at most one job below its nominal quota, none
    of a queue that does not borrow), also when other lenders reclaim at the same time (victims already chosen
    for them count as gone, and their room as their preemptors', unless those run already);
  - the victims are a minimal set, the least work lost first, and they really make room (simulated first);
  - a protection that runs out with time (a victim's minimum runtime, a spent eviction budget's window) is
    looked at again on the clock tick, for every waiting job that could preempt;
  - the simulation decides by the rules quota and placement apply: after the evictions the preemptor is
    really admitted and placed (no evictions for nothing);
  - a queue inside its nominal quota waits for borrowers no longer than its reclaim grace plus the longest
    minimum runtime that protects them.

No executor runs: victims stay on their GPUs until a test reports them evicted.
"""

from __future__ import annotations

import msgspec

from contracts import (
    ClockTick,
    EventBase,
    JobEvicted,
    JobFinished,
    JobPlaced,
    PreemptionDecided,
    PriorityClassesChanged,
    QuotaReserved,
)
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES
from libs.core.quota.decider import QuotaDecider
from tests.unit.builders import EventFeed, brief, job, kinds, node, of, pipeline, queue
from tests.unit.quota_builders import D, cluster, on, outcome, q


def placed(feed: EventFeed) -> dict[str, tuple[str, ...]]:
    """Each job placed so far (its last placement): the nodes it runs on."""
    return {p.job_id: tuple(r.node for r in p.placements) for p in of(feed.log, JobPlaced)}


def evict(feed: EventFeed, decided: list[PreemptionDecided]) -> list[EventBase]:
    """The executor acts on the decisions: every victim leaves its GPUs."""
    return [e for d in decided for v in d.victims for e in feed.send(JobEvicted, job_id=v.job_id, reason="preempted")]


def usage(feed: EventFeed, name: str) -> float:
    """GPUs the queue holds by quota's own book."""
    quota = next(d for d in feed.deciders if isinstance(d, QuotaDecider))
    return sum(u for (held_by, _), u in quota.state.book.used.items() if held_by == name) / 1000


def victims(decided: list[PreemptionDecided]) -> list[str]:
    return sorted(v.job_id for d in decided for v in d.victims)


def batch_min_runtime(feed: EventFeed, seconds: float) -> None:
    classes = tuple(c if c.name != "batch" else msgspec.structs.replace(c, min_runtime_s=seconds)
                    for c in DEFAULT_PRIORITY_CLASSES)
    feed.send(PriorityClassesChanged, classes=classes, version=2)


# --- a reclaim takes a queue's jobs only while it borrows -------------------------------------------------

def test_two_lenders_reclaiming_at_once_take_back_only_what_the_borrower_borrows() -> None:
    """x (nominal 4) runs 6 GPUs, borrowing 2; l1 and l2 (nominal 2, lending 1 each) each ask for 2. The one
    eviction chosen for l1 gives back x's whole borrowing, and with it room for l2 too: l2 evicts nobody."""
    feed = cluster(q("x", 4), q("l1", 2, lending_limit_gpus=1), q("l2", 2, lending_limit_gpus=1))
    feed.nodes(node("n1", 8))
    feed.at(D - 60)
    for i in range(3):
        assert kinds(feed.submit(f"x{i}", on("x", 2).priority("batch")))[-1] == "JobPlaced"
    feed.at(D)
    first = feed.submit("l1-job", on("l1", 2))
    second = feed.submit("l2-job", on("l2", 2))
    assert outcome(first, "l1-job") == outcome(second, "l2-job") == ("deferred", "quota_lent_out")
    decided = of(first + second, PreemptionDecided)
    assert [d.preemptor_id for d in decided] == ["l1-job"]
    assert sum(v.gpu_milli for d in decided for v in d.victims) == 2000
    evict(feed, decided)
    assert {"l1-job", "l2-job"} <= set(placed(feed))
    assert usage(feed, "x") == 4  # exactly its nominal quota


def test_a_reclaim_takes_a_borrower_only_one_job_below_its_nominal_even_to_free_a_node() -> None:
    """y (nominal 3) borrows 1 GPU in four 1-GPU jobs filling n1; z (nominal 1) borrows 2 in three 1-GPU jobs
    on n2, which has one GPU free. l (nominal 4) asks for 4 on one node: only evicting all of y's jobs or all
    of z's frees a node, and a reclaim may take one of y's (y borrows 1) and two of z's (z borrows 2 and then
    1): none frees a node, so nobody is evicted."""
    feed = cluster(q("l", 4), q("y", 3), q("z", 1))
    feed.nodes(node("n1", 4, "A100"), node("n2", 4, "H100"))
    feed.at(D - 60)
    for i in range(4):
        assert kinds(feed.submit(f"y{i}", on("y", 1).models("A100")))[-1] == "JobPlaced"
    for i in range(3):
        assert kinds(feed.submit(f"z{i}", on("z", 1).models("H100")))[-1] == "JobPlaced"
    feed.at(D)
    decisions = feed.submit("l0", on("l", 4))
    assert outcome(decisions, "l0") == ("deferred", "quota_lent_out")
    assert of(decisions, PreemptionDecided) == []
    assert of(feed.at(D + 60).send(ClockTick), PreemptionDecided) == []


def test_a_victim_whose_preemptor_already_runs_elsewhere_leaves_room_for_the_next_preemptor() -> None:
    """p1 evicts v3; before v3 is gone, v1 ends and p1 runs in its place. v3's GPUs, once free, are nobody's:
    p2 counts on them and evicts nobody."""
    feed = pipeline()
    feed.queues(queue("ml-train", "ml"))
    feed.nodes(node("a", 6))
    for job_id in ("v1", "v2", "v3"):
        assert kinds(feed.submit(job_id, job().gpus(2).priority("batch")))[-1] == "JobPlaced"
    first = of(feed.submit("p1", job().gpus(2).priority("urgent")), PreemptionDecided)
    assert victims(first) == ["v3"]
    assert ("JobPlaced", "p1") in brief(feed.send(JobFinished, job_id="v1"))
    out = feed.submit("p2", job().gpus(2).priority("urgent"))
    assert kinds(out)[-1] == "PlacementDeferred" and of(out, PreemptionDecided) == []
    evict(feed, first)
    assert placed(feed)["p2"] == ("a",)


# --- minimal victim sets -------------------------------------------------------------------------------------

def test_reclaim_evicts_the_one_job_that_frees_a_node_not_four_cheaper_ones() -> None:
    """y and z (nominal 0) borrow everything they run: y four 1-GPU jobs on n1 (100 s each: 400 GPU-s of
    work), z one 4-GPU job on n2 started later (50 s: 200 GPU-s). Each y job alone loses less than z's, but
    the least work lost is z's one job, and it frees a whole node."""
    feed = cluster(q("l", 8), q("y", 0), q("z", 0))
    feed.nodes(node("n1", 4, "A100"), node("n2", 4, "H100"))
    feed.at(D - 100)
    for i in range(4):
        assert kinds(feed.submit(f"y{i}", on("y", 1).models("A100").priority("batch")))[-1] == "JobPlaced"
    feed.at(D - 50)
    assert kinds(feed.submit("z0", on("z", 4).priority("batch")))[-1] == "JobPlaced"
    feed.at(D)
    decisions = feed.submit("l0", on("l", 4))
    decided = of(decisions, PreemptionDecided)
    assert victims(decided) == ["z0"]
    assert decided[0].victims[0].lost_gpu_seconds == 200.0
    evict(feed, decided)
    assert placed(feed)["l0"] == ("n2",)


# --- protections that run out with time ------------------------------------------------------------------------

def protected_borrower(*lender_jobs: tuple[str, int]) -> EventFeed:
    """b (nominal 4) borrows 4 in four batch jobs that may not be evicted before they ran 300 s; then l
    (nominal 4, no reclaim grace) submits its jobs, which wait for the quota b borrows. ("solo", a queue of
    its own, is there for unrelated work.)"""
    feed = cluster(q("l", 4), q("b", 4), q("solo", 1, cohort=""))
    feed.nodes(node("n1", 8))
    batch_min_runtime(feed, 300.0)
    feed.at(D)
    for i in range(4):
        assert kinds(feed.submit(f"b{i}", on("b", 2).priority("batch")))[-1] == "JobPlaced"
    feed.at(D + 10)
    for job_id, gpus in lender_jobs:
        assert of(feed.submit(job_id, on("l", gpus)), PreemptionDecided) == []  # b's jobs are protected
    return feed


def ticks(feed: EventFeed, *times: float) -> list[PreemptionDecided]:
    return [d for t in times for d in of(feed.at(t).send(ClockTick), PreemptionDecided)]


def test_a_lender_reclaims_on_the_tick_after_the_borrowers_minimum_runtime_ends_with_nothing_else_happening() -> None:
    feed = protected_borrower(("l0", 2))
    assert ticks(feed, D + 100, D + 200, D + 299) == []
    decided = ticks(feed, D + 300, D + 310)
    assert [d.preemptor_id for d in decided] == ["l0"]
    evict(feed, decided)
    assert "l0" in placed(feed)


def test_a_lender_reclaims_for_a_job_that_is_not_the_first_of_its_queue() -> None:
    """l0 (6 GPUs, above l's nominal 4) sorts first in l and can never reclaim; l1 (2 GPUs) can, once b's jobs
    ran their minimum runtime. Unrelated work changes something just before that tick, so that the tick
    looks at each queue's first waiting job anyway: l1 must be looked at too."""
    feed = protected_borrower(("l0", 6), ("l1", 2))
    assert ticks(feed, D + 100) == []
    solo = feed.at(D + 305).submit("solo-0", on("solo", 1).priority("batch"))
    assert kinds(solo)[-1] == "PlacementDeferred"  # n1 is full
    decided = ticks(feed, D + 310)
    assert [d.preemptor_id for d in decided] == ["l1"]
    evict(feed, decided)
    assert "l1" in placed(feed)


def test_a_lender_reclaims_for_its_second_job_when_the_borrowers_lose_their_protection() -> None:
    """b's batch jobs borrow, protected by their class's minimum runtime (30 s) while l's jobs begin to wait.
    l0 (6 GPUs, above l's nominal) sorts first and can never reclaim: once the protection is over, the tick
    looks at l1 too."""
    feed = cluster(q("l", 4), q("b", 4))
    feed.nodes(node("n1", 8))
    batch_min_runtime(feed, 30.0)
    feed.at(D)
    for i in range(4):
        assert kinds(feed.submit(f"b{i}", on("b", 2).priority("batch")))[-1] == "JobPlaced"
    feed.at(D + 10)
    for job_id, gpus in (("l0", 6), ("l1", 2)):
        assert of(feed.submit(job_id, on("l", gpus)), PreemptionDecided) == []
    assert ticks(feed, D + 20) == []
    decided = ticks(feed, D + 30, D + 40)
    assert [d.preemptor_id for d in decided] == ["l1"]


def test_a_reclaim_takes_borrowers_made_not_preemptible_only_as_far_as_they_borrow() -> None:
    """b's batch jobs borrow, then become not preemptible (the priority classes change under them): they
    borrowed while they could be preempted, and the lender is owed its quota back. l0 (6 GPUs, above l's
    nominal) can never reclaim; l1 reclaims at once, 2 GPUs of the 4 b borrows, none of b's nominal."""
    feed = cluster(q("l", 4), q("b", 4))
    feed.nodes(node("n1", 8))
    feed.at(D)
    for i in range(4):
        assert kinds(feed.submit(f"b{i}", on("b", 2).priority("batch")))[-1] == "JobPlaced"
    classes = tuple(msgspec.structs.replace(c, preemptible=c.name != "batch") for c in DEFAULT_PRIORITY_CLASSES)
    feed.at(D + 5).send(PriorityClassesChanged, classes=classes, version=2)
    feed.at(D + 10)
    assert of(feed.submit("l0", on("l", 6)), PreemptionDecided) == []
    decided = of(feed.submit("l1", on("l", 2)), PreemptionDecided)
    assert [d.preemptor_id for d in decided] == ["l1"]
    assert [(v.queue, v.gpu_milli) for d in decided for v in d.victims] == [("b", 2000)]
    feed.at(D + 20)
    assert of(feed.submit("l2", on("l", 2)), PreemptionDecided) != []  # l's nominal is 4: b still borrows 2
    assert of(feed.submit("l3", on("l", 2)), PreemptionDecided) == []  # l is at its nominal: nothing is owed


def test_a_queue_inside_its_nominal_quota_waits_no_longer_than_its_grace_plus_the_minimum_runtime() -> None:
    """Reclaim grace 120 s, borrowers protected for 300 s from their start: reclaim comes on the first tick at
    or after max(arrival + grace, start + minimum runtime)."""
    feed = cluster(q("l", 4, reclaim_after_s=120.0), q("b", 4))
    feed.nodes(node("n1", 8))
    batch_min_runtime(feed, 300.0)
    feed.at(D)
    for i in range(4):
        assert kinds(feed.submit(f"b{i}", on("b", 2).priority("batch")))[-1] == "JobPlaced"
    feed.at(D + 250)
    assert of(feed.submit("l0", on("l", 4)), PreemptionDecided) == []
    assert ticks(feed, D + 300, D + 360) == []  # protected no more, but l0's grace runs to D + 370
    decided = ticks(feed, D + 370)
    assert [d.preemptor_id for d in decided] == ["l0"]
    assert sum(v.gpu_milli for d in decided for v in d.victims) == 4000


def test_a_preemptor_held_back_by_a_spent_eviction_budget_evicts_on_the_tick_the_window_ages_out() -> None:
    """ml may lose 2 GPUs per 600 s to eviction: p1 takes them; p2 waits until p1's eviction ages out of the
    window, with nothing but ticks happening meanwhile."""
    feed = cluster(q("ml", 8, cohort="", eviction_budget_gpus=2, eviction_window_s=600.0))
    feed.nodes(node("n1", 8))
    feed.at(D)
    for i in range(4):
        assert kinds(feed.submit(f"v{i}", on("ml", 2).priority("batch")))[-1] == "JobPlaced"
    first = of(feed.at(D + 10).submit("p1", on("ml", 2).priority("urgent")), PreemptionDecided)
    assert victims(first) == ["v3"]
    assert of(feed.submit("p2", on("ml", 2).priority("urgent")), PreemptionDecided) == []
    evict(feed, first)
    assert "p1" in placed(feed)
    assert ticks(feed, D + 20, D + 300, D + 605) == []
    decided = ticks(feed, D + 610, D + 615)
    assert [(d.preemptor_id, victims([d])) for d in decided] == [("p2", ["v2"])]


# --- the simulation decides by quota's and placement's rules --------------------------------------------------

def test_no_evictions_for_a_preemptor_that_quota_would_not_let_borrow_while_a_lender_waits() -> None:
    """b (nominal 4) runs eight 1-GPU batch jobs, borrowing l's 4; l0 (4 GPUs, inside l's nominal) waits for
    them, its reclaim grace not over. b's urgent job must borrow: quota lets no borrower grow while l0 waits
    for quota lent out. Evicting two of b's jobs would make room for it but quota would still refuse it; the
    preemptor evicts what it takes for quota to admit it (l0 then no longer fits within what is lent out)."""
    feed = cluster(q("l", 4, reclaim_after_s=3600.0), q("b", 4))
    feed.nodes(node("n1", 8))
    feed.at(D - 60)
    for i in range(8):
        assert kinds(feed.submit(f"b{i}", on("b", 1).priority("batch")))[-1] == "JobPlaced"
    feed.at(D)
    assert outcome(feed.submit("l0", on("l", 4)), "l0") == ("deferred", "quota_lent_out")
    feed.at(D + 1)
    decided = of(feed.submit("p", on("b", 2).priority("urgent")), PreemptionDecided)
    assert [d.preemptor_id for d in decided] == ["p"]
    out = evict(feed, decided)
    assert ("p", True) in [(r.job_id, r.borrowed_milli > 0) for r in of(out, QuotaReserved)]
    assert "p" in placed(feed)
    assert len(decided[0].victims) == 4
