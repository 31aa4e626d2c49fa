"""A queue's preemption and flavor policies, as Kueue's ClusterQueue states them, each a rule stated once: quota,
preemption and the guarantee checker all ask these.

- reclaim_within_cohort (Kueue preemption.reclaimWithinCohort): whom a reclaim of the queue's lent quota may
  evict in the other queues of its cohort: any borrower ("any", today's rule), those of lower priority than the
  preemptor ("lower-priority"), or none ("never").
- within_queue_preemption (preemption.withinClusterQueue): whom a job may evict in its own queue: jobs of lower
  priority ("lower-priority"), also those of its priority submitted after it while it is no larger than its
  queue's nominal quota of a flavor ("lower-or-newer-equal-priority"), or none ("never").
- borrow_within_cohort (preemption.borrowWithinCohort): may a job that must borrow to fit evict borrowers of the
  other queues of its cohort? Never ("never", today's rule: it evicts only in its own queue), or those of lower
  priority than it and at most borrow_within_cohort_max_priority ("lower-priority").
- when_can_borrow / when_can_preempt (flavorFungibility): in which of its flavors a job takes quota. The first
  with room ("borrow", "try-next-flavor": today's rule), or a flavor it need not borrow in before one where it
  would ("when_can_borrow: try-next-flavor"), and never past a flavor whose nominal quota would hold it once a
  reclaim takes back what the queue lent, where the jobs holding that quota that its reclaim_within_cohort lets it
  take could free what it lacks ("when_can_preempt: preempt": it waits there for the reclaim).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from contracts import QueueSpec
from contracts.model import (
    ANY_PRIORITY,
    BORROW,
    LOWER_OR_NEWER_EQUAL_PRIORITY,
    LOWER_PRIORITY,
    NEVER,
    PREEMPT,
    TRY_NEXT_FLAVOR,
)
from contracts.model import QUEUE_POLICY_CHOICES as CHOICES

# Each setting's values (the first is the default: contracts/model.py) and the Kueue name of each.
KUEUE_NAMES = {NEVER: "Never", ANY_PRIORITY: "Any", LOWER_PRIORITY: "LowerPriority",
               LOWER_OR_NEWER_EQUAL_PRIORITY: "LowerOrNewerEqualPriority", BORROW: "Borrow",
               TRY_NEXT_FLAVOR: "TryNextFlavor", PREEMPT: "Preempt"}


def policy_problem(spec: QueueSpec) -> str | None:
    """Why the queue's policies are not valid, or None."""
    for name, choices in CHOICES.items():
        value = getattr(spec, name)
        if value not in choices:
            return f"{name} must be {', '.join(choices[:-1])} or {choices[-1]}, not {value!r}"
    if spec.borrow_within_cohort_max_priority is not None and spec.borrow_within_cohort != LOWER_PRIORITY:
        return "borrow_within_cohort_max_priority needs borrow_within_cohort lower-priority"
    if spec.within_queue_preemption == NEVER and spec.las_threshold_gpu_hours is not None:
        return "within_queue_preemption never forbids what las_threshold_gpu_hours asks: preemption within the queue"
    return None


def reclaim_allows(spec: QueueSpec | None, preemptor_priority: int, victim_priority: int) -> bool:
    """May a reclaim for a job of the queue `spec` evict a borrower of another queue of `victim_priority`?"""
    policy = spec.reclaim_within_cohort if spec is not None else ANY_PRIORITY
    return policy == ANY_PRIORITY or (policy == LOWER_PRIORITY and victim_priority < preemptor_priority)


def within_queue_allows(spec: QueueSpec | None, preemptor_priority: int, victim_priority: int,
                        newer: bool, within_nominal: bool) -> bool:
    """May a job evict a job of its own queue of `victim_priority`? `newer`: the victim was submitted after it;
    `within_nominal`: the preemptor is no larger than its queue's nominal quota of some flavor (Kueue: "fits
    within the nominal quota")."""
    policy = spec.within_queue_preemption if spec is not None else LOWER_PRIORITY
    if policy == NEVER:
        return False
    if victim_priority < preemptor_priority:
        return True
    return (policy == LOWER_OR_NEWER_EQUAL_PRIORITY and victim_priority == preemptor_priority and newer
            and within_nominal)


def evicts_equal_priority(spec: QueueSpec | None) -> bool:
    """May a job of the queue evict newer jobs of its own priority?"""
    return spec is not None and spec.within_queue_preemption == LOWER_OR_NEWER_EQUAL_PRIORITY


def borrowing_preemption_allows(spec: QueueSpec | None, preemptor_priority: int, victim_priority: int) -> bool:
    """May a job of the queue that must borrow to fit evict a borrower of another queue of its cohort of
    `victim_priority`?"""
    if spec is None or spec.borrow_within_cohort != LOWER_PRIORITY or victim_priority >= preemptor_priority:
        return False
    threshold = spec.borrow_within_cohort_max_priority
    return threshold is None or victim_priority <= threshold


def preempts_while_borrowing(spec: QueueSpec | None) -> bool:
    return spec is not None and spec.borrow_within_cohort == LOWER_PRIORITY


def fungible(spec: QueueSpec | None) -> bool:
    """Does the queue choose flavors otherwise than the first with room (a setting not its default)?"""
    return spec is not None and (spec.when_can_borrow != BORROW or spec.when_can_preempt != TRY_NEXT_FLAVOR)


def waits_to_preempt(spec: QueueSpec | None) -> bool:
    """Does a job of the queue wait at a flavor whose nominal quota would hold it once a reclaim takes back what
    the queue lent, rather than take a later flavor with room? Not where the queue reclaims nothing
    (reclaim_within_cohort never): no reclaim would ever serve it there, and it would wait for good beside room."""
    return spec is not None and spec.when_can_preempt == PREEMPT and spec.reclaim_within_cohort != NEVER


def reclaim_could_serve(spec: QueueSpec | None, priority: int, lacking: int, lent_to: Iterable[tuple[int, int]]
                        ) -> bool:
    """Could a reclaim for a job of `priority` of the queue free the `lacking` quota (thousandths of GPUs) it
    lacks, taking the holders of what the queue lent (`lent_to`: each as its priority and its quota) that its
    reclaim_within_cohort lets it take? At most: a reclaim may leave some of them to their queue's nominal."""
    for holder_priority, milli in lent_to:
        if reclaim_allows(spec, priority, holder_priority):
            lacking -= milli
            if lacking <= 0:
                return True
    return False


def flavors_in_turn(spec: QueueSpec | None, flavors: Iterable[str], demand: int,
                    left: Callable[[str], tuple[int, int]], priority: int,
                    lent_to: Callable[[str], Iterable[tuple[int, int]]]) -> tuple[str, ...]:
    """The flavors a job of `priority` tries, in turn, by its queue's flavor fungibility; `left(flavor)`: what is
    left of the queue's nominal quota of the flavor, and the queue's room there; `lent_to(flavor)`: the jobs
    holding what the queue lent of the flavor (QuotaBook.holders_of_lent, holds_lent), each as its priority and
    its quota (thousandths of GPUs). With the defaults, `flavors` as they are. With when_can_preempt preempt,
    none after the first flavor whose nominal quota holds the job but whose room does not (quota lent out) where
    a reclaim for it could make that room (`reclaim_could_serve`): the job waits there for the reclaim. Where it
    could not (reclaim_within_cohort lower-priority, the holders of its priority or higher), no reclaim would
    serve it there, and it goes on to the next flavor. With when_can_borrow try-next-flavor, those it needs not
    borrow in first, each group in the queue's order."""
    flavors = tuple(flavors)
    if not fungible(spec) or spec is None:
        return flavors
    if waits_to_preempt(spec):
        for i, flavor in enumerate(flavors):
            nominal_left, room = left(flavor)
            if nominal_left >= demand > room and reclaim_could_serve(spec, priority, demand - room, lent_to(flavor)):
                flavors = flavors[:i + 1]
                break
    if spec.when_can_borrow == TRY_NEXT_FLAVOR:
        own = tuple(f for f in flavors if left(f)[0] >= demand)
        flavors = own + tuple(f for f in flavors if f not in own)
    return flavors
